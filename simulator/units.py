"""Units used across aisim, said once.

GB means 1e9 bytes and GiB 2**30 bytes; TFLOP/s means 1e12 FLOP/s. Every field and variable carries its unit
in its name (``latency_s``, ``hbm_bw_bytes_per_s``, ``memory_bytes``). One FLOP convention: a multiply-add is
2 FLOPs (as torch.utils.flop_counter; fvcore counts it as 1).
"""

GB = 1e9
GiB = 2**30
MB = 1e6
MiB = 2**20
TFLOP = 1e12
MS_PER_S = 1e3
US_PER_S = 1e6
FLOPS_PER_MAC = 2

DTYPE_BYTES = {
    "fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5,
}
