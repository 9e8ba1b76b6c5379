"""The fp8 GEMM efficiency curve of the H100 calibration, from the committed torch._scaled_mm microbenchmark.

    python -m aisim.validation.scripts.derive_fp8_curve [validation/data/kernels/fp8-gemm-h100.jsonl]

Efficiency = roofline time / measured time, with the roofline of a W8A8 GEMM: max(FLOPs / fp8 peak, bytes / HBM
bandwidth), bytes = M*K + K*N (fp8 operands) + 2*M*N (bf16 output); the peaks are the H100 SXM spec file's.
Kernel: tensor-wise scales (fp32 scalars), no fast accumulation, as vLLM's Fp8LinearMethod runs --quantization
fp8 (dynamic per-tensor activation scale, cutlass_scaled_mm). Shapes with equal FLOPs are merged by their median.
Prints the YAML of ``gemm_efficiency.fp8`` (x: log10 FLOPs) for hardware_specs/calibration/h100-sxm.yaml.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "kernels" / "fp8-gemm-h100.jsonl"
KERNEL = "fp8-tensor"
FP8_BYTES, OUT_BYTES = 1, 2


def curve(path: Path = DATA) -> tuple[list[float], list[float]]:
    from aisim.specs import all_hardware

    gpu = all_hardware()["h100-sxm"]
    peak, bw = gpu.peak_flops_per_s.fp8, gpu.memory_bw_bytes_per_s
    by_flops: dict[float, list[float]] = {}
    for row in map(json.loads, open(path)):
        if row.get("type") != "case" or row.get("kernel") != KERNEL or row.get("status") != "ok":
            continue
        m, k, n = row["m"], row["k"], row["n"]
        nbytes = FP8_BYTES * (m * k + k * n) + OUT_BYTES * m * n
        roofline_s = max(row["flop"] / peak, nbytes / bw)
        by_flops.setdefault(row["flop"], []).append(min(roofline_s / (row["median_ms"] * 1e-3), 1.0))
    xs = sorted(by_flops)
    return [round(math.log10(x), 4) for x in xs], [round(statistics.median(by_flops[x]), 4) for x in xs]


def main() -> int:
    x, eff = curve(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA)
    print("  fp8:\n    x:\n" + "".join(f"    - {v}\n" for v in x) + "    efficiency:\n"
          + "".join(f"    - {v}\n" for v in eff), end="")
    return 0


if __name__ == "__main__":
    from aisim.validation.scripts import run_main

    raise SystemExit(run_main(main))
