"""transformers' continuous-batching engine (transformers 5.17, generation/continuous_batching) under load.

    python3 -m aisim.validation.harness.serve_cb --out OUT/serve_cb.jsonl --step-mix [--max-minutes 2.5] [--smoke]

A model config (default harness/configs/qwen2.5-1.5b.json) with random bf16 weights on the GPU, served by
``model.init_continuous_batching(...)`` with the DEFAULT ``ContinuousBatchingConfig()`` (the engine picks num_blocks,
max_batch_tokens, CUDA graphs, attention path: all recorded per run; --cb-json overrides fields for experiments)
and the workload hints ``generate_batch`` would pass (max prompt, max new tokens, request count). EOS is disabled
(GenerationConfig(eos_token_id=-1) and add_request(eos_token_id=-1): RequestState keeps no EOS id < 0, requests.py
__post_init__), so every request generates exactly its max_new_tokens; greedy (do_sample=False).

Runs (one JSON line each, ``type: run``):
- offline: --n-offline requests submitted at once (add_request in a loop)
- poisson: --n-poisson requests per rate in --rates (req/s), a submitter thread sleeps until each seeded
  exponential inter-arrival time and calls add_request
Prompts: seeded random token ids, lengths uniform in [--in-min, --in-max]; outputs uniform in [--out-min,
--out-max] (or --out-len). Before the measured requests each run serves --warm-requests short requests (untimed).

Per request (compact, times in ms from the run's t0 = just before the first submission): ``arr`` scheduled
arrival, ``sub`` add_request time (RequestState.created_time), ``start`` leaves PENDING (lifespan[0]), ``tok`` the
time of every generated token (record_timestamps=True: RequestState._timestamps, appended when the engine's
update_batch receives the token), ``end`` finished (lifespan[1]); ``in`` / ``out`` lengths.
Per engine step (``steps``: [start_ms, step_ms, requests, q_tokens, decode_requests, kv_tokens_read, fast_path]),
from wrappers on the scheduler's schedule_batch and the batch processor's _generation_step (forward, sampling and
the device sync; the CPU batch preparation is the gap to the next start).
Per run: the resolved engine config, wall time, GPU energy (NVML total-energy counter, read on a counter step),
peak memory (torch.cuda.max_memory_allocated, KV cache included), and a summary (TTFT, TPOT, throughput).

--step-mix: single engine steps at fixed batch mixes (decode-only batches, prefill chunks, mixed), through the
engine's own path: RequestState/FutureRequestState built as its warm-up does (utils.create_warmup_future_states),
ContinuousBatchingIOs.prepare_batch_tensors, then ContinuousBatchProcessor._generation_step (the same calls as
prepare_next_batch / _generation_step in continuous_api.py). Each mix: 2 warm-up steps, --mix-reps timed steps,
wall time of the batch preparation (CPU) and of the step (synchronised), median.

--profile-steps (instead of the runs above): where one engine step spends its time, host calls vs device, at 1 and
32 running requests, isolated and in serving, with torch.profiler windows (serve_cb_profile.py); a text summary
next to --out (FILE.jsonl -> FILE.txt).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import threading
import time

from . import common

SCRIPT = "serve_cb"
MS = 1e3
DEFAULT_MIXES = ("d1x256,d8x256,d32x256,d64x256,d1x1024,d8x1024,d32x1024,d64x1024,"
                 "p256,p1024,p2048,p4x1024,p8x1024,p512+d32x1024,p2048+d64x1024")


# ---------------------------------------------------------------------------------------------------- workload


def make_requests(n: int, args, seed: int, vocab: int, rate: float | None) -> list[dict]:
    rng = random.Random(seed)
    low, high = 10, max(11, min(vocab, 32000))
    requests, t = [], 0.0
    for i in range(n):
        n_in = rng.randint(args.in_min, args.in_max)
        n_out = args.out_len or rng.randint(args.out_min, args.out_max)
        if rate:
            t += rng.expovariate(rate)
        requests.append({"id": f"r{i}", "ids": [rng.randrange(low, high) for _ in range(n_in)], "out": n_out,
                         "arrival": t if rate else 0.0})
    return requests


def generation_config(max_new_tokens: int):
    from transformers import GenerationConfig

    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)


def cb_config(args):
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    overrides = json.loads(args.cb_json) if args.cb_json else {}
    return ContinuousBatchingConfig(**overrides), overrides


def engine_info(manager, model) -> dict:
    """The engine config the manager resolved (after its batch processor and cache exist)."""
    cfg = manager.continuous_batching_config
    bp = manager.batch_processor
    cache = bp.cache
    io = bp.inputs_and_outputs
    host = io.io_pairs[0].host_io if hasattr(io, "io_pairs") else io
    masks = getattr(host, "attention_mask", None) or {}
    kv_bytes = sum(t.numel() * t.element_size() for t in list(cache.key_cache) + list(cache.value_cache))

    def compile_dict(c):
        return None if c is None else {k: (v if isinstance(v, (str, bool, int, float, type(None))) else repr(v))
                                       for k, v in c.to_dict().items()}

    return {
        "block_size": cfg.block_size, "num_blocks": cfg.num_blocks, "max_batch_tokens": cfg.max_batch_tokens,
        "kv_cache_tokens": cfg.num_blocks * cfg.block_size, "kv_cache_gb": round(kv_bytes / common.GB, 4),
        "attention_mask_gb": round(sum(m.numel() * m.element_size() for m in masks.values()) / common.GB, 4),
        "max_requests_per_batch": cfg.max_requests_per_batch, "max_blocks_per_request": cfg.max_blocks_per_request,
        "decode_fast_path": cache.max_blocks_per_request > 0,
        "use_cuda_graph": list(cfg.use_cuda_graph) if cfg.use_cuda_graph is not None else None,
        "use_async_batching": cfg.use_async_batching, "pad_inputs": bp.model_runner.pad_inputs,
        "q_padding_interval_size": cfg.q_padding_interval_size,
        "kv_padding_interval_size": cfg.kv_padding_interval_size,
        "varlen_compile_config": compile_dict(cfg.varlen_compile_config),
        "decode_compile_config": compile_dict(cfg.decode_compile_config),
        "default_compile_level": cfg.default_compile_level, "max_memory_percent": cfg.max_memory_percent,
        "scheduler": type(bp.scheduler).__name__, "safety_margin": bp.scheduler.safety_margin,
        "allow_block_sharing": cfg.allow_block_sharing, "prefix_sharing": cache.use_prefix_sharing,
        "attn_implementation": model.config._attn_implementation,
        "logits_processing": bool(bp.logit_processor.do_processing), "do_sample": bp.do_sample,
    }


class StepLog:
    """Wraps the scheduler's schedule_batch (batch composition) and _generation_step (its duration)."""

    def __init__(self, bp):
        self.steps: list[list] = []
        self.t0: float | None = None
        self.pending = None
        schedule, generation_step = bp.scheduler.schedule_batch, bp._generation_step

        def schedule_batch(token_budget, cache_budget):
            result = schedule(token_budget, cache_budget)
            requests = result[0]
            if requests:
                q = [fs.query_length for fs in requests]
                kv = sum(fs.state.position_offset for fs in requests)
                self.pending = [len(requests), sum(q), sum(1 for x in q if x == 1), kv, int(bool(result[1]))]
            return result

        def step(model):
            start = time.perf_counter()
            generation_step(model)
            duration = time.perf_counter() - start
            if self.t0 is not None and self.pending is not None:
                self.steps.append([round((start - self.t0) * MS, 2), round(duration * MS, 3), *self.pending])

        bp.scheduler.schedule_batch = schedule_batch
        bp._generation_step = step


def _wait_results(manager, wanted: set, timeout_s: float) -> tuple[dict, str]:
    results, deadline = {}, time.perf_counter() + timeout_s
    while len(results) < len(wanted):
        result = manager.get_result(timeout=0.2)
        if result is None:
            if not manager.is_running():
                return results, "engine-stopped"
            if time.perf_counter() > deadline:
                return results, "timeout"
            continue
        if result.request_id in wanted and result.is_finished():
            results[result.request_id] = result
    return results, "ok"


def _request_record(req: dict, res, t0: float) -> dict:
    rec = {"id": req["id"], "in": len(req["ids"]), "out_req": req["out"], "arr": round(req["arrival"] * MS, 2)}
    if res is None:
        rec["status"] = "missing"
        return rec
    ms = lambda t: round((t - t0) * MS, 2) if t is not None and t > 0 else None  # noqa: E731
    rec.update({"out": len(res.generated_tokens), "sub": ms(res.created_time), "start": ms(res.lifespan[0]),
                "end": ms(res.lifespan[1]), "tok": [ms(t) for t in (res.timestamps or [])]})
    if res.error:
        rec["error"] = str(res.error)[:200]
    return rec


def _run_summary(records: list[dict], steps: list[list], t_end_ms: float) -> dict:
    done = [r for r in records if r.get("tok")]
    ttft = [r["tok"][0] - r["sub"] for r in done]
    e2e = [r["end"] - r["sub"] for r in done if r.get("end") is not None]
    tpot = [(r["tok"][-1] - r["tok"][0]) / (len(r["tok"]) - 1) for r in done if len(r["tok"]) > 1]
    out_tokens = sum(r.get("out", 0) for r in records)
    in_tokens = sum(r["in"] for r in done)
    last = max((r["end"] for r in done if r.get("end") is not None), default=t_end_ms)
    q = lambda xs, p: round(sorted(xs)[min(len(xs) - 1, int(p * len(xs)))], 2) if xs else None  # noqa: E731
    return {
        "finished": len(done), "requests": len(records), "output_tokens": out_tokens, "input_tokens": in_tokens,
        "makespan_s": round(last / MS, 4),
        "output_tokens_per_s": round(out_tokens / (last / MS), 2) if last > 0 else None,
        "total_tokens_per_s": round((out_tokens + in_tokens) / (last / MS), 2) if last > 0 else None,
        "ttft_ms_median": q(ttft, 0.5), "ttft_ms_p90": q(ttft, 0.9), "ttft_ms_max": q(ttft, 1.0),
        "tpot_ms_median": q(tpot, 0.5), "tpot_ms_p90": q(tpot, 0.9),
        "e2e_ms_median": q(e2e, 0.5), "e2e_ms_p90": q(e2e, 0.9),
        "steps": len(steps), "step_ms_median": q([s[1] for s in steps], 0.5),
        "mean_requests_per_step": round(statistics.fmean(s[2] for s in steps), 2) if steps else None,
        "max_requests_per_step": max((s[2] for s in steps), default=None),
        "max_q_tokens_per_step": max((s[3] for s in steps), default=None),
    }


def run_serving(model, mode: str, rate: float | None, n: int, args, device, budget: common.Budget,
                seed: int) -> dict:
    vocab = int(model.config.vocab_size)
    requests = make_requests(n, args, seed, vocab, rate)
    warm = make_requests(args.warm_requests, argparse.Namespace(in_min=64, in_max=128, out_min=8, out_max=8,
                                                                out_len=8), seed + 999, vocab, None)
    run = {"type": "run", "mode": mode, "rate_req_s": rate, "n": n, "seed": seed, "model": args.model,
           "in_range": [args.in_min, args.in_max],
           "out_range": [args.out_len, args.out_len] if args.out_len else [args.out_min, args.out_max],
           "warm_requests": len(warm), "status": "ok"}
    from transformers.generation.continuous_batching.utils import WorkloadHints

    cb, overrides = cb_config(args)
    run["cb_overrides"] = overrides
    max_out = max(r["out"] for r in requests + warm)
    hints = WorkloadHints(max_prompt_length=max(len(r["ids"]) for r in requests + warm),
                          max_generated_length=max_out, num_requests=len(requests) + len(warm))
    run["workload_hints"] = vars(hints)
    manager = log = thread = None
    stop_submitting = threading.Event()
    t_start = time.perf_counter()
    finished = False
    try:
        common.reset_peak(device)
        run["allocated_before_gb"] = common.memory(device)["allocated_gb"]
        manager = model.init_continuous_batching(generation_config=generation_config(max_out),
                                                 continuous_batching_config=cb, workload_hints=hints)
        t = time.perf_counter()
        manager.warmup()        # creates the batch processor and cache; captures graphs if the engine uses them
        run["engine_warmup_s"] = round(time.perf_counter() - t, 3)
        run["engine"] = engine_info(manager, model)
        log = StepLog(manager.batch_processor)
        manager.start()
        for r in warm:
            manager.add_request(r["ids"], request_id=f"warm-{r['id']}", max_new_tokens=r["out"], eos_token_id=-1)
        _, warm_status = _wait_results(manager, {f"warm-{r['id']}" for r in warm}, 300)
        if warm_status != "ok":
            raise RuntimeError(f"warm-up requests: {warm_status}")
        energy = common.EnergyWindow(device)
        energy.start()
        t0 = time.perf_counter()
        log.t0 = t0

        def submit(r):
            manager.add_request(r["ids"], request_id=r["id"], max_new_tokens=r["out"], record_timestamps=True,
                                eos_token_id=-1)

        if rate is None:
            for r in requests:
                submit(r)
        else:
            def submitter():
                for r in requests:
                    wait = t0 + r["arrival"] - time.perf_counter()
                    if wait > 0 and stop_submitting.wait(wait):
                        return
                    if stop_submitting.is_set():
                        return
                    submit(r)
            thread = threading.Thread(target=submitter, daemon=True)
            thread.start()
        timeout = max(5.0, min(args.run_timeout_s, budget.left()))
        results, status = _wait_results(manager, {r["id"] for r in requests}, timeout)
        t_end = time.perf_counter()
        run["energy"] = energy.stop()
        run["status"] = status
        stop_submitting.set()
        records = [_request_record(r, results.get(r["id"]), t0) for r in requests]
        failed = [r for r in records if r.get("error") or r.get("status") == "missing"]
        if failed and status == "ok":
            # the engine thread catches a failing step (e.g. CUDA OOM) and fails the requests instead of raising
            message = failed[0].get("error") or "result missing"
            run["status"] = "oom" if "out of memory" in message.lower() else "error"
            run["error"] = f"{len(failed)} of {len(records)} requests failed; first: {message}"
        run["wall_s"] = round(t_end - t0, 4)
        run["summary"] = _run_summary(records, log.steps, (t_end - t0) * MS)
        if run["energy"].get("energy_j") is not None and run["summary"]["output_tokens"]:
            run["energy"]["j_per_output_token"] = round(run["energy"]["energy_j"] / run["summary"]["output_tokens"],
                                                        5)
        run["steps_columns"] = ["start_ms", "step_ms", "requests", "q_tokens", "decode_requests", "kv_tokens_read",
                                "fast_path"]
        run["steps"] = log.steps
        run["requests"] = records
        run.update(common.memory(device))
        finished = True
    except Exception as exc:  # noqa: BLE001 - recorded per run
        run["status"], run["error"] = common.classify_error(exc)
    finally:
        stop_submitting.set()
        if manager is not None:
            try:
                # hard stop (fail what is left) after an error, a timeout or an interrupt (KeyboardInterrupt)
                manager.stop(block=True, timeout=30, hard_stop=not finished or run["status"] != "ok")
                manager.destroy()
            except Exception as exc:  # noqa: BLE001
                run["stop_error"] = common.classify_error(exc)[1]
        if thread is not None:
            thread.join(timeout=5)
        manager = log = None            # drop the engine (its KV cache) before the next run allocates one
        common.free_memory()
    run["run_s"] = round(time.perf_counter() - t_start, 3)
    return run


# ---------------------------------------------------------------------------------------------------- step mix


def parse_mix(text: str) -> dict:
    """'d32x1024' = 32 decode rows at context 1024; 'p2048' = one prefill chunk of 2048 tokens; 'p4x1024' = 4
    prefill chunks of 1024; '+' combines."""
    decode, prefill = [], []
    for part in text.split("+"):
        kind, spec = part[0], part[1:]
        count, size = (spec.split("x") if "x" in spec else ("1", spec))
        if kind == "d":
            decode.extend([int(size)] * int(count))
        elif kind == "p":
            prefill.extend([int(size)] * int(count))
        else:
            raise ValueError(f"bad mix {text!r}")
    return {"name": text, "decode_ctx": decode, "prefill": prefill}


def run_step_mix(model, mixes: list[str], args, device, out, budget: common.Budget) -> list[dict]:
    from transformers.generation.continuous_batching.requests import (FutureRequestState, RequestState,
                                                                        RequestStatus)
    from transformers.generation.continuous_batching.utils import WorkloadHints

    cb, overrides = cb_config(args)
    parsed = [parse_mix(m) for m in mixes]
    max_len = max([c + 1 for p in parsed for c in p["decode_ctx"]] + [q for p in parsed for q in p["prefill"]])
    max_rows = max(len(p["decode_ctx"]) + len(p["prefill"]) for p in parsed)
    hints = WorkloadHints(max_prompt_length=max_len, max_generated_length=1, num_requests=max(max_rows, 64))
    rows = []
    manager = model.init_continuous_batching(generation_config=generation_config(16), continuous_batching_config=cb,
                                             workload_hints=hints)
    try:
        manager.warmup()
        bp = manager.batch_processor
        info = engine_info(manager, model)
        out.write({"type": "step_mix_engine", "model": args.model, "cb_overrides": overrides, "engine": info,
                   "method": "RequestState/FutureRequestState + inputs_and_outputs.prepare_batch_tensors + "
                             "ContinuousBatchProcessor._generation_step (continuous_api.py prepare_next_batch / "
                             "_generation_step)"})
        cache, runner, io = bp.cache, bp.model_runner, bp.inputs_and_outputs
        rng = random.Random(args.seed)
        vocab_high = max(11, min(int(model.config.vocab_size), 32000))
        for k, mix in enumerate(parsed):
            if budget.expired():
                break
            row = {"type": "step_mix", "mix": mix["name"], "decode_rows": len(mix["decode_ctx"]),
                   "decode_ctx": sorted(set(mix["decode_ctx"])), "prefill_chunks": mix["prefill"], "status": "ok"}
            ids = []
            try:
                specs = [(1, c, RequestStatus.DECODING) for c in mix["decode_ctx"]]
                specs += [(q, 0, RequestStatus.PREFILLING) for q in mix["prefill"]]
                states = []
                for j, (q, past, status) in enumerate(specs):
                    rid = f"__mix{k}_{j}"
                    tokens = [rng.randrange(10, vocab_high) for _ in range(past + q)]
                    state = RequestState(request_id=rid, initial_tokens=tokens, max_new_tokens=1)
                    state._status = status       # bypass the setter's lifecycle side effects, as the warm-up does
                    allocated = cache.allocate_blocks(math.ceil((past + q) / cache.block_size), rid, 0)
                    if allocated is None:
                        raise MemoryError(f"cache has no room for mix {mix['name']} ({len(specs)} rows)")
                    ids.append(rid)
                    state.allocated_blocks = allocated
                    states.append((FutureRequestState(state, has_new_token=True, complete_blocks=0, query_length=q),
                                   tokens[past:], past))
                futures = [s[0] for s in states]
                num_q = sum(fs.query_length for fs in futures)
                kv = sum(past for _, _, past in states)
                fast = cache.max_blocks_per_request > 0 and all(
                    fs.query_length == 1 and past < cache.max_blocks_per_request * cache.block_size
                    for fs, _, past in states)
                q_pad, kv_pad = runner.maybe_pad_inputs(num_q, kv, fast)
                row.update({"q_tokens": num_q, "kv_tokens_read": kv, "fast_path": fast, "q_padded": q_pad,
                            "kv_padded": kv_pad})
                prep, stepw = [], []
                for rep in range(2 + args.mix_reps):
                    for fs, toks, past in states:
                        fs.state.position_offset = past
                        fs.state.tokens_to_process = list(toks)
                    common.sync(device)
                    t0 = time.perf_counter()
                    io.prepare_batch_tensors(futures, bp.logit_processor, fast, q_pad, kv_pad,
                                             use_padding=runner.pad_inputs)
                    t1 = time.perf_counter()
                    bp._generation_step(model)
                    common.sync(device)
                    t2 = time.perf_counter()
                    if rep >= 2:
                        prep.append((t1 - t0) * MS)
                        stepw.append((t2 - t1) * MS)
                row.update({"prepare_ms_median": round(statistics.median(prep), 4),
                            "step_ms_median": round(statistics.median(stepw), 4),
                            "step_ms_min": round(min(stepw), 4), "step_ms_max": round(max(stepw), 4),
                            "total_ms_median": round(statistics.median(p + s for p, s in zip(prep, stepw)), 4),
                            "reps": len(stepw), "step_ms": common.rounded(stepw, 3),
                            "prepare_ms": common.rounded(prep, 3)})
            except Exception as exc:  # noqa: BLE001
                row["status"], row["error"] = common.classify_error(exc)
                if common.is_fatal_device_error(exc):
                    raise
            finally:
                for rid in ids:
                    cache.free_blocks(rid)
            out.write(row)
            rows.append(row)
            print(f"[serve_cb] step-mix {row['mix']}: {row['status']} prepare {row.get('prepare_ms_median')} ms "
                  f"step {row.get('step_ms_median')} ms", flush=True)
    finally:
        # The manager was never started, so stop() would return early: release its batch processor (cache) and
        # restore the attention implementation it switched to paged|... by hand.
        original = getattr(manager, "_original_attn_impl", None)
        manager.batch_processor = None
        if original is not None:
            model.set_attn_implementation(original)
        try:
            manager.destroy()
        except Exception:  # noqa: BLE001
            pass
        del manager
        common.free_memory()
    return rows


# -------------------------------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "tiny model, few requests, seconds on a CPU")
    parser.add_argument("--model", default="qwen2.5-1.5b", help="config name (harness/configs, model_specs) or path")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--modes", default="offline,poisson", help="serving runs: offline, poisson (or none)")
    parser.add_argument("--n-offline", type=int, default=128)
    parser.add_argument("--n-poisson", type=int, default=64)
    parser.add_argument("--rates", default="4,16", help="Poisson arrival rates, requests/s")
    parser.add_argument("--in-min", type=int, default=64)
    parser.add_argument("--in-max", type=int, default=1024)
    parser.add_argument("--out-min", type=int, default=64)
    parser.add_argument("--out-max", type=int, default=256)
    parser.add_argument("--out-len", type=int, default=None, help="fixed output length (overrides min/max)")
    parser.add_argument("--warm-requests", type=int, default=2)
    parser.add_argument("--run-timeout-s", type=float, default=120.0)
    parser.add_argument("--cb-json", default=None, help="ContinuousBatchingConfig overrides as JSON (default: none)")
    parser.add_argument("--step-mix", action="store_true", help="also time single engine steps at batch mixes")
    parser.add_argument("--mixes", default=DEFAULT_MIXES)
    parser.add_argument("--mix-reps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile-steps", action="store_true",
                        help="profile engine steps (serve_cb_profile.py) instead of the serving runs")
    parser.add_argument("--profile-out", default=None, help="text summary (default: --out with .txt)")
    parser.add_argument("--profile-ctx", type=int, default=512, help="context of the profiled requests")
    parser.add_argument("--profile-batch", type=int, default=32, help="running requests of the large case")
    parser.add_argument("--profile-out-len", type=int, default=40, help="output tokens per served request")
    parser.add_argument("--profile-reps", type=int, default=8, help="timed isolated steps per shape")
    parser.add_argument("--profile-window", type=int, default=8, help="steps under torch.profiler per window")
    parser.add_argument("--profile-fresh-steps", type=int, default=10, help="steps per backend, growing contexts")
    parser.add_argument("--profile-parts", default=None,
                        help="comma list of sdpa,isolated,thread-32,thread-1,main-32 (default: all, in that order)")
    parser.add_argument("--profile-backends", default="EFFICIENT_ATTENTION,MATH,CUDNN_ATTENTION",
                        help="SDPA backends forced in turn on the growing-context steps")
    args = parser.parse_args(argv)
    common.set_env()
    import torch

    device = common.pick_device()
    if args.smoke:
        common.smoke_threads(device)
    if args.smoke:
        args.model = "tiny-qwen2"
        args.n_offline, args.n_poisson, args.rates = 6, 6, "50"
        args.in_min, args.in_max, args.out_min, args.out_max = 8, 48, 3, 6
        args.warm_requests, args.mix_reps = 1, 2
        args.mixes = "d1x32,d4x64,p64,p32+d2x32"
        if device.type == "cpu":
            args.dtype = "fp32"
        if not args.cb_json:   # on a CPU the default sizing would take 90% of the host's RAM
            args.cb_json = json.dumps({"num_blocks": 16, "max_batch_tokens": 128, "block_size": 32})
        args.profile_ctx, args.profile_batch, args.profile_out_len = 24, 2, 5
        args.profile_reps, args.profile_window, args.profile_fresh_steps = 2, 2, 3
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    out = common.JsonlOut(args.out)
    out.write(common.header(SCRIPT, args))
    budget = common.Budget(args.max_minutes)
    t0 = time.perf_counter()
    model = common.build_causal_lm(common.hf_config(args.model), dtype, device, seed=args.seed)
    common.sync(device)
    with torch.inference_mode():    # initialise the GEMM libraries outside every timed window
        model(input_ids=torch.randint(0, 100, (1, 16), device=device))
    common.sync(device)
    out.write({"type": "model", "model": args.model, "params": common.param_count(model), "dtype": args.dtype,
               "attn_implementation": model.config._attn_implementation,
               "build_s": round(time.perf_counter() - t0, 2), **common.memory(device)})
    if args.profile_steps:
        from . import serve_cb_profile

        args.profile_shape = {"ctx": args.profile_ctx, "batch": args.profile_batch, "out_len": args.profile_out_len,
                              "fresh_steps": args.profile_fresh_steps}
        args.backends = [b for b in args.profile_backends.split(",") if b]
        if not args.profile_out and args.out:
            args.profile_out = str(args.out)[:-len(".jsonl")] + ".txt" if str(args.out).endswith(".jsonl") \
                else str(args.out) + ".txt"
        return serve_cb_profile.run(model, args, device, out, budget)
    modes = [m for m in args.modes.split(",") if m and m != "none"]
    plan = []
    if "offline" in modes:
        plan.append(("offline", None, args.n_offline))
    if "poisson" in modes:
        plan += [("poisson", rate, args.n_poisson) for rate in common.parse_floats(args.rates)]
    rows, stopped, estimate = [], False, 20.0
    try:
        for i, (mode, rate, n) in enumerate(plan):
            if not budget.allows(estimate):
                stopped = True
                break
            run = run_serving(model, mode, rate, n, args, device, budget, args.seed + i)
            estimate = max(10.0, run["run_s"] * 0.8)
            out.write(run)
            summary = {"mode": mode, "rate": rate, "n": n, "status": run["status"], **(run.get("summary") or {}),
                       "num_blocks": (run.get("engine") or {}).get("num_blocks"),
                       "max_batch_tokens": (run.get("engine") or {}).get("max_batch_tokens"),
                       "energy_j": (run.get("energy") or {}).get("energy_j")}
            rows.append(summary)
            print(f"[serve_cb] {mode} rate={rate} n={n}: {run['status']} {run.get('error', '')} "
                  f"makespan {summary.get('makespan_s')} s, {summary.get('output_tokens_per_s')} out tok/s, "
                  f"engine {json.dumps(run.get('engine'))[:400]}", flush=True)
        mix_rows = []
        if args.step_mix and not stopped and budget.allows(10):
            mix_rows = run_step_mix(model, [m for m in args.mixes.split(",") if m], args, device, out, budget)
    except KeyboardInterrupt:
        stopped = True
        mix_rows = []
    if stopped:
        out.write({"type": "stopped", "reason": "time budget or interrupt", "runs_done": len(rows)})
    common.print_table(rows, ["mode", "rate", "n", "status", "makespan_s", "output_tokens_per_s", "ttft_ms_median",
                              "tpot_ms_median", "steps", "mean_requests_per_step", "num_blocks", "max_batch_tokens",
                              "energy_j"], title=f"serve_cb {args.model}")
    if mix_rows:
        common.print_table(mix_rows, ["mix", "q_tokens", "kv_tokens_read", "fast_path", "prepare_ms_median",
                                      "step_ms_median", "status"], title="serve_cb step mixes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
