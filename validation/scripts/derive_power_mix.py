"""A calibration's power under its board limit for mixed kernel sequences (``power_limit_mix``) and the top of its
memory-bound power curve, from the power_mix microbenchmark (validation/harness/power_mix.py; H100:
validation/data/kernels/power-mix-h100.jsonl, -run2, -run3 and power-gaps-h100.jsonl, four H100 machines).

    python -m aisim.validation.scripts.derive_power_mix [--calibration h100-sxm] [--write]

1. Memory curve. calibrate's copy loops stop at 64 MiB (0.78 of bandwidth, 450 W on H100) and the curve is flat
   beyond, where a large add or copy runs at 0.89-0.90 of bandwidth: the add and copy loops of power_mix (768 and
   1024 MiB moved per call) are added as points (x: bytes moved / measured time / datasheet bandwidth; y: average
   power / power limit; median over the files), power kept non-decreasing in x as calibrate's fit does.
2. Mixes and waits. A GEMM loop is held at the limit by lower clocks (1260-1335 MHz on H100 against 1980 MHz
   boost); GEMMs interleaved with adds or copies, or launched alone with the GPU waiting between them, run
   unthrottled and draw more: the interleaved mixes sit near the limit (681-700 W where the GEMMs take >= 43% of the
   time), a 4096^3 GEMM every 0.4 ms averages 473 W where its loop power and the waiting power give 408 W. The two
   constants of cost.energy.limited_energy_j, ``compute_dynamic_ratio`` and ``limit_fraction``, are the pair (grid
   0.01 / 0.0025) whose prediction is closest to every sequence's and gapped run's measured power (median over the
   files), the kernels taken at their own measured times (the loops alone) and aisim's achieved fractions of peak:
   a fit of power, not of aisim's kernel times. Memory-bound kernels with waits between them draw their loop power
   and then the waiting power (the gapped adds are within 2% of that without any rule).

``--check FILE`` scores a held-out run (validation/data/kernels/power-mix-h100-check.jsonl: a fifth H100 machine, run
after the fit, one round of each) against the shipped calibration.

Nothing here reads a judged row. --write replaces the curve and the block in the calibration file; --transfer-to h200
writes the block alone into the H200's file (the same GH100 die and 700 W limit): the H100's ratio and fraction, and
the H200's own GEMM loop clock from its run (validation/data/kernels/power-mix-h200.jsonl, measured after the rule
was committed: `--calibration h200 --check` on it gives power MAPE 5.9% at the loop powers, 2.7% with the rule).
``gemm_loop_clock_mhz``: the median SM clock sampled through each GPU's gemm and gemm_small loops
(power-mix-h100-clocks.jsonl, power-mix-h200-clocks.jsonl; cost.power: a --gpu-clock cap slows the GEMMs a limit
holds only below it).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

import numpy as np

from aisim.errors import AisimError

from . import calibration_name, run_main
from .derive_eager_attention import write_lines

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "validation" / "data" / "kernels"
DATA = (*(KERNELS / f"power-mix-h100{run}.jsonl" for run in ("", "-run2", "-run3")), KERNELS / "power-gaps-h100.jsonl")
CAL_DIR = ROOT / "hardware_specs" / "calibration"
ADD_ELEMENTS, ADD_SMALL_ELEMENTS, COPY_ELEMENTS = 128 * 2**20, 8 * 2**20, 256 * 2**20   # harness/power_mix.py
GEMM_MNK = {"gemm": 8192, "gemm_small": 4096}
BF16_BYTES = 2
MOVED = {"add": 3 * ADD_ELEMENTS * BF16_BYTES, "copy": 2 * COPY_ELEMENTS * BF16_BYTES}   # read + write
RATIOS = np.round(np.arange(1.0, 2.0001, 0.01), 4)
LIMITS = np.round(np.arange(0.95, 1.00001, 0.0025), 4)


def load(paths=DATA) -> tuple[list[dict], dict[str, dict], dict[tuple[str, float], float]]:
    """(headers, sequence name -> {"parts", "power_w": median, "ms": median}, (kernel, period ms) -> median power
    of the gapped runs)."""
    headers, found, gapped = [], {}, {}
    for path in paths:
        with open(path) as f:
            for r in map(json.loads, f):
                if r.get("type") == "header":
                    headers.append(r)
                elif r.get("type") == "sequence" and r.get("avg_power_w"):
                    entry = found.setdefault(r["name"], {"parts": r["parts"], "power": [], "ms": []})
                    entry["power"].append(r["avg_power_w"])
                    entry["ms"].append(r["ms_per_iteration"])
                elif r.get("type") == "gapped" and r.get("avg_power_w"):
                    gapped.setdefault((r["part"], r["period_ms"]), []).append(r["avg_power_w"])
    return (headers, {k: {"parts": v["parts"], "power_w": statistics.median(v["power"]),
                          "ms": statistics.median(v["ms"])} for k, v in found.items()},
            {k: statistics.median(v) for k, v in gapped.items()})


def gemm_loop_clock_mhz(paths) -> float | None:
    """The clock the board limit holds a 16-bit GEMM loop at: the median over the gemm and gemm_small loops of the
    SM clock sampled while the loop ran (busy_sm_clock_mhz; the runs that record it), None where none does. The
    older runs' single reading after the window (sm_clock_mhz) is not used: it read 1245-1350 MHz on H100 where the
    samples through the window average 1438-1448 MHz."""
    clocks = []
    for path in paths:
        with open(path) as f:
            clocks += [r["busy_sm_clock_mhz"] for r in map(json.loads, f) if r.get("type") == "sequence"
                       and r.get("name") in GEMM_MNK and r.get("busy_sm_clock_mhz")]
    return round(float(statistics.median(clocks))) if clocks else None


def gpu_files(calibration: str) -> tuple[Path, ...]:
    """A calibration's own power_mix sequence files (power-mix-<gpu>.jsonl, -runN, -check, -clocks; held-out runs
    included: the clock is a reading, not a fit)."""
    gpu = {"h100-sxm": "h100"}.get(calibration, calibration)
    pattern = re.compile(rf"power-mix-{re.escape(gpu)}(-run\d+|-check|-clocks)?\.jsonl")
    return tuple(sorted(p for p in KERNELS.glob(f"power-mix-{gpu}*.jsonl") if pattern.fullmatch(p.name)))


def memory_points(seqs: dict, gpu, limit_w: float) -> list[tuple[float, float]]:
    return [(MOVED[name] / (seqs[name]["ms"] / 1e3) / gpu.memory_bw_bytes_per_s, seqs[name]["power_w"] / limit_w)
            for name in MOVED if name in seqs]


def extended_curve(curve, points):
    from aisim.specs import Curve

    pts = sorted(set(zip(curve.x, curve.efficiency)) | set(points))
    xs, ys = [], []
    for x, y in pts:
        if xs and x <= xs[-1] + 1e-4:
            ys[-1] = max(ys[-1], y)
            continue
        xs.append(round(x, 4))
        ys.append(round(max(y, ys[-1]) if ys else y, 4))
    return Curve(x=xs, efficiency=ys)


def calibrated_memory_curve(calibration: str):
    """The memory power curve as `aisim calibrate` fits it from the calibration's raw file (what --write extends)."""
    from aisim.validation.calibrate_fit import fit_power

    with open(CAL_DIR / f"{calibration}.raw.json") as f:
        raw = json.load(f)
    return fit_power(raw["records"], float(raw["provenance"]["power_limit_w"]))["power_memory_curve"]


def kernels(cal, dev):
    """Kernel name -> (aisim seconds, compute seconds, memory seconds)."""
    from aisim.cost.ops_time import op_time
    from aisim.formulas import op_cost
    from aisim.graph.ops import Op, TensorMeta

    def t(*shape):
        return TensorMeta(tuple(shape), "bf16")

    def op(name, args, out):
        return Op(name=name, args=tuple(args), kwargs={}, outputs=(out,), alias=False)

    ops = {name: op("aten.mm", [t(n, n), t(n, n)], t(n, n)) for name, n in GEMM_MNK.items()}
    ops.update({"add": op("aten.add.Tensor", [t(ADD_ELEMENTS), t(ADD_ELEMENTS)], t(ADD_ELEMENTS)),
                "add_small": op("aten.add.Tensor", [t(ADD_SMALL_ELEMENTS), t(ADD_SMALL_ELEMENTS)],
                                t(ADD_SMALL_ELEMENTS)),
                "copy": op("aten.copy_", [t(COPY_ELEMENTS), t(COPY_ELEMENTS)], t(COPY_ELEMENTS))})
    out = {}
    for name, o in ops.items():
        r = op_time(o, op_cost(o), dev, cal, "bf16")
        out[name] = (r.gpu_s, r.compute_s, r.memory_s)
    return out


def measured_times(seqs: dict, times: dict) -> dict:
    """Each kernel's (seconds, compute seconds, memory seconds) at its measured time alone (its loop's time per
    iteration), keeping aisim's achieved fractions of peak: the fit is of power, not of aisim's kernel times."""
    out = {}
    for name, (g, c, m) in times.items():
        t = seqs[name]["ms"] / 1e3 if name in seqs else g
        out[name] = (t, c * t / g, m * t / g)
    return out


def is_gemm(kernel: str) -> bool:
    """A power_mix load that is a GEMM (tensor cores): gemm, gemm_small, and the --skinny loops' mm_M..."""
    return kernel in GEMM_MNK or kernel.startswith("mm_")


def predicted_w(parts, times, cal, gpu, period_s: float | None = None) -> float:
    """aisim's average power over one iteration of ``parts`` back to back (or one launch of them in a ``period_s``,
    the GPU waiting the rest)."""
    from aisim.cost.energy import limited_energy_j, op_power_w

    g, c, m = (np.array([times[p][i] for p in parts]) for i in range(3))
    tc = np.array([is_gemm(p) for p in parts])                 # the GEMMs run on tensor cores
    runtime = float(g.sum()) if period_s is None else max(period_s, float(g.sum()))
    return limited_energy_j(gpu, cal, op_power_w(gpu, cal, g, c, m, tc), g, c, m, np.ones(len(parts)), runtime,
                            tc) / runtime


def cases(seqs: dict, gapped: dict) -> list[tuple[list[str], float | None, float]]:
    """(kernels, period s or None, measured W): each sequence, each gapped run."""
    out = [(s["parts"], None, s["power_w"]) for s in seqs.values()]
    out += [([part], period_ms / 1e3, power) for (part, period_ms), power in gapped.items()]
    return out


def errors(measured: list, times: dict, cal, gpu) -> list[float]:
    """aisim's power over the measured power, less 1, for each case of ``measured`` (cases)."""
    return [predicted_w(parts, times, cal, gpu, period) / watts - 1.0 for parts, period, watts in measured]


def mape(measured: list, times: dict, cal, gpu) -> float:
    return 100.0 * statistics.mean(abs(e) for e in errors(measured, times, cal, gpu))


def derive(calibration: str = "h100-sxm", paths=DATA) -> dict:
    from aisim.catalog import resolve_device
    from aisim.specs import PowerLimitMix, load_calibration

    cal = load_calibration(calibration).model_copy(update={"power_limit_mix": None})
    dev = resolve_device(cal.device)
    headers, seqs, gapped = load(paths)
    limit_w = float(headers[0].get("power_limit_w") or dev.gpu.board_power_w)
    curve = extended_curve(calibrated_memory_curve(calibration), memory_points(seqs, dev.gpu, limit_w))
    cal = cal.model_copy(update={"power_memory_curve": curve})
    times = measured_times(seqs, kernels(cal, dev))
    measured = cases(seqs, gapped)
    best = None
    for ratio in RATIOS:
        for limit in LIMITS:
            c = cal.model_copy(update={"power_limit_mix": PowerLimitMix(compute_dynamic_ratio=float(ratio),
                                                                        limit_fraction=float(limit))})
            e = mape(measured, times, c, dev.gpu)
            if best is None or e < best[0] - 1e-12:
                best = (e, c)
    fitted = best[1]
    names = [("+".join(parts) if period is None else f"{parts[0]} every {period * 1e3:g} ms")
             for parts, period, _ in measured]
    rows = {name: (100 * b, 100 * a) for name, b, a in zip(names, errors(measured, times, cal, dev.gpu),
                                                            errors(measured, times, fitted, dev.gpu))}
    clock = gemm_loop_clock_mhz(gpu_files(calibration))
    mix = fitted.power_limit_mix.model_copy(update={"gemm_loop_clock_mhz": clock})
    return {"headers": headers, "curve": curve, "mix": mix, "mape_before": mape(measured, times, cal, dev.gpu),
            "mape_after": best[0], "rows": rows}


def check(path: Path, calibration: str = "h100-sxm") -> tuple[float, float, int]:
    """(power MAPE of a held-out run with each kernel at its loop power, with the shipped rule, cases): the file's
    sequences and gapped runs against the calibration as shipped (its curve and block), the kernels at the run's
    own measured times."""
    from aisim.catalog import resolve_device
    from aisim.specs import load_calibration

    shipped = load_calibration(calibration)
    dev = resolve_device(shipped.device)
    _, seqs, gapped = load([path])
    times = measured_times(seqs, kernels(shipped, dev))
    measured = cases(seqs, gapped)
    return (mape(measured, times, shipped.model_copy(update={"power_limit_mix": None}), dev.gpu),
            mape(measured, times, shipped, dev.gpu), len(measured))


def _flow_curve(curve) -> str:
    return "{x: [" + ", ".join(f"{x:g}" for x in curve.x) + "], efficiency: [" + ", ".join(
        f"{y:g}" for y in curve.efficiency) + "]}"


def write(calibration: str, result: dict) -> Path:
    path = CAL_DIR / f"{calibration}.yaml"
    # calibrate writes the curve as a block: collapse it so that write_lines can replace one line
    path.write_text(re.sub(r"^power_memory_curve:\n(?:  .*\n)+", "power_memory_curve: null\n", path.read_text(),
                           flags=re.M))
    h = result["headers"][0]
    mix = result["mix"]
    note = (f"# power_memory_curve, power_limit_mix: python -m aisim.validation.scripts.derive_power_mix --calibration "
            f"{calibration} --write (validation/harness/power_mix.py, {len(result['headers'])} runs on "
            f"{h.get('gpu_name')}, driver {h.get('driver')}, torch {h.get('torch')}, {str(h.get('date', ''))[:10]}; "
            f"the curve is calibrate's plus the add and copy loops; power MAPE over its sequences and gapped runs "
            f"{result['mape_before']:.1f}% -> {result['mape_after']:.1f}%)")
    write_lines(path, {"power_memory_curve": f"power_memory_curve: {_flow_curve(result['curve'])}",
                       "power_limit_mix": _mix_line(mix)}, note)
    return path


def _mix_line(mix) -> str:
    clock = f", gemm_loop_clock_mhz: {mix.gemm_loop_clock_mhz:g}" if mix.gemm_loop_clock_mhz else ""
    return (f"power_limit_mix: {{compute_dynamic_ratio: {mix.compute_dynamic_ratio:g}, "
            f"limit_fraction: {mix.limit_fraction:g}{clock}}}")


def write_transferred(calibration: str, source: str, result: dict) -> Path:
    """The mix block alone, into another GPU's file (the same die and power limit; its own curves stay)."""
    path = CAL_DIR / f"{calibration}.yaml"
    own = gpu_files(calibration)
    mix = result["mix"].model_copy(update={"gemm_loop_clock_mhz": gemm_loop_clock_mhz(own)})
    clock = (f"; gemm_loop_clock_mhz from this GPU's own loops ({', '.join(p.name for p in own)}), whose power the "
             "transferred ratio and fraction predict (--check)" if own else "")
    note = (f"# power_limit_mix: python -m aisim.validation.scripts.derive_power_mix --calibration {source} --write "
            f"--transfer-to {calibration} (the ratio and fraction from the {source} power_mix runs: the same GH100 die "
            f"and 700 W limit; this GPU's own loop powers stay{clock})")
    write_lines(path, {"power_limit_mix": _mix_line(mix)}, note)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibration", default="h100-sxm", type=calibration_name)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--check", default=None, help="a held-out power_mix run: its power MAPE under the shipped "
                        "calibration, without and with the rule (nothing is fitted or written)")
    parser.add_argument("--transfer-to", default=None, type=calibration_name,
                        help="with --write: also write the mix block into this calibration (a GPU with the same die "
                        "and power limit)")
    args = parser.parse_args(argv)
    if args.check:
        before, after, n = check(Path(args.check), args.calibration)
        print(f"{args.check}: {n} cases, power MAPE at the loop powers {before:.1f}% -> with the shipped rule "
              f"{after:.1f}%")
        return 0
    if args.calibration != "h100-sxm":
        raise AisimError(f"the power_mix fit files are the H100's (DATA); --calibration {args.calibration} takes its "
                         "block with --calibration h100-sxm --write --transfer-to " + args.calibration)
    result = derive(args.calibration)
    print(f"power_memory_curve: {_flow_curve(result['curve'])}")
    print(f"power_limit_mix: {result['mix'].model_dump()}")
    print(f"power MAPE over the sequences and gapped runs (the kernels at their measured times): each kernel at its "
          f"loop power {result['mape_before']:.1f}% -> with the limit rule {result['mape_after']:.1f}%")
    print(f"{'case':<28} {'error before %':>14} {'after %':>8}")
    for name, (before, after) in result["rows"].items():
        print(f"{name:<28} {before:>+14.1f} {after:>+8.1f}")
    if args.write:
        print(f"written to {write(args.calibration, result)}")
        if args.transfer_to:
            print(f"written to {write_transferred(args.transfer_to, args.calibration, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
