"""Derive the compiled step's non-kernel time for ``--runtime graphs`` (hardware_specs/runtimes/graphs.yaml:
replay_kernel_gap_s and per_step_overhead_s) from HF StaticCache + torch.compile(mode="reduce-overhead") decode of
models that no table judges, on three H100 hosts: Llama-3.2-1B and 3B widths (kernels as long as a real model's) at
2-16 layers, batch 8 (validation/data/kernels/graphs-replay-wide-h100.jsonl, -run2: validation/harness/
graphs_decode.py --models llama-1b,llama-3b --layers 2,8,16 --batches 8 --modes compile --profile) and batch 1, 8
and 32 (graphs-replay-batches-h100.jsonl: --layers 4,16 --batches 1,8,32), and a 256-wide tiny Llama (2-4 us
kernels) at batch 1 and 32 (graphs-replay-tiny-h100.jsonl: --models cbhost-llama --layers 2,8,32).

In aisim's accounting (the shipped constants): each row's step is priced by ``--runtime graphs`` with no gap and no
per-step overhead (each kernel its eager back-to-back time less the eager launch gap, efficiency.
graph_replay_credit_s), and least squares over the rows gives measured step - that = per_step_overhead +
aisim's kernels x replay_kernel_gap. The gap so carries the kernels aisim does not count (cuBLAS split-K
reductions, cuDNN attention's second kernel). For comparison, the profiler's accounting: measured step - profiled
kernel time = per step + profiled kernels x gap. None of the judged rows (qwen2.5-1.5b, Meta-Llama-3-8B) is read.

    python -m aisim.validation.scripts.derive_graphs_replay [PATH ...]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from . import run_main

KERNELS = Path(__file__).resolve().parent.parent / "data" / "kernels"
# every replay run of non-judged models: three H100 hosts (2026-11-26/27), wide models at batch 8 (two hosts) and
# batch 1, 8 and 32 (one), the tiny Llama at batch 1 and 32
DATA = (KERNELS / "graphs-replay-wide-h100.jsonl", KERNELS / "graphs-replay-wide-h100-run2.jsonl",
        KERNELS / "graphs-replay-batches-h100.jsonl", KERNELS / "graphs-replay-tiny-h100.jsonl")
JUDGED = ("qwen2.5-1.5b", "Meta-Llama-3-8B")
CONFIGS = Path(__file__).resolve().parent.parent / "harness" / "configs"


def rows(paths: tuple[Path, ...] = DATA) -> list[dict]:
    """The compiled, profiled rows of non-judged models, each with the GPU its file's header names."""
    from .derive_gemm_align import load_jsonl

    out = []
    for path in paths:
        header, records = load_jsonl(path, "graphs_decode")
        device = header["gpu_name"]
        for r in records:
            prof = r.get("profile") or {}
            if (r.get("type") == "case" and r.get("mode") == "compile" and r.get("status") == "ok"
                    and prof.get("status") == "ok" and prof.get("kernels_per_step")
                    and not r["model"].startswith(JUDGED)):
                out.append({"model": r["model"], "device": device, "batch": r["batch"], "context": r["context"],
                            "max_cache_len": r["max_cache_len"], "step_ms": r["median_ms"],
                            "kernel_ms": prof["gpu_kernel_ms"], "kernels": prof["kernels_per_step"]})
    return out


def _config(model: str, folder: Path) -> str:
    """The harness's model (``name@<n>L``: its config with n layers) as a config.json path under ``folder``."""
    base, _, layers = model.partition("@")
    config = json.loads((CONFIGS / f"{base}.json").read_text())
    if layers:
        config["num_hidden_layers"] = int(layers.rstrip("L"))
    path = folder / f"{model}.json"
    path.write_text(json.dumps(config))
    return str(path)


def aisim_kernels(data: list[dict]) -> list[tuple[float, float]]:
    """(GPU time in s, kernels) of each row's step as ``--runtime graphs`` prices it with no replay gap and no
    per-step overhead: each kernel's eager back-to-back time less the tiny-kernel credit
    (efficiency.graph_replay_credit_s), and the kernels aisim counts (launches)."""
    import tempfile

    from aisim.scenario import scenario
    from aisim.specs import all_runtimes
    from aisim.step import op_arrays, step_cost
    from aisim.workload import StepShape

    bare = all_runtimes()["graphs"].model_copy(update={"replay_kernel_gap_s": 0.0, "per_step_overhead_s": 0.0})
    out = []
    with tempfile.TemporaryDirectory() as folder:
        for r in data:
            sc = scenario(_config(r["model"], Path(folder)), r["device"], dtype="bf16", runtime=bare)
            shape = StepShape(phase="decode", batch=r["batch"], seq=r["context"], static_cache_len=r["max_cache_len"])
            a = op_arrays(sc, sc.workload(shape))
            kernels = float((a.launches * a.repeats)[[k not in ("comm", "none", "sync", "module")
                                                      for k in a.kinds]].sum())
            out.append((step_cost(sc, shape).gpu_busy_s, kernels))
    return out


def _fit(kernels: np.ndarray, nonkernel_s: np.ndarray) -> tuple[float, float, np.ndarray]:
    design = np.stack([np.ones_like(kernels), kernels], axis=1)
    (fixed_s, gap_s), *_ = np.linalg.lstsq(design, nonkernel_s, rcond=None)
    return float(fixed_s), float(gap_s), (design @ np.array([fixed_s, gap_s]) - nonkernel_s)


def derive(paths: tuple[Path, ...] = DATA) -> dict:
    """{'replay_kernel_gap_s', 'per_step_overhead_s', 'rows', 'residual_ms', 'profile_gap_s',
    'profile_overhead_s'}: least squares over the files' rows pooled, in aisim's accounting (the shipped
    constants: measured step - aisim's GPU time with no gap = per step + aisim's kernels x gap) and, for comparison,
    in the profiler's (measured step - profiled kernel time = per step + profiled kernels x gap)."""
    from aisim.errors import AisimError

    data = rows(paths)
    if len(data) < 2:
        raise AisimError(f"{', '.join(map(str, paths))}: {len(data)} usable compiled rows with a profile; need at "
                         "least 2 depths")
    priced = aisim_kernels(data)
    for r, (gpu_s, kernels) in zip(data, priced):
        r["aisim_kernel_ms"], r["aisim_kernels"] = gpu_s * 1e3, kernels
    step_s = np.array([r["step_ms"] / 1e3 for r in data])
    fixed_s, gap_s, residual_s = _fit(np.array([k for _, k in priced]), step_s - np.array([g for g, _ in priced]))
    prof_fixed_s, prof_gap_s, _ = _fit(np.array([r["kernels"] for r in data]),
                                       step_s - np.array([r["kernel_ms"] / 1e3 for r in data]))
    return {"replay_kernel_gap_s": gap_s, "per_step_overhead_s": max(fixed_s, 0.0), "rows": data,
            "residual_ms": [round(float(x) * 1e3, 4) for x in residual_s],
            "profile_gap_s": prof_gap_s, "profile_overhead_s": prof_fixed_s}


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
        print(f"{r['model']:>20} b={r['batch']:<3} step {r['step_ms']:.4f} ms; profiled kernels "
              f"{r['kernel_ms']:.4f} ms x {r['kernels']:.0f}; aisim's {r['aisim_kernel_ms']:.4f} ms x "
              f"{r['aisim_kernels']:.0f}; fit residual {res:+.4f} ms")
    print(f"in the profiler's accounting: {result['profile_gap_s'] * 1e6:.3f} us per profiled kernel + "
          f"{result['profile_overhead_s'] * 1e3:.4f} ms per step")
    print(f"replay_kernel_gap_s: {result['replay_kernel_gap_s']:.4g}")
    print(f"per_step_overhead_s: {result['per_step_overhead_s']:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
