"""Operator graphs traced from the real PyTorch modules (see extract.trace_workload)."""
