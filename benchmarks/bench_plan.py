"""Timings of the two capacity-planning searches: `aisim plan serve` and `aisim plan train`.

    python benchmarks/bench_plan.py            # both
    python benchmarks/bench_plan.py train      # one
Set AISIM_CACHE_DIR to an empty folder for a cold graph cache (every micro-batch graph traced).
Prints the candidates considered and the wall time of each search; the goal is >= 1,000 candidates in <= 60 s
on 2 CPU cores.

Measured 2026-11-26 on this 2-core machine while other jobs ran (load average 6-8):
  plan serve: 1,080 candidates (46 simulation runs, saturated bound runs included), 33 s wall.
Measured 2026-11-27 (two saturated bound runs, the second with 8 x max_num_seqs requests; runs at the load
lengthened to a steady window; configurations simulated at the load counted):
  plan serve: 1,080 candidates (12 simulated), 22.1 s wall.
  plan train (llama-2-70b, h100,a100 x 256,512,1024, default space): 2,304 candidates (1,113 pruned without a
  trace, 1,191 costed, 148 graphs traced), 24 s with the graph cache warm; 220-290 s wall (90-105 s CPU) cold,
  where tracing dominates (about 0.6 s CPU per graph). Traces are shared across GPU counts and devices, not yet
  across pipeline degrees (the traced 2- and 3-layer graphs do not depend on pp).
"""
from __future__ import annotations

import sys
import time


def bench_serve() -> None:
    from aisim.studies.plan_serve import plan_request, plan_serve

    req = plan_request(model="Mistral-7B-v0.1", devices=["h100", "a100", "l4"], rate_per_s=50.0, input_len="512",
                       output_len="256", max_gpus=64, num_requests=200)
    t = time.perf_counter()
    r = plan_serve(req)
    wall = time.perf_counter() - t
    print(f"plan serve  Mistral-7B-v0.1 h100,a100,l4 rate 50 in 512 out 256 max-gpus 64: {r.considered} candidates "
          f"({r.simulated} simulated), {len(r.ranked)} meet the SLOs, {wall:.1f} s")


def bench_train() -> None:
    from aisim.studies.plan_train import plan_train, plan_train_request

    req = plan_train_request(model="llama-2-70b", tokens=2e12, seq=4096, global_batch=1024,
                             devices=["h100", "a100"], gpus=[256, 512, 1024])
    t = time.perf_counter()
    r = plan_train(req)
    wall = time.perf_counter() - t
    best = r.ranked[0] if r.ranked else None
    print(f"plan train  llama-2-70b 2e12 tokens seq 4096 batch 1024 h100,a100 x 256,512,1024: {r.considered} "
          f"candidates ({sum(r.pruned.values())} pruned, {r.evaluated} costed, {r.traces} traces), "
          f"{len(r.ranked)} fit, {wall:.1f} s"
          + (f"; fastest {best.device} x {best.gpus} tp {best.tp} pp {best.pp} zero {best.zero} "
             f"{best.time_to_train_days:.1f} days, MFU {best.mfu:.0%}" if best else ""))


if __name__ == "__main__":
    which = sys.argv[1:] or ["serve", "train"]
    for name in which:
        {"serve": bench_serve, "train": bench_train}[name]()
