"""Derive transformers-cb's per-step host times (hardware_specs/runtimes/transformers-cb.yaml, serving.
attention_graph_build_s and scheduler_overhead_s).

attention_graph_build_s: cuDNN SDPA called alone with a key count new at each call, less the same call repeated
(the profile_sdpa_fresh records of the engine profiles, validation/data/profiles/cb-*-profile.jsonl: a
microbenchmark of one kernel call, not the serving runs).
scheduler_overhead_s: from the engine run on a 2-layer, 256-wide model whose GPU work is negligible
(validation/data/serve/cbhost-llama-h100.jsonl, written by validation/harness/serve_cb.py --model cbhost-llama):
each step's cycle (its recorded time plus the gap to the next step) less aisim's own estimate of that model's
forward, the profile's batch-preparation terms and one graph build where the step's shape is new in its run is the
loop's host work. The median over every step of the three runs is the calibration. None of the judged serving runs
(cb-qwen2.5-1.5b, cb-llama-3-8b) is read.

    python -m aisim.validation.scripts.derive_cb_host [--profiles]

--profiles: the check of aisim's packed-mask attention kernel by kernel against the H100 profiles of the engine's
own steps (validation/data/profiles/cb-*-profile.jsonl, serve_cb --profile-steps): per isolated step shape, the
measured cuDNN SDPA time per layer, the non-contiguous (generic elementwise) copies and the index_select gathers
per step, against aisim's terms for them (timer.StepCostTimer._packed_s); nothing is fitted.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent.parent / "data" / "serve" / "cbhost-llama-h100.jsonl"
PROFILES = Path(__file__).resolve().parent.parent / "data" / "profiles"
PROFILED = {"Meta-Llama-3-8B": "Meta-Llama-3-8B",
            "qwen2.5-1.5b": str(Path(__file__).resolve().parent.parent / "harness" / "configs" / "qwen2.5-1.5b.json")}
# the isolated shapes of serve_cb --profile-steps (defaults): decoding requests x context, or one prompt of 512
PROFILE_SHAPES = {"d1": (1, 512), "d32": (32, 512), "d64x1024": (64, 1024), "p": (0, 512)}
CONFIG = Path(__file__).resolve().parent.parent / "harness" / "configs" / "cbhost-llama.json"


def graph_build_s() -> dict:
    """serving.attention_graph_build_s: cuDNN SDPA called alone (serve_cb --profile-steps, profile_sdpa_fresh: 32
    queries over 16,384 keys, the model's heads) with a key count new at each call, less the same call at a repeated
    key count; the median over the profiled models."""
    builds = {}
    for name in PROFILED:
        path = PROFILES / f"cb-{name}-profile.jsonl"
        for r in map(json.loads, path.read_text().splitlines() if path.is_file() else []):
            if r.get("type") == "profile_sdpa_fresh":
                builds[name] = (r["wall_ms"]["K+1 per call"] - r["wall_ms"]["same K"]) / 1e3
    if not builds:
        raise SystemExit(f"no profile_sdpa_fresh records in {PROFILES}/cb-*-profile.jsonl")
    return {"per_model_s": builds, "median_s": float(np.median(list(builds.values())))}


def derive() -> dict:
    """serving.scheduler_overhead_s: per step of the cbhost runs, the cycle less aisim's forward, the preparation
    terms and, where the step's (query, key) count is new in its run (each run is a new engine thread, so a new
    graph cache), one graph build (graph_build_s); the median."""
    from aisim.scenario import scenario
    from aisim.step import step_cost
    from aisim.workload import StepShape

    sc = scenario(str(CONFIG), "h100", dtype="bf16", runtime="transformers-cb")
    s = sc.runtime.serving
    build = graph_build_s()["median_s"]
    loop, new_steps = [], 0
    for line in DATA.read_text().splitlines():
        run = json.loads(line)
        if run.get("type") != "run":
            continue
        steps = run["steps"]  # start_ms, step_ms, requests, q_tokens, decode_requests, kv_tokens_read
        built = set()
        for cur, nxt in zip(steps, steps[1:]):
            cycle_s = (nxt[0] - cur[0]) / 1e3
            forward = step_cost(sc, StepShape(phase="prefill", batch=1, seq=max(int(cur[3]), 1))).runtime_s
            prepare = s.prepare_s + s.prepare_per_seq_s * cur[2] + s.prepare_per_kv_token_s * cur[5]
            new = (cur[3], cur[5]) not in built
            built.add((cur[3], cur[5]))
            new_steps += new
            loop.append(cycle_s - forward - prepare - build * new)
    loop = np.array(loop)
    return {"steps": len(loop), "new_shape_steps": new_steps, "graph_build_s": build,
            "median_s": float(np.median(loop)), "p10_s": float(np.percentile(loop, 10)),
            "p90_s": float(np.percentile(loop, 90))}


def profile_check() -> list[dict]:
    """Measured (profile windows of isolated engine steps) against aisim's packed-mask terms, per model and shape."""
    from aisim.scenario import scenario
    from aisim.studies.serve.steptime import BatchShape
    from aisim.studies.serve.timer import StepCostTimer

    rows = []
    for name, model in PROFILED.items():
        path = PROFILES / f"cb-{name}-profile.jsonl"
        if not path.is_file():
            continue
        records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        windows = {r["shape"]: r for r in records if r.get("type") == "profile_window" and r.get("part") == "isolated"}
        steps = {r["shape"]: r["summary"] for r in records
                 if r.get("type") == "profile_phases" and r.get("part") == "isolated" and "summary" in r}
        sc = scenario(model, "h100", dtype="bf16", runtime="transformers-cb")
        timer = StepCostTimer(sc, 8192)
        d, e = timer.dims, timer.dims.element_bytes
        for shape, (n, ctx) in PROFILE_SHAPES.items():
            if shape not in windows:
                continue
            kernels = windows[shape]["top_kernels"]

            def measured(part: str, kernels=kernels) -> tuple[float, float]:
                hits = [k for k in kernels if part in k["kernel"]]
                return sum(k["ms_per_step"] for k in hits), sum(k["calls_per_step"] for k in hits)

            batch = (BatchShape(0, 0.0, 0, n, float(n * (ctx + 1))) if n
                     else BatchShape(ctx, float(ctx * ctx), 1, 0, 0.0, float(ctx)))
            q, k = batch.tokens, (n * (ctx + 1) if n else ctx)
            q_row, kv_row = d.q_heads * d.head_dim * e, d.kv_heads * d.head_dim * e
            sdpa_ms, sdpa_calls = measured("sdpa")
            copy_ms, copy_calls = measured("gpu_kernel_impl_nocast<at::native::direct_copy")
            gather_ms, _ = measured("vectorized_gather")
            flops = 4.0 * q * k * d.q_heads * d.head_dim
            sdpa_bytes = e * (2 * q * d.q_heads * d.head_dim + 2 * k * d.q_heads * d.head_dim + q * k)
            copies = 2 * d.layers * (timer._memory_s(2 * q * q_row, strided=True)
                                     + timer._memory_s(k * kv_row + k * q_row, strided=True))
            rows.append({
                "model": name, "shape": shape, "step_ms": steps.get(shape, {}).get("step_ms"),
                "kernel_ms": windows[shape]["kernel_ms_per_step"],
                "aisim_forward_ms": 1e3 * (timer.step_time_s(batch) - timer._host_s(batch)),
                "sdpa_ms_per_layer": sdpa_ms / max(sdpa_calls, 1),
                "aisim_sdpa_ms_per_layer": 1e3 * timer._masked_sdpa_s(q, k, flops, sdpa_bytes),
                "strided_copies_ms": copy_ms, "strided_copies_calls": copy_calls, "aisim_strided_copies_ms": 1e3 * copies,
                "gather_ms": gather_ms,
                "aisim_gather_ms": 1e3 * 2 * d.layers * timer._memory_s(2 * k * kv_row) if n else 0.0})
    return rows


if __name__ == "__main__":
    import sys

    if "--profiles" in sys.argv[1:]:
        for row in profile_check():
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}))
    else:
        print(json.dumps(derive(), indent=1))
