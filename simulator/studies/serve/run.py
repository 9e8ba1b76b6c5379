"""`aisim serve`: the request-level simulation of a continuous-batching engine for a resolved Scenario.

The engine's scheduler defaults and memory policy come from the runtime profile (``serving:`` in
hardware_specs/runtimes/*.yaml), overridden by the request; the KV cache capacity from aisim's memory model of the
scenario (weights per GPU) and the engine's memory policy; each step's time from aisim's step costs (timer.py).
A replica is the scenario's plan (tp x pp GPUs); the device's other GPUs hold more replicas behind a router.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil, gcd, log2
from typing import Any

import numpy as np

from ...errors import AisimError, DoesNotFit
from ...graph.engine import moe_routing
from ...scenario import Scenario, calibration_note, serving_notes
from ...step import step_cost
from ...workload import StepShape
from . import EngineConfig, ServeRequest, ServeRun, run_serving, validated
from .metrics import MS_PER_S, overload
from .steptime import BatchShape
from .timer import ModelDims, StepCostTimer

ENGINE_KNOBS = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "block_size",
                "preemption_mode", "gpu_memory_utilization", "num_gpu_blocks_override", "enable_prefix_caching")
ENGINE_FLAGS = {"max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
                "enable_chunked_prefill": "--chunked-prefill", "block_size": "--block-size",
                "preemption_mode": "--preemption-mode", "gpu_memory_utilization": "--gpu-memory-utilization",
                "num_gpu_blocks_override": "--num-gpu-blocks-override",
                "enable_prefix_caching": "--enable-prefix-caching"}

# --block-size values each engine accepts. vLLM: CacheConfig's BlockSize = Literal[1, 8, 16, 32, 64, 128, 256]
# (vllm/config/cache.py), and its FlashAttention backend takes multiples of 16 only (vllm/v1/attention/backends/
# flash_attn.py get_kv_cache_shape: "Block size must be a multiple of 16."). transformers CB: at least 4
# (generation/continuous_batching/cache.py PagedAttentionCache: _min_block_size = 4, checked in __init__).
BLOCK_SIZES: dict[str, tuple[tuple[int, ...] | None, int, str]] = {
    "vllm": ((16, 32, 64, 128, 256), 16, "one of 16, 32, 64, 128, 256 (vLLM's CacheConfig sizes its FlashAttention "
                                         "backend takes)"),
    "transformers-cb": (None, 4, "at least 4 (transformers' PagedAttentionCache)"),
}

# why a request was rejected (engine.ReplicaScheduler.reject_reason) and what to do about it
FAILURE_HINTS = {
    "max_model_len": "have input + output tokens over max_model_len {max_model_len} (the model's "
                     "max_position_embeddings): shorten --input-len / --output-len (or the trace's requests), or choose "
                     "a longer-context model",
    "kv_capacity": "need more KV cache than one replica holds ({kv_tokens}): {kv_fix}",
    "max_num_batched_tokens": "have prompts over --max-num-batched-tokens {max_num_batched_tokens} with chunked "
                              "prefill off: raise it, or use --chunked-prefill",
}


@dataclass(frozen=True)
class KvCapacity:
    blocks: int                # engine blocks: block_size tokens of one KV group (all layers, without windows)
    tokens: int                # tokens the pool holds in every layer (a full-attention model's capacity)
    bytes_per_token: float
    budget_bytes: float
    weights_bytes: float
    how: str
    full_groups: int = 1       # KV groups of full attention (1 and no sliding: one group of all layers)
    sliding_groups: int = 0
    sliding_window_blocks: int = 0


def sliding_layout(sc: Scenario, layers: int, block_size: int) -> tuple[int, int, int]:
    """(full-attention KV groups, sliding-window KV groups, blocks a sliding group holds per request while
    decoding) of a model with windowed layers, the layers of one type in groups of the gcd of the type counts, one
    engine block being block_size tokens of one group (transformers' group_layers_by_attn_type, after vLLM's hybrid
    allocator: groups of one type and equal size), for a model with windowed layers (graph.engine.sliding_windows: Mistral's sliding_window, gpt-oss's and Gemma's layer_types,
    Llama 4's attention_chunk_size), else (1, 0, 0): one group of all layers. Both engines keep a sliding layer's
    cache at the window: vLLM's hybrid KV cache manager (on unless --disable-hybrid-kv-cache-manager,
    vllm/config/scheduler.py SchedulerConfig.disable_hybrid_kv_cache_manager = False) frees the blocks wholly
    before the window (vllm/v1/core/single_type_kv_cache_manager.py SlidingWindowManager.remove_skipped_blocks:
    blocks before (computed - window + 1) // block_size), so a request holds cdiv(window - 1, block_size) + 1;
    transformers' paged cache gives a sliding-attention group ceil(window / block_size) blocks per request
    (generation/continuous_batching/cache_manager.py SlidingAttentionCacheAllocator._max_blocks_per_request).
    During a prefill step vLLM gives a windowed layer blocks for the window plus the whole scheduled chunk
    (vllm/v1/kv_cache_interface.py SlidingWindowSpec.max_memory_usage_bytes: "the last sliding_window-1 computed
    tokens plus the newly scheduled tokens") and frees them afterwards: EngineConfig.sliding_chunk_blocks (the
    chunk's blocks on top of the window's; transformers' ring buffer does not). Known difference: vLLM pads the
    smaller type's groups where the counts share no large divisor; here the gcd is exact."""
    from ...graph.engine import sliding_windows, windowed_layers

    windows = sliding_windows(sc.config)
    if not windows:
        return 1, 0, 0
    sliding = windowed_layers(sc.config, layers)
    group = gcd(layers - sliding, sliding)
    window = windows["window"]
    per_request = (-(-window // block_size) if sc.runtime.name == "transformers-cb"
                   else -(-(window - 1) // block_size) + 1)
    return (layers - sliding) // group, sliding // group, per_request


def kv_capacity(sc: Scenario, block_size: int, max_batched_tokens: int, utilization: float) -> KvCapacity:
    """KV blocks on one GPU of a replica, by the engine's memory policy (vLLM: a fraction of total memory less
    weights, activation and CUDA-graph reserves; transformers CB: a fraction of the memory left after loading, which
    it reads with torch.cuda.mem_get_info, so the CUDA context and NCCL's buffers are not in it, less its
    [1, 1, M, N + M] attention mask)."""
    s = sc.runtime.serving
    dims = ModelDims.of(sc)
    memory = step_cost(sc, StepShape(phase="prefill", batch=1, seq=1)).memory
    weights = memory.weights_gb * 1e9
    total = sc.device.gpu.memory_bytes
    per_token = dims.kv_bytes_per_token
    if s.memory_of == "total":
        budget = (total * utilization - weights - s.activation_reserve_bytes_per_token * max_batched_tokens
                  - s.cuda_graph_reserve_bytes)
        tokens = budget / per_token
        how = (f"{utilization:g} x {total / 1e9:.1f} GB - weights {weights / 1e9:.2f} GB - activation and CUDA-graph "
               "reserves")
    else:
        total -= memory.runtime_reserved_gb * 1e9   # transformers requests.py 43-50: free memory by mem_get_info
        budget = (total - weights) * utilization
        mask = dims.element_bytes * max_batched_tokens if s.attention == "packed-mask" else 0.0
        tokens = (budget - mask * max_batched_tokens) / (per_token + mask)
        how = (f"{utilization:g} x ({total / 1e9:.1f} GB - weights {weights / 1e9:.2f} GB)"
               + (f", less the {max_batched_tokens} x (N + {max_batched_tokens}) attention mask" if mask else ""))
    blocks = int(tokens // block_size)
    full, sliding, window_blocks = sliding_layout(sc, dims.layers, block_size)
    if blocks < 1:
        where = (f"{sc.device.gpu.name} (per GPU of tp {sc.plan.tp} x pp {sc.plan.pp})"
                 if sc.plan.tp * sc.plan.pp > 1 else sc.device.gpu.name)
        # the memory the engine's policy lets the weights and the KV cache share (before its reserves)
        usable = total * utilization if s.memory_of == "total" else total
        share = (f"gpu_memory_utilization {utilization:g} of {total / 1e9:.1f} GB"
                 if s.memory_of == "total" else f"{total / 1e9:.1f} GB free after the CUDA context")
        detail = (f"{sc.model}'s weights take {weights / 1e9:.2f} GB per GPU, more than the "
                  f"{sc.device.gpu.memory_bytes / 1e9:.1f} GB of {where}" if weights >= sc.device.gpu.memory_bytes else
                  f"{sc.model}'s weights take {weights / 1e9:.2f} GB per GPU, more than the {usable / 1e9:.2f} GB the "
                  f"engine can use on {where} ({share})" if weights >= usable else
                  f"{sc.model}'s weights ({weights / 1e9:.2f} GB per GPU) and the engine's reserves "
                  f"({(usable - weights - budget) / 1e9:.2f} GB of activation and CUDA-graph reserve) leave no room "
                  f"for a KV cache in the {usable / 1e9:.2f} GB it can use on {where} ({share})"
                  if budget <= 0 and s.memory_of == "total" else
                  f"{sc.model} on {where} leaves no room for a KV cache ({how} leaves {max(budget, 0.0) / 1e9:.2f} GB, "
                  f"under one block of {block_size} tokens at {per_token / 1e6:.3f} MB per token)")
        count, split = sc.device.count, sc.plan.tp * sc.plan.pp
        need = split * 2 ** ceil(log2(max(weights / max(usable, 1.0), 1.0) * 1.0001))
        tp_hint = min(need, 8)
        example = f"--tp {tp_hint}" + (f" --pp {need // tp_hint}" if need > tp_hint else "")
        raise DoesNotFit(detail, (f"split each replica over more of the device's {count} GPUs (--tp x --pp >= {need}, "
                                  f"e.g. {example})" if split < need <= count else "use more GPUs (--tp, --pp)")
                         + ", a smaller --quant or a larger GPU")
    if sliding:   # one engine block = block_size tokens of one KV group of dims.layers / (full + sliding) layers
        return KvCapacity(int(tokens * (full + sliding) // block_size), blocks * block_size, per_token, budget,
                          weights, how, full, sliding, window_blocks)
    return KvCapacity(blocks, blocks * block_size, per_token, budget, weights, how)


def blocks_override(cap: KvCapacity, blocks: int, block_size: int) -> KvCapacity:
    """The capacity with ``blocks`` engine blocks per GPU (vLLM --num-gpu-blocks-override, transformers CB's
    num_blocks): block_size tokens of one KV group each (sliding_layout). More than the memory policy leaves is
    "does not fit", as the engine would run out of memory allocating them."""
    if isinstance(blocks, bool) or not isinstance(blocks, int) or not 1 <= blocks <= 1_000_000_000:
        raise AisimError(f"--num-gpu-blocks-override: give a number of KV blocks from 1 to 1e9 (got {blocks!r})")
    groups = cap.full_groups + cap.sliding_groups
    need = blocks * block_size * cap.bytes_per_token / groups
    if need > cap.budget_bytes:
        raise DoesNotFit(f"--num-gpu-blocks-override {blocks} needs {need / 1e9:.2f} GB of KV cache per GPU, more "
                         f"than the {cap.budget_bytes / 1e9:.2f} GB the memory policy leaves ({cap.how})",
                         f"give at most {cap.blocks} blocks")
    return replace(cap, blocks=blocks, tokens=blocks // groups * block_size, how=f"--num-gpu-blocks-override {blocks}")


SERVE_ENERGY_NOTE = ("energy: aisim's serving energy is checked only against transformers-cb runs on an H100, where it "
                     "was low on every run (J/token MAPE 22%, docs/accuracy.md serving section): read it as a lower "
                     "bound")
VLLM_UNMEASURED_NOTE = ("runtime vllm: built from vLLM's source (scheduler, memory policy, kernels: "
                        "hardware_specs/runtimes/vllm.yaml) over aisim's step costs; no vLLM run has been measured "
                        "here; its step costs match another engine's published static batches (TensorRT-LLM: aisim "
                        "validate --reference trtllm-perf), but against published vLLM 0.11 bench-serve runs of "
                        "gpt-oss-20b with every request at once it is 1.4-4.9x optimistic in throughput (aisim "
                        "validate --reference vllm-serve): under heavy load read its throughput as an upper bound")


def unloaded_latency_s(run: ServeRun, timer, cfg: EngineConfig) -> float:
    """A median request's latency alone on the engine: its prompt's first chunk, then one decode step per further
    output token at half its output's context (a lower bound on what it meets under load)."""
    table = run.requests
    n_in, n_out = int(np.median(table.input_tokens)), int(np.median(table.output_tokens))
    chunk = max(min(n_in, cfg.max_num_batched_tokens), 1)
    prefill = timer.step_time_s(BatchShape(chunk, float(chunk) * chunk, 1, 0, 0.0, float(chunk)))
    decode = timer.step_time_s(BatchShape(0, 0.0, 0, 1, n_in + n_out / 2))
    return prefill + max(n_out - 1, 0) * decode


def load_note(run: ServeRun, request: ServeRequest, timer, cfg: EngineConfig) -> str | None:
    """Whether the replicas keep up with the arrivals (metrics.overload), in words with what to do."""
    alone_s = unloaded_latency_s(run, timer, cfg)
    behind = overload(run.requests, alone_s)
    more = "--num-requests" if request.trace_path is None else "a longer trace"
    table = run.requests
    ok = table.completed
    first = float(table.arrival_s[ok].min()) if ok.any() else 0.0
    done_rate = ok.sum() / max(float(table.finish_s[ok].max()) - first, 1e-9) if ok.any() else 0.0
    if behind == "short":
        offered = (ok.sum() - 1) / max(float(table.arrival_s[ok].max()) - first, 1e-9)
        return (f"the arrivals last under twice a typical request's latency alone ({alone_s:.2g} s): the run ends "
                f"while the engine is still filling, so it cannot show whether the server keeps up with "
                f"{offered:.3g} req/s (it completed {done_rate:.3g} req/s from the first arrival to the last "
                f"finish, the drain included); give {more}")
    if behind is None:
        return None
    rate_s, in_mid, in_end = behind
    fix = ("the trace's arrivals outpace it: use more replicas" if request.trace_path is not None else
           "the latencies depend on --num-requests: lower --rate, add replicas")
    return (f"the server falls behind its arrivals: in the second half of the arrivals ({rate_s:.3g} req/s) the "
            f"requests in the system grew from {in_mid} to {in_end}; from the first arrival to the last finish it "
            f"completed {done_rate:.3g} req/s (about its capacity when overloaded); {fix}, or let "
            "`aisim plan serve` find the cheapest configuration for an SLO")


def client_queue_note(run: ServeRun, request: ServeRequest) -> str | None:
    """Under --max-concurrency, whether the sends fall behind the arrivals (the client's queue builds)."""
    if request.max_concurrency is None:
        return None
    table = run.requests
    order = np.argsort(table.arrival_s - table.client_queue_ms / MS_PER_S, kind="stable")
    quarters = np.array_split(table.client_queue_ms[order], 4)
    late, early = float(np.median(quarters[3])), float(np.median(quarters[0]))
    if late < 1000.0 or late < 2 * max(early, 1.0):
        return None
    return (f"under --max-concurrency {request.max_concurrency} the sends fall behind the arrivals: the last quarter "
            f"of the requests waited a median {late / 1000:.3g} s for a slot (the client's queue builds; the "
            "latencies shown count from the send, as vLLM's do)")


def refuse_encoder_decoder(model: str, config: dict) -> None:
    """The serving simulator runs decoder-only text models (one line where the model is not one)."""
    if config.get("is_encoder_decoder"):
        raise AisimError(f"{model} is an encoder-decoder model: the serving simulator runs decoder-only text "
                         "models; for speech use `aisim estimate --workload transcribe`")


def engine_config(sc: Scenario, knobs: dict[str, Any]) -> tuple[EngineConfig, KvCapacity]:
    """The runtime profile's serving defaults with ``knobs`` (CLI overrides) applied, and the KV capacity."""
    s = sc.runtime.serving
    if s is None:
        raise AisimError(f"runtime {sc.runtime.name} has no continuous-batching engine profile; choose "
                         "--runtime transformers-cb or vllm (aisim list runtimes)")
    refuse_encoder_decoder(sc.model, sc.config)
    unknown = set(knobs) - set(ENGINE_KNOBS)
    if unknown:
        raise AisimError(f"unknown engine setting(s) {sorted(unknown)}; known: {', '.join(ENGINE_KNOBS)}")
    values = {**engine_defaults(s, sc.device.gpu), **{k: v for k, v in knobs.items() if v is not None}}
    _check_knobs(sc.runtime.name, values)
    cap = kv_capacity(sc, values["block_size"], values["max_num_batched_tokens"], values["gpu_memory_utilization"])
    if knobs.get("num_gpu_blocks_override") is not None:
        cap = blocks_override(cap, knobs["num_gpu_blocks_override"], values["block_size"])
    # with a batch per pipeline stage in flight, a simulated step is a round of pp schedule() calls, each with
    # its own token budget (ServingSpec.pipeline_batches)
    rounds = sc.plan.pp if s.pipeline_batches else 1
    cfg = validated(EngineConfig, {
        "num_kv_blocks": cap.blocks, "block_size": values["block_size"], "max_num_seqs": values["max_num_seqs"],
        "max_num_batched_tokens": values["max_num_batched_tokens"] * rounds,
        "enable_chunked_prefill": values["enable_chunked_prefill"], "preemption_mode": values["preemption_mode"],
        "enable_prefix_caching": values["enable_prefix_caching"],
        "kv_bytes_per_token": cap.bytes_per_token, "full_groups": cap.full_groups,
        "sliding_groups": cap.sliding_groups, "sliding_window_blocks": cap.sliding_window_blocks,
        "sliding_chunk_blocks": bool(cap.sliding_groups) and sc.runtime.name != "transformers-cb",
        "prefill_slack_tokens": values["prefill_slack_tokens"],
        "max_model_len": _max_model_len(sc)}, ENGINE_FLAGS)
    return cfg, cap


def engine_defaults(s, gpu) -> dict[str, Any]:
    """The runtime profile's serving settings as the engine picks them on ``gpu`` (small_gpu_defaults applied)."""
    return {**s.model_dump(), **small_gpu_defaults(s, gpu)}


def small_gpu_defaults(s, gpu) -> dict[str, int]:
    """The engine's scheduler defaults for a smaller GPU (ServingSpec.small_gpu), where they apply; else none."""
    small = s.small_gpu
    if small is None or (gpu.memory_bytes >= small.below_memory_gib * 2**30
                         and not any(n.lower() in gpu.name.lower() for n in small.names)):
        return {}
    return {"max_num_seqs": small.max_num_seqs, "max_num_batched_tokens": small.max_num_batched_tokens}


# engines without swap preemption, with the source that says so
RECOMPUTE_ONLY = {"vllm": "vLLM V1's scheduler frees and recomputes, v1/core/sched/scheduler.py; swap was dropped with "
                          "V0"}


def _check_knobs(runtime: str, values: dict[str, Any]) -> None:
    """The memory fraction, block size and preemption mode the engine would accept (vLLM's CacheConfig:
    gpu_memory_utilization gt=0, le=1; block sizes in BLOCK_SIZES; RECOMPUTE_ONLY)."""
    util = values["gpu_memory_utilization"]
    if not 0 < util <= 1:
        raise AisimError(f"--gpu-memory-utilization: give a fraction of GPU memory in (0, 1], e.g. 0.9 (got {util:g})")
    allowed, least, text = BLOCK_SIZES.get(runtime, (None, 1, "a positive number of tokens"))
    size = values["block_size"]
    if (allowed is not None and size not in allowed) or size < least:
        raise AisimError(f"--block-size: {runtime} takes {text} (got {size})")
    if runtime in RECOMPUTE_ONLY and values["preemption_mode"] == "swap":
        raise AisimError(f"--preemption-mode swap: {runtime} preempts by recomputing only "
                         f"({RECOMPUTE_ONLY[runtime]}); drop --preemption-mode")


KV_FIX = "raise --gpu-memory-utilization, use more GPUs per replica (--tp) or a larger GPU"


def failure_summary(run: ServeRun, cfg: EngineConfig, overridden: bool = False, kv_fix: str = KV_FIX) -> str | None:
    """The failed requests by reason, each with what to do; None when every request completed. ``overridden``: the
    KV blocks came from --num-gpu-blocks-override; ``kv_fix``: the advice for requests the KV cache cannot hold (a
    study that searches the GPUs itself names its own flags)."""
    reasons = run.result.failed_reasons
    if not reasons:
        return None
    longest = cfg.max_request_tokens()
    fill = {"max_model_len": cfg.max_model_len,
            "kv_tokens": "no request" if not longest else f"a request of {longest:,} tokens at most",
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "kv_fix": "raise --num-gpu-blocks-override" if overridden else kv_fix}
    return "; ".join(f"{n} request(s) " + FAILURE_HINTS.get(why, why).format(**fill) for why, n in reasons.items())


def _max_model_len(sc: Scenario) -> int | None:
    return sc.config.get("max_position_embeddings") or sc.config.get("n_positions")


def serve(sc: Scenario, request: ServeRequest, knobs: dict[str, Any] | None = None,
          progress=None) -> tuple[ServeRun, EngineConfig, list[str]]:
    """Simulate ``request`` on the scenario's engine; returns the run, the engine settings and the notes."""
    cfg, cap = engine_config(sc, knobs or {})
    timer = StepCostTimer(sc, cfg.max_num_batched_tokens)
    run = run_serving(request, timer, cfg, progress)
    s = sc.runtime.serving
    notes = serving_notes(sc) + [
        f"engine {sc.runtime.name}: {cfg.num_kv_blocks} KV blocks of {cfg.block_size} tokens "
        f"({cap.tokens:,} tokens, {cap.bytes_per_token / 1e3:.1f} kB per token per GPU) from {cap.how}; "
        + (f"{cap.sliding_groups} of its {cap.full_groups + cap.sliding_groups} KV groups (one block: {cfg.block_size} "
           f"tokens of one group) are windowed and hold a decoding request's last {cap.sliding_window_blocks} "
           f"block(s){', plus its prompt chunk while it is computed' if cfg.sliding_chunk_blocks else ''}; "
           if cap.sliding_groups else "")
        + f"max_num_seqs {cfg.max_num_seqs}, max_num_batched_tokens {cfg.max_num_batched_tokens}, chunked prefill "
        f"{'on' if cfg.enable_chunked_prefill else 'off'}, preemption by {cfg.preemption_mode} (the engine source lines "
        f"each setting comes from: serving.source in the {sc.runtime.name} runtime spec, hardware_specs/runtimes/ or "
        "$AISIM_SPECS_DIR/runtimes/)",
        f"step times from aisim's step costs of {sc.model} on {sc.device.name} (aisim.studies.serve.timer: the "
        f"forward without attention traced at 1..{cfg.max_num_batched_tokens} tokens"
        f"{', MoE experts at the rows each step routes to them' if moe_routing(sc.config) else ''}, "
        f"{s.attention} attention)"
        + (f"; the attention kernel's graph is built once per new (queries, keys) shape of a replica's run, "
           f"{s.attention_graph_build_s * 1e3:.1f} ms each on the host" if s.attention_graph_build_s else "")]
    cal = calibration_note(sc)
    if cal:
        notes.append(cal)
    notes.append(SERVE_ENERGY_NOTE)
    if sc.runtime.name == "vllm":
        notes.append(VLLM_UNMEASURED_NOTE)
    if cfg.enable_prefix_caching and cap.sliding_groups and run.result.num_preemptions:
        notes.append("prefix caching: not modelled for a KV pool with sliding-window groups (vLLM's hybrid manager "
                     "caches them; transformers' CB shares blocks only where every layer is full attention, "
                     "continuous_batching/cache.py); a request preempted here recomputes its whole prefix")
    if (knobs or {}).get("enable_prefix_caching") and sc.runtime.name == "transformers-cb":
        notes.append("--enable-prefix-caching under transformers-cb: aisim applies vLLM V1's reuse of a preempted "
                     "request's cached prefix, which transformers' CB does not do (it matches prefixes only for "
                     "requests not yet started, continuous_batching/scheduler.py, and evicts the last-freed cached "
                     "block first, cache_manager.py has_enough_free_blocks)")
    failures = failure_summary(run, cfg, (knobs or {}).get("num_gpu_blocks_override") is not None)
    if failures:
        notes.append(f"failed: {failures}")
    if run.arrival_offset_s:
        notes.append(f"the trace's first arrival is at {run.arrival_offset_s:,.3f} s in its own clock: times "
                     "(duration, throughputs, energy) count from it")
    for note in (load_note(run, request, timer, cfg), client_queue_note(run, request)):
        if note:
            notes.append(note)
    if request.replicas > 1:
        notes.append(f"{request.replicas} replicas of tp {sc.plan.tp} x pp {sc.plan.pp} GPUs behind a "
                     f"{request.router} router")
    if request.lockstep > 1:
        notes.append(f"expert parallel over data parallel: each group of {request.lockstep} replicas steps together "
                     "(every rank joins each MoE layer's all-to-all), a step lasting as long as its slowest rank's, "
                     "a rank without requests running vLLM's one-token dummy batch until a 32nd step of the wave "
                     "finds none with work (vllm/v1/engine/core.py DPEngineCoreProc); each rank's step is costed "
                     "as if the others carried a batch like its own")
    if sc.plan.pp > 1 and sc.runtime.serving.pipeline_batches:
        notes.append(f"pipeline parallel {sc.plan.pp}: {sc.runtime.name} keeps a batch in flight per stage (vLLM V1's "
                     f"batch queue): a step is a round of up to {sc.plan.pp} micro-batches, each a balanced share "
                     f"of the running requests with its own {cfg.max_num_batched_tokens // sc.plan.pp}-token budget, "
                     f"priced as {sc.plan.pp} x one stage of a share (the stages' p2p sends not counted)")
    elif sc.plan.pp > 1:
        notes.append(f"pipeline parallel {sc.plan.pp}: each step runs its {sc.plan.pp} stages one after another "
                     f"({sc.runtime.name} keeps no batch in flight per stage)")
    return run, cfg, notes
