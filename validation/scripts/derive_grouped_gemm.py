"""Grouped-GEMM table and broadcast-elementwise curve of a calibration file, from the grouped_gemm microbenchmark
(validation/harness/grouped_gemm.py; H100: validation/data/kernels/grouped-gemm-h100.jsonl).

    python -m aisim.validation.scripts.derive_grouped_gemm [DATA.jsonl] [--gpu h100-sxm] [--write CAL.yaml]

- ``grouped_gemm_tables.bf16``: the ``grid`` section (torch._grouped_mm, E experts x m rows each, weight (E, N, K)
  passed transposed as transformers does): efficiency = roofline / measured, roofline = max(FLOPs / datasheet peak,
  bytes / datasheet bandwidth), bytes = rows x K + E x N x K + rows x N elements (aisim's _grouped_mm formula with
  every expert touched), on the measured m x N x K grid. cost/ops_time.py reads it at the op's rows per touched
  expert (streaming the experts' weights, never above the contiguous memory curve of the op's bytes).
- ``eager_op_dispatch_s``: host cost per call of torch.sort, torch._grouped_mm, cumsum, histc (and the router's
  topk where the data has it: harness runs after 2026-11-26), relative to a
  masked_fill_ timed in the same loop at <= 8 tokens (op_dispatch), in units of the calibration's per-kernel cost.
- ``broadcast_memory_efficiency``: the ``model`` section's broadcast ops (the three masked fills with the (S, 1)
  sentinel mask and the routing-weight multiply by an (S, 1) column, bf16) where the GPU set the pace (rows that
  are not host-bound): bytes / bandwidth / measured time against log10 bytes, the median per quarter decade.
  cost/efficiency.py takes the smaller of it and the contiguous memory curve.

``--check-grid FILE ...``: instead, the calibration's table (``--calibration``, default the GPU's) against other grid
runs (other expert counts and widths than the table's: validation/data/kernels/grouped-gemm-grid-e8-h100.jsonl,
8 experts, N up to 28672, K up to 14336; grouped-gemm-grid-e64-h100.jsonl, 64 experts, N and K 8192): time MAPE and
mean signed error per file, as ops_time reads the table (the memory curve caps a memory-bound call).

Without --write it prints the YAML blocks and a check: the model section's grouped GEMMs (the three models' shapes,
not used to build the table) predicted with the dense table at rows per touched expert (before) and the grouped
table (after), against the measured times. --write replaces (or appends) the two blocks in the calibration file
and its provenance line, leaving the rest of the file as it is.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from pathlib import Path

from . import run_main

DATA = Path(__file__).resolve().parents[1] / "data" / "kernels" / "grouped-gemm-h100.jsonl"
BROADCAST_OPS = ("masked_fill_rows_", "masked_fill_gate_up", "masked_fill_down", "mul_routing_weights")
GROUPED_OPS = ("grouped_gate_up", "grouped_down")
BIN_DECADES = 0.25
KEYS = ("grouped_gemm_tables", "broadcast_memory_efficiency", "eager_op_dispatch_s")
# host cost per call of the MoE path's ops that are not one plain kernel launch: harness op -> (aten op, the other
# aten ops its call makes: views / kernel ops, costed at the calibration's V / K); reference: masked_fill_rows_
# (one masked_fill_, one kernel op), measured in the same loop
DISPATCH_OPS = {"sort": ("aten.sort", 0, 0), "grouped_gate_up": ("aten._grouped_mm", 1, 0),
                "grouped_down": ("aten._grouped_mm", 1, 0), "cumsum": ("aten.cumsum", 0, 0),
                "histc": ("aten.histc", 0, 1), "router_topk": ("aten.topk", 0, 0)}
DISPATCH_REFERENCE = "masked_fill_rows_"
DISPATCH_MAX_TOKENS = 8


def load(path: Path) -> tuple[dict, list[dict]]:
    with open(path) as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    header = next((r for r in rows if r.get("type") == "header"), {})
    return header, [r for r in rows if r.get("type") == "case" and r.get("status") == "ok"]


def _gpu(name: str):
    from aisim.catalog import resolve_gpu

    return resolve_gpu(name)


def roofline_s(flop: float, nbytes: float, gpu, dtype: str = "bf16") -> float:
    return max(flop / gpu.peak_for(dtype), nbytes / gpu.memory_bw_bytes_per_s)


def grouped_table(rows: list[dict], gpu) -> dict:
    """{m, n, k, efficiency} from the grid rows (a missing grid point: the nearest measured m of its n, k)."""
    grid = {(r["m"], r["n"], r["k"]): r for r in rows if r.get("section") == "grid"}
    if not grid:
        raise ValueError("no grid rows")
    ms, ns, ks = (sorted({key[i] for key in grid}) for i in range(3))

    def eff(m: int, n: int, k: int) -> float:
        r = grid.get((m, n, k))
        if r is None:
            same = [key for key in grid if key[1:] == (n, k)]
            r = grid[min(same, key=lambda key: abs(math.log2(key[0] / m)))]
        return round(min(roofline_s(r["flop"], r["bytes"], gpu) / (r["median_ms"] * 1e-3), 1.0), 4)

    return {"m": ms, "n": ns, "k": ks, "efficiency": [[[eff(m, n, k) for k in ks] for n in ns] for m in ms]}


def broadcast_curve(rows: list[dict], gpu) -> dict:
    """{x: log10 bytes, efficiency} of the device-bound broadcast ops, median per BIN_DECADES bin."""
    bins: dict[float, list[tuple[float, float]]] = {}
    for r in rows:
        if r.get("section") != "model" or r.get("op") not in BROADCAST_OPS or r.get("host_bound"):
            continue
        x = math.log10(r["bytes"])
        eff = min(r["bytes"] / gpu.memory_bw_bytes_per_s / (r["median_ms"] * 1e-3), 1.0)
        bins.setdefault(round(x / BIN_DECADES) * BIN_DECADES, []).append((x, eff))
    if not bins:
        raise ValueError("no device-bound broadcast rows")
    xs, effs = [], []
    for key in sorted(bins):
        pts = bins[key]
        xs.append(round(statistics.median(p[0] for p in pts), 4))
        effs.append(round(statistics.median(p[1] for p in pts), 4))
    return {"x": xs, "efficiency": effs}


def op_dispatch(rows: list[dict], cal) -> dict[str, float]:
    """eager_op_dispatch_s: per aten op, its host cost per call relative to a masked_fill_ timed in the same loop (the
    model section at <= 8 tokens, where the host sets the pace), in the calibration's units: ratio x K minus the
    views (V) and kernel ops (K) the call also makes; the median over models and token counts, rounded to 0.1 us.
    Relative, so a faster or slower host than the calibration's does not move it."""
    ref = {(r["model"], r["tokens"]): r["loop_host_ms"] for r in rows if r.get("section") == "model"
           and r.get("op") == DISPATCH_REFERENCE and r["tokens"] <= DISPATCH_MAX_TOKENS and r.get("loop_host_ms")}
    found: dict[str, list[float]] = {}
    for r in rows:
        if r.get("section") != "model" or r.get("op") not in DISPATCH_OPS or (r["model"], r["tokens"]) not in ref:
            continue
        name, views, kernels = DISPATCH_OPS[r["op"]]
        ratio = r["loop_host_ms"] / ref[(r["model"], r["tokens"])]
        found.setdefault(name, []).append(ratio * cal.eager_kernel_dispatch_s - views * cal.eager_view_dispatch_s
                                          - kernels * cal.eager_kernel_dispatch_s)
    return {name: round(max(statistics.median(v), cal.eager_kernel_dispatch_s), 7) for name, v in sorted(found.items())}


def check(rows: list[dict], gpu, cal, table: dict | None) -> list[dict]:
    """The model section's grouped GEMMs: measured against the cost model's efficiency before (dense table at rows
    per touched expert, or the memory curve when streaming) and after (the grouped table)."""
    from aisim.cost import efficiency
    from aisim.specs import GemmTable

    grouped = GemmTable(**table) if table else None
    out = []
    for r in rows:
        if r.get("section") != "model" or r.get("op") not in GROUPED_OPS:
            continue
        n, k = (2 * r["inter"], r["hidden"]) if r["op"] == "grouped_gate_up" else (r["hidden"], r["inter"])
        m = max(1, round(r["rows"] / max(r["touched"], 1)))
        compute_s = r["flop"] / gpu.peak_for("bf16")
        memory_s = r["bytes"] / gpu.memory_bw_bytes_per_s
        roof = max(compute_s, memory_s)
        streaming = memory_s > compute_s          # as cost/ops_time.py reads a routed grouped GEMM
        before = efficiency.memory_efficiency(cal, r["bytes"], gpu) if streaming else \
            efficiency.gemm_efficiency(cal, "bf16", m, n, k, r["flop"], r["bytes"], False, gpu)
        after = before
        if grouped is not None:
            after = efficiency.gemm_table_value(grouped, m, n, k)
            if streaming:
                after = min(after, efficiency.memory_efficiency(cal, r["bytes"], gpu))
        out.append({"model": r["model"], "op": r["op"], "tokens": r["tokens"], "m": m, "measured_ms": r["median_ms"],
                    "before_ms": roof / before * 1e3, "after_ms": roof / after * 1e3,
                    "host_bound": r.get("host_bound", False)})
    return out


def yaml_blocks(table: dict, curve: dict, dispatch: dict, source: str) -> str:
    import yaml

    data = {"grouped_gemm_tables": {"bf16": table}, "broadcast_memory_efficiency": curve}
    if dispatch:
        data["eager_op_dispatch_s"] = dispatch
    text = yaml.safe_dump(data, default_flow_style=None, width=120, sort_keys=False)
    return f"# grouped_gemm_tables, broadcast_memory_efficiency, eager_op_dispatch_s: {source}\n{text}"


def write(path: Path, blocks: str, provenance: str) -> None:
    """Replace the two top-level blocks (and their comment line) in the calibration file, or append them; set the
    ``grouped_gemm`` provenance line."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    kept, skip = [], False
    for line in lines:
        top = re.match(r"^([A-Za-z_][\w]*):", line)
        if line.startswith("# grouped_gemm_tables, broadcast_memory_efficiency"):
            continue
        if top:
            skip = top.group(1) in KEYS
        if not skip:
            kept.append(line)
    text = "".join(kept)
    if not text.endswith("\n"):
        text += "\n"
    text += blocks
    entry = f"  grouped_gemm: '{provenance}'\n"
    lines = [line for line in text.splitlines(keepends=True) if not line.startswith("  grouped_gemm: ")]
    start = next(i for i, line in enumerate(lines) if line.startswith("provenance:"))
    end = start + 1
    while end < len(lines) and lines[end].startswith("  "):    # the provenance block: its entries and their
        end += 1                                              # continuation lines
    path.write_text("".join(lines[:end] + [entry] + lines[end:]))


def grid_check(paths: list[Path], gpu, cal) -> list[tuple[str, int, float, float]]:
    """(file, rows, time MAPE %, mean signed time error %) of the calibration's grouped table on each file's grid."""
    from aisim.cost.efficiency import grouped_gemm_efficiency, memory_efficiency

    out = []
    for path in paths:
        errors = []
        for r in load(path)[1]:
            if r.get("section") != "grid":
                continue
            memory_bound = r["bytes"] / gpu.memory_bw_bytes_per_s > r["flop"] / gpu.peak_for("bf16")
            eff = grouped_gemm_efficiency(cal, "bf16", r["m"], r["n"], r["k"], r["bytes"], memory_bound, gpu)
            if memory_bound:
                eff = min(eff, memory_efficiency(cal, r["bytes"], gpu))
            estimate_ms = roofline_s(r["flop"], r["bytes"], gpu) / eff * 1e3
            errors.append(estimate_ms / r["median_ms"] - 1)
        if not errors:
            raise ValueError(f"{path}: no grid rows")
        out.append((path.name, len(errors), 100 * statistics.mean(map(abs, errors)), 100 * statistics.mean(errors)))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", nargs="?", default=str(DATA))
    parser.add_argument("--gpu", default="h100-sxm")
    parser.add_argument("--calibration", default=None, help="calibration whose curves the check's 'before' reads "
                        "(default: the GPU's)")
    parser.add_argument("--write", default=None, help="calibration YAML to update in place")
    parser.add_argument("--check-grid", nargs="+", type=Path, default=None, help="grid runs to check the "
                        "calibration's table against (no derivation)")
    args = parser.parse_args(argv)
    from aisim.specs import load_calibration

    gpu = _gpu(args.gpu)
    if args.check_grid:
        for name, n, mape, signed in grid_check(args.check_grid, gpu, load_calibration(args.calibration or args.gpu)):
            print(f"{name}: {n} grouped GEMMs, time MAPE {mape:.1f}%, mean signed {signed:+.1f}%")
        return 0
    header, rows = load(Path(args.data))
    table, curve = grouped_table(rows, gpu), broadcast_curve(rows, gpu)
    try:
        shown = Path(args.data).resolve().relative_to(Path(__file__).resolve().parents[2])
    except ValueError:
        shown = Path(args.data)
    source = (f"python -m aisim.validation.scripts.derive_grouped_gemm {shown} (validation/harness/grouped_gemm.py "
              f"on {header.get('gpu_name')}, driver {header.get('driver')}, torch {header.get('torch')}, "
              f"transformers {header.get('transformers')}, {str(header.get('date', ''))[:10]})")
    cal = load_calibration(args.calibration or args.gpu)
    blocks = yaml_blocks(table, curve, op_dispatch(rows, cal), source)
    rows_check = check(rows, gpu, cal, table)
    print(blocks)
    print(f"{'model':<20} {'op':<16} {'tokens':>6} {'m':>5} {'measured':>9} {'before':>9} {'after':>9}")
    for c in rows_check:
        print(f"{c['model']:<20} {c['op']:<16} {c['tokens']:>6} {c['m']:>5} {c['measured_ms']:>9.4f} "
              f"{c['before_ms']:>9.4f} {c['after_ms']:>9.4f}{'  (host-bound)' if c['host_bound'] else ''}")
    scored = [c for c in rows_check if not c["host_bound"]]
    if scored:
        for key in ("before_ms", "after_ms"):
            mape = statistics.mean(abs(c[key] - c["measured_ms"]) / c["measured_ms"] for c in scored) * 100
            print(f"grouped GEMM MAPE {key[:-3]}: {mape:.1f}% over {len(scored)} device-bound rows")
    if args.write:
        write(Path(args.write), blocks, source.replace("'", ""))
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
