"""The GEMM wave rule of a calibration file (``gemm_wave_tiles``), from the gemm_layout microbenchmark's dense sweeps
(validation/harness/gemm_layout.py --sweep; H100: validation/data/kernels/gemm-sweep-h100.jsonl), and what its grid
runs say about layouts and bias (gemm-layout-h100*.jsonl).

    python -m aisim.validation.scripts.derive_gemm_waves [SWEEP.jsonl] [--calibration h100-sxm] [--write]

The calibration's GEMM tables are timed on a grid of powers of 4 (M, N 512 / 2048 / 8192 / ...). The sweeps time
``x @ W.t()`` at every multiple of 128 from 1024 to 8192 along one of M, N, K (the others 2048). In fp32 (cuBLAS's
SIMT sgemm kernels) the efficiency between grid points is a sawtooth in M and N, flat in K: it falls where the output
tiles overflow a whole number of waves over the SMs (0.74 at N = 4224, 0.54 at 4352, rising back to 0.75 at 6272),
so the table's interpolation between its full-wave grid points is optimistic for most shapes between them. For each
dtype the script searches the tile (tile_m, tile_n in 64 / 128 / 256), CTAs resident per SM (1, 2) and the fewest full
waves before the rule applies (1-3; fewer waves: cuBLAS picks smaller tiles) that minimise the sweep's error against
the table times ``efficiency.wave_factor``, and keeps a dtype only where that cuts the sweep's error against the
plain table by at least a third (KEEP_BELOW): fp32 7.6% -> 3.9% (128 x 128, 2 per SM, from 2 waves); 16-bit sweeps are
irregular (Hopper's kernels pick tiles per shape: dips to 0.39 of the table at single shapes) and the best rule
takes bf16 only from 10.2% to 8.4%, so 16-bit GEMMs keep the table as measured.

Nothing here reads a judged row. --write sets the line in the calibration file (the same GPU die reads the same rule:
H200 has the H100's 132 SMs and kernels; its own sweep, where run, is passed as SWEEP.jsonl).
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

from .derive_eager_attention import write_lines
from . import calibration_name, run_main

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "validation" / "data" / "kernels"
SWEEP = KERNELS / "gemm-sweep-h100.jsonl"
GRID_FILES = (KERNELS / "gemm-layout-h100.jsonl", KERNELS / "gemm-layout-h100-run2.jsonl")
CAL_DIR = ROOT / "hardware_specs" / "calibration"
TILES = (64, 128, 256)
KEEP_BELOW = 2.0 / 3.0      # a rule is kept where it cuts the sweep's error by at least a third
MIN_ROWS = 2048


def _records(path: Path, kind: str) -> tuple[dict, list[dict]]:
    with open(path) as f:
        lines = [r for r in map(json.loads, f) if isinstance(r, dict)]
    header = next((r for r in lines if r.get("type") == "header"), {})
    records = [r for r in lines if r.get("type") == kind and r.get("status") == "ok"]
    if not records:    # nothing to fit: --write would otherwise replace the shipped rule with none
        from aisim.errors import AisimError

        raise AisimError(f"{path}: no {kind} records; pass a file written by validation/harness/gemm_layout.py"
                         + (" --sweep" if kind == "gemm_sweep" else ""))
    return header, records


def sweep_points(path: Path, cal, gpu) -> dict[str, list[tuple[int, int, float, float]]]:
    """dtype -> (m, n, measured efficiency, table efficiency) of each plain-GEMM sweep point."""
    from aisim.cost.efficiency import gemm_table_value

    out: dict[str, list[tuple[int, int, float, float]]] = {}
    for r in _records(path, "gemm_sweep")[1]:
        table = cal.gemm_tables.get(r["dtype"])
        if r["op"] != "mm" or table is None:
            continue
        m, n, k = r["m"], r["n"], r["k"]
        measured = 2.0 * m * n * k / (r["median_ms"] / 1e3) / gpu.peak_for(r["dtype"])
        out.setdefault(r["dtype"], []).append((m, n, measured, gemm_table_value(table, m, n, k)))
    return out


def sweep_mape(points, table, sms: int, tiles=None) -> float:
    from aisim.cost.efficiency import wave_factor

    errors = [abs(measured / (value * (wave_factor(tiles, table, m, n, sms) if tiles else 1.0)) - 1.0)
              for m, n, measured, value in points]
    return 100.0 * statistics.mean(errors)


def fit(points, table, sms: int) -> tuple[float, float, object]:
    """(the plain table's sweep MAPE, the best rule's, the best WaveTiles)."""
    from aisim.specs import WaveTiles

    best = None
    for tm, tn, ctas, waves in itertools.product(TILES, TILES, (1, 2), (1, 2, 3)):
        tiles = WaveTiles(tile_m=tm, tile_n=tn, ctas_per_sm=ctas, min_waves=waves)
        mape = sweep_mape(points, table, sms, tiles)
        if best is None or mape < best[0] - 1e-9:
            best = (mape, tiles)
    return sweep_mape(points, table, sms), best[0], best[1]


def variant_ratios(paths=GRID_FILES, min_rows: int = MIN_ROWS) -> dict[tuple[str, str, str], list[float]]:
    """(dtype, op, layout) -> its time over mm nt's (the table's layout) on the same file, round and shape."""
    ratios: dict[tuple[str, str, str], list[float]] = {}
    for path in paths:
        times = {(r["round"], r["dtype"], r["m"], r["n"], r["k"], r.get("op", "mm"), r["layout"]): r["median_ms"]
                 for r in _records(path, "gemm_layout")[1]}
        for (rnd, dtype, m, n, k, op, layout), ms in times.items():
            base = times.get((rnd, dtype, m, n, k, "mm", "nt"))
            if base and m >= min_rows and (op, layout) != ("mm", "nt"):
                ratios.setdefault((dtype, op, layout), []).append(ms / base)
    return ratios


def derive(path: Path = SWEEP, calibration: str = "h100-sxm") -> dict:
    from aisim.catalog import resolve_gpu
    from aisim.specs import load_calibration

    cal = load_calibration(calibration)
    gpu = resolve_gpu(cal.device)
    cal = cal.model_copy(update={"gemm_wave_tiles": {}})
    fits = {dtype: fit(points, cal.gemm_tables[dtype], gpu.sm_count)
            for dtype, points in sorted(sweep_points(path, cal, gpu).items())}
    kept = {dtype: tiles for dtype, (plain, mape, tiles) in fits.items() if mape <= KEEP_BELOW * plain}
    return {"fits": fits, "gemm_wave_tiles": kept, "header": _records(path, "gemm_sweep")[0]}


def _flow(kept: dict) -> str:
    return "{" + ", ".join(f"{d}: {{tile_m: {t.tile_m}, tile_n: {t.tile_n}, ctas_per_sm: {t.ctas_per_sm}, "
                           f"min_waves: {t.min_waves}}}" for d, t in kept.items()) + "}"


def write(calibration: str, result: dict, path: Path) -> Path:
    target = CAL_DIR / f"{calibration}.yaml"
    h = result["header"]
    fits = "; ".join(f"{d} sweep MAPE {plain:.1f}% -> {mape:.1f}%" for d, (plain, mape, _) in result["fits"].items())
    try:
        shown = path.resolve().relative_to(ROOT)
    except ValueError:
        shown = path
    note = (f"# gemm_wave_tiles: python -m aisim.validation.scripts.derive_gemm_waves {shown} --calibration "
            f"{calibration} --write (validation/harness/gemm_layout.py --sweep on {h.get('gpu_name')}, driver "
            f"{h.get('driver')}, torch {h.get('torch')}, {str(h.get('date', ''))[:10]}; {fits}; kept where it cuts "
            "the error by a third or more)")
    write_lines(target, {"gemm_wave_tiles": f"gemm_wave_tiles: {_flow(result['gemm_wave_tiles'])}"}, note)
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", nargs="?", default=str(SWEEP))
    parser.add_argument("--calibration", default="h100-sxm", type=calibration_name)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    result = derive(Path(args.data), args.calibration)
    grid = ", ".join(p.name for p in GRID_FILES)
    print(f"Layout and bias (H100), time over x @ W.t() (shapes of >= {MIN_ROWS} rows, {grid}): median [min-max] (n)")
    for (dtype, op, layout), v in sorted(variant_ratios().items()):
        print(f"  {dtype:5s} {op:5s} {layout}: {statistics.median(v):.3f} [{min(v):.2f}-{max(v):.2f}] ({len(v)})")
    print(f"Dense sweeps ({args.data}) against the {args.calibration} table: sweep MAPE, plain -> best wave rule")
    for dtype, (plain, mape, tiles) in result["fits"].items():
        kept = "kept" if dtype in result["gemm_wave_tiles"] else "not kept"
        print(f"  {dtype:5s} {plain:5.1f}% -> {mape:5.1f}%  {tiles.model_dump()}  ({kept})")
    print(f"gemm_wave_tiles: {_flow(result['gemm_wave_tiles'])}")
    if args.write:
        print(f"written to {write(args.calibration, result, Path(args.data))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
