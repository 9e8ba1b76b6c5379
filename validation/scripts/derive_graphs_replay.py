"""Derive the compiled step's non-kernel time for ``--runtime graphs`` (hardware_specs/runtimes/graphs.yaml:
replay_kernel_gap_s and per_step_overhead_s) from HF StaticCache + torch.compile(mode="reduce-overhead") decode of
models that no table judges, at several depths: validation/data/kernels/graphs-replay-wide-h100.jsonl and -run2 (two
H100 hosts, pooled: the shipped constants; validation/harness/graphs_decode.py --models llama-1b,llama-3b
--layers 2,8,16 --batches 8 --modes compile --profile: Llama-3.2-1B and 3B widths, whose kernels are as long as a
real model's, 7-10 us) and, for comparison, validation/data/kernels/graphs-replay-tiny-h100.jsonl (--models
cbhost-llama --layers 2,8,32: 256 wide, 2-4 us kernels, which leave shorter gaps: 1.45 us against 2.82).

Per compiled row: non-kernel time = median step time (CUDA events around the compiled call) - the profiled GPU kernel
time per forward; least squares over the rows: non-kernel = per_step_overhead + kernels x replay_kernel_gap (kernels:
the profiled launches per forward). None of the judged rows (qwen2.5-1.5b, Meta-Llama-3-8B) is read.

    python -m aisim.validation.scripts.derive_graphs_replay [PATH ...]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

KERNELS = Path(__file__).resolve().parent.parent / "data" / "kernels"
# two hosts: 2026-11-27 02:58 and 03:39 UTC (each fit alone: 2.67 us + 0.13 ms, 2.98 us + 0.19 ms)
DATA = (KERNELS / "graphs-replay-wide-h100.jsonl", KERNELS / "graphs-replay-wide-h100-run2.jsonl")
TINY = (KERNELS / "graphs-replay-tiny-h100.jsonl",)
JUDGED = ("qwen2.5-1.5b", "Meta-Llama-3-8B")


def _lines(paths: tuple[Path, ...]) -> list[dict]:
    from aisim.errors import AisimError

    try:
        return [json.loads(x) for path in paths for x in path.read_text().splitlines() if x.strip()]
    except (OSError, ValueError, RecursionError) as exc:
        raise AisimError(f"{', '.join(map(str, paths))}: cannot read graphs_decode JSONL ({type(exc).__name__}); "
                         "pass files written by validation/harness/graphs_decode.py --profile")


def rows(paths: tuple[Path, ...] = DATA) -> list[dict]:
    out = []
    for r in _lines(paths):
        if not isinstance(r, dict):
            continue
        prof = r.get("profile") or {}
        if (r.get("type") == "case" and r.get("mode") == "compile" and r.get("status") == "ok"
                and prof.get("status") == "ok" and prof.get("kernels_per_step")
                and not r["model"].startswith(JUDGED)):
            out.append({"model": r["model"], "batch": r["batch"], "step_ms": r["median_ms"],
                        "kernel_ms": prof["gpu_kernel_ms"], "kernels": prof["kernels_per_step"]})
    return out


def derive(paths: tuple[Path, ...] = DATA) -> dict:
    """{'replay_kernel_gap_s', 'per_step_overhead_s', 'rows', 'residual_ms'} of the least-squares fit over the
    files' rows pooled."""
    from aisim.errors import AisimError

    data = rows(paths)
    if len(data) < 2:
        raise AisimError(f"{', '.join(map(str, paths))}: {len(data)} usable compiled rows with a profile; need at "
                         "least 2 depths")
    kernels = np.array([r["kernels"] for r in data])
    nonkernel_s = np.array([(r["step_ms"] - r["kernel_ms"]) / 1e3 for r in data])
    design = np.stack([np.ones_like(kernels), kernels], axis=1)
    (fixed_s, gap_s), *_ = np.linalg.lstsq(design, nonkernel_s, rcond=None)
    residual_ms = (design @ np.array([fixed_s, gap_s]) - nonkernel_s) * 1e3
    return {"replay_kernel_gap_s": float(gap_s), "per_step_overhead_s": float(max(fixed_s, 0.0)), "rows": data,
            "residual_ms": [round(float(x), 4) for x in residual_ms]}


def main(argv=None) -> int:
    from aisim.errors import AisimError

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path, help="graphs_decode JSONL files (default: the wide runs)")
    args = parser.parse_args(argv)
    try:
        result = derive(tuple(args.paths) or DATA)
    except (AisimError, KeyError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for r, res in zip(result["rows"], result["residual_ms"]):
        print(f"{r['model']:>20} b={r['batch']:<3} step {r['step_ms']:.4f} ms, kernels {r['kernel_ms']:.4f} ms "
              f"x {r['kernels']:.0f}, fit residual {res:+.4f} ms")
    print(f"replay_kernel_gap_s: {result['replay_kernel_gap_s']:.4g}")
    print(f"per_step_overhead_s: {result['per_step_overhead_s']:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
