"""MoE models in HF transformers (no compile) on one GPU: prefill / decode time, peak memory, routing statistics.

    python3 -m aisim.validation.harness.moe_bench --out OUT/moe.jsonl --profile --profile-out OUT/moe_profile.txt \
        [--max-minutes 2] [--smoke]

Models (random bf16 weights, configs in harness/configs with their sources): OLMoE-1B-7B (olmoe, 64 experts top-8),
Qwen1.5-MoE-A2.7B (qwen2_moe, 60 experts top-4 + a shared expert), Qwen3-30B-A3B (qwen3_moe, 128 experts top-8;
61 GB of bf16 weights: fits an 80 GB card with little room, cases that do not fit are recorded as oom).

Experts implementation: transformers 5.17 picks ``grouped_mm`` by default (modeling_utils.py
get_correct_experts_implementation: torch grouped GEMM over experts sorted by expert id, integrations/moe.py
grouped_mm_experts_forward); ``eager`` is the model file's own loop over the experts that got tokens (one pair of
small GEMMs per hit expert, index_add_). Each case line names the implementation (``impl``); --impls picks them,
the eager loop runs the --eager-cases subset only.

Workloads (batch x context, one step timed):
- prefill: ``model(ids[b, ctx], use_cache=True, logits_to_keep=1)`` under inference_mode
- decode:  one token per row over a DynamicCache holding ctx-1 tokens (a real chunked prefill); after every step
           ``cache.crop(-1)`` and the layers made contiguous again, untimed (as aisim.validation.measure)
Timing: 2 warm-up steps, then >= 5 trials lasting >= 0.3 s, CUDA events, median. Peak memory:
torch.cuda.max_memory_allocated over the trials (reset after the cache fill).

Routing realism: random weights give near-uniform routing. One extra untimed step runs with a forward hook on every
router (``mlp.gate``, the TopKRouter returning (logits, weights, indices)); per layer it records how many distinct
experts got tokens and the largest number of (token, slot) assignments one expert got, next to what uniform random
top-k routing would give (expected distinct = E * (1 - (1 - k/E)^T), balanced load = T*k/E).

--profile: torch.profiler over 3 steps of one decode (batch 8, ctx 1024) and one prefill (batch 1, ctx 1024) case of
the first model, for each implementation; the top 25 CUDA kernels by total time (and the op table) go to
--profile-out, a summary line per table to the JSONL. It runs last, on the first model built again, after every timed
case: a torch.profiler session with CUDA activities can leave CUPTI attached to the process (Kineto tears it down only
where TEARDOWN_CUPTI=1 or its default says so; pytorch/pytorch#144455), and later kernel launches then cost the host
more; the 2026-11-26 H100 run profiled between its first and second model (see grouped_gemm.py's residue section).
"""
from __future__ import annotations

import time
from collections import defaultdict

from . import common

SCRIPT = "moe_bench"
DEFAULT_MODELS = "olmoe-1b-7b,qwen1.5-moe-a2.7b,qwen3-30b-a3b"
DEFAULT_EAGER_CASES = "decode:1:1024,decode:32:1024,prefill:1:1024,prefill:8:1024"
PREFILL_CHUNK_TOKENS = 8192
PROFILE_RESERVE_S = 25.0   # seconds of the budget the timed cases leave to the profile at the end


def _routers(model):
    """(layer index, router module) for every MoE router (the ``gate`` of a sparse MLP block, gpt-oss's ``router``)."""
    found = []
    for name, module in model.named_modules():
        if name.endswith(("mlp.gate", "mlp.router")) and type(module).__name__.endswith("Router"):
            parts = name.split(".")
            layer = next((int(p) for p in parts if p.isdigit()), len(found))
            found.append((layer, module))
    return found


class RoutingProbe:
    """Forward hooks on the routers that record per-layer distinct experts and the max load of one expert."""

    def __init__(self, model):
        self.model = model
        self.routers = _routers(model)
        self.rows = []
        self.handles = []

    def __enter__(self):
        import torch

        def hook(layer):
            def fn(module, args, output):
                indices = output[2] if isinstance(output, (tuple, list)) and len(output) >= 3 else None
                if indices is None:
                    return
                experts = int(getattr(module, "num_experts", 0) or int(indices.max().item()) + 1)
                counts = torch.bincount(indices.reshape(-1).long(), minlength=experts)
                self.rows.append((layer, int(indices.shape[0]), int(indices.shape[-1]), experts,
                                  int((counts > 0).sum().item()), int(counts.max().item())))
            return fn

        self.handles = [m.register_forward_hook(hook(layer)) for layer, m in self.routers]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        return False

    def result(self) -> dict | None:
        if not self.rows:
            return None
        rows = sorted(self.rows)
        tokens, top_k, experts = rows[0][1], rows[0][2], rows[0][3]
        distinct = [r[4] for r in rows]
        max_load = [r[5] for r in rows]
        return {
            "tokens": tokens, "top_k": top_k, "experts": experts, "layers": len(rows),
            "distinct_per_layer": distinct, "max_tokens_per_expert_per_layer": max_load,
            "mean_distinct": round(sum(distinct) / len(distinct), 3),
            "mean_max_load": round(sum(max_load) / len(max_load), 3),
            "uniform_expected_distinct": round(experts * (1 - (1 - top_k / experts) ** tokens), 3),
            "balanced_load": round(tokens * top_k / experts, 3),
        }


def _ids(model, shape, generator, device):
    import torch

    vocab = int(model.config.vocab_size)
    return torch.randint(0, vocab, shape, generator=generator, device=device)


def _fill_cache(model, batch: int, context: int, generator, device):
    """A DynamicCache holding context-1 tokens per row: a real prefill in chunks of <= 8192 tokens."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    past = context - 1
    chunk = max(1, PREFILL_CHUNK_TOKENS // batch)
    with torch.inference_mode():
        for start in range(0, past, chunk):
            ids = _ids(model, (batch, min(chunk, past - start)), generator, device)
            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    if cache.get_seq_length() != past:
        raise RuntimeError(f"cache holds {cache.get_seq_length()} tokens, expected {past}")
    return cache


def prepare(model, workload: str, batch: int, context: int, device, seed: int):
    """(step, after, cleanup) for one case."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed + batch * 131 + context)
    if workload == "prefill":
        ids = _ids(model, (batch, context), g, device)

        def step():
            with torch.inference_mode():
                model(input_ids=ids, use_cache=True, logits_to_keep=1)
        return step, (lambda: None), (lambda: None)
    if workload != "decode":
        raise ValueError(f"unknown workload {workload!r}")
    cache = _fill_cache(model, batch, context, g, device)
    # sliding-window layers (gpt-oss) keep the last window - 1 tokens as a view of the prefill's whole K/V: record the
    # step's past so that crop(-1) can roll it back (transformers 5.17 cache_utils.DynamicSlidingWindowLayer.crop),
    # and hold the window contiguous, as after a real generation step
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            layer.activate_past_recording()
            layer.keys, layer.values = layer.keys.contiguous(), layer.values.contiguous()
    new = _ids(model, (batch, 1), g, device)

    def step():
        with torch.inference_mode():
            model(input_ids=new, past_key_values=cache, use_cache=True)

    def after():
        # transformers 5.17: crop(-1) removes one token; contiguous() as a real generation step leaves the cache.
        cache.crop(-1)
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.contiguous(), layer.values.contiguous()

    return step, after, (lambda: cache.layers.clear())


def run_case(model, model_name: str, impl: str, workload: str, batch: int, context: int, device, args,
             routing: bool) -> dict:
    row = {"type": "case", "model": model_name, "impl": impl, "workload": workload, "batch": batch,
           "context": context, "tokens": batch * (context if workload == "prefill" else 1),
           "attn_implementation": model.config._attn_implementation, "status": "ok"}
    t0 = time.perf_counter()
    cleanup = lambda: None  # noqa: E731
    try:
        step, after, cleanup = prepare(model, workload, batch, context, device, args.seed)
        if routing:
            with RoutingProbe(model) as probe:
                step()
            common.sync(device)
            after()
            row["routing"] = probe.result()
        common.reset_peak(device)
        times = common.time_steps(step, device, warmup=args.warmup, min_trials=args.min_trials,
                                  max_trials=args.max_trials, min_time_s=args.min_time_s, after=after)
        row.update(common.summary(times))
        row.update(common.memory(device))
        row["tokens_per_s"] = round(row["tokens"] / (row["median_ms"] / 1e3), 2) if row["median_ms"] else None
    except Exception as exc:  # noqa: BLE001 - recorded per case
        row["status"], row["error"] = common.classify_error(exc)
        if common.is_fatal_device_error(exc):
            raise
    finally:
        try:
            cleanup()
        except Exception:  # noqa: BLE001
            pass
    common.free_memory(collect=row["status"] != "ok")
    row["case_s"] = round(time.perf_counter() - t0, 3)
    return row


# ----------------------------------------------------------------------------------------------------- profile


def _kernel_table(prof, limit: int = 25) -> list[dict]:
    """Device kernels aggregated by name: calls, total and mean time (us), sorted by total time."""
    totals = defaultdict(lambda: [0, 0.0])
    for name, duration in common.device_events(prof):
        entry = totals[name]
        entry[0] += 1
        entry[1] += duration
    grand = sum(v[1] for v in totals.values()) or 1.0
    rows = [{"kernel": name, "calls": calls, "total_us": round(total, 2), "mean_us": round(total / calls, 3),
             "share": round(total / grand, 4)} for name, (calls, total) in totals.items()]
    rows.sort(key=lambda r: -r["total_us"])
    return rows[:limit]


def _op_table(prof, limit: int = 25) -> str:
    averages = prof.key_averages()
    for key in ("self_device_time_total", "self_cuda_time_total", "self_cpu_time_total"):
        try:
            return averages.table(sort_by=key, row_limit=limit, max_name_column_width=80)
        except Exception:  # noqa: BLE001 - older / newer key names
            continue
    return str(averages)


def profile_cases(model, model_name: str, impls: list[tuple[str, str]], device, args, out, text_path) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    cases = [("decode", args.profile_decode[0], args.profile_decode[1]),
             ("prefill", args.profile_prefill[0], args.profile_prefill[1])]
    summaries = []
    chunks = []
    for impl_label, impl_value in impls:
        model.set_experts_implementation(impl_value)
        for workload, batch, context in cases:
            label = f"{model_name} impl={impl_label} {workload} batch={batch} ctx={context}"
            record = {"type": "profile", "model": model_name, "impl": impl_label, "workload": workload,
                      "batch": batch, "context": context, "status": "ok"}
            cleanup = lambda: None  # noqa: E731
            try:
                step, after, cleanup = prepare(model, workload, batch, context, device, args.seed)
                for _ in range(2):
                    step()
                    after()
                common.sync(device)
                with profile(activities=activities) as prof:
                    for _ in range(3):
                        step()
                        common.sync(device)
                        after()
                kernels = _kernel_table(prof)
                record["steps"] = 3
                record["top_kernels"] = kernels
                lines = [f"==== {label}: top {len(kernels)} device kernels over 3 steps ===="]
                lines.append(f"{'total_us':>12} {'calls':>7} {'mean_us':>10} {'share':>7}  kernel")
                for k in kernels:
                    lines.append(f"{k['total_us']:>12.1f} {k['calls']:>7d} {k['mean_us']:>10.2f} "
                                 f"{k['share']:>7.3f}  {k['kernel'][:160]}")
                lines.append(f"\n---- {label}: operator table (top 25 by self device time) ----")
                lines.append(_op_table(prof))
                chunks.append("\n".join(lines))
            except Exception as exc:  # noqa: BLE001
                record["status"], record["error"] = common.classify_error(exc)
                chunks.append(f"==== {label}: {record['status']}: {record['error']}")
            finally:
                try:
                    cleanup()
                except Exception:  # noqa: BLE001
                    pass
                common.free_memory()
            out.write(record)
            summaries.append(record)
            if text_path:
                with open(text_path, "w") as handle:
                    handle.write("\n\n".join(chunks) + "\n")
    return summaries


# -------------------------------------------------------------------------------------------------------- main


def profile_first_model(args, device, dtype, out) -> None:
    """The --profile tables, after every timed case: the first model built again, each implementation profiled."""
    name = next(m for m in args.models.split(",") if m)
    try:
        model = common.build_causal_lm(common.hf_config(name), dtype, device, seed=args.seed)
    except Exception as exc:  # noqa: BLE001
        out.write({"type": "profile", "model": name, "status": common.classify_error(exc)[0],
                   "error": common.classify_error(exc)[1]})
        return
    default_impl = model.config._experts_implementation
    impls = [(default_impl, default_impl)] + ([] if args.smoke else
                                              [(i, i) for i in args.impls.split(",") if i not in ("", "default")])
    profile_cases(model, name, impls, device, args, out, args.profile_out)
    del model
    common.free_memory()


def parse_case(text: str) -> tuple[str, int, int]:
    workload, batch, context = text.split(":")
    return workload, int(batch), int(context)


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "tiny models on the CPU (or the GPU), seconds")
    parser.add_argument("--models", default=DEFAULT_MODELS, help="comma list of config names / paths")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--contexts", default="128,1024")
    parser.add_argument("--workloads", default="decode,prefill")
    parser.add_argument("--impls", default="default,eager",
                        help="experts implementations: default (what transformers picks), eager, grouped_mm, ...")
    parser.add_argument("--eager-cases", default=DEFAULT_EAGER_CASES,
                        help="workload:batch:context cases run for the non-default implementations ('all' = all)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--min-trials", type=int, default=5)
    parser.add_argument("--max-trials", type=int, default=30)
    parser.add_argument("--min-time-s", type=float, default=0.3)
    parser.add_argument("--no-host", action="store_true", help="skip the host microbenchmark (validation/host.py) "
                        "run before the first and after the last timed case")
    parser.add_argument("--profile", action="store_true", help="torch.profiler kernel tables of the first model")
    parser.add_argument("--profile-out", default=None, help="text file of the profile tables")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    common.set_env()
    import torch

    if args.smoke:
        args.models = "tiny-olmoe,tiny-qwen2_moe,tiny-qwen3_moe"
        args.batches, args.contexts = "2", "16"
        args.eager_cases = "decode:2:16"   # the eager loop's index_add_ is slow on CPUs
        args.min_trials, args.max_trials, args.min_time_s, args.warmup = 2, 3, 0.0, 1
    args.profile_decode = (8, 1024) if not args.smoke else (2, 16)
    args.profile_prefill = (1, 1024) if not args.smoke else (1, 16)
    if args.profile and not args.profile_out and args.out:
        args.profile_out = str(args.out).rsplit(".", 1)[0] + "_profile.txt"
    device = common.pick_device()
    if args.smoke:
        common.smoke_threads(device)
    if args.smoke and device.type == "cpu":
        args.dtype = "fp32"   # bf16 matmuls are emulated (slow) on most CPUs
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    out, budget, measure_host = common.start_run(SCRIPT, args, device)
    batches, contexts = common.parse_ints(args.batches), common.parse_ints(args.contexts)
    workloads = [w for w in args.workloads.split(",") if w]
    all_cases = [(w, b, c) for w in workloads for b in batches for c in contexts]
    subset = all_cases if args.eager_cases == "all" else [parse_case(c) for c in args.eager_cases.split(",") if c]
    rows, last_case_s, stopped = [], 5.0, False
    profile_reserve_s = PROFILE_RESERVE_S if args.profile else 0.0   # the profile runs last
    try:
        for name in (m for m in args.models.split(",") if m):
            if not budget.allows(20 + profile_reserve_s):
                stopped = True
                break
            t0 = time.perf_counter()
            model_row = {"type": "model", "model": name, "status": "ok"}
            model = None
            try:
                config = common.hf_config(name)
                model_row["source"] = (common.config_path(name).name if not name.startswith("tiny-") else "tiny")
                model = common.build_causal_lm(config, dtype, device, seed=args.seed)
                common.sync(device)
                default_impl = model.config._experts_implementation
                model_row.update({"params": common.param_count(model), "dtype": args.dtype,
                                  "default_experts_implementation": default_impl,
                                  "attn_implementation": model.config._attn_implementation,
                                  "num_experts": getattr(config, "num_experts", None),
                                  "top_k": getattr(config, "num_experts_per_tok", None),
                                  "build_s": round(time.perf_counter() - t0, 2), **common.memory(device)})
            except Exception as exc:  # noqa: BLE001
                model_row["status"], model_row["error"] = common.classify_error(exc)
            out.write(model_row)
            print(f"[moe] {name}: {model_row['status']} params={model_row.get('params')} "
                  f"impl={model_row.get('default_experts_implementation')} build {model_row.get('build_s')} s",
                  flush=True)
            if model is None:
                common.free_memory()
                continue
            impls = []
            for impl in (i for i in args.impls.split(",") if i):
                impls.append((default_impl if impl == "default" else impl, default_impl if impl == "default" else impl,
                              impl == "default"))
            for impl_label, impl_value, is_default in impls:
                try:
                    model.set_experts_implementation(impl_value)
                except Exception as exc:  # noqa: BLE001
                    row = {"type": "case", "model": name, "impl": impl_label, "status": "error",
                           "error": common.classify_error(exc)[1]}
                    out.write(row)
                    rows.append(row)
                    continue
                for workload, batch, context in (all_cases if is_default else subset):
                    if not budget.allows(min(last_case_s, 30.0) + profile_reserve_s):
                        stopped = True
                        break
                    row = run_case(model, name, impl_label, workload, batch, context, device, args,
                                   routing=is_default)
                    last_case_s = row["case_s"]
                    out.write(row)
                    rows.append(row)
                    print(f"[moe] {name} {impl_label} {workload} b={batch} ctx={context}: {row['status']} "
                          f"{row.get('median_ms')} ms peak {row.get('peak_allocated_gb')} GB", flush=True)
                if stopped:
                    break
            del model
            common.free_memory()
            if stopped:
                break
        if measure_host:
            out.write(common.host_record("end"))
        if args.profile and budget.allows(10):
            profile_first_model(args, device, dtype, out)
    except KeyboardInterrupt:
        stopped = True
    if stopped:
        out.write({"type": "stopped", "reason": "time budget or interrupt", "cases_done": len(rows)})
    for row in rows:
        routing = row.get("routing") or {}
        row["distinct"] = routing.get("mean_distinct")
        row["uniform"] = routing.get("uniform_expected_distinct")
        row["max_load"] = routing.get("mean_max_load")
    common.print_table(rows, ["model", "impl", "workload", "batch", "context", "median_ms", "tokens_per_s",
                              "peak_allocated_gb", "distinct", "uniform", "max_load", "status"],
                       title="moe_bench (distinct = mean distinct experts per layer; uniform = expected under "
                             "uniform top-k; max_load = mean over layers of the busiest expert's assignments)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
