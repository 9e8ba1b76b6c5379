"""serve_cb --profile-steps: where one step of transformers' continuous-batching engine spends its time.

    python3 -m aisim.validation.harness.serve_cb --profile-steps --model qwen2.5-1.5b \
        --out OUT/cb-qwen2.5-1.5b-profile.jsonl [--max-minutes 1] [--smoke]

writes OUT/cb-qwen2.5-1.5b-profile.jsonl (one line per step and per profiled window) and the text summary
OUT/cb-qwen2.5-1.5b-profile.txt. Every step is split into its engine calls (continuous_api.py
ContinuousBatchProcessor.prepare_next_batch / _generation_step / update_batch; inside the step
input_outputs.py get_model_kwargs, model_runner.py compute_batch (the forward, launched on the compute stream) and
retrieve_device_outputs (compute_stream.synchronize)), each timed with perf_counter, plus the device span of the
forward (CUDA events on the compute stream) and the time in Python's garbage collector. Parts:

- isolated: single steps built as --step-mix builds them (main thread), at 1 and 32 decoding requests and one
  prefill chunk, the same shape repeated; then 32 decoding requests whose contexts grow by one token per step as
  in serving ("fresh": a new key length every step), under the default SDPA backend choice and under each backend
  forced (torch.nn.attention.sdpa_kernel);
- thread: the engine serving 32 requests (and then 1) in its own background thread (manager.start(), as
  run_serving), a window of steps under torch.profiler started and stopped inside that thread;
- main: the same 32 requests with the engine's loop body driven from the main thread (no background thread).
torch.profiler windows: top device kernels per step, operator tables by self CPU and self device time, kernels
and CPU time per step.
"""
from __future__ import annotations

import gc
import math
import random
import statistics
import threading
import time
from collections import defaultdict
from pathlib import Path

from . import common

MS = 1e3
PHASES = ("prepare", "kwargs", "compute_host", "sync_wait", "update")


class PhaseClock:
    """Wraps the batch processor's per-step calls with timers; one record per engine step.

    prepare: prepare_next_batch (serving: scheduling + prepare_batch_tensors) or prepare_batch_tensors (isolated);
    kwargs: get_model_kwargs; compute_host: model_runner.compute_batch until it returns (the host launches the
    forward); sync_wait: retrieve_device_outputs (compute_stream.synchronize); update: update_batch;
    step: _generation_step as a whole; device_ms: CUDA-event span of compute_batch on the compute stream; gc_ms:
    time in the garbage collector during the step's calls."""

    def __init__(self, bp, device):
        self.bp, self.cuda = bp, device.type == "cuda"
        self.records: list[dict] = []
        self.current: dict = {}
        self.events: list = []
        self.on_step = None          # callable(step_index, "before"|"after") for profiler windows
        self._gc_t0 = None
        self._in_prepare = False
        self._originals = []
        io, runner = bp.inputs_and_outputs, bp.model_runner
        self._wrap(bp, "prepare_next_batch", "prepare")
        self._wrap(io, "prepare_batch_tensors", "prepare")
        self._wrap(io, "get_model_kwargs", "kwargs")
        self._wrap(runner, "compute_batch", "compute_host", events=True)
        self._wrap(io, "retrieve_device_outputs", "sync_wait")
        self._wrap(bp, "update_batch", "update", closes=True)
        self._wrap_step(bp)
        gc.callbacks.append(self._gc)

    def _gc(self, phase, info):
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0 is not None:
            self.current["gc_ms"] = self.current.get("gc_ms", 0.0) + (time.perf_counter() - self._gc_t0) * MS
            self.current["gc_runs"] = self.current.get("gc_runs", 0) + 1
            self._gc_t0 = None

    def _wrap(self, obj, name, phase, events=False, closes=False):
        original = getattr(obj, name)
        self._originals.append((obj, name, original, name in vars(obj)))
        clock = self

        def wrapper(*args, **kwargs):
            if phase == "prepare":
                if clock._in_prepare:                       # prepare_batch_tensors inside prepare_next_batch
                    return original(*args, **kwargs)
                if clock.current.get("step_ms") is not None:
                    clock._close()                          # isolated steps have no update_batch
                clock._in_prepare = True
                try:
                    t0 = time.perf_counter()
                    result = original(*args, **kwargs)
                    elapsed = (time.perf_counter() - t0) * MS
                finally:
                    clock._in_prepare = False
                if result is not False:                     # False: prepare_next_batch found nothing to run
                    clock.current["prepare"] = clock.current.get("prepare", 0.0) + elapsed
                return result
            stream = getattr(clock.bp.inputs_and_outputs, "compute_stream", None)
            start_event = end_event = None
            if events and clock.cuda and stream is not None:
                import torch

                start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start_event.record(stream)
            t0 = time.perf_counter()
            result = original(*args, **kwargs)
            clock.current[phase] = clock.current.get(phase, 0.0) + (time.perf_counter() - t0) * MS
            if end_event is not None:
                end_event.record(stream)
                clock.events.append((clock.current, start_event, end_event))
            if closes:
                clock._close()
            return result

        setattr(obj, name, wrapper)

    def _wrap_step(self, bp):
        original = bp._generation_step
        self._originals.append((bp, "_generation_step", original, "_generation_step" in vars(bp)))
        clock = self

        def step(model):
            index = len(clock.records)
            io = clock.bp.inputs_and_outputs
            clock.current.update({"requests": io.num_request_in_batch, "q_tokens": io.num_q_tokens,
                                  "kv_read": io.max_kv_read})
            if clock.on_step is not None:
                clock.on_step(index, "before")
            t0 = time.perf_counter()
            result = original(model)
            clock.current["step_ms"] = (time.perf_counter() - t0) * MS
            if clock.on_step is not None:
                clock.on_step(index, "after")
            return result

        bp._generation_step = step

    def _close(self):
        if self.current.get("step_ms") is not None:
            self.records.append(self.current)
        self.current = {}

    def finish(self) -> list[dict]:
        """Close the last step, resolve the CUDA events, unwrap; the records with rounded times."""
        self._close()
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        for record, start, end in self.events:
            record["device_ms"] = start.elapsed_time(end)
        self.events = []
        for obj, name, original, was_instance_attribute in reversed(self._originals):
            if was_instance_attribute:
                setattr(obj, name, original)
            else:
                delattr(obj, name)
        self._originals = []
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)
        return [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in self.records]


def phase_summary(records: list[dict]) -> dict:
    """Median of each phase over the records (0 for a phase a record lacks), and the step count."""
    keys = ("step_ms", "device_ms", *PHASES, "gc_ms")
    out = {"steps": len(records)}
    for key in keys:
        values = [r.get(key, 0.0) or 0.0 for r in records]
        out[key] = round(statistics.median(values), 3) if values else None
    for key in ("requests", "q_tokens", "kv_read"):
        values = [r[key] for r in records if key in r]
        out[key] = statistics.median(values) if values else None
    if records:
        out["cycle_ms"] = round(sum(out[k] or 0.0 for k in ("prepare", "step_ms", "update")), 3)
    return out


# ---------------------------------------------------------------------------------------------------- profiler


class Window:
    """torch.profiler over steps [first, first + count) of a PhaseClock, started and stopped in the thread that runs
    the steps (torch.profiler records the CPU operators of the thread that starts it)."""

    def __init__(self, device, first: int, count: int):
        self.device, self.first, self.count = device, first, count
        self.prof = None
        self.error = None
        self.steps = 0
        self.completed = False
        self.done = threading.Event()

    def hook(self, index: int, when: str) -> None:
        try:
            if when == "before" and index == self.first and self.prof is None:
                self.prof = _profiler(self.device)
                self.prof.start()
            elif when == "after" and self.prof is not None and not self.done.is_set():
                self.steps += 1
                if index < self.first + self.count - 1:
                    return
                common.sync(self.device)
                self.prof.stop()
                self.completed = True
                self.done.set()
        except Exception as exc:  # noqa: BLE001 - a failed profiler must not kill the engine's thread
            self.error = common.classify_error(exc)[1]
            self.done.set()

    def close(self) -> None:
        """After the steps: a window the steps did not complete is dropped (a profiler is stopped by the thread
        that started it)."""
        self.done.set()


def _profiler(device):
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    try:
        from torch._C._profiler import _ExperimentalConfig

        return profile(activities=activities, experimental_config=_ExperimentalConfig(enable_cuda_sync_events=True))
    except Exception:  # noqa: BLE001 - older torch
        return profile(activities=activities)


def profile_report(prof, steps: int, label: str, limit: int = 20) -> tuple[dict, str]:
    """Per-step kernel time, kernel count and CPU operator time of a profiled window, and its text tables."""
    kernels = defaultdict(lambda: [0, 0.0])
    syncs = defaultdict(lambda: [0, 0.0])
    for name, duration in common.device_events(prof):
        entry = (syncs if "Sync" in name or "Wait Event" in name else kernels)[name]
        entry[0] += 1
        entry[1] += duration
    averages = prof.key_averages()
    cpu_rows = sorted(averages, key=lambda a: -a.self_cpu_time_total)
    kernel_us = sum(v[1] for v in kernels.values())
    summary = {"label": label, "steps": steps, "kernels_per_step": round(sum(v[0] for v in kernels.values()) / steps, 1),
               "kernel_ms_per_step": round(kernel_us / steps / 1e3, 3),
               "cpu_op_ms_per_step": round(sum(a.self_cpu_time_total for a in averages) / steps / 1e3, 3),
               "top_kernels": [{"kernel": name[:160], "calls_per_step": round(c / steps, 2),
                                "ms_per_step": round(t / steps / 1e3, 4)}
                               for name, (c, t) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:limit]],
               "top_cpu_ops": [{"op": a.key[:120], "calls_per_step": round(a.count / steps, 2),
                                "self_cpu_ms_per_step": round(a.self_cpu_time_total / steps / 1e3, 4)}
                               for a in cpu_rows[:limit]],
               "sync_events": [{"event": name[:80], "calls_per_step": round(c / steps, 2),
                                "ms_per_step": round(t / steps / 1e3, 4)} for name, (c, t) in syncs.items()],
               "attention_ops": sorted({a.key for a in averages if "attention" in a.key.lower()
                                        or "sdpa" in a.key.lower() or "cudnn" in a.key.lower()})}
    lines = [(f"---- {label}: {steps} steps; {summary['kernels_per_step']} kernels and "
              f"{summary['kernel_ms_per_step']} ms of kernel time per step, {summary['cpu_op_ms_per_step']} ms of "
              f"operator self CPU time per step; attention ops: {', '.join(summary['attention_ops']) or '-'}"),
             f"{'ms/step':>10} {'calls/step':>10}  device kernel"]
    for k in summary["top_kernels"]:
        lines.append(f"{k['ms_per_step']:>10.3f} {k['calls_per_step']:>10.2f}  {k['kernel'][:150]}")
    for k in summary["sync_events"]:
        lines.append(f"{k['ms_per_step']:>10.3f} {k['calls_per_step']:>10.2f}  [sync] {k['event']}")
    lines.append(f"{'self CPU ms/step':>16} {'calls/step':>10}  operator (by self CPU time)")
    for a in summary["top_cpu_ops"]:
        lines.append(f"{a['self_cpu_ms_per_step']:>16.3f} {a['calls_per_step']:>10.2f}  {a['op']}")
    for key in ("self_device_time_total", "self_cuda_time_total"):
        try:
            lines.append(averages.table(sort_by=key, row_limit=limit, max_name_column_width=70))
            break
        except Exception:  # noqa: BLE001 - key names differ between torch versions
            continue
    return summary, "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- requests


def _prompt(rng, n: int, vocab_high: int) -> list[int]:
    return [rng.randrange(10, vocab_high) for _ in range(n)]


def _new_manager(model, args, n_requests: int, prompt: int, out_len: int):
    from transformers.generation.continuous_batching.utils import WorkloadHints

    from .serve_cb import cb_config, generation_config

    cb, _ = cb_config(args)
    hints = WorkloadHints(max_prompt_length=prompt, max_generated_length=out_len, num_requests=n_requests)
    manager = model.init_continuous_batching(generation_config=generation_config(out_len),
                                             continuous_batching_config=cb, workload_hints=hints)
    manager.warmup()
    return manager


def _release(manager, model, started: bool) -> None:
    try:
        if started:
            manager.stop(block=True, timeout=30, hard_stop=True)
        else:
            original = getattr(manager, "_original_attn_impl", None)
            manager.batch_processor = None
            if original is not None:
                model.set_attn_implementation(original)
        manager.destroy()
    except Exception:  # noqa: BLE001
        pass
    common.free_memory()


# ------------------------------------------------------------------------------------------------------ parts


def isolated(model, args, device, budget, emit) -> list[str]:
    """Single steps through the engine's own calls (main thread): repeated shapes, then fresh shapes per backend."""
    import torch
    from transformers.generation.continuous_batching.requests import (
        FutureRequestState,
        RequestState,
        RequestStatus,
    )

    p = args.profile_shape
    mixes = [("d1", [p["ctx"]], []), (f"d{p['batch']}", [p["ctx"]] * p["batch"], []),
             (f"d{2 * p['batch']}x{2 * p['ctx']}", [2 * p["ctx"]] * (2 * p["batch"]), []), ("p", [], [p["ctx"]])]
    fresh_steps = p["fresh_steps"]
    manager = _new_manager(model, args, max(2 * p["batch"], 8),
                           2 * p["ctx"] + fresh_steps * (2 + len(args.backends)) + 64, 16)
    texts = []
    try:
        from .serve_cb import engine_info

        emit({"type": "profile_engine", "model": args.model, "engine": engine_info(manager, model)})
        bp = manager.batch_processor
        cache, runner, io = bp.cache, bp.model_runner, bp.inputs_and_outputs
        rng = random.Random(args.seed)
        vocab_high = max(11, min(int(model.config.vocab_size), 32000))
        grow = fresh_steps * (2 + len(args.backends)) + 4

        def build(name, decode_ctx, prefill):
            specs = [(1, c, RequestStatus.DECODING) for c in decode_ctx]
            specs += [(q, 0, RequestStatus.PREFILLING) for q in prefill]
            states = []
            for j, (q, past, status) in enumerate(specs):
                rid = f"__prof_{name}_{j}"
                tokens = _prompt(rng, past + q + grow, vocab_high)
                state = RequestState(request_id=rid, initial_tokens=tokens, max_new_tokens=1)
                state._status = status
                allocated = cache.allocate_blocks(math.ceil((past + q + grow) / cache.block_size), rid, 0)
                if allocated is None:
                    raise MemoryError(f"cache has no room for {name}")
                state.allocated_blocks = allocated
                fs = FutureRequestState(state, has_new_token=True, complete_blocks=0, query_length=q)
                states.append((fs, tokens, past, q, rid))
            return states

        def run_steps(states, n, grow_by=0, offset=0):
            futures = [s[0] for s in states]
            for i in range(n):
                extra = offset + i * grow_by
                kv = 0
                for fs, tokens, past, q, _ in states:
                    start = past + extra if q == 1 else past
                    fs.state.position_offset = start
                    fs.state.tokens_to_process = list(tokens[start:start + q])
                    kv += start
                q_pad, kv_pad = runner.maybe_pad_inputs(sum(s[3] for s in states), kv, False)
                io.prepare_batch_tensors(futures, bp.logit_processor, False, q_pad, kv_pad,
                                         use_padding=runner.pad_inputs)
                bp._generation_step(model)
            common.sync(device)

        for name, decode_ctx, prefill in mixes:
            if not budget.allows(8):
                break
            ctx = (decode_ctx or prefill)[0]
            states = []
            try:
                states = build(name, decode_ctx, prefill)
                clock = PhaseClock(bp, device)
                run_steps(states, 3)
                clock.finish()
                clock = PhaseClock(bp, device)
                run_steps(states, args.profile_reps)
                records = clock.finish()
                summary = phase_summary(records)
                emit({"type": "profile_phases", "part": "isolated", "shape": name, "context": ctx,
                      "summary": summary, "steps": records})
                texts.append(_phase_line(f"isolated {name} ctx {ctx} (same shape every step)", summary))
                window = Window(device, 0, args.profile_window)
                clock = PhaseClock(bp, device)
                clock.on_step = window.hook
                run_steps(states, args.profile_window)
                clock.finish()
                if window.completed:
                    prof_summary, text = profile_report(window.prof, max(window.steps, 1),
                                                        f"isolated {name} ctx {ctx}")
                    emit({"type": "profile_window", "part": "isolated", "shape": name, **prof_summary})
                    texts.append(text)
            except Exception as exc:  # one shape failing (no room in the cache) is a result; the next goes on
                status, error = common.classify_error(exc)
                emit({"type": "profile_phases", "part": "isolated", "shape": name, "status": status, "error": error})
                texts.append(f"== isolated {name}: {status}: {error}")
                if common.is_fatal_device_error(exc):
                    raise
            finally:
                for s in states:
                    cache.free_blocks(s[4])

        # Fresh shapes: the decoding batch's contexts grow by one token per step (a new key length every step, as
        # in serving), under the default backend choice and each forced backend.
        from torch.nn.attention import SDPBackend, sdpa_kernel

        name = f"d{p['batch']}"
        states = build(name + "-fresh", [p["ctx"]] * p["batch"], [])
        try:
            offset = 0
            for backend in ["default", *args.backends, "default-profiled"]:
                if not budget.allows(6):
                    break
                row = {"type": "profile_phases", "part": "isolated-fresh", "shape": name, "context": p["ctx"],
                       "backend": backend, "status": "ok"}
                clock = PhaseClock(bp, device)
                # the timed series run without the profiler; a last default one under it (its times inflated)
                window = Window(device, 0, min(args.profile_window, fresh_steps)) if backend == "default-profiled" \
                    else None
                clock.on_step = window.hook if window else None
                try:
                    context = (sdpa_kernel([getattr(SDPBackend, backend)]) if not backend.startswith("default")
                               else _null_context())
                    with context:
                        run_steps(states, fresh_steps, grow_by=1, offset=offset)
                except Exception as exc:  # a backend that refuses these inputs is a result
                    row["status"], row["error"] = common.classify_error(exc)
                    if common.is_fatal_device_error(exc):
                        raise
                offset += fresh_steps
                records = clock.finish()
                if window is not None:
                    window.close()
                row["summary"] = phase_summary(records[1:] if len(records) > 1 else records)
                row["steps"] = records
                emit(row)
                texts.append(_phase_line(f"isolated {name} ctx {p['ctx']}+1/step (fresh key length), SDPA "
                                         f"{backend}", row["summary"], row.get("error")))
                if window is not None and window.completed:
                    prof_summary, text = profile_report(window.prof, max(window.steps, 1),
                                                        f"isolated {name} fresh shapes, SDPA default "
                                                        "(under the profiler)")
                    emit({"type": "profile_window", "part": "isolated-fresh", "shape": name, **prof_summary})
                    texts.append(text)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        finally:
            for s in states:
                cache.free_blocks(s[4])
    finally:
        _release(manager, model, started=False)
    return texts


def _null_context():
    import contextlib

    return contextlib.nullcontext()


def serving(model, args, device, budget, emit, n_requests: int, threaded: bool) -> list[str]:
    """The engine serving n_requests (prompt ctx, output out_len) in its background thread (threaded) or with its
    loop body driven from this thread; a profiler window over decode steps when threaded."""
    p = args.profile_shape
    manager = _new_manager(model, args, n_requests, p["ctx"], p["out_len"])
    texts = []
    part = ("thread" if threaded else "main") + f"-{n_requests}"
    rng = random.Random(args.seed + n_requests)
    vocab_high = max(11, min(int(model.config.vocab_size), 32000))
    prompts = [_prompt(rng, p["ctx"], vocab_high) for _ in range(n_requests)]
    prefill_steps = math.ceil(n_requests * p["ctx"] / manager.batch_processor.max_batch_tokens) + 1
    count = max(1, min(args.profile_window, p["out_len"] - 4))
    first = max(1, min(prefill_steps + 2, p["out_len"] - count - 2))
    window = Window(device, first, count) if threaded else None
    clock = PhaseClock(manager.batch_processor, device)
    clock.on_step = window.hook if window else None
    started = False
    status = "ok"
    t0 = time.perf_counter()
    try:
        ids = [f"prof-{part}-{i}" for i in range(n_requests)]
        if threaded:
            manager.start()
            started = True
        for rid, prompt in zip(ids, prompts):
            manager.add_request(prompt, request_id=rid, max_new_tokens=p["out_len"], eos_token_id=-1)
        if threaded:
            from .serve_cb import _wait_results

            _, status = _wait_results(manager, set(ids), max(5.0, min(60.0, budget.left())))
        else:
            bp = manager.batch_processor
            manager.current_batch = 0
            finished, deadline = 0, time.perf_counter() + max(5.0, min(60.0, budget.left()))
            while finished < n_requests:
                manager._generation_loop_body(bp, bootstrapping=False)
                while not manager.output_router.output_queue.empty():
                    if manager.output_router.output_queue.get_nowait().is_finished():
                        finished += 1
                if time.perf_counter() > deadline:
                    status = "timeout"
                    break
    except Exception as exc:  # noqa: BLE001
        status = common.classify_error(exc)[1]
    finally:
        if window is not None:
            window.done.wait(timeout=5)
            window.close()
        records = clock.finish()
        _release(manager, model, started)
    decode = [r for r in records if r.get("q_tokens") == r.get("requests")]
    summary = phase_summary(decode)
    emit({"type": "profile_phases", "part": part, "status": status, "requests": n_requests, "context": p["ctx"],
          "out_len": p["out_len"], "wall_s": round(time.perf_counter() - t0, 3), "summary_decode": summary,
          "summary_all": phase_summary(records), "steps": records})
    where = "the engine's background thread" if threaded else "loop body driven from the main thread"
    texts.append(_phase_line(f"serving {n_requests} requests ({where}), decode steps", summary,
                             None if status == "ok" else status))
    if window is not None and window.completed:
        prof_summary, text = profile_report(window.prof, max(window.steps, 1), f"serving {n_requests} requests, "
                                                                        f"{where}, decode steps")
        emit({"type": "profile_window", "part": part, **prof_summary})
        texts.append(text)
    elif window is not None:
        texts.append(f"---- serving {n_requests}: profiler window (steps {first}..{first + count - 1}) not completed: "
                     f"{window.error or 'too few steps'}")
    return texts


def _phase_line(label: str, s: dict, error: str | None = None) -> str:
    if error:
        return f"== {label}: {error}"
    parts = " ".join(f"{k} {s.get(k)}" for k in ("prepare", "kwargs", "compute_host", "sync_wait", "update", "gc_ms"))
    return (f"== {label}: {s['steps']} steps, median step {s['step_ms']} ms (device span {s['device_ms']} ms), "
            f"cycle {s.get('cycle_ms')} ms; {parts}; requests {s.get('requests')} q {s.get('q_tokens')} "
            f"kv {s.get('kv_read')}")


def sdpa_masks(model, args, device, budget, emit) -> list[str]:
    """PyTorch SDPA alone at the model's heads, with the mask as paged|sdpa passes it (a [1, 1, Q, K] view of the
    engine's [1, 1, M, N + M] buffer: rows N + M apart, input_outputs.py 180-191 and 517-518) and contiguous (as
    validation/harness/sdpa_mask.py measured the calibration's table): CUDA-event median and the kernels that ran."""
    import torch

    cfg = model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    dt = next(model.parameters()).dtype
    row_stride = 1_500_000 if device.type == "cuda" else 4096
    shapes = [(1, 1024), (32, 16384), (64, 65536)] if device.type == "cuda" else [(1, 64), (4, 256)]
    texts, lines = [], [f"{'Q':>5} {'K':>7} {'mask':>10} {'median_ms':>10}  kernels"]
    for q, k in shapes:
        if not budget.allows(5):
            break
        query = torch.randn(1, heads, q, head_dim, device=device, dtype=dt)
        key = torch.randn(1, heads, k, head_dim, device=device, dtype=dt)
        value = torch.randn(1, heads, k, head_dim, device=device, dtype=dt)
        buffer = torch.zeros(1, 1, q, max(row_stride, k + 64), device=device, dtype=dt)
        masks = {"contiguous": torch.zeros(1, 1, q, k, device=device, dtype=dt), "engine-view": buffer[..., :k]}
        for label, mask in masks.items():
            def step(query=query, key=key, value=value, mask=mask):
                torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=False)

            row = {"type": "profile_sdpa", "q": q, "k": k, "heads": heads, "head_dim": head_dim, "mask": label,
                   "mask_stride": list(mask.stride()), "status": "ok"}
            try:
                times = common.time_steps(step, device, warmup=3, min_trials=5, max_trials=30, min_time_s=0.05)
                row["median_ms"] = round(statistics.median(times), 4)
                prof = _profiler(device)
                with prof:
                    step()
                    common.sync(device)
                row["kernels"] = sorted({e.name[:100] for e in prof.events()
                                         if str(getattr(e, "device_type", "")).endswith("CUDA")})
                row["ops"] = sorted({e.name for e in prof.events() if "attention" in e.name or "sdpa" in e.name})
            except Exception as exc:  # noqa: BLE001
                row["status"], row["error"] = common.classify_error(exc)
            emit(row)
            lines.append(f"{q:>5} {k:>7} {label:>10} {row.get('median_ms', row.get('error'))!s:>10}  "
                         f"{'; '.join(row.get('ops', []))} | {'; '.join(row.get('kernels', []))[:300]}")
        del query, key, value, buffer, masks
    # a new key length every call (as in serving) against the same one repeated: wall time per call, synchronised
    q, k = shapes[1]
    if budget.allows(5):
        query = torch.randn(1, heads, q, head_dim, device=device, dtype=dt)
        key = torch.randn(1, heads, k + 16, head_dim, device=device, dtype=dt)
        value = torch.randn(1, heads, k + 16, head_dim, device=device, dtype=dt)
        buffer = torch.zeros(1, 1, q, max(row_stride, k + 64), device=device, dtype=dt)
        walls = {}
        for label, grow in (("same K", 0), ("K+1 per call", 1)):
            times = []
            for i in range(12):
                n = k + grow * i
                common.sync(device)
                t0 = time.perf_counter()
                torch.nn.functional.scaled_dot_product_attention(query, key[:, :, :n], value[:, :, :n],
                                                                 attn_mask=buffer[..., :n], is_causal=False)
                common.sync(device)
                times.append((time.perf_counter() - t0) * MS)
            walls[label] = round(statistics.median(times[2:]), 4)
        emit({"type": "profile_sdpa_fresh", "q": q, "k": k, "heads": heads, "wall_ms": walls})
        lines.append(f"wall per call (synchronised), Q {q} K {k}: " + ", ".join(f"{a} {b} ms" for a, b in walls.items()))
        del query, key, value, buffer
    common.free_memory()         # the engine sizes its cache from the memory left: return these blocks first
    texts.append(f"== SDPA alone, {heads} heads x {head_dim}, {dt}, mask contiguous vs the engine's view "
                 f"(row stride {row_stride}):\n" + "\n".join(lines))
    return texts


# -------------------------------------------------------------------------------------------------------- main


def run(model, args, device, out, budget) -> int:
    """All parts for one model; the text summary goes to args.profile_out (or stdout)."""
    import torch

    texts = [(f"# serve_cb --profile-steps {args.model}: torch {torch.__version__}, "
              f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
              f"cudnn_sdp {getattr(torch.backends.cuda, 'cudnn_sdp_enabled', lambda: None)()}, "
              f"flash_sdp {torch.backends.cuda.flash_sdp_enabled()}, "
              f"mem_efficient_sdp {torch.backends.cuda.mem_efficient_sdp_enabled()}, "
              f"math_sdp {torch.backends.cuda.math_sdp_enabled()}, cudnn {torch.backends.cudnn.version()}; "
              "times in ms")]
    parts = [("sdpa", lambda: sdpa_masks(model, args, device, budget, out.write)),
             ("isolated", lambda: isolated(model, args, device, budget, out.write)),
             ("thread-32", lambda: serving(model, args, device, budget, out.write, args.profile_shape["batch"], True)),
             ("thread-1", lambda: serving(model, args, device, budget, out.write, 1, True)),
             ("main-32", lambda: serving(model, args, device, budget, out.write, args.profile_shape["batch"], False))]
    wanted = [x for x in args.profile_parts.split(",") if x] if args.profile_parts else [name for name, _ in parts]
    if wanted and wanted[0].startswith("thread"):
        with _profiler(device):      # the profiler's first session in the main thread (Kineto registers it there)
            common.sync(device)
    for name, part in parts:
        if name not in wanted:
            continue
        if not budget.allows(10):
            texts.append(f"== {name}: skipped (time budget)")
            continue
        t0 = time.perf_counter()
        try:
            texts.extend(part())
        except Exception as exc:  # noqa: BLE001 - recorded, the next part goes on
            status, error = common.classify_error(exc)
            out.write({"type": "profile_error", "part": name, "status": status, "error": error})
            texts.append(f"== {name}: {status}: {error}")
            if common.is_fatal_device_error(exc):
                break
        print(f"[serve_cb] profile {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        _write_text(args, texts)
    _write_text(args, texts)
    return 0


def _write_text(args, texts: list[str]) -> None:
    text = "\n\n".join(texts) + "\n"
    if args.profile_out:
        Path(args.profile_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.profile_out).write_text(text)
    else:
        print(text)
