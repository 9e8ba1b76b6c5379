"""Decode with HF's static KV cache and ``torch.compile(mode="reduce-overhead")`` (CUDA graphs), against eager.

    python3 -m aisim.validation.harness.graphs_decode --out OUT/graphs.jsonl [--max-minutes 3] [--smoke]
        [--cache-lens 1039,4096]

Calibration of the compiled step's non-kernel time on a tiny, non-judged model (cbhost-llama: 256 wide, Llama-3
layout) at three depths; validation/scripts/derive_graphs_replay.py fits step time - profiled kernel time against
the profiled kernel count (~3 min: 6 compile cases of ~20 s):

    python3 -m aisim.validation.harness.graphs_decode --out OUT/graphs-replay-tiny-h100.jsonl --models cbhost-llama \
        --layers 2,8,32 --batches 1,32 --modes compile --profile --max-minutes 6

Out-of-sample static-cache run (issue 16; ~7 min on one H100: 8 compile cases of ~45 s, compile ~36-41 s each):

    python3 -m aisim.validation.harness.graphs_decode --out OUT/graphs-decode-cachelen-h100.jsonl \
        --models qwen2.5-1.5b,Meta-Llama-3-8B --batches 1,32 --modes compile --cache-lens 4096,1039 --profile \
        --max-minutes 9

As transformers documents it (llm_optims: static cache + torch.compile): a ``StaticCache`` and
``model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)``; the decode loop calls the
model with one token per row, ``past_key_values=cache`` and ``cache_position``. (``generate`` does the same when
``generation_config.cache_implementation="static"``: it compiles the decode steps with its CompileConfig, default
mode reduce-overhead.) Models: a ~1.5B (Qwen2.5-1.5B config) and Meta-Llama-3-8B (model_specs), bf16, sdpa.

Per model and batch (context --context, default 1024):
- the cache is filled by an eager prefill of context-1 tokens; the decode steps then write positions
  context-1 .. context-1+15 in turn (so every step attends over ~context tokens); max_cache_len = context + 15:
  with a static cache, sdpa attends over the whole max_cache_len (masked), which is why it is kept tight;
  --cache-lens L1,L2,...: each case runs at each of these max_cache_len instead (each >= context + 15; the
  context and the decode positions stay the same, only the static cache, and so the masked keys, grows)
- ``eager``: the same loop, uncompiled
- ``compile``: the first three calls are timed one by one (compile_s = first call: dynamo + inductor + the
  cudagraph-trees warm-up run; the second records the graph), then the timed steps; dynamo counters (graph
  breaks, graphs, cudagraph skips) of those calls are recorded
Timing: after warm-up, >= --steps steps, CUDA events per step (they include CPU launch gaps and the compiled call's
host work: guards, cudagraph-tree bookkeeping), median; the per-layer fill-level rewind runs between steps, untimed
(row "timed": "forward"; earlier rows timed it with the step). The compile time is recorded separately and never
enters the step time. --profile: torch.profiler over 3 compiled forwards, GPU kernel ms and launches per step.
Every batch size is a new static shape and compiles anew (automatic dynamic shapes off, as a fresh process serving
that batch would compile it).
On a CPU (--smoke) torch.compile runs with backend="eager" and fullgraph=True: only dynamo's trace (no graph
breaks) is checked, as reduce-overhead needs CUDA.
"""
from __future__ import annotations

import time

from . import common

SCRIPT = "graphs_decode"
DEFAULT_MODELS = "qwen2.5-1.5b,Meta-Llama-3-8B"
POSITION_SPAN = 16


def default_cache_len(context: int) -> int:
    """The tightest static cache for the decode positions context-1 .. context-1+POSITION_SPAN-1."""
    return context - 1 + POSITION_SPAN


class Decoder:
    """A static cache of ``batch`` rows filled to context-1 tokens, and a one-token decode step."""

    def __init__(self, model, batch: int, context: int, device, seed: int, max_cache_len: int | None = None):
        import torch
        from transformers import StaticCache

        self.model, self.device = model, device
        self.max_cache_len = max_cache_len or default_cache_len(context)
        if self.max_cache_len < default_cache_len(context):
            raise ValueError(f"max_cache_len {self.max_cache_len} < context - 1 + {POSITION_SPAN} = "
                             f"{default_cache_len(context)}: the decode steps would write past the cache")
        self.cache = StaticCache(config=model.config, max_cache_len=self.max_cache_len)
        g = torch.Generator(device=device)
        g.manual_seed(seed + batch)
        vocab = int(model.config.vocab_size)
        prompt = torch.randint(0, vocab, (batch, context - 1), generator=g, device=device)
        # torch.no_grad as generate uses it (not inference_mode: the cache tensors are inputs of the CUDA graphs)
        with torch.no_grad():     # eager prefill (model.forward is replaced only after this)
            chunk = max(1, 8192 // batch)
            for start in range(0, context - 1, chunk):
                ids = prompt[:, start:start + chunk]
                model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                        cache_position=torch.arange(start, start + ids.shape[1], device=device), logits_to_keep=1)
        self.tokens = torch.randint(0, vocab, (batch, 1), generator=g, device=device)
        self.start = context - 1
        self.positions = [torch.tensor([context - 1 + i], device=device) for i in range(POSITION_SPAN)]
        self.i = 0
        self.compiled = False

    def _rewind(self, position: int) -> None:
        """Set every static layer's fill level to ``position`` (in place: the CUDA graphs keep its address).
        transformers 5.x StaticLayer.update ignores the caller's cache_position and writes at its own
        cumulative_length, which grows by one per step: the harness's positions cycle over POSITION_SPAN, so
        without the rewind the 17th step wrote past max_cache_len (the index_copy_ out-of-bounds crash of the
        2026-11-26 H100 run)."""
        for layer in getattr(self.cache, "layers", ()):
            length = getattr(layer, "cumulative_length", None)
            if getattr(layer, "is_initialized", False) and length is not None:
                length.fill_(position)

    def rewind(self) -> None:
        """Set the fill level for the next step (run between steps, outside the timed region)."""
        self._rewind(self.start + self.i % POSITION_SPAN)

    def forward(self) -> None:
        """One decode step from the current fill level (what is timed: HF's compiled forward alone)."""
        import torch

        if self.compiled and self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            self.model(input_ids=self.tokens, past_key_values=self.cache,
                       cache_position=self.positions[self.i % POSITION_SPAN], use_cache=True)
        self.i += 1

    def step(self) -> None:
        self.rewind()
        self.forward()


def _counters() -> dict:
    """Dynamo / inductor counters: graph breaks, captured graphs, recompiles, cudagraph skips."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001
        return {}
    return {"graph_breaks": sum(counters["graph_break"].values()),
            "unique_graphs": counters["stats"].get("unique_graphs", 0),
            "cudagraph_skips": counters["inductor"].get("cudagraph_skips", 0)}


def _configure_dynamo(limit: int = 64) -> dict:
    """Static shapes per batch size (no automatic dynamic batch dimension after the first recompile: every batch
    size gets its own static graph, as a fresh process serving that batch would) and room for the recompiles."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(limit, getattr(torch._dynamo.config, name)))
    if hasattr(torch._dynamo.config, "automatic_dynamic_shapes"):
        torch._dynamo.config.automatic_dynamic_shapes = False
    return {"automatic_dynamic_shapes": getattr(torch._dynamo.config, "automatic_dynamic_shapes", None)}


REWIND_KERNEL = "FillFunctor"   # the rewind's eager fill_ kernels, left out of the profiled forward


def profile_steps(decoder, device, steps: int = 3) -> dict:
    """torch.profiler over ``steps`` forwards (rewinds between them): GPU kernel time and launches per step (the
    device's view, without the host's dispatch and the cudagraph replay's own host work) and the top kernels by
    time (their names say which SDPA backend ran: fmha_cutlassF = memory-efficient, cudnn, flash)."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    try:
        common.sync(device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(steps):
                decoder.forward()
                common.sync(device)
                decoder.rewind()
        totals = defaultdict(lambda: [0, 0.0])
        for event in prof.events():
            if not str(getattr(event, "device_type", "")).endswith("CUDA") or REWIND_KERNEL in event.name:
                continue
            entry = totals[event.name]
            entry[0] += 1
            entry[1] += float(event.time_range.elapsed_us())
        kernels = sorted(totals.items(), key=lambda kv: -kv[1][1])
        return {"steps": steps, "status": "ok",
                "gpu_kernel_ms": round(sum(v[1] for _, v in kernels) / steps / 1e3, 4),
                "kernels_per_step": round(sum(v[0] for _, v in kernels) / steps, 1),
                "top_kernels": [{"kernel": name[:160], "calls": calls // steps, "ms": round(us / steps / 1e3, 4)}
                                for name, (calls, us) in kernels[:15]]}
    except Exception as exc:  # noqa: BLE001 - the timing stands without the profile
        return {"status": common.classify_error(exc)[0], "error": str(exc)[:300]}


def run_case(model, name: str, mode: str, batch: int, context: int, device, args, compile_kwargs: dict,
             cache_len: int | None = None) -> dict:
    import torch

    row = {"type": "case", "model": name, "mode": mode, "batch": batch, "context": context,
           "layers": model.config.num_hidden_layers, "attn_implementation": model.config._attn_implementation,
           "status": "ok"}
    t0 = time.perf_counter()
    decoder = None
    original_forward = model.forward
    try:
        decoder = Decoder(model, batch, context, device, args.seed, cache_len)
        row["max_cache_len"] = decoder.max_cache_len
        common.reset_peak(device)
        if mode == "compile":
            counters_before = _counters()
            row["compile"] = {k: (v if isinstance(v, (str, bool, int, float)) else repr(v))
                              for k, v in compile_kwargs.items()}
            model.forward = torch.compile(type(model).forward.__get__(model), **compile_kwargs)
            decoder.compiled = True
            first = []
            for _ in range(3):
                decoder.rewind()
                common.sync(device)
                t = time.perf_counter()
                decoder.forward()
                common.sync(device)
                first.append(time.perf_counter() - t)
            row["first_calls_s"] = common.rounded(first, 4)
            row["compile_s"] = round(first[0], 3)
            after = _counters()
            # cudagraph_skips > 0: inductor compiled but did not use CUDA graphs (reason in the log)
            row["dynamo_counters"] = {k: after[k] - counters_before.get(k, 0) for k in after}
        # the fill-level rewind (one eager fill_ per layer) runs untimed between steps; until 2026-11-26 10:00 it
        # ran inside the timed step (rows without "timed" carry its host time: L eager kernel launches)
        decoder.rewind()
        times = common.time_steps(decoder.forward, device, warmup=args.warmup, min_trials=args.steps,
                                  max_trials=max(args.steps, args.max_steps), min_time_s=args.min_time_s,
                                  after=decoder.rewind)
        row["timed"] = "forward"
        row.update(common.summary(times))
        row["tokens_per_s"] = round(batch / (row["median_ms"] / 1e3), 2)
        row.update(common.memory(device))
        if args.profile and mode == "compile":
            row["profile"] = profile_steps(decoder, device)
    except Exception as exc:  # noqa: BLE001 - recorded per case
        row["status"], row["error"] = common.classify_error(exc)
        if common.is_fatal_device_error(exc):
            raise
    finally:
        model.forward = original_forward
        del decoder
    common.free_memory(collect=row["status"] != "ok")
    row["case_s"] = round(time.perf_counter() - t0, 3)
    return row


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "tiny model on the CPU (dynamo trace only)")
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--modes", default="eager,compile")
    parser.add_argument("--cache-lens", default="",
                        help="max_cache_len values of the static cache (comma-separated, each >= context + 15; "
                             "default: context + 15 only)")
    parser.add_argument("--compile-mode", default="reduce-overhead")
    parser.add_argument("--layers", default="",
                        help="num_hidden_layers overrides, each model built at each (rows name MODEL@NL): a tiny "
                             "model at several depths separates the compiled step's per-layer and fixed overheads")
    parser.add_argument("--profile", action="store_true",
                        help="compile cases: torch.profiler over 3 forwards (GPU kernel ms and launches per step)")
    parser.add_argument("--steps", type=int, default=20, help="timed decode steps (at least)")
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--min-time-s", type=float, default=0.2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile-estimate-s", type=float, default=60.0,
                        help="a compile case starts only if this much budget is left")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    common.set_env()
    import torch

    device = common.pick_device()
    if args.smoke:
        common.smoke_threads(device)
    if args.smoke:
        args.models, args.batches, args.context = "tiny-llama", "2", 32
        args.steps, args.max_steps, args.min_time_s, args.warmup, args.compile_estimate_s = 3, 3, 0.0, 1, 0.0
        if device.type == "cpu":
            args.dtype = "fp32"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if device.type == "cuda":
        compile_kwargs = {"mode": args.compile_mode, "fullgraph": True}
    else:
        compile_kwargs = {"backend": "eager", "fullgraph": True}
    dynamo_settings = _configure_dynamo()
    out = common.JsonlOut(args.out)
    out.write(common.header(SCRIPT, args, compile_kwargs=compile_kwargs, dynamo=dynamo_settings))
    budget = common.Budget(args.max_minutes)
    modes = [m for m in args.modes.split(",") if m]
    rows, stopped, models = [], False, {}
    try:
        # All models stay resident (1.5B + 8B bf16 = ~19 GB) so the cases run batch-major: batch 1 of every model
        # first, then the next batch size, which keeps both models covered when the budget ends early.
        layer_counts = common.parse_ints(args.layers) if args.layers else [None]
        for name in ((m, n) for m in args.models.split(",") if m for n in layer_counts):
            name, layers = name
            overrides = {} if layers is None else {"num_hidden_layers": layers}
            name = name if layers is None else f"{name}@{layers}L"
            t0 = time.perf_counter()
            model_row = {"type": "model", "model": name, "status": "ok", "layers": layers}
            try:
                models[name] = common.build_causal_lm(common.hf_config(name.split("@")[0], **overrides), dtype,
                                                      device, seed=args.seed)
                common.sync(device)
                model_row.update({"params": common.param_count(models[name]), "dtype": args.dtype,
                                  "attn_implementation": models[name].config._attn_implementation,
                                  "build_s": round(time.perf_counter() - t0, 2), **common.memory(device)})
            except Exception as exc:  # noqa: BLE001
                model_row["status"], model_row["error"] = common.classify_error(exc)
                common.free_memory()
            out.write(model_row)
            print(f"[graphs] {name}: {model_row['status']} build {model_row.get('build_s')} s", flush=True)
        cache_lens = common.parse_ints(args.cache_lens) if args.cache_lens else [default_cache_len(args.context)]
        for batch in common.parse_ints(args.batches):
            for cache_len in cache_lens:
                for name, model in models.items():
                    for mode in modes:
                        need = args.compile_estimate_s if mode == "compile" else 5.0
                        if not budget.allows(need):
                            row = {"type": "case", "model": name, "mode": mode, "batch": batch,
                                   "context": args.context, "max_cache_len": cache_len, "status": "skipped",
                                   "error": f"time budget: {budget.left():.0f} s left, {need:.0f} s needed"}
                        else:
                            row = run_case(model, name, mode, batch, args.context, device, args, compile_kwargs,
                                           cache_len)
                        out.write(row)
                        rows.append(row)
                        print(f"[graphs] {name} {mode} b={batch} max_cache_len={cache_len}: {row['status']} "
                              f"{row.get('median_ms')} ms/step compile {row.get('compile_s')} s", flush=True)
    except KeyboardInterrupt:
        stopped = True
    if stopped:
        out.write({"type": "stopped", "reason": "time budget or interrupt", "cases_done": len(rows)})
    models.clear()
    torch._dynamo.reset()
    common.free_memory()
    common.print_table(rows, ["model", "mode", "batch", "context", "max_cache_len", "median_ms", "tokens_per_s",
                              "compile_s", "peak_allocated_gb", "status"], title="graphs_decode (per-token decode step)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
