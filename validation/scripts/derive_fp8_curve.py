"""The fp8 GEMM efficiency curve of the H100 calibration, from the committed torch._scaled_mm microbenchmark.

    python -m aisim.validation.scripts.derive_fp8_curve [FILE.jsonl ...]
        (default: validation/data/kernels/fp8-gemm-h100.jsonl, M 16-8192, and fp8-gemm-smallm-h100.jsonl, M 1-64)

Efficiency = roofline time / measured time, with the roofline of a W8A8 GEMM: max(FLOPs / fp8 peak, bytes / HBM
bandwidth), bytes = M*K + K*N (fp8 operands) + 2*M*N (bf16 output); the peaks are the H100 SXM spec file's.
Kernel: tensor-wise scales (fp32 scalars), no fast accumulation, as vLLM's Fp8LinearMethod runs --quantization
fp8 (dynamic per-tensor activation scale, cutlass_scaled_mm). Shapes with equal FLOPs are merged by their median.
Prints the YAML of ``gemm_efficiency.fp8`` (x: log10 FLOPs) and ``gemm_efficiency.fp8-memory`` (the memory-bound
calls, x: log10 bytes; memory_curve) for hardware_specs/calibration/h100-sxm.yaml.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from . import run_main

DATA = tuple(Path(__file__).resolve().parents[1] / "data" / "kernels" / name
             for name in ("fp8-gemm-h100.jsonl", "fp8-gemm-smallm-h100.jsonl"))
KERNEL = "fp8-tensor"
FP8_BYTES, OUT_BYTES = 1, 2


def curve(paths: tuple[Path, ...] = DATA) -> tuple[list[float], list[float]]:
    from aisim.specs import all_hardware

    gpu = all_hardware()["h100-sxm"]
    peak, bw = gpu.peak_flops_per_s.fp8, gpu.memory_bw_bytes_per_s
    by_flops: dict[float, list[float]] = {}
    rows = [row for path in paths for row in map(json.loads, open(path))]
    for row in rows:
        if row.get("type") != "case" or row.get("kernel") != KERNEL or row.get("status") != "ok":
            continue
        m, k, n = row["m"], row["k"], row["n"]
        nbytes = FP8_BYTES * (m * k + k * n) + OUT_BYTES * m * n
        roofline_s = max(row["flop"] / peak, nbytes / bw)
        by_flops.setdefault(row["flop"], []).append(min(roofline_s / (row["median_ms"] * 1e-3), 1.0))
    xs = sorted(by_flops)
    return [round(math.log10(x), 4) for x in xs], [round(statistics.median(by_flops[x]), 4) for x in xs]


def memory_curve(paths: tuple[Path, ...] = DATA) -> tuple[list[float], list[float]]:
    """``gemm_efficiency.fp8-memory``: the memory-bound calls (bytes / bandwidth above FLOPs / peak: the decode
    GEMMs), efficiency against log10 bytes moved, the calls of one weight shape (bytes within 0.05 decades) merged
    by their median: a weight streams at about one rate whatever the few rows, so the step time does not fall as
    the batch grows (the FLOPs curve, which mixes the shapes' launch-bound and streaming calls, made it)."""
    from aisim.specs import all_hardware

    gpu = all_hardware()["h100-sxm"]
    peak, bw = gpu.peak_flops_per_s.fp8, gpu.memory_bw_bytes_per_s
    by_bytes: dict[float, list[float]] = {}
    for row in (row for path in paths for row in map(json.loads, open(path))):
        if row.get("type") != "case" or row.get("kernel") != KERNEL or row.get("status") != "ok":
            continue
        m, k, n = row["m"], row["k"], row["n"]
        nbytes = FP8_BYTES * (m * k + k * n) + OUT_BYTES * m * n
        if nbytes / bw <= row["flop"] / peak:
            continue
        key = round(round(math.log10(nbytes) / 0.05) * 0.05, 2)
        by_bytes.setdefault(key, []).append(min(nbytes / bw / (row["median_ms"] * 1e-3), 1.0))
    xs = sorted(by_bytes)
    return xs, [round(statistics.median(by_bytes[x]), 4) for x in xs]


def _block(name: str, x: list[float], eff: list[float]) -> str:
    return (f"  {name}:\n    x:\n" + "".join(f"    - {v}\n" for v in x) + "    efficiency:\n"
            + "".join(f"    - {v}\n" for v in eff))


def main() -> int:
    paths = tuple(map(Path, sys.argv[1:])) or DATA
    print(_block("fp8", *curve(paths)) + _block("fp8-memory", *memory_curve(paths)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
