"""aisim's all-to-all time against NCCL all-to-all measured on the device's GPUs (not fitted: a check).

    python -m aisim.validation.scripts.check_all_to_all [FILE.raw.json ...]

The files are validation/collectives.py raw files (validation/data/collectives/*-a2a.raw.json: torch's
all_to_all_single, each rank's send buffer of ``size_bytes`` in world_size equal chunks, GPU-side time of
back-to-back calls). aisim prices an expert-parallel all-to-all inside one node as its ring figure on the system's
all-reduce fit (aisim.cost.comm.collective_time_s: latency + (n-1)/n x bytes / bus bandwidth); this prints, per
GPU count and size, the measured and estimated times, the all-to-all's own alpha-beta fit beside the all-reduce's,
and the error over the sizes of 1 MiB and more (where an MoE layer's dispatch lies: 4096 tokens x 2 experts x
4096 x bf16 = 64 MiB) and over all sizes.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import run_main

DATA = Path(__file__).resolve().parents[2] / "validation" / "data" / "collectives"
LARGE_BYTES = 2**20


def estimate_s(size_bytes: float, world_size: int, device_name: str) -> float:
    """aisim's time of one all-to-all of ``size_bytes`` per rank over ``world_size`` GPUs of ``device_name``."""
    from aisim.catalog import resolve_device
    from aisim.cost.comm import collective_time_s
    from aisim.formulas import Cost
    from aisim.graph.ops import Op
    from aisim.scenario import scenario

    device = resolve_device(f"{device_name}x{world_size}")
    cal = scenario("opt-125m", device).calibration
    op = Op(name="nccl.all_to_all", args=(), kwargs={}, outputs=(), alias=False, attrs={"group": world_size})
    return collective_time_s(op, Cost(0.0, size_bytes, size_bytes, 0, "comm"), device, cal)


def rows(path: Path) -> list[dict]:
    raw = json.loads(path.read_text())
    out = []
    for r in raw["records"]:
        if r.get("bench") != "collective" or r.get("op") != "all_to_all" or not r.get("gpu_time_s_per_rank"):
            continue
        measured = min(r["gpu_time_s_per_rank"])     # the rank that arrived last (collectives.fit_collectives)
        est = estimate_s(r["size_bytes"], r["world_size"], raw["device"])
        out.append({"world_size": r["world_size"], "size_bytes": r["size_bytes"], "measured_s": measured,
                    "estimated_s": est, "error_pct": 100 * (est - measured) / measured})
    return out


def main() -> int:
    from aisim.validation.collectives import bus_bytes, fit_alpha_beta

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    args = ap.parse_args()
    files = args.files or sorted(DATA.glob("*-a2a.raw.json"))
    if not files:
        print(f"no all-to-all files under {DATA}")
        return 1
    for path in files:
        found = rows(path)
        if not found:
            print(f"{path.name}: no all-to-all records")
            continue
        raw = json.loads(path.read_text())
        n = found[0]["world_size"]
        print(f"{path.name} ({raw['provenance'].get('gpu_name')} x {n}, {raw['provenance'].get('date')}):")
        for r in found:
            print(f"  {r['size_bytes']:>11,d} B  measured {r['measured_s'] * 1e6:9.1f} us  aisim "
                  f"{r['estimated_s'] * 1e6:9.1f} us  {r['error_pct']:+6.1f}%")
        lat, bw = fit_alpha_beta([bus_bytes("all_to_all", r["size_bytes"], n) for r in found],
                                 [r["measured_s"] for r in found])
        fit = raw.get("fit") or {}
        large = [abs(r["error_pct"]) for r in found if r["size_bytes"] >= LARGE_BYTES]
        every = [abs(r["error_pct"]) for r in found]
        print(f"  all-to-all fit: latency {lat * 1e6:.1f} us, bus bandwidth {bw / 1e9:.0f} GB/s (this run's "
              f"all-reduce: {(fit.get('allreduce_latency_s') or 0) * 1e6:.1f} us, "
              f"{(fit.get('allreduce_bus_bw_bytes_per_s') or 0) / 1e9:.0f} GB/s)")
        print(f"  aisim's error: mean |error| {sum(large) / max(len(large), 1):.1f}% over {len(large)} sizes >= 1 MiB, "
              f"{sum(every) / len(every):.1f}% over all {len(every)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
