"""Cost a step once: (Scenario, StepShape) -> StepCost.

Two halves. The device-free half traces the per-GPU graph (cached in memory and on disk), expands the engine's
ops and prices every op with the formula registry (FLOPs, bytes, launches), as arrays; it depends on the model,
plan, precision and runtime only. The device half turns those into per-op time on the device (calibrated
roofline), the CPU/GPU timeline, energy, the pipeline composition and the memory breakdown. Both halves are
memoised, so a study that asks for the same step twice (the planner, the serving simulator's step-time surface)
costs it once.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np

from .results import MemoryBreakdown, OpCost
from .scenario import Scenario, fp8_block_scaled
from .units import GB, MS_PER_S
from .workload import StepShape, Workload

STEP_CACHE_SIZE = 8192
DEVICE_FREE_CACHE_SIZE = 256


@dataclass(frozen=True)
class StepCost:
    """One step on the scenario's GPUs. ``runtime_s``: wall time (pipeline stages one after another);
    ``energy_j``: every GPU of the plan, waiting included; ``flops``/``bytes``: per GPU; ``table``: op rows of
    one stage, by GPU time; ``memory``: the peak per GPU."""
    runtime_s: float
    energy_j: float
    power_w: float
    flops: float
    bytes: float
    table: tuple[OpCost, ...]
    unknown: tuple[str, ...]
    memory: MemoryBreakdown | None = None
    workload: Workload | None = field(default=None, compare=False)
    gpu_busy_s: float = 0.0   # one stage: kernel time, launch gaps included
    cpu_busy_s: float = 0.0   # one stage: the host's dispatch time

    def times(self, n: float) -> "StepCost":
        """n of these steps (time, energy, work and op rows scaled; memory and power unchanged)."""
        rows = tuple(r.model_copy(update={"count": round(r.count * n), "flops": r.flops * n, "bytes": r.bytes * n,
                                          "time_ms": r.time_ms * n}) for r in self.table)
        return replace(self, runtime_s=self.runtime_s * n, energy_j=self.energy_j * n, flops=self.flops * n,
                       bytes=self.bytes * n, table=rows, gpu_busy_s=self.gpu_busy_s * n,
                       cpu_busy_s=self.cpu_busy_s * n)


EMPTY = StepCost(0.0, 0.0, 0.0, 0.0, 0.0, (), ())


@dataclass(frozen=True)
class OpArrays:
    """The device-free half: expanded ops of one traced step with their formula costs, as arrays."""
    ops: tuple
    costs: tuple
    repeats: np.ndarray
    walk_repeats: np.ndarray          # the timeline's (cost.timeline.layer_walk_repeats): same totals
    phases: tuple[str, ...]           # each op's phase (forward, backward, optimizer): the timeline's rounds
    kinds: tuple[str, ...]
    launches: np.ndarray
    flops: float
    bytes: float
    unknown: tuple[str, ...]
    graph: object


_DEVICE_FREE: OrderedDict = OrderedDict()
_STEPS: OrderedDict = OrderedDict()


def _remember(cache: OrderedDict, key, value, size: int):
    cache[key] = value
    if len(cache) > size:
        cache.popitem(last=False)
    return value


def op_arrays(sc: Scenario, w: Workload) -> OpArrays:
    """Trace (cached) and price every op of one step with the formula registry: no device involved."""
    key = (sc.key, w)
    found = _DEVICE_FREE.get(key)
    if found is not None:
        return found
    from .formulas import expert_parallel_rows, is_known, is_kv_append, kv_append_in_place, op_cost, quantized
    from .graph.engine import (expand, fuse, fused_attention_peak, kv_rewrite, mla_absorb, moe_routing,
                               sliding_windows, static_cache_decode)
    from .graph.extract import trace_workload

    graph = trace_workload(sc.config, w.model_copy(update={"static_cache_len": None}), sc.plan)
    rt = sc.runtime
    moe = moe_routing(sc.config, sc.plan, w.quant)
    ops, repeats = expand(graph.ops, graph.repeats, w, rt, graph.meta.get("vocab_size") or 0, w.batch // sc.plan.dp,
                          moe, bool(sc.device.gpu.peak_flops_per_s.fp8), fp8_block_scaled(sc.config, rt.name))
    ops, repeats = fuse(ops, repeats, rt.fusions, rt.kv_cache == "preallocated")
    if "native_gqa" in rt.fusions and w.phase == "decode":   # an engine's own MLA kernels (HF's, compiled or
        ops, repeats = mla_absorb(ops, repeats, sc.config)     # not, up-project the whole cache every step)
    peak = fused_attention_peak(graph, ops)
    if peak != graph.peak_activation_bytes:
        graph = replace(graph, peak_activation_bytes=peak)
    if rt.static_cache and w.phase == "decode":    # HF StaticCache: masked attention over max_cache_len
        ops, repeats = static_cache_decode(ops, repeats, w.seq, w.static_cache_len or w.seq,
                                           sliding_windows(sc.config))
    if rt.fusions or sc.kv_dtype != "auto":   # engines with their own KV cache and attention kernels
        # the sliding window as the engine's own attention kernel takes it (vLLM's FlashAttention window_size); HF's
        # compiled runtime (graphs) runs transformers' masked SDPA, as traced
        ops = kv_rewrite(ops, None if sc.kv_dtype == "auto" else sc.kv_dtype,
                         sliding_windows(sc.config) if "native_gqa" in rt.fusions else None)
    costs = [quantized(op_cost(op), op, w.quant) for op in ops]
    if moe is not None and moe.get("rows_share", 1.0) < 1.0:
        costs = [expert_parallel_rows(c, op, moe["rows_share"]) for c, op in zip(costs, ops)]
    if rt.kv_cache == "preallocated":   # the engine writes the new tokens in place: no cat kernel
        costs = [kv_append_in_place(c, op) for c, op in zip(costs, ops)]
        ops = [replace(op, attrs={k: v for k, v in op.attrs.items() if k != "strided_inputs"})
               if op.attrs.get("strided_inputs") and is_kv_append(op) else op for op in ops]
    from .cost.timeline import layer_walk_repeats

    reps = np.array(repeats, dtype=float)
    arrays = OpArrays(ops=tuple(ops), costs=tuple(costs), repeats=reps, walk_repeats=layer_walk_repeats(ops, reps),
                      phases=tuple(op.phase for op in ops), kinds=tuple(c.kind for c in costs),
                      launches=np.array([c.launches for c in costs], dtype=float),
                      flops=float(np.dot([c.flops for c in costs], reps)),
                      bytes=float(np.dot([c.bytes for c in costs], reps)),
                      unknown=tuple(sorted({op.name for op in ops if not is_known(op)})), graph=graph)
    return _remember(_DEVICE_FREE, key, arrays, DEVICE_FREE_CACHE_SIZE)


def step_cost(sc: Scenario, shape: StepShape, **overrides) -> StepCost:
    """The cost of one step of ``shape`` in scenario ``sc`` (memoised on both); ``overrides``: workload fields a
    study sets itself (Scenario.workload)."""
    w = sc.workload(shape, **overrides)
    return workload_cost(sc, w)


def workload_cost(sc: Scenario, w: Workload) -> StepCost:
    key = (sc.key, w)
    found = _STEPS.get(key)
    if found is not None:
        return found
    return _remember(_STEPS, key, _device_half(sc, w, op_arrays(sc, w)), STEP_CACHE_SIZE)


def replay_kernel_gap_s(sc: Scenario) -> float:
    """GPU time a CUDA-graph engine's replay adds to each kernel beyond the calibration's tiny-kernel replay
    (RuntimeSpec.replay_kernel_gap_s, measured on compiled models; 0 where the profile has none)."""
    rt = sc.runtime
    return (rt.replay_kernel_gap_s or 0.0) if rt.dispatch == "graphs" and rt.kernel_overhead_s is None else 0.0


def graph_credit_s(sc: Scenario, cal) -> float:
    """Under CUDA graphs (the calibration's graph replay cost per kernel) each kernel sheds the eager stream's
    launch gap; 0 for eager dispatch or an engine with its own per-kernel overhead."""
    from .cost.efficiency import graph_replay_credit_s

    rt = sc.runtime
    return graph_replay_credit_s(cal, sc.device.gpu) if rt.dispatch == "graphs" and rt.kernel_overhead_s is None \
        else 0.0


def _device_half(sc: Scenario, w: Workload, a: OpArrays) -> StepCost:
    from .cost.efficiency import runtime_scales
    from .cost.energy import TENSOR_CORE_DTYPES, step_energy_j, waiting_power_w
    from .cost.memory import breakdown, with_runtime_reserve
    from .cost.ops_time import compute_dtype, op_time
    from .cost.timeline import cpu_costs, simulate, step_host_s

    dev, rt, plan = sc.device, sc.runtime, sc.plan
    cal = sc.calibration
    compute_scale, memory_scale = runtime_scales(rt, dev.gpu, cal, w.dtype)
    credit_s, gap_s = graph_credit_s(sc, cal), replay_kernel_gap_s(sc)
    aten = rt.dispatch != "graphs"     # PyTorch's own kernels run the unfused ops (ops_time.op_time)
    times = [op_time(op, c, dev, cal, w.dtype, compute_scale, memory_scale, rt.matvec_max_tokens, credit_s, aten,
                     gap_s) for op, c in zip(a.ops, a.costs)]
    gpu_s = np.array([t.gpu_s for t in times])
    # an engine's slower kernels keep the SMs as busy as the calibrated ones they replace (emulated tensor ops,
    # less tuned shaders): power follows the activity before the engine's scale
    busy_c = np.array([t.compute_s for t in times]) / min(compute_scale, 1.0)
    busy_m = np.array([t.memory_s for t in times]) / min(memory_scale, 1.0)
    tensor_core = np.array([c.kind in ("gemm", "attention")
                            and compute_dtype(op, w.dtype, sc.device.gpu) in TENSOR_CORE_DTYPES
                            for op, c in zip(a.ops, a.costs)], dtype=bool)
    power_w = ratio = None
    if sc.power is not None:
        from .cost.power import apply_power_mode, mix_ratio, reference_clock_mhz

        ref = reference_clock_mhz(dev.gpu, cal, gpu_s, busy_c, busy_m, tensor_core)
        ratio = mix_ratio(dev.gpu, cal, sc.power, ref)
        gpu_s, power_w = apply_power_mode(dev.gpu, cal, sc.power, gpu_s, busy_c, busy_m, tensor_core, ref)
        times = [replace(t, gpu_s=g) for t, g in zip(times, gpu_s.tolist())]
    model_type = sc.config.get("model_type")
    cpu_s = cpu_costs(a.ops, list(a.kinds), a.launches, cal, rt, w.phase, model_type)
    syncs = np.array([k == "sync" for k in a.kinds])
    # HF's per-call host work happens once per model call: in the first stage's timeline (pp 1), else added once
    head_s = step_host_s(cal, rt, w.phase, model_type)
    timeline = simulate(gpu_s, cpu_s, a.repeats, syncs, head_s if plan.pp == 1 else 0.0,
                        a.phases, a.walk_repeats)
    stage_s = timeline.runtime_s + rt.per_step_overhead_s
    # the GPUs of one pipeline stage (tensor x data parallel) work together; the stages run one after another
    # (no micro-batching): each stage's GPUs wait, at the waiting power, while the other pp - 1 stages run
    stage_j, _ = step_energy_j(dev.gpu, cal, gpu_s, busy_c, busy_m, a.repeats, stage_s, plan.tp * plan.dp,
                               power_w, tensor_core, sc.power.power_limit_w if sc.power is not None else None,
                               ratio)
    runtime_s = stage_s * plan.pp + (head_s if plan.pp > 1 else 0.0)
    energy_j = stage_j * plan.pp + waiting_power_w(dev.gpu, cal) * (plan.pp - 1) * stage_s * plan.gpus
    table = tuple(op_rows(a.ops, a.costs, times, a.repeats, stage_s))
    return StepCost(runtime_s, energy_j, energy_j / (runtime_s * plan.gpus) if runtime_s else 0.0, a.flops, a.bytes,
                    table, a.unknown, with_runtime_reserve(
                        stage_memory(expert_memory(kv_memory(static_kv(breakdown(a.graph, w, dev), w, rt, sc.config),
                                                             w.dtype, sc.kv_dtype), sc, w.dtype, a.graph.layers),
                                     sc, w.dtype, a.graph.layers), cal, rt.framework,
                        plan.tp * plan.pp > 1 or "comm" in a.kinds), w,
                    timeline.gpu_busy_s, timeline.cpu_busy_s)


def expert_memory(mem: MemoryBreakdown, sc: Scenario, dtype: str, stage_layers: int | None = None) -> MemoryBreakdown:
    """The breakdown with quantized expert weights (gpt-oss MXFP4, or --quant): the gate/up and down expert tensors, E x 3 x
    hidden x moe width per MoE layer of the traced stage (its first ``stage_layers`` layers; graph.engine.
    moe_layer_count: not DeepSeek's first dense layers), at their stored width; per GPU over max(tp, ep) (experts
    and their widths are split over both)."""
    from .graph.engine import expert_weight_bytes, moe_layer_count
    from .units import DTYPE_BYTES

    element = expert_weight_bytes(sc.config, sc.quant)
    params = _expert_params_per_gpu(sc)
    if element is None or not params:
        return mem
    saved = moe_layer_count(sc.config, stage_layers) * params * (DTYPE_BYTES[dtype] - element) / GB
    return mem.model_copy(update={"weights_gb": mem.weights_gb - saved, "total_gb": mem.total_gb - saved})


def _expert_params_per_gpu(sc: Scenario) -> float:
    """Routed expert weights of one MoE layer on one GPU: E x 3 x hidden x moe width over max(tp, ep) (experts and
    their widths are split over both); 0 for a dense model."""
    from .graph.engine import expert_count

    cfg = sc.config
    experts = expert_count(cfg)
    if not experts:
        return 0.0
    width = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    return experts * 3 * cfg["hidden_size"] * width / max(sc.plan.tp, sc.plan.ep)


def state_groups(sc: Scenario, param_count: float, stage_layers: int) -> tuple[tuple[float, int, int], ...]:
    """The parameters per GPU of the heaviest pipeline stage (the traced stage's ``param_count``, plus what a
    later stage of an MoE whose first layers are dense holds more: heaviest_stage_extra) by the data-parallel group
    that holds copies of them, as (parameters, group size, rank stride): the dense ones over the dp ranks (tp
    apart); with expert parallelism over data-parallel ranks (ep > tp) an MoE's routed experts over the
    expert-data-parallel ranks, tp x dp / max(tp, ep) of them, max(tp, ep) apart (Megatron's expert data parallel
    group: the GPUs holding the same experts, whose gradients and ZeRO shards are reduced and split among
    themselves). With pipeline stages an untied model's first stage holds the embedding and its last the LM head,
    not both (pipeline_vocab_params)."""
    from .graph.engine import moe_layer_count

    plan = sc.plan
    extra_layers, routed, other = heaviest_stage_extra(sc, stage_layers)
    traced = moe_layer_count(sc.config, stage_layers) * _expert_params_per_gpu(sc)   # the traced stage's experts
    experts = traced + extra_layers * routed
    dense = max(param_count - traced + extra_layers * other - pipeline_vocab_params(sc), 0.0)
    if plan.ep <= plan.tp:
        return ((dense + experts, plan.dp, plan.tp),)
    return ((dense, plan.dp, plan.tp), (experts, plan.tp * plan.dp // max(plan.tp, plan.ep), max(plan.tp, plan.ep)))


def pipeline_vocab_params(sc: Scenario) -> float:
    """Parameters per GPU of one vocabulary matrix that the traced stage (layers, embedding and LM head) holds beyond
    any real pipeline stage: with pp > 1 and untied embeddings the first stage holds the embedding and the last the
    head (Megatron; tied ones keep a copy on both, as traced); vocab / tp rows where the vocabulary is
    tensor-parallel. 0 otherwise."""
    from .graph.build import make_config

    if sc.plan.pp <= 1:
        return 0.0
    hf = make_config(sc.config)   # hidden_size is every family's width (HF attribute_map: n_embd, d_model)
    if getattr(hf, "tie_word_embeddings", False) or not getattr(hf, "vocab_size", None):
        return 0.0
    return hf.vocab_size * getattr(hf, "hidden_size", 0) / (sc.plan.tp if sc.plan.tp_scope == "full" else 1)


def heaviest_stage_extra(sc: Scenario, stage_layers: int) -> tuple[int, float, float]:
    """A pipeline stage is traced as the model's first ``stage_layers`` layers; where those include dense layers
    (DeepSeek's first_k_dense_replace, Qwen-MoE's mlp_only_layers) a later stage holds more MoE layers, as many as
    the stage has layers (or the model has MoE layers). Returns (how many more, per such layer the routed expert
    parameters per GPU, and its shared experts and router less the dense MLP it replaces, per GPU); 0 layers for
    pp 1 or a model whose traced stage is already all MoE."""
    from .graph.engine import expert_count, moe_layer_count

    cfg, plan = sc.config, sc.plan
    moe_total = moe_layer_count(cfg)
    if plan.pp <= 1 or not moe_total:
        return 0, 0.0, 0.0
    extra_layers = min(stage_layers, moe_total) - moe_layer_count(cfg, stage_layers)
    if extra_layers <= 0:
        return 0, 0.0, 0.0
    h = cfg["hidden_size"]
    width = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    shared = cfg.get("shared_expert_intermediate_size") or (cfg.get("n_shared_experts") or 0) * width
    other = 3 * h * (shared - cfg["intermediate_size"]) / plan.tp + expert_count(cfg) * h
    return extra_layers, _expert_params_per_gpu(sc), other


def stage_memory(mem: MemoryBreakdown, sc: Scenario, dtype: str, stage_layers: int) -> MemoryBreakdown:
    """The weights per GPU of the heaviest pipeline stage: an untied model's stage holds the embedding (first) or
    the LM head (last), not both as traced (pipeline_vocab_params, in the model dtype: vLLM's PPMissingLayer on the
    other ranks, Megatron's stages); and a later stage of an MoE whose first layers are dense holds more MoE layers
    than the traced first stage (heaviest_stage_extra): each extra MoE layer's experts, shared experts and router
    in place of a dense MLP, at their stored bytes (the router in the model dtype)."""
    from .formulas import QUANT_BYTES_PER_WEIGHT
    from .graph.engine import expert_count, expert_weight_bytes
    from .units import DTYPE_BYTES

    vocab = pipeline_vocab_params(sc) * DTYPE_BYTES[dtype] / GB
    if vocab:
        mem = mem.model_copy(update={"weights_gb": mem.weights_gb - vocab, "total_gb": mem.total_gb - vocab})
    extra_layers, routed, other = heaviest_stage_extra(sc, stage_layers)
    if not extra_layers:
        return mem
    router = expert_count(sc.config) * sc.config["hidden_size"]
    linear = QUANT_BYTES_PER_WEIGHT.get(sc.quant, DTYPE_BYTES[dtype])
    expert = expert_weight_bytes(sc.config, sc.quant) or linear
    extra = extra_layers * max(routed * expert + (other - router) * linear + router * DTYPE_BYTES[dtype], 0.0) / GB
    return mem.model_copy(update={"weights_gb": mem.weights_gb + extra, "total_gb": mem.total_gb + extra})


def static_kv(mem: MemoryBreakdown, w: Workload, rt, config: dict) -> MemoryBreakdown:
    """A static-cache runtime's decode holds max_cache_len slots per sequence (StaticLayer preallocates them),
    not the context's; a sliding-window layer min(max_cache_len, window) (StaticSlidingWindowLayer) where the traced
    step held min(seq, window)."""
    from .graph.engine import sliding_windows, windowed_fraction

    if not (rt.static_cache and w.phase == "decode" and w.static_cache_len and mem.kv_cache_gb):
        return mem
    windows, share = sliding_windows(config), windowed_fraction(config)
    window = windows["window"] if windows else w.seq
    held = share * min(w.seq, window) + (1 - share) * w.seq
    slots = share * min(w.static_cache_len, window) + (1 - share) * w.static_cache_len
    kv = mem.kv_cache_gb * slots / held
    return mem.model_copy(update={"kv_cache_gb": kv, "total_gb": mem.total_gb - mem.kv_cache_gb + kv})


def kv_memory(mem: MemoryBreakdown, dtype: str, kv_dtype: str) -> MemoryBreakdown:
    """The breakdown with the KV cache stored in ``kv_dtype`` (auto: the model dtype, unchanged)."""
    from .units import DTYPE_BYTES

    if kv_dtype == "auto" or not mem.kv_cache_gb:
        return mem
    kv = mem.kv_cache_gb * DTYPE_BYTES[kv_dtype] / DTYPE_BYTES[dtype]
    return mem.model_copy(update={"kv_cache_gb": kv, "total_gb": mem.total_gb - mem.kv_cache_gb + kv})


def op_rows(ops, costs, times, repeats, runtime_s: float) -> list[OpCost]:
    """One row per op name: count, FLOPs, bytes and GPU time summed, the dominant bound, share of the step."""
    groups: dict[str, list] = {}
    for op, c, t, r in zip(ops, costs, times, repeats):
        if c.kind in ("none", "module") and t.gpu_s == 0:
            continue
        g = groups.setdefault(op.name, [0.0, 0.0, 0.0, 0.0, {}])
        g[0] += r
        g[1] += c.flops * r
        g[2] += c.bytes * r
        g[3] += t.gpu_s * r
        g[4][t.bound] = g[4].get(t.bound, 0.0) + t.gpu_s * r
    rows = [OpCost(name=n, count=int(round(g[0])), flops=g[1], bytes=g[2], time_ms=g[3] * MS_PER_S,
                   bound=max(g[4], key=g[4].get) if g[4] else "none",
                   share=g[3] / runtime_s if runtime_s else 0.0) for n, g in groups.items()]
    return sorted(rows, key=lambda r: -r.time_ms)


def linear_total(cost_at, lo: float, hi: float, count: float, total: float,
                 row_scale: float | None = None) -> StepCost:
    """The sum of ``count`` steps whose sizes x (a context length, a prompt length) lie in [lo, hi] and sum to
    ``total``, for a cost linear in x: only the two ends are costed, and
    sum_i c(x_i) = count * c(lo) + (c(hi) - c(lo)) * (total - count * lo) / (hi - lo).
    Decode steps are linear in their context (attention reads it; everything else does not depend on it), and a
    prompt call in its length. Op rows are those of the ``hi`` step times ``row_scale`` (default ``count``)."""
    if count <= 0:
        return EMPTY
    a = cost_at(lo)
    if hi <= lo:
        return a.times(count)
    b = cost_at(hi)
    frac = (total - count * lo) / (hi - lo)

    def mix(attr: str) -> float:
        return count * getattr(a, attr) + (getattr(b, attr) - getattr(a, attr)) * frac

    scale = count if row_scale is None else row_scale
    rows = tuple(r.model_copy(update={"count": round(r.count * count), "flops": r.flops * scale,
                                      "bytes": r.bytes * scale, "time_ms": r.time_ms * scale}) for r in b.table)
    runtime_s = mix("runtime_s")
    return StepCost(runtime_s, mix("energy_j"), b.power_w, mix("flops"), mix("bytes"), rows,
                    tuple(sorted(set(a.unknown) | set(b.unknown))), b.memory, b.workload, mix("gpu_busy_s"),
                    mix("cpu_busy_s"))


def clear_caches() -> None:
    _DEVICE_FREE.clear()
    _STEPS.clear()
