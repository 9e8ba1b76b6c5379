"""Kernel-level profile of a few validation cases (torch.profiler), to explain estimate-vs-measured gaps.

    python -m aisim.validation.scripts.profile_cases MODEL:WORKLOAD:BATCH:SEQ:DTYPE [...] [--out FILE.txt]

Builds each model as the validation suite does (validation/measure.py), warms up, profiles 3 steps and prints
the top CUDA kernels by total time, the kernel count per step, and the CPU and CUDA time per step.
"""
from __future__ import annotations

import argparse
import sys

from ..measure import build_model, free_memory, prepare
from ..suite import Case, MeasureSettings


def profile(spec: str, out) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    model, workload, batch, seq, dtype = spec.split(":")
    case = Case(model=model, workload=workload, batch=int(batch), seq=int(seq), dtype=dtype)
    bm = build_model(model, dtype, torch.device("cuda"))
    steps = prepare(bm, case, MeasureSettings())
    for _ in range(3):
        steps.step()
        steps.after()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            steps.step()
            steps.after()
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0) > 0]
    total_us = sum(getattr(e, "self_device_time_total", 0) for e in kernels) / 3
    n_kernels = sum(e.count for e in kernels) / 3
    print(f"\n=== {case.key}: {n_kernels:.0f} kernels/step, CUDA kernel time {total_us / 1e3:.3f} ms/step", file=out)
    print(events.table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=70), file=out)
    steps.cleanup()
    del bm, steps
    free_memory()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cases", nargs="+", help="MODEL:WORKLOAD:BATCH:SEQ:DTYPE")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    out = open(args.out, "w") if args.out else sys.stdout
    for spec in args.cases:
        try:
            profile(spec, out)
        except Exception as exc:  # a failing case is reported and the next one runs
            print(f"\n=== {spec}: failed: {exc!r}", file=out)
        out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
