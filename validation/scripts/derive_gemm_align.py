"""The default rules' unaligned-GEMM plateaus and multi_tensor_apply bandwidth, from one H100 microbenchmark.

    python -m aisim.validation.scripts.derive_gemm_align [--data FILE ...]

Data: validation/data/kernels/gemm-align-h100.jsonl and gemm-align-h100-run2.jsonl (validation/harness/gemm_align.py
on two H100 hosts; the second, asked for an H200 and lent an H100, adds 128-1024 rows; none of it a judged row).

- ``unaligned_gemm_efficiency``: 16-bit GEMMs of >= 2048 rows whose output (``output``) or only an input
  (``input``) has a leading dimension that is not a multiple of 8 elements: the median achieved fraction of the
  datasheet 16-bit peak, both files pooled; 512-1024 rows reach 0.93-0.97 of it (printed), so aisim applies it from
  ``efficiency.UNALIGNED_MIN_ROWS`` = 512 rows. cuBLAS gives such GEMMs older, unpipelined kernels (a profile of
  gpt2-large's LM head on an H100: cutlass sm75 kernels) at 4-8x the time of the aligned twin. The odd-K GEMMs
  (0.22-0.28) are recorded but left out of the median, as is every GEMM of fewer rows. Keyed by the GPU's
  architecture.
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
DATA = tuple(ROOT / "validation" / "data" / "kernels" / f"gemm-align-h100{run}.jsonl" for run in ("", "-run2"))
MIN_ROWS = 2048


def load_jsonl(path: Path, script: str) -> tuple[dict, list[dict]]:
    """(header, records) of a harness JSONL file written by ``script``; AisimError (one line) otherwise."""
    try:
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError, RecursionError) as exc:
        raise AisimError(f"{path}: cannot read a {script} JSONL file ({type(exc).__name__}); run "
                         f"validation/harness/{script}.py")
    lines = [r for r in lines if isinstance(r, dict)]
    header = next((r for r in lines if r.get("type") == "header" and r.get("script") == script), None)
    if header is None or not header.get("gpu_name"):
        raise AisimError(f"{path}: no {script} header line with a gpu_name; pass a file written by "
                         f"validation/harness/{script}.py")
    return header, [r for r in lines if r is not header]


def load(path: Path = DATA[0]) -> tuple[dict, list[dict]]:
    header, records = load_jsonl(path, "gemm_align")
    return header, [r for r in records if r.get("status") == "ok" and r.get("type") in ("gemm", "optimizer")]


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


def derive(paths: tuple[Path, ...] = DATA) -> tuple[dict, dict, dict]:
    """(first header, unaligned_gemm_efficiency, multi_tensor_bandwidth_fraction) over the files (each file's
    optimizer slopes on its own; the GEMMs pooled); AisimError on files that do not hold what they need."""
    loaded = [load(p) for p in paths]
    header = loaded[0][0]
    if len({h["gpu_name"] for h, _ in loaded}) > 1:
        raise AisimError(f"{', '.join(map(str, paths))}: files of different GPUs; derive one GPU at a time")
    try:
        unaligned = unaligned_gemm_efficiency(header, [r for _, rs in loaded for r in rs])
        multi = _median_of(multi_tensor_bandwidth_fraction(h, rs) for h, rs in loaded)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise AisimError(f"{', '.join(map(str, paths))}: a gemm_align record lacks what the derivation needs "
                         f"({type(exc).__name__}: {exc}); pass complete files written by "
                         "validation/harness/gemm_align.py")
    if not any(unaligned.values()) or not multi or min(multi.values()) <= 0:
        raise AisimError(f"{', '.join(map(str, paths))}: too few gemm_align records to derive both rules (unaligned "
                         f"{unaligned}, multi-tensor {multi}); rerun validation/harness/gemm_align.py")
    return header, unaligned, multi


def _median_of(tables) -> dict[int, float]:
    pooled: dict[int, list[float]] = {}
    for table in tables:
        for size, value in table.items():
            pooled.setdefault(size, []).append(value)
    return {size: round(statistics.median(v), 2) for size, v in sorted(pooled.items())}


def below_plateau(header: dict, records: list[dict], plateau: dict[str, float]) -> dict[int, float]:
    """Per row count under MIN_ROWS: the median of measured efficiency / plateau (where the rule may reach)."""
    peak = _gpu(header).peak_for("bf16")
    ratios: dict[int, list[float]] = {}
    for r in records:
        if r["type"] == "gemm" and not r["aligned"] and r["op"] != "mm" and 1 < r["m"] < MIN_ROWS:
            eff = 2 * r["m"] * r["n"] * r["k"] / (r["median_ms"] * 1e-3) / peak
            ratios.setdefault(r["m"], []).append(eff / plateau["output" if r["op"] == "fwd" else "input"])
    return {m: round(statistics.median(v), 2) for m, v in sorted(ratios.items())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, nargs="+", default=list(DATA))
    args = parser.parse_args(argv)
    try:
        header, unaligned, multi = derive(tuple(args.data))
        records = [r for p in args.data for r in load(p)[1]]
        below = below_plateau(header, records, next(iter(unaligned.values())))
    except AisimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{', '.join(p.name for p in args.data)}: {header['gpu_name']}, driver {header.get('driver')}, "
          f"torch {header.get('torch')}, {header.get('date')}")
    print("unaligned_gemm_efficiency:", unaligned)
    print("measured / plateau below", MIN_ROWS, "rows:", below)
    print("multi_tensor_bandwidth_fraction:", multi)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
