"""How a kernel's power combines tensor-core and HBM activity (the calibration's ``power_overlap``), from
weight-streaming GEMM loops (validation/harness/power_mix.py --skinny; H200: validation/data/kernels/power-skinny-h200.jsonl).

    python -m aisim.validation.scripts.derive_power_overlap [FILE ...] [--calibration h200] [--write]
        [--transfer-to h100-sxm] [--check]

A GEMM x[M, K] @ w[K, N] with few rows streams its weights at near HBM bandwidth while its tensor cores do M times
the work of a matrix-vector product. aisim's power model (cost/energy.py) took the larger of the two activities'
power above the waiting power; on an H200 a loop of such GEMMs draws 502 W at M = 1, 576-625 W at M = 32 and the
700 W limit from M = 64 on (clocks pulled down; medians of two rounds), where the copy loop that streams HBM alone
draws 547 W. ``power_overlap``
adds that share of the smaller activity's power: P = P_wait + max(D_c, D_m) + overlap x min(D_c, D_m), under the
calibration's power-limit rule (power_limit_mix) as a step's kernels are, on tensor-core kernels only. The fit:
the overlap (grid 0.01) whose prediction is closest (power MAPE) to every skinny loop's measured power, each GEMM
at its measured time per call with aisim's FLOPs and bytes (a fit of power, not of aisim's kernel times), with the
calibration's memory-bound power scaled to the run's own copy loop (normalised: the machine's HBM power is not the
overlap's to absorb); the reference GEMM and copy loops and the layer-like mix are shown beside it, not fitted.
Nothing here reads a judged row.

--write puts the overlap into the calibration's file; --transfer-to writes it into another GPU's (the same GH100
die and 700 W limit: H100 SXM from the H200's loops), which keeps its own power curves.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from . import calibration_name, run_main
from .derive_eager_attention import write_lines
from .derive_power_mix import CAL_DIR, KERNELS, kernels, measured_times, predicted_w

DATA = (KERNELS / "power-skinny-h200.jsonl",)
OVERLAPS = np.round(np.arange(0.0, 2.0001, 0.01), 4)


def load(paths) -> tuple[list[dict], dict[str, dict]]:
    """(headers, name -> {"parts", "mkn", "power_w": median, "ms": median}) of the --skinny records."""
    headers, found = [], {}
    for path in paths:
        with open(path) as f:
            for r in map(json.loads, f):
                if r.get("type") == "header":
                    headers.append(r)
                elif r.get("type") == "skinny" and r.get("avg_power_w"):
                    e = found.setdefault(r["name"], {"parts": r["parts"], "power": [], "ms": [],
                                                     "mkn": (r.get("m"), r.get("k"), r.get("n")),
                                                     "dtype": r.get("dtype", "bf16")})
                    e["power"].append(r["avg_power_w"])
                    e["ms"].append(r["ms_per_iteration"])
    if not found:
        raise ValueError("no skinny records with power (power_mix --skinny writes them)")
    return headers, {k: {"parts": v["parts"], "mkn": v["mkn"], "dtype": v["dtype"],
                         "power_w": statistics.median(v["power"]), "ms": statistics.median(v["ms"])}
                     for k, v in found.items()}


def gemm_times(mkn, dtype: str, seconds: float, cal, dev) -> tuple[float, float, float]:
    """(seconds, compute seconds, memory seconds) of the GEMM at its measured time: aisim's FLOPs and bytes over the
    GPU's peak FLOP/s and bandwidth, so the achieved fractions are the measured ones."""
    from aisim.cost.ops_time import op_time
    from aisim.formulas import op_cost
    from aisim.graph.ops import Op, TensorMeta

    m, k, n = mkn
    op = Op(name="aten.mm", args=(TensorMeta((m, k), dtype), TensorMeta((k, n), dtype)), kwargs={},
            outputs=(TensorMeta((m, n), dtype),), alias=False)
    r = op_time(op, op_cost(op), dev, cal, dtype)
    return seconds, r.compute_s * seconds / r.gpu_s, r.memory_s * seconds / r.gpu_s


def kernel_times(seqs: dict, cal, dev) -> dict[str, tuple[float, float, float]]:
    """Every kernel of the records at its measured time alone: the skinny GEMMs, and the reference loads as
    derive_power_mix times them (the small add, never looped alone here: aisim's time)."""
    loads = {n: s for n, s in seqs.items() if s["mkn"][0] is None}
    gemms = {n: gemm_times(s["mkn"], s["dtype"], s["ms"] / 1e3, cal, dev) for n, s in seqs.items()
             if s["mkn"][0] is not None}
    return {**measured_times(loads, kernels(cal, dev)), **gemms}


def normalised(cal, seqs: dict, times: dict, gpu):
    """The calibration with its memory-bound power scaled to the run's own copy loop (the machine's HBM power:
    547 W on the fit's H200 where the calibration's host drew 602 W), so that the overlap fitted is the
    combination alone, not one machine's memory power. The linear model's power_memory_fraction, or the memory
    curve's power above the waiting power; unchanged without a copy loop in the run."""
    from aisim.cost.energy import waiting_power_w

    if "copy" not in seqs:
        return cal
    idle_w, board = waiting_power_w(gpu, cal), gpu.board_power_w
    model_w = predicted_w(["copy"], times, cal, gpu)
    k = (seqs["copy"]["power_w"] - idle_w) / max(model_w - idle_w, 1e-9)
    if cal.power_memory_curve is not None:
        curve = cal.power_memory_curve
        eff = [idle_w / board + (e - idle_w / board) * k for e in curve.efficiency]
        return cal.model_copy(update={"power_memory_curve": curve.model_copy(update={"efficiency": eff})})
    frac = (idle_w + (cal.power_memory_fraction * board - idle_w) * k) / board
    return cal.model_copy(update={"power_memory_fraction": min(frac, 1.0)})


def errors(seqs: dict, names, times, cal, gpu) -> dict[str, float]:
    return {n: predicted_w(seqs[n]["parts"], times, cal, gpu) / seqs[n]["power_w"] - 1.0 for n in names}


def mape(errs: dict[str, float]) -> float:
    return 100.0 * statistics.mean(abs(e) for e in errs.values())


def derive(calibration: str, paths=DATA) -> dict:
    from aisim.catalog import resolve_device
    from aisim.specs import load_calibration

    shipped = load_calibration(calibration).model_copy(update={"power_overlap": 0.0})
    dev = resolve_device(shipped.device)
    headers, seqs = load(paths)
    times = kernel_times(seqs, shipped, dev)
    cal = normalised(shipped, seqs, times, dev.gpu)
    fit = [n for n, s in seqs.items() if s["mkn"][0] is not None and len(s["parts"]) == 1]
    shown = [n for n in seqs if n not in fit]
    def fit_mape(o: float) -> float:
        return mape(errors(seqs, fit, times, cal.model_copy(update={"power_overlap": float(o)}), dev.gpu))

    best = min(OVERLAPS, key=lambda o: (fit_mape(o), o))
    fitted = cal.model_copy(update={"power_overlap": float(best)})
    before, after = (errors(seqs, list(seqs), times, c, dev.gpu) for c in (cal, fitted))
    return {"headers": headers, "overlap": float(best), "fit": fit, "shown": shown, "seqs": seqs,
            "before": before, "after": after,
            "mape_before": mape({n: before[n] for n in fit}), "mape_after": mape({n: after[n] for n in fit})}


def check(paths, calibration: str) -> tuple[float, float, float, float, int]:
    """Power MAPE of a held-out run's skinny GEMM loops with the larger activity alone and with the shipped overlap,
    under the shipped calibration and under it with the run's own memory power (normalised), and the loops:
    nothing fitted."""
    from aisim.catalog import resolve_device
    from aisim.specs import load_calibration

    shipped = load_calibration(calibration)
    dev = resolve_device(shipped.device)
    _, seqs = load(paths)
    times = kernel_times(seqs, shipped, dev)
    loops = [n for n, s in seqs.items() if s["mkn"][0] is not None and len(s["parts"]) == 1]
    run = normalised(shipped.model_copy(update={"power_overlap": 0.0}), seqs, times, dev.gpu)
    out = []
    for cal in (shipped, run.model_copy(update={"power_overlap": shipped.power_overlap})):
        out += [mape(errors(seqs, loops, times, cal.model_copy(update={"power_overlap": 0.0}), dev.gpu)),
                mape(errors(seqs, loops, times, cal, dev.gpu))]
    return (*out, len(loops))


def write(calibration: str, result: dict, source: str | None = None) -> Path:
    path = CAL_DIR / f"{calibration}.yaml"
    h = result["headers"][0]
    origin = (f"--calibration {source} --write --transfer-to {calibration}: fitted to the {source} loops, the same "
              "GH100 die and 700 W limit; this GPU's own power curves stay" if source else
              f"--calibration {calibration} --write")
    note = (f"# power_overlap: python -m aisim.validation.scripts.derive_power_overlap {origin} "
            f"(validation/harness/power_mix.py --skinny on {h.get('gpu_name')}, driver {h.get('driver')}, torch "
            f"{h.get('torch')}, {str(h.get('date', ''))[:10]}: {len(result['fit'])} weight-streaming GEMM loops of "
            f"1-4096 rows, power MAPE {result['mape_before']:.1f}% -> {result['mape_after']:.1f}%)")
    write_lines(path, {"power_overlap": f"power_overlap: {result['overlap']:g}"}, note)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", nargs="*", help="power_mix --skinny files (default: the committed H200 run)")
    parser.add_argument("--calibration", default="h200", type=calibration_name,
                        help="the GPU the files were measured on")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--transfer-to", default=None, type=calibration_name,
                        help="with --write: also write the overlap into this calibration (same die and power limit)")
    parser.add_argument("--check", action="store_true", help="score the files (a held-out run) against the shipped "
                        "calibration: nothing fitted or written")
    args = parser.parse_args(argv)
    if args.check:
        before, after, run_before, run_after, n = check([Path(p) for p in args.data] or DATA, args.calibration)
        print(f"{n} skinny GEMM loops: power MAPE with the larger activity alone {before:.1f}% -> with the shipped "
              f"power_overlap {after:.1f}%; with the memory power of the run's own copy loop {run_before:.1f}% -> "
              f"{run_after:.1f}%")
        return 0
    result = derive(args.calibration, [Path(p) for p in args.data] or DATA)
    print(f"power_overlap: {result['overlap']:g}; power MAPE over {len(result['fit'])} skinny GEMM loops "
          f"{result['mape_before']:.1f}% (the larger activity alone) -> {result['mape_after']:.1f}%")
    print(f"{'load':<40} {'measured W':>10} {'before %':>9} {'after %':>8}")
    for name in result["fit"] + result["shown"]:
        mark = "" if name in result["fit"] else "  (not fitted)"
        print(f"{name:<40} {result['seqs'][name]['power_w']:>10.1f} {100 * result['before'][name]:>+9.1f} "
              f"{100 * result['after'][name]:>+8.1f}{mark}")
    if args.write:
        print(f"written to {write(args.calibration, result)}")
        if args.transfer_to:
            print(f"written to {write(args.transfer_to, result, args.calibration)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
