"""eager_collective_host_adds: the host work of one all-reduce issued from eager HF code, from tiny non-judged models.

    python -m aisim.validation.scripts.derive_collective_host [--data FILE ...] [--write]

The tp-tiny suites (validation/suites/tp-tiny.yaml and tp-tiny4.yaml; validation/data/kernels/tp-tiny-h100x2.jsonl,
tp-tiny-h100x4.jsonl and tp-tiny-h200x2.jsonl, a 2-GPU and a 4-GPU H100 host and a 2-GPU H200 host: tiny llama and
opt models, width 256, at 1, 4 and 16 layers, forward 1 x 128 and decode batch 1, at TP 4 (4-GPU host), TP 2 and
TP 1, with the TP suites' implementation, validation/tp.py: an all-reduce from a forward hook per row-parallel
linear, two per layer) measure what a TP step adds over its TP 1 twin on the same host per all-reduce: the slope
over the all-reduce count. aisim's own per-all-reduce increment (with the field unset) is taken off, and the rest
is read in the calibration host's time: divided by how much slower that host ran the TP 1 layers than h100-sxm's
constants predict (slope over depth of measured over estimated TP 1 time), then expressed in h100-sxm's plain adds
before its framework scale.

TP 2: the median over every (host, family, phase) sweep; hosts and families differ up to 5x (host variance, as for
every host cost here). TP 4: the TP 2 value times the median ratio of TP 4's per-all-reduce extra to TP 2's on the
same host. --write puts it in h100-sxm.yaml, h200.yaml and default.yaml (a ratio to the add, portable as the
per-op table is). Nothing here sees a judged row.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from aisim.errors import AisimError

from . import run_main
from .derive_eager_attention import write_lines
from .derive_op_host import _flow

ROOT = Path(__file__).resolve().parents[2]
DATA = tuple(ROOT / "validation" / "data" / "kernels" / f"tp-tiny-{host}.jsonl"
             for host in ("h100x2", "h100x4", "h200x2"))
CONFIGS = ROOT / "validation" / "harness" / "configs" / "tiny"
CAL_DIR = ROOT / "hardware_specs" / "calibration"
WRITE_TO = ("h100-sxm", "h200", "default")
ALLREDUCES_PER_LAYER = 2    # validation/tp.py: the attention output and the MLP output projections
BASE_TP = 2


def _slope(xs: list[float], ys: list[float]) -> float:
    import numpy as np

    return float(np.polyfit(xs, ys, 1)[0])


def sweeps(path: Path) -> dict[tuple[str, str], dict[int, dict[int, float]]]:
    """(family, phase) -> layers -> tp -> measured ms."""
    out: dict = {}
    with open(path) as f:
        for r in map(json.loads, f):
            if r.get("type") != "case" or r.get("status") != "ok":
                continue
            m = re.search(r"tp-tiny-([a-z]+)-(\d+)\.json$", r["model"])
            if m:
                out.setdefault((m[1], r["workload"]), {}).setdefault(int(m[2]), {})[r["tp"]] = r["runtime_ms_median"]
    return out


def derive(paths: tuple[Path, ...] = DATA, reference=None) -> dict:
    """The fit, read with ``reference``'s host constants (default: h100-sxm.yaml)."""
    import aisim
    from aisim.specs import load_calibration

    cal = (reference or load_calibration("h100-sxm")).model_copy(update={"eager_collective_host_adds": {}})
    unit_s = cal.eager_add_dispatch_s * cal.eager_framework_scale
    found: dict[int, list[float]] = {}
    extra_us: dict[tuple[str, str, str, int], float] = {}
    per_sweep = {}
    estimates: dict = {}

    def estimate(family: str, phase: str, layers: int, tp: int) -> float:
        key = (family, phase, layers, tp)
        if key not in estimates:
            kw = dict(model=str(CONFIGS / f"tp-tiny-{family}-{layers}.json"), workload=phase, batch=1, seq=128,
                      dtype="bf16" if family == "llama" else "fp16", calibration=cal)
            estimates[key] = (aisim.estimate(device="h100", **kw) if tp == 1 else
                              aisim.estimate(device=f"h100x{tp}", tp=tp, **kw)).runtime_ms
        return estimates[key]

    for path in paths:
        for (family, phase), by_layers in sorted(sweeps(path).items()):
            for tp in sorted({t for tps in by_layers.values() for t in tps} - {1}):
                layers = sorted(L for L, tps in by_layers.items() if {1, tp} <= set(tps))
                if len(layers) < 2:
                    continue
                ars = [ALLREDUCES_PER_LAYER * L for L in layers]
                measured = _slope(ars, [by_layers[L][tp] - by_layers[L][1] for L in layers])
                own = _slope(ars, [estimate(family, phase, L, tp) - estimate(family, phase, L, 1) for L in layers])
                host_ratio = (_slope(layers, [by_layers[L][1] for L in layers])
                              / _slope(layers, [estimate(family, phase, L, 1) for L in layers]))
                adds = (measured / host_ratio - own) * 1e-3 / unit_s
                found.setdefault(tp, []).append(adds)
                extra_us[(path.name, family, phase, tp)] = measured * 1e3
                per_sweep[f"{path.name} {family} {phase} tp{tp}"] = {
                    "measured_us_per_allreduce": round(measured * 1e3, 1),
                    "aisim_us_per_allreduce": round(own * 1e3, 1), "host_ratio": round(host_ratio, 3),
                    "adds": round(adds, 2)}
    if BASE_TP not in found:
        raise ValueError(f"no (family, phase) with TP 1 and TP {BASE_TP} cases at two or more depths")
    # hosts differ up to 5x in this cost: TP 2 from every host's sweeps; a larger degree as its ratio to TP 2 on the
    # same host (per family and phase, both per-all-reduce extras positive), times that
    base = statistics.median(found[BASE_TP])
    adds = {BASE_TP: round(base, 1)}
    for tp in sorted(set(found) - {BASE_TP}):
        ratios = [v / extra_us[(*sweep, BASE_TP)] for (*sweep, t), v in extra_us.items()
                  if t == tp and v > 0 and extra_us.get((*sweep, BASE_TP), 0) > 0]
        if ratios:
            adds[tp] = round(base * statistics.median(ratios), 1)
            per_sweep[f"tp{tp} / tp{BASE_TP} on the same host"] = {"ratios": [round(r, 3) for r in ratios]}
    return {"eager_collective_host_adds": adds, "sweeps": per_sweep}


def write(value: dict[int, float], paths: tuple[Path, ...] = DATA) -> None:
    """The value and its provenance (each file's GPUs, driver, torch, transformers, date) into WRITE_TO."""
    headers = []
    for path in paths:
        with open(path) as f:
            h = json.loads(f.readline())
        headers.append(f"{path.name}: {h.get('gpu_count')} x {h.get('gpu_name')}, driver {h.get('driver')}, torch "
                       f"{h.get('torch')}, transformers {h.get('transformers')}, {str(h.get('date', ''))[:10]}")
    note = ("# eager_collective_host_adds: python -m aisim.validation.scripts.derive_collective_host (tiny llama/opt "
            "at TP 1 and TP > 1, per TP degree; validation/data/kernels/" + "; ".join(headers) + ")")
    for name in WRITE_TO:
        write_lines(CAL_DIR / f"{name}.yaml", {"eager_collective_host_adds":
                                               f"eager_collective_host_adds: {_flow(value)}"}, note)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", default=[str(p) for p in DATA])
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    for data in args.data:
        if not Path(data).is_file():
            parser.error(f"--data: {data} is not a file")
    paths = tuple(Path(d) for d in args.data)
    try:
        fit = derive(paths)
    except (ValueError, KeyError, AttributeError, TypeError, AisimError) as exc:
        parser.error(f"--data {' '.join(args.data)}: not the tp-tiny suites' records ({type(exc).__name__}: {exc})")
    print(json.dumps(fit, indent=1))
    if args.write:
        write(fit["eager_collective_host_adds"], paths)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
