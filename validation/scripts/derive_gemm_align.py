"""The default rules' unaligned-GEMM plateaus and multi_tensor_apply bandwidth, from one H100 microbenchmark.

    python -m aisim.validation.scripts.derive_gemm_align [--data FILE]

Data: validation/data/kernels/gemm-align-h100.jsonl (validation/harness/gemm_align.py; none of it a judged row).

- ``unaligned_gemm_efficiency``: 16-bit GEMMs of >= 2048 rows whose output (``output``) or only an input
  (``input``) has a leading dimension that is not a multiple of 8 elements: the median achieved fraction of the
  datasheet 16-bit peak. cuBLAS gives such GEMMs older, unpipelined kernels (a profile of gpt2-large's LM head on
  an H100: cutlass sm75 kernels) at 4-8x the time of the aligned twin. The odd-K GEMMs (0.22-0.28) are
  recorded but left out of the median, as is every GEMM of fewer rows. Keyed by the GPU's architecture.
- ``multi_tensor_bandwidth_fraction``: torch.optim.AdamW, foreach and fused, over 184M- and 670M-parameter lists:
  per element size, the slope of step time over bytes moved (formulas.ADAMW_STREAMS) as a fraction of the
  datasheet bandwidth, the median over both implementations (the intercept, 0.35-0.55 ms per step, is the Python
  prologue of ``step()``: host time, not modelled).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from aisim.errors import AisimError
from aisim.graph.ops import ELEMENT_BYTES

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "validation" / "data" / "kernels" / "gemm-align-h100.jsonl"
MIN_ROWS = 2048


def load(path: Path = DATA) -> tuple[dict, list[dict]]:
    try:
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise AisimError(f"{path}: cannot read a gemm_align JSONL file ({exc}); run validation/harness/gemm_align.py")
    lines = [r for r in lines if isinstance(r, dict)]
    header = next((r for r in lines if r.get("type") == "header" and r.get("script") == "gemm_align"), None)
    if header is None or not header.get("gpu_name"):
        raise AisimError(f"{path}: no gemm_align header line with a gpu_name; pass a file written by "
                         "validation/harness/gemm_align.py")
    return header, [r for r in lines if r.get("status") == "ok" and r.get("type") in ("gemm", "optimizer")]


def _gpu(header: dict):
    from aisim.catalog import resolve_device

    return resolve_device(header["gpu_name"]).gpu


def unaligned_gemm_efficiency(header: dict, records: list[dict]) -> dict[str, float]:
    peak = _gpu(header).peak_for("bf16")
    by_kind: dict[str, list[float]] = {"output": [], "input": []}
    for r in records:
        if r["type"] != "gemm" or r["aligned"] or r["m"] < MIN_ROWS or r["op"] == "mm":
            continue
        # F.linear's output (M x N) has the odd leading dim; its dgrad and wgrad, and the odd-K mm, read it
        kind = "output" if r["op"] == "fwd" else "input"
        by_kind[kind].append(2 * r["m"] * r["n"] * r["k"] / (r["median_ms"] * 1e-3) / peak)
    return {_gpu(header).architecture: {k: round(statistics.median(v), 3) for k, v in by_kind.items() if v}}


def multi_tensor_bandwidth_fraction(header: dict, records: list[dict]) -> dict[int, float]:
    from aisim.formulas import ADAMW_STREAMS

    bw = _gpu(header).memory_bw_bytes_per_s
    slopes: dict[int, list[float]] = {}
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        if r["type"] == "optimizer":
            groups.setdefault((r["impl"], r["dtype"]), []).append(r)
    for (impl, dtype), rows in groups.items():
        if len(rows) < 2:
            continue
        read, written, _ = ADAMW_STREAMS[impl]          # KeyError on an impl the formula does not know
        small, large = sorted(rows, key=lambda r: r["params"])[::len(rows) - 1]
        per_param = (read + written) * ELEMENT_BYTES[dtype]
        seconds_per_byte = ((large["median_ms"] - small["median_ms"]) * 1e-3
                            / ((large["params"] - small["params"]) * per_param))
        slopes.setdefault(ELEMENT_BYTES[dtype], []).append(1.0 / seconds_per_byte / bw)
    return {size: round(statistics.median(v), 2) for size, v in sorted(slopes.items())}


def derive(path: Path = DATA) -> tuple[dict, dict, dict]:
    """(header, unaligned_gemm_efficiency, multi_tensor_bandwidth_fraction); AisimError on a file that does not
    hold what they need."""
    header, records = load(path)
    try:
        unaligned = unaligned_gemm_efficiency(header, records)
        multi = multi_tensor_bandwidth_fraction(header, records)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise AisimError(f"{path}: a gemm_align record lacks what the derivation needs ({type(exc).__name__}: "
                         f"{exc}); pass a complete file written by validation/harness/gemm_align.py")
    if not any(unaligned.values()) or not multi or min(multi.values()) <= 0:
        raise AisimError(f"{path}: too few gemm_align records to derive both rules (unaligned {unaligned}, "
                         f"multi-tensor {multi}); rerun validation/harness/gemm_align.py without --max-minutes cuts")
    return header, unaligned, multi


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args(argv)
    try:
        header, unaligned, multi = derive(args.data)
    except AisimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.data.name}: {header['gpu_name']}, driver {header.get('driver')}, torch {header.get('torch')}, "
          f"{header.get('date')}")
    print("unaligned_gemm_efficiency:", unaligned)
    print("multi_tensor_bandwidth_fraction:", multi)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
