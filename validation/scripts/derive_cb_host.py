"""Derive transformers-cb's per-step host loop time (hardware_specs/runtimes/transformers-cb.yaml,
serving.scheduler_overhead_s) from the engine run on a 2-layer, 256-wide model whose GPU work is negligible
(validation/data/serve/cbhost-llama-h100.jsonl, written by validation/harness/serve_cb.py --model cbhost-llama):
each step's cycle (its recorded time plus the gap to the next step) less aisim's own estimate of that model's
forward and the profile's batch-preparation terms is the loop's host work. The median over every step of the
three runs is the calibration. None of the judged serving runs (cb-qwen2.5-1.5b, cb-llama-3-8b) is read.

    python -m aisim.validation.scripts.derive_cb_host
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent.parent / "data" / "serve" / "cbhost-llama-h100.jsonl"
CONFIG = Path(__file__).resolve().parent.parent / "harness" / "configs" / "cbhost-llama.json"


def derive() -> dict:
    from aisim.scenario import scenario
    from aisim.step import step_cost
    from aisim.workload import StepShape

    sc = scenario(str(CONFIG), "h100", dtype="bf16", runtime="transformers-cb")
    s = sc.runtime.serving
    loop = []
    for line in DATA.read_text().splitlines():
        run = json.loads(line)
        if run.get("type") != "run":
            continue
        steps = run["steps"]  # start_ms, step_ms, requests, q_tokens, decode_requests, kv_tokens_read
        for cur, nxt in zip(steps, steps[1:]):
            cycle_s = (nxt[0] - cur[0]) / 1e3
            forward = step_cost(sc, StepShape(phase="prefill", batch=1, seq=max(int(cur[3]), 1))).runtime_s
            prepare = s.prepare_s + s.prepare_per_seq_s * cur[2] + s.prepare_per_kv_token_s * cur[5]
            loop.append(cycle_s - forward - prepare)
    loop = np.array(loop)
    return {"steps": len(loop), "median_s": float(np.median(loop)), "p10_s": float(np.percentile(loop, 10)),
            "p90_s": float(np.percentile(loop, 90))}


if __name__ == "__main__":
    print(json.dumps(derive(), indent=1))
