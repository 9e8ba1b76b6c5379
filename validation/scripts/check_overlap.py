"""aisim's eager step time against the overlap harness's wall times, with the timeline's two walks (a check, not fitted).

    python -m aisim.validation.scripts.check_overlap [FILE.jsonl ...] [--calibration h100-sxm] [--no-host]

The files are validation/harness/overlap.py records (validation/data/kernels/overlap-h100.jsonl: models of their own
widths that no judged dataset holds, each forward and decode step timed as wall time, host issue time and GPU busy
time). Each case is estimated with the run's host line (its median ``type: host`` record, as ``--host`` takes it;
``--no-host``: the calibration's host) twice: with aisim.cost.timeline as it is (each phase's repeated layers walked
in rounds, layer after layer) and with the walk it replaced on 2026-11-28 (each op's repeats one block of
back-to-back calls, kept here as ``block_walk``). Prints each case, then the MAPE of both over the forwards, over
the decode steps, and over the cases where the two walks differ by more than 1% (the balanced steps, where the
walk matters).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import run_main

DATA = Path(__file__).resolve().parents[2] / "validation" / "data" / "kernels" / "overlap-h100.jsonl"
CONFIGS = Path(__file__).resolve().parents[2] / "validation" / "harness" / "configs"
DIFFER = 0.01


def block_walk(gpu_s, cpu_s, repeats, syncs, head_cpu_s: float = 0.0, phases=None, walk_repeats=None):
    """The timeline walk before 2026-11-28: each run of consecutive ops with one repeat count walked op by op, each op
    as a block of its repeats back to back (call by call where the run holds a sync); ``phases`` and
    ``walk_repeats`` ignored (it walked the traced repeats)."""
    import numpy as np

    from aisim.cost.timeline import Timeline, _step

    g_l, c_l, r_l, s_l = gpu_s.tolist(), cpu_s.tolist(), repeats.tolist(), syncs.tolist()
    state = [head_cpu_s, 0.0]
    i, n = 0, len(g_l)
    while i < n:
        j = i + 1
        while j < n and r_l[j] == r_l[i]:
            j += 1
        r = r_l[i]
        if r > 1 and any(s_l[i:j]):
            whole = int(r)
            for _ in range(whole):
                for k in range(i, j):
                    _step(state, g_l[k], c_l[k], 1.0, s_l[k])
            for k in range(i, j):
                _step(state, g_l[k], c_l[k], r - whole, s_l[k])
        else:
            for k in range(i, j):
                _step(state, g_l[k], c_l[k], r, s_l[k])
        i = j
    return Timeline(runtime_s=max(state), gpu_busy_s=float(np.dot(gpu_s, repeats)),
                    cpu_busy_s=float(np.dot(cpu_s, repeats)) + head_cpu_s)


def rows(paths: list[Path], calibration: str, use_host: bool) -> list[dict]:
    """One dict per measured case: wall, host and GPU ms measured; aisim's runtime with both walks."""
    import aisim
    import aisim.cost.timeline as timeline
    from aisim.step import clear_caches
    from aisim.validation.host import host_spec

    out = []
    for path in paths:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        hosts = [r for r in records if r.get("type") == "host" and r.get("constants")]
        host = host_spec(hosts) if use_host and hosts else None
        for r in records:
            if r.get("type") != "case" or r.get("status") != "ok":
                continue
            est = {}
            for label, walk in (("rounds", timeline.simulate), ("blocks", block_walk)):
                saved = timeline.simulate
                timeline.simulate = walk
                try:
                    clear_caches()
                    est[label] = aisim.estimate(model=str(CONFIGS / f"{r['model']}.json"), device=calibration,
                                                workload=r["workload"], batch=r["batch"], seq=r["seq"],
                                                dtype=r["dtype"], host=host).runtime_ms
                finally:
                    timeline.simulate = saved
            clear_caches()
            out.append({**{k: r[k] for k in ("model", "workload", "batch", "seq", "wall_ms")},
                        "host_ms": r.get("host_ms"), "gpu_ms": r.get("gpu_ms"), **est})
    if not out:
        raise ValueError(f"no measured overlap cases in {', '.join(map(str, paths))}")
    return out


def mape(selected: list[dict], label: str) -> float:
    return 100 * sum(abs(r[label] / r["wall_ms"] - 1) for r in selected) / len(selected) if selected else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, default=[DATA])
    parser.add_argument("--calibration", default="h100-sxm", help="the device (and its calibration) to estimate on")
    parser.add_argument("--no-host", action="store_true", help="the calibration's host, not the run's host line")
    args = parser.parse_args()
    table = rows(args.files, args.calibration, not args.no_host)
    print(f"{'model':18s} {'case':16s} {'wall':>8s} {'rounds':>8s} {'err':>7s} {'blocks':>8s} {'err':>7s}")
    for r in table:
        case = f"{r['workload']} {r['batch']}x{r['seq']}"
        print(f"{r['model']:18s} {case:16s} {r['wall_ms']:8.2f} {r['rounds']:8.2f} "
              f"{100 * (r['rounds'] / r['wall_ms'] - 1):+6.1f}% {r['blocks']:8.2f} "
              f"{100 * (r['blocks'] / r['wall_ms'] - 1):+6.1f}%")
    groups = {"forward": [r for r in table if r["workload"] == "forward"],
              "decode": [r for r in table if r["workload"] == "decode"],
              f"walks differ > {DIFFER:.0%}": [r for r in table if abs(r["rounds"] / r["blocks"] - 1) > DIFFER]}
    for name, selected in groups.items():
        print(f"MAPE {name} (n={len(selected)}): rounds {mape(selected, 'rounds'):.1f}%, "
              f"blocks {mape(selected, 'blocks'):.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
