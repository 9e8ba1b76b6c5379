"""Device memory outside PyTorch's allocator: the CUDA context (``cuda_context_bytes``) and, once a process group
exists, NCCL's buffers (``nccl_buffer_bytes``), from the NVML readings the validation runs record beside PyTorch's.

    python -m aisim.validation.scripts.derive_runtime_memory [--write]

Every suite case records the device's NVML used memory and torch.cuda.memory_reserved() at its peak
(validation/measure.py). Their difference is what the process holds outside the caching allocator: the CUDA context
with the kernels it loaded, and NCCL's communicator buffers in a tensor-parallel case. It is not a judged figure
(aisim's peak memory is compared with torch.cuda.max_memory_allocated) and it is not a fit: per GPU, the median over
the single-GPU cases of each run, then the median over runs; NCCL's, the median over the tensor-parallel cases of
(NVML - reserved) less the same files' single-GPU median. aisim adds both to the peak when it checks that a
configuration fits (cost.memory.with_runtime_reserve), as the GPU's capacity is not all PyTorch's to allocate.

Runs: CUDA 13.0, driver 580.159.04, torch 2.11.0+cu130 (the headers give the rest). default.yaml takes the H100's
(the same software stack on another GPU: an assumption; a CUDA context differs with the driver, the CUDA version
and the kernels a build loads).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from . import run_main
from .derive_eager_attention import write_lines

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "validation" / "data"
CAL_DIR = ROOT / "hardware_specs" / "calibration"
SINGLE = {"h100-sxm": ("h100.jsonl", "h100-rerun.jsonl", "h100-rerun2.jsonl", "h100-rerun3.jsonl",
                       "h100-rerun4.jsonl"),
          "h200": ("h200.jsonl", "h200-rerun.jsonl", "whisper-h200.jsonl")}
TP = {"h200": ("tp2-h200.jsonl", "tp4-h200.jsonl")}
DEFAULT_FROM = {"default": "h100-sxm"}


def _outside(path: Path) -> tuple[dict, list[tuple[int, float]]]:
    """(header, [(tp, NVML used - reserved, GB)]) of a suite file's cases."""
    header, out = {}, []
    with open(path) as f:
        for r in map(json.loads, f):
            if r.get("type") == "header":
                header = r
            nvml, reserved = r.get("nvml_memory_gb"), r.get("reserved_memory_gb")
            if nvml and reserved and r.get("peak_memory_gb"):
                out.append((int(r.get("tp") or 1), nvml - reserved))
    return header, out


def derive() -> dict[str, dict[str, float]]:
    """calibration -> {"cuda_context_bytes": B, "nccl_buffer_bytes": B (where measured)}."""
    result: dict[str, dict[str, float]] = {}
    for cal, files in SINGLE.items():
        per_run = [statistics.median(gb for tp, gb in _outside(DATA / f)[1] if tp == 1) for f in files]
        result[cal] = {"cuda_context_bytes": round(statistics.median(per_run), 2) * 1e9}
    for cal, files in TP.items():
        extra = []
        for f in files:
            cases = _outside(DATA / f)[1]
            single = statistics.median(gb for tp, gb in cases if tp == 1)
            extra += [gb - single for tp, gb in cases if tp > 1]
        result[cal]["nccl_buffer_bytes"] = round(statistics.median(extra), 2) * 1e9
    for cal, source in DEFAULT_FROM.items():
        nccl = next(v["nccl_buffer_bytes"] for v in result.values() if "nccl_buffer_bytes" in v)
        result[cal] = {"cuda_context_bytes": result[source]["cuda_context_bytes"], "nccl_buffer_bytes": nccl}
    result["h100-sxm"].setdefault("nccl_buffer_bytes", result["default"]["nccl_buffer_bytes"])
    return result


def write(cal: str, values: dict[str, float]) -> Path:
    path = CAL_DIR / f"{cal}.yaml"
    files = ", ".join(SINGLE.get(cal, SINGLE[DEFAULT_FROM.get(cal, cal)]))
    note = ("# cuda_context_bytes, nccl_buffer_bytes: python -m aisim.validation.scripts.derive_runtime_memory "
            f"--write (NVML used - torch reserved of the suite cases: {files}"
            + (f"; NCCL: {', '.join(TP[cal])} tensor-parallel cases less their single-GPU ones" if cal in TP else
               "; NCCL: the H200 tensor-parallel suites") + ")")
    write_lines(path, {k: f"{k}: {v:.4g}" for k, v in values.items()}, note)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    for cal, values in derive().items():
        print(cal, {k: f"{v / 1e9:.2f} GB" for k, v in values.items()})
        if args.write:
            print(f"  written to {write(cal, values)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
