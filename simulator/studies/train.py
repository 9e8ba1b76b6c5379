"""Training plan study: one optimizer step of data / ZeRO / FSDP / pipeline parallel training -> TrainResult.

Built on the step cost of one micro-batch's forward + backward on one GPU (the traced graph: the precision mode
sets its dtype and autocast, checkpointing recomputes each layer in backward, TP collectives are traced ops):

    step = compute + exposed data-parallel communication + optimizer (+ ZeRO-1/2's parameter all-gather)
    compute = m * t_mb                                   (no pipeline; m micro-batches per replica)
            = (m + pp - 1) * t_mb                        (1F1B: the bubble is (pp - 1) / m of the work)
            = (m + (pp - 1) / v) * t_mb                  (interleaved 1F1B with v chunks per stage)
    DDP:   all-reduce of the gradients in ``bucket_mb`` buckets, overlapped with the last micro-batch's backward:
           exposed = max(0, sum(buckets) - last - backward) + last bucket   (PyTorch DDP reducer; no_sync on the
           accumulation micro-batches), plus the copies of the gradients into the buckets
    ZeRO-1/2: reduce-scatter of the gradients (overlapped as DDP's), all-gather of the updated parameters after the
           optimizer step (exposed); stage 2 reduce-scatters every micro-batch
    ZeRO-3 / FSDP: per micro-batch an all-gather of every unit's parameters before forward and again before
           backward (reshard after forward) and a reduce-scatter of its gradients, prefetched one unit ahead:
           exposed = first unit + max(0, all-gathers - forward) + max(0, all-gathers + reduce-scatters - backward)
           + last unit's reduce-scatter, plus FSDP2's copy-in/copy-out and dtype casts (memory-bound kernels)
Sources: Li et al. 2020 "PyTorch Distributed" (VLDB; DDP buckets, overlap, no_sync); Rajbhandari et al. 2020
"ZeRO" (SC20; stages, 2+2+12 bytes, traffic); Zhao et al. 2023 "PyTorch FSDP" (VLDB; prefetch, units);
Narayanan et al. 2021 (SC21; 1F1B and interleaved schedules, bubble (p - 1) / m and (p - 1) / (v m)).
MFU = model FLOPs (6 N + causal attention 6 L d_attn (s + 1) per token, see model_flops_per_token) / (step x
GPUs x dense peak).
Known inaccuracies: communication kernels are taken not to slow the compute they overlap (they take SMs and
memory bandwidth in reality); pipeline p2p sends are exposed only in the fill and drain; the costed stage's time
carries both the embedding and the head and loss (its memory is the larger of the first stage, min(pp, m)
micro-batches' saved activations and the embedding, and the last, one micro-batch with the head and loss:
aisim.cost.memory.train_breakdown); energy covers the compute only.
"""
from __future__ import annotations


from types import SimpleNamespace

from pydantic import BaseModel, ConfigDict, Field

from ..errors import AisimError
from ..results import MemoryBreakdown, OpCost
from ..scenario import Scenario, calibration_note
from ..step import op_arrays, pipeline_vocab_params, state_groups, step_cost
from ..units import MS_PER_S
from ..workload import MAX_BATCH, MAX_TOKENS, StepShape, TrainPlan
from .common import not_fit_reason, train_not_fit_hint
from .single import check_positions

PRECISION_DTYPE = {"bf16-mixed": "bf16", "16-mixed": "fp16", "bf16-true": "bf16", "16-true": "fp16",
                   "32-true": "fp32"}
MB = 2 ** 20  # DDP's bucket_cap_mb is in MiB (torch/nn/parallel/distributed.py: bucket_cap_mb * 1024 * 1024)


class TrainRequest(BaseModel):
    """One training step: the global ``batch`` (sequences, split over data-parallel replicas) of ``seq`` tokens,
    the training plan, and optionally a token budget for the time to train."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    batch: int = Field(ge=1, le=MAX_BATCH)
    seq: int = Field(ge=1, le=MAX_TOKENS)
    plan: TrainPlan = TrainPlan()
    token_budget: float | None = Field(None, gt=0)


class TrainResult(BaseModel):
    """Per optimizer step. ``phases``: compute, pipeline bubble, exposed communication, optimizer (ms)."""
    fits: bool
    not_fit_reason: str | None = None
    step_ms: float | None
    memory: MemoryBreakdown
    micro_batch: int
    grad_accum: int
    tokens_per_step: int
    tokens_per_s: float | None
    tokens_per_s_per_gpu: float | None
    model_tflops_per_gpu: float | None
    mfu: float | None
    hardware_tflops_per_gpu: float | None
    time_to_train_s: float | None = None
    flops_per_gpu: float = Field(0.0, description="traced FLOPs of the step's micro-batches on one GPU")
    bytes_per_gpu: float = Field(0.0, description="bytes they move")
    energy_j: float | None = Field(None, description="every GPU of the plan over the step: the micro-batches' "
                                   "kernels, waiting power through the bubble and exposed communication")
    phases: dict[str, float] = Field(default_factory=dict)
    top_ops: list[OpCost] = Field(default_factory=list)
    unknown_ops: list[str] = Field(default_factory=list)
    assumptions: list[str] = Field(default_factory=list)


def check_interleaved(config: dict, pp: int, v: int, m: int) -> None:
    """Megatron's interleaved 1F1B: each stage's layers split into v equal model chunks
    (num_layers_per_virtual_pipeline_stage), v of at least 2, and the micro-batches a multiple of pp
    (megatron/core/pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving)."""
    layers = config.get("num_hidden_layers") or config.get("n_layer") or 0
    per_stage = layers // pp if layers % pp == 0 else None
    if per_stage is None:
        raise AisimError(f"--pp-schedule interleaved: the {layers} layers do not split evenly over --pp {pp}; "
                         "choose a --pp that divides them")
    chunks = [d for d in range(2, per_stage + 1) if per_stage % d == 0]
    if v < 2 or per_stage % v:
        raise AisimError(f"--virtual-stages {v}: each of the {pp} stages holds {per_stage} layers, which the model "
                         f"chunks must split evenly; choose one of {', '.join(map(str, chunks)) or 'none (use 1f1b)'}")
    if m % pp:
        raise AisimError(f"--pp-schedule interleaved needs micro-batches per step in multiples of --pp {pp} (got {m}); "
                         "raise --grad-accum or the batch, or use --pp-schedule 1f1b")


def micro_batching(batch: int, dp: int, plan: TrainPlan) -> tuple[int, int]:
    """(micro-batch, micro-batches per step) of one replica; the replica's batch is batch / dp."""
    if batch % dp:
        raise AisimError(f"data parallel {dp} does not divide the global batch {batch}; give a batch divisible by "
                         f"{dp}")
    local = batch // dp
    if plan.micro_batch is not None:
        if plan.micro_batch > local:
            raise AisimError(f"--micro-batch {plan.micro_batch} exceeds the {local} sequences per replica (batch "
                             f"{batch} / dp {dp}); give at most {local}")
        if local % plan.micro_batch:
            raise AisimError(f"--micro-batch {plan.micro_batch} does not divide the {local} sequences per replica "
                             f"(batch {batch} / dp {dp})")
        m = local // plan.micro_batch
        if plan.grad_accum is not None and plan.grad_accum != m:
            raise AisimError(f"--grad-accum {plan.grad_accum} disagrees with batch {batch} / (dp {dp} x micro-batch "
                             f"{plan.micro_batch}) = {m}; give one of them")
        return plan.micro_batch, m
    m = plan.grad_accum or 1
    if local % m:
        raise AisimError(f"--grad-accum {m} does not divide the {local} sequences per replica")
    return local // m, m


def traced_options(plan: TrainPlan) -> dict:
    """Workload fields of the traced micro-batch: dtype, autocast (plain/DDP mixed precision runs under
    torch.autocast with fp32 weights; ZeRO/FSDP cast the weights themselves, so their compute is pure 16-bit),
    recompute, and whether full gradients are released as produced (ZeRO-2/3, FSDP)."""
    mixed = plan.precision.endswith("-mixed")
    options = {"dtype": PRECISION_DTYPE[plan.precision], "autocast": mixed and plan.stage == 0,
               "recompute": plan.recompute, "grad_release": plan.stage >= 2}
    return options | ({"attn_impl": "eager"} if plan.attention == "explicit" else {})


def train(sc: Scenario, req: TrainRequest) -> TrainResult:
    from ..cost.memory import TRAIN_STATE_BYTES, train_breakdown, with_runtime_reserve

    plan, par = req.plan, sc.plan
    if sc.config.get("is_encoder_decoder"):
        raise AisimError("a training step is not modelled for an encoder-decoder model: estimate its encode, "
                         "prefill / decode / generate or transcribe workloads")
    b, m = micro_batching(req.batch, par.dp, plan)
    if plan.pp_schedule == "interleaved" and par.pp > 1:
        check_interleaved(sc.config, par.pp, plan.virtual_stages, m)
    shape = StepShape(phase="forward-backward", batch=b * par.dp, seq=req.seq)
    check_positions(sc.config, SimpleNamespace(phase="forward-backward", seq=req.seq, gen_tokens=0), learned_only=True)
    options = traced_options(plan)
    mb = step_cost(sc, shape, **options)
    w = mb.workload
    graph = op_arrays(sc, w).graph
    in_flight = _in_flight(par.pp, m, plan)
    from .train_comm import dp_comm, optimizer_cost, pipeline_p2p, shard_groups

    groups = state_groups(sc, graph.param_count, graph.layers)
    shards = shard_groups(sc, plan, groups)      # HYBRID_SHARD: the states sharded inside a node
    # a forward that follows a backward of the same step (m > pp) runs beside the accumulated gradients
    memory = with_runtime_reserve(
        train_breakdown(graph, w, plan, par.dp, sc.device, in_flight, accumulating=m > par.pp, groups=shards,
                        pp=par.pp, root_less=pipeline_vocab_params(sc)),
        sc.calibration, sc.runtime.framework, par.gpus > 1)
    notes = list(sc.assumptions) + _notes(plan, par, b, m, {"adamw": "AdamW", "sgd": "SGD"}[sc.optimizer])
    limit = sc.config.get("max_position_embeddings")
    if limit and req.seq > limit:   # not a learned table (check_positions refused those)
        rotary = any(sc.config.get(k) for k in ("rope_theta", "rope_scaling", "rope_parameters", "rotary_dim"))
        notes.append(f"seq {req.seq:,} is beyond the model's {limit:,} positions: costed as training "
                     + ("with its rotary positions extended (rope_scaling set for that length)" if rotary else
                        "past the length its positions were made for")
                     + "; the model as shipped was not trained there")
    cal = calibration_note(sc)
    notes += [cal] if cal else []
    parts = (memory.weights_gb + memory.activations_gb + memory.gradients_gb + memory.optimizer_gb
             + memory.workspace_gb)
    if parts > memory.total_gb * 1.01:
        notes.append(f"memory: each part is shown at its own largest; they add to {parts:.2f} GB, the peak is "
                     f"{memory.total_gb:.2f} GB (the parts peak at different moments of the step: activations "
                     "at the forward's end, gradients late in the backward as it frees activations)")
    tokens = req.batch * req.seq
    reason = not_fit_reason(memory, sc.device.gpu.name, train_not_fit_hint(plan.stage, plan.recompute, b, plan.fsdp))
    rows = [r.model_copy(update={"count": round(r.count * m), "flops": r.flops * m, "bytes": r.bytes * m,
                                 "time_ms": r.time_ms * m}) for r in mb.table]
    if reason is not None:   # no times (it would not run), but the work it would do, as inference reports it
        return TrainResult(fits=False, not_fit_reason=reason, step_ms=None, memory=memory, micro_batch=b,
                           grad_accum=m, tokens_per_step=tokens, tokens_per_s=None, tokens_per_s_per_gpu=None,
                           model_tflops_per_gpu=None, mfu=None, hardware_tflops_per_gpu=None,
                           flops_per_gpu=mb.flops * m, bytes_per_gpu=mb.bytes * m, top_ops=rows,
                           unknown_ops=list(mb.unknown), assumptions=notes)

    t_mb = mb.runtime_s / par.pp
    bwd_frac = _backward_fraction(sc, w)
    weight_b, grad_b, compute_b = TRAIN_STATE_BYTES[plan.precision]
    compute_s = _pipeline_s(t_mb, m, par.pp, plan)
    opt = optimizer_cost(sc, graph, plan, par.dp, shards)
    comm = dp_comm(sc, graph, plan, m, t_mb * (1 - bwd_frac), t_mb * bwd_frac, w.autocast, groups)
    p2p_s = pipeline_p2p(sc, b, req.seq, compute_b, plan) if par.pp > 1 else 0.0
    step_s = compute_s + comm.exposed_s + opt.time_s + p2p_s
    # the traced collectives (tensor parallel, expert parallel all-to-all) run inside the micro-batches' compute:
    # their time is part of compute_ms, shown beside it (phases do not add up past it)
    traced_comm_ms = sum(r.time_ms for r in rows if r.name.startswith("nccl."))
    rows += comm.rows + opt.rows
    rows = sorted((r.model_copy(update={"share": r.time_ms / (step_s * MS_PER_S)}) for r in rows),
                  key=lambda r: -r.time_ms)
    gpus = par.gpus
    peak = sc.device.gpu.peak_for(PRECISION_DTYPE[plan.precision])
    model_flops = model_flops_per_token(sc.config, req.seq) * tokens
    per_gpu = model_flops / step_s / gpus
    from ..cost.energy import waiting_power_w

    idle_w = waiting_power_w(sc.device.gpu, sc.calibration)
    busy_j = mb.energy_j - idle_w * (par.pp - 1) * t_mb * gpus   # the stages ran one after another in mb
    energy_j = m * busy_j + idle_w * gpus * max(step_s - m * t_mb, 0.0)
    phases = {"compute_ms": m * t_mb * MS_PER_S, "collectives_in_compute_ms": traced_comm_ms,
              "bubble_ms": (compute_s - m * t_mb) * MS_PER_S,
              "exposed_comm_ms": (comm.exposed_s + p2p_s) * MS_PER_S, "comm_total_ms": comm.total_s * MS_PER_S,
              "optimizer_ms": opt.time_s * MS_PER_S}
    return TrainResult(
        fits=True, step_ms=step_s * MS_PER_S, memory=memory, micro_batch=b, grad_accum=m, tokens_per_step=tokens,
        tokens_per_s=tokens / step_s, tokens_per_s_per_gpu=tokens / step_s / gpus,
        model_tflops_per_gpu=per_gpu / 1e12, mfu=per_gpu / peak,
        hardware_tflops_per_gpu=mb.flops * m / step_s / 1e12,
        time_to_train_s=req.token_budget / (tokens / step_s) if req.token_budget else None, energy_j=energy_j,
        flops_per_gpu=mb.flops * m, bytes_per_gpu=mb.bytes * m,
        phases=phases, top_ops=rows, unknown_ops=list(mb.unknown), assumptions=notes)


def _in_flight(pp: int, m: int, plan: TrainPlan) -> float:
    """Micro-batches whose activations the first 1F1B stage holds: min(pp, m); interleaved: times
    (1 + (pp - 1) / (pp v)) (Narayanan et al. 2021, sec. 2.2.2)."""
    if pp == 1:
        return 1.0
    held = min(pp, m)
    return held * (1 + (pp - 1) / (pp * plan.virtual_stages)) if plan.pp_schedule == "interleaved" else held


def _pipeline_s(t_mb: float, m: int, pp: int, plan: TrainPlan) -> float:
    if pp == 1:
        return m * t_mb
    v = plan.virtual_stages if plan.pp_schedule == "interleaved" else 1
    return (m + (pp - 1) / v) * t_mb


def _backward_fraction(sc: Scenario, w) -> float:
    """The backward's share of a micro-batch, by traced FLOPs (recomputed forwards included)."""
    a = op_arrays(sc, w)
    total = sum(c.flops * r for c, r in zip(a.costs, a.repeats))
    back = sum(c.flops * r for op, c, r in zip(a.ops, a.costs, a.repeats) if op.phase == "backward")
    return back / total if total else 2.0 / 3.0


def model_flops_per_token(config: dict, seq: int) -> float:
    """Model FLOPs of training one token (no recompute): 6 N + 6 L d_attn (seq + 1).

    N (matmul_params, active) counts the weight matmuls of the decoder layers (attention projections, MLP) and the
    logit layer, not the input embedding (a lookup): Megatron's model FLOPs (Narayanan et al. 2021, appendix;
    Korthikanti et al. 2022 use it for MFU), each matmul once forward and twice backward, 2 FLOPs per multiply-add.
    The attention term counts QK^T and PV (4 d_attn FLOPs per query-key pair forward, 12 with backward) over the
    causal triangle, a mean of (seq + 1) / 2 keys per query: half of PaLM's 12 L H Q T (Chowdhery et al. 2022,
    appendix B) and of Megatron's s / 6h term, which count the full square although a causal flash kernel computes
    only the triangle (aisim.formulas.attention_pairs). So MFU <= hardware FLOPs utilisation without recompute."""
    from ..graph.build import make_config

    hf = make_config(config)
    heads = hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    return 6.0 * matmul_params(config) + 6.0 * hf.num_hidden_layers * heads * head_dim * (seq + 1) * (seq > 0)


def matmul_params(config: dict, active: bool = True, routed: bool = True) -> float:
    """Weights of the decoder layers' matmuls and the logit layer (not the input embedding). MoE layers: the routed
    top-k experts, the shared experts and the router with ``active`` (what a token runs through: MFU), every expert
    without (what the GPUs hold: the planner's memory bound), no routed expert with ``routed`` False (what expert
    parallelism does not split); the layers without experts
    (graph.engine.moe_layer_count: DeepSeek's first_k_dense_replace, Qwen-MoE's mlp_only_layers) their dense MLP.
    Known inaccuracy: MLA's low-rank attention projections are counted as plain multi-head ones."""
    from ..graph.build import make_config
    from ..graph.engine import TOP_K_KEYS, expert_count, moe_layer_count

    hf = make_config(config)
    h, layers = hf.hidden_size, hf.num_hidden_layers
    heads = hf.num_attention_heads
    kv = getattr(hf, "num_key_value_heads", None) or heads
    head_dim = getattr(hf, "head_dim", None) or h // heads
    inter = getattr(hf, "intermediate_size", None) or getattr(hf, "n_inner", None) or 4 * h
    gated = getattr(hf, "hidden_act", "gelu") in ("silu", "swiglu") or hf.model_type in ("llama", "mistral", "qwen2")
    attn = h * head_dim * (2 * heads + 2 * kv)
    logits = hf.vocab_size * h
    experts = expert_count(config)
    if not experts:
        return float(layers * (attn + (3 if gated else 2) * h * inter) + logits)
    # MoE (gated experts throughout)
    expert_inter = config.get("moe_intermediate_size") or inter
    shared = config.get("shared_expert_intermediate_size") or (config.get("n_shared_experts") or 0) * expert_inter
    per_token = next((config[k] for k in TOP_K_KEYS if config.get(k)), 2) if active else experts
    moe = 3 * h * ((per_token if routed else 0) * expert_inter + shared) + h * experts
    dense = layers - moe_layer_count(config)      # DeepSeek's first layers, Qwen-MoE's mlp_only_layers: dense MLPs
    return float(layers * attn + dense * 3 * h * inter + (layers - dense) * moe + logits)


def _notes(plan: TrainPlan, par, b: int, m: int, optimizer: str = "AdamW") -> list[str]:
    out = [f"training: {plan.precision}, ZeRO stage {plan.stage}" + (f" (FSDP {plan.fsdp})" if plan.fsdp != "none"
           else "") + f", recompute {plan.recompute}, micro-batch {b} x {m} per replica, dp {par.dp}, "
           f"{optimizer} {plan.optimizer_impl}"]
    if plan.stage and par.dp == 1:
        out.append(f"ZeRO stage {plan.stage} shards over the data-parallel ranks: with dp 1 it changes nothing (give "
                   "--tp 1 or a smaller --tp so the GPUs left are data parallel)")
    if plan.recompute == "selective":
        out.append("recompute selective (Megatron: the attention core) saves nothing over none with a fused "
                   "attention kernel, which never stores the score matrix: traced as none")
    if par.pp > 1:
        v = plan.virtual_stages if plan.pp_schedule == "interleaved" else 1
        out.append(f"pipeline {par.pp} stages, {plan.pp_schedule}"
                   + (f" (v = {plan.virtual_stages})" if plan.pp_schedule == "interleaved" else "")
                   + f": bubble (pp - 1) / {'(m v)' if v > 1 else 'm'} = {(par.pp - 1) / (m * v):.1%} of the work")
    return out


def multi_node_device(device, nodes: int | None = None):
    """``device`` (a name, path or Device) on ``nodes`` nodes of its multi-node system (``--nodes``); names
    ``SYSTEMxN`` resolve in the catalog (aisim.catalog.multi_node)."""
    from .. import catalog

    dev = catalog.resolve_device(device)
    return dev if nodes is None else catalog.multi_node(dev, nodes)


DTYPE_PRECISION = {"bf16": "bf16-true", "fp16": "16-true", "fp32": "32-true", "tf32": "32-true"}


def default_precision(dtype: str, model) -> str:
    """--precision when only --dtype is given: its true precision; auto: the checkpoint's dtype (config.json
    torch_dtype), trained in it, 32-true where it is float32 or unmarked."""
    if dtype == "auto":
        from ..catalog import resolve_model
        from ..scenario import checkpoint_dtype

        dtype = checkpoint_dtype(resolve_model(model)[1])[1] or "fp32"
    return DTYPE_PRECISION.get(dtype, "bf16-true")


def train_estimate(sc: Scenario, req: TrainRequest):
    """The training step as an aisim.results.Estimate (what ``aisim estimate --workload train`` prints): runtime =
    one optimizer step, phases = compute (of it, the traced collectives) / bubble / exposed communication /
    optimizer, the DP collectives as op rows, MFU and time to train among the notes and in ``training``."""
    from ..results import Estimate, TrainFigures
    from ..workload import Workload

    if req.plan.pp_schedule == "interleaved" and sc.plan.pp == 1:
        from ..errors import AisimError

        raise AisimError("--pp-schedule interleaved needs pipeline stages: give --pp 2 or more, or drop it")
    r = train(sc, req)
    options = traced_options(req.plan)
    w = Workload(phase="train", batch=req.batch, seq=req.seq, dtype=options["dtype"], autocast=options["autocast"],
                 recompute=req.plan.recompute, grad_release=options["grad_release"])
    notes = list(r.assumptions)
    dtype = PRECISION_DTYPE[req.plan.precision]
    peak_tflops = sc.device.gpu.peak_for(dtype) / 1e12
    if r.fits:
        notes.append(f"MFU {r.mfu:.1%} of the {dtype} dense peak, {peak_tflops:.0f} TFLOP/s (model FLOPs 6 N + causal "
                     f"attention per token; {r.model_tflops_per_gpu:.0f} TFLOP/s per GPU), hardware "
                     f"{r.hardware_tflops_per_gpu:.0f} TFLOP/s per GPU (traced FLOPs, recompute included)")
        if r.time_to_train_s is not None:
            notes.append(f"time to train {req.token_budget:.3g} tokens: {r.time_to_train_s / 86400:.2f} days")
    step_s = (r.step_ms or 0.0) / MS_PER_S
    return Estimate(model=sc.model, device=sc.device.name, workload=w, plan=sc.plan, runtime=sc.runtime.name,
                    runtime_ms=r.step_ms, memory_gb=r.memory.total_gb, memory=r.memory, energy_j=r.energy_j,
                    energy_j_per_token=r.energy_j / r.tokens_per_step if r.fits else None,
                    power_w=r.energy_j / (step_s * sc.plan.gpus) if r.fits and step_s else None,
                    throughput_tokens_per_s=r.tokens_per_s,
                    tokens=r.tokens_per_step, fits=r.fits,
                    flops=r.flops_per_gpu, bytes=r.bytes_per_gpu, phases=r.phases,
                    top_ops=r.top_ops, unknown_ops=r.unknown_ops, calibrated=sc.calibration_is_own,
                    assumptions=notes, not_fit_reason=r.not_fit_reason,
                    training=TrainFigures(
                        precision=req.plan.precision, zero_stage=req.plan.stage, fsdp=req.plan.fsdp,
                        recompute=req.plan.recompute, optimizer=sc.optimizer, micro_batch=r.micro_batch,
                        grad_accum=r.grad_accum, pp_schedule=req.plan.pp_schedule, tokens_per_step=r.tokens_per_step,
                        tokens_per_s_per_gpu=r.tokens_per_s_per_gpu, model_tflops_per_gpu=r.model_tflops_per_gpu,
                        hardware_tflops_per_gpu=r.hardware_tflops_per_gpu, mfu=r.mfu, mfu_peak_tflops=peak_tflops,
                        time_to_train_s=r.time_to_train_s))
