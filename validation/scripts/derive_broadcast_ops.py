"""The default rules' broadcast-copy and outer-broadcast bandwidth fractions, from one H100 microbenchmark, and
their reading on another GPU checked on an H200 run of the same harness (validation/data/kernels/
broadcast-ops-h200.jsonl: the H200 reaches the H100's absolute rate, so efficiency.broadcast_fraction keeps the rate
by SMs x clock).

    python -m aisim.validation.scripts.derive_broadcast_ops [--data FILE]

Data: validation/data/kernels/broadcast-ops-h100.jsonl (validation/harness/broadcast_ops.py; attention-sized
tensors of 268M elements, none of it a judged row). Per element size, the median over shapes of bytes / time /
datasheet bandwidth:
- ``broadcast_copy_bandwidth_fraction``: ``out.copy_(alibi.expand(...))``, the bytes written (what baddbmm does
  with an expanded ``input`` before its GEMM);
- ``outer_broadcast_bandwidth_fraction``: (B, H, S, S) + (B, 1, S, S), the output and both inputs at their size.
Printed beside them: the same add without broadcast (the contiguous kernel), and the fp16 softmax to float32 (one
kernel on CUDA) against bf16's (a cast, then the float softmax).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from aisim.errors import AisimError

from . import run_main
from .derive_gemm_align import _gpu, load_jsonl

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "validation" / "data" / "kernels" / "broadcast-ops-h100.jsonl"
ELEMENT = {"float16": 2, "bfloat16": 2, "float32": 4}
FIELDS = {"broadcast_copy": "broadcast_copy_bandwidth_fraction", "add_outer_broadcast":
          "outer_broadcast_bandwidth_fraction"}


def fractions(path: Path = DATA) -> tuple[dict, dict[str, dict[int, float]], dict[str, dict[str, float]]]:
    """(header, {field: {element bytes: fraction}}, {op: {dtype: fraction}} of every op, for the printout)."""
    header, records = load_jsonl(path, "broadcast_ops")
    bw = _gpu(header).memory_bw_bytes_per_s
    pooled: dict[tuple[str, str], list[float]] = {}
    try:
        for r in records:
            if r.get("type") == "case" and r.get("status") == "ok":
                pooled.setdefault((r["op"], r["dtype"]), []).append(r["bytes"] / (r["median_ms"] * 1e-3) / bw)
    except (KeyError, TypeError, ZeroDivisionError) as exc:
        raise AisimError(f"{path}: a broadcast_ops record lacks what the derivation needs ({exc!r})")
    every = {op: {dt: round(statistics.median(v), 3) for (o, dt), v in pooled.items() if o == op}
             for op in sorted({o for o, _ in pooled})}
    out: dict[str, dict[int, float]] = {}
    for op, field in FIELDS.items():
        by_size: dict[int, list[float]] = {}
        for (o, dt), v in pooled.items():
            if o == op and dt in ELEMENT:
                by_size.setdefault(ELEMENT[dt], []).extend(v)
        out[field] = {size: round(statistics.median(v), 2) for size, v in sorted(by_size.items())}
    if not all(out.values()) or not all(0 < f <= 1 for table in out.values() for f in table.values()):
        raise AisimError(f"{path}: too few or implausible broadcast_ops records ({out}: fractions must lie in (0, 1]); "
                         "rerun validation/harness/broadcast_ops.py")
    return header, out, every


H200_DATA = ROOT / "validation" / "data" / "kernels" / "broadcast-ops-h200.jsonl"


def transfer_check(source: Path = DATA, target: Path = H200_DATA) -> dict[str, dict[int, tuple[float, float, float]]]:
    """{field: {element bytes: (target measured, source's fraction as a fraction (the old reading), source's rate
    kept by SMs x clock (efficiency.broadcast_fraction))}}: the rule that reads the default fractions on another GPU,
    checked on a GPU the fractions were not taken from."""
    from aisim.cost.efficiency import _sm_cycle_scale

    src_header, src, _ = fractions(source)
    dst_header, dst, _ = fractions(target)
    scale = _sm_cycle_scale(_gpu(src_header), _gpu(dst_header))
    return {field: {size: (dst[field][size], value, round(value * scale, 3)) for size, value in table.items()
                    if size in dst[field]} for field, table in src.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args(argv)
    try:
        header, out, every = fractions(args.data)
    except AisimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.data.name}: {header['gpu_name']}, driver {header.get('driver')}, torch {header.get('torch')}, "
          f"{header.get('date')}")
    for field, table in out.items():
        print(f"{field}: {table}")
    for op, table in every.items():
        print(f"  {op}: {table}")
    if args.data == DATA and H200_DATA.exists():
        for field, table in transfer_check().items():
            for size, (measured, same, kept) in table.items():
                print(f"{field} {size}-byte on the H200: measured {measured:.2f}; the H100 value read as a fraction "
                      f"{same:.2f}, its rate kept by SMs x clock {kept:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
