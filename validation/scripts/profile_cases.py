"""Kernel-level profile of a few validation cases (torch.profiler), to explain estimate-vs-measured gaps.

    python -m aisim.validation.scripts.profile_cases MODEL:WORKLOAD:BATCH:SEQ:DTYPE [...] [--out FILE.txt]

Builds each model as the validation suite does (validation/measure.py), warms up, profiles 3 steps and prints
the top CUDA kernels by total time, the kernel count per step, and the CPU and CUDA time per step.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..cli import new_app, run

from ..measure import build_model, free_memory, prepare
from ..suite import Case, MeasureSettings


def profile(spec: str, out, rows: int = 14) -> None:
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
    # device-side events only (kernels, memcpy, memset): an aten op's row carries its kernels' time too, so counting
    # the rows with self device time would count every kernel twice
    kernels = [e for e in events if e.device_type.name == "CUDA" and not getattr(e, "is_user_annotation", False)]
    total_us = sum(getattr(e, "self_device_time_total", 0) for e in kernels) / 3
    n_kernels = sum(e.count for e in kernels) / 3
    print(f"\n=== {case.key}: {n_kernels:.0f} kernels/step, CUDA kernel time {total_us / 1e3:.3f} ms/step", file=out)
    print(events.table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=70), file=out)
    steps.cleanup()
    del bm, steps
    free_memory()


app = new_app(__doc__.split("\n")[0])


@app.command()
def _profile(cases: list[str] = typer.Argument(..., help="MODEL:WORKLOAD:BATCH:SEQ:DTYPE"),
             out: Optional[Path] = typer.Option(None, help="text file (default stdout)"),
             rows: int = typer.Option(14, min=1, help="table rows (ops and kernels by CUDA time)")) -> int:
    stream = open(out, "w") if out else sys.stdout
    for spec in cases:
        try:
            profile(spec, stream, rows)
        except Exception as exc:  # a failing case is reported and the next one runs
            print(f"\n=== {spec}: failed: {exc!r}", file=stream)
        stream.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(app, argv, "python -m aisim.validation.scripts.profile_cases")


if __name__ == "__main__":
    raise SystemExit(main())
