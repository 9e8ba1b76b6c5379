"""`aisim plan train`: the fastest and cheapest ways to train a model on a token budget, over devices and GPU counts.

Search space per (device, GPU count): TP x PP x EP (MoE) x ZeRO stage x recompute x micro-batch, with DP = GPUs /
(TP x PP) and EP inside TP x DP (experts spread over EP of those GPUs, Megatron's expert model parallel group).
Every candidate is counted; each is either pruned without a trace or costed by aisim.studies.train:
  - shape: TP x PP must divide the GPUs, TP must divide the heads (aisim.plan.check_tp) and stay inside a node, PP
    must not exceed the layers (stages of ceil(layers / PP), Megatron's uneven first/last stages), EP must divide
    TP x DP (and the experts), DP x micro-batch must divide the global batch;
  - states: a lower bound of the persistent bytes per GPU (N / (TP x PP) parameters; weights, AdamW's two states and
    sharded gradients at the precision's bytes, each divided by DP from its ZeRO stage on) above the GPU's memory;
  - activations: a micro-batch larger than one that did not fit with the same recompute (activation memory grows
    with the micro-batch);
  - dominated: a heavier recompute where a lighter one fits at the same micro-batch (recompute adds a forward).
The traced per-GPU graph of one micro-batch depends on (model, micro-batch, seq, TP, PP, precision, recompute,
ZeRO's tracing options), not on DP: it is traced once at DP = 1 and shared by every GPU count and device
(aisim.graph.extract's memory cache; the disk cache keeps it between runs), and step costs are memoised.

Costs: time to train = tokens / (tokens per step / step time); GPU-hours = GPUs x time; $ = GPU-hours x price per
GPU-hour (the GPU spec's default or ``prices``); energy per step = GPUs x (busy power x compute time + waiting power
x (step - compute time)), busy power from the traced micro-batch's kernels (aisim.cost.energy), times PUE; MWh =
energy x steps. Known inaccuracies: communication and the optimizer are charged at the waiting power; hosts,
network switches and storage draw nothing here.
"""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..catalog import resolve_device, resolve_gpu, resolve_model
from ..errors import AisimError
from ..plan import check_ep_experts, check_tp
from ..scenario import Scenario, quantized_training_note, scenario
from ..specs import all_systems
from ..step import step_cost
from ..workload import MAX_BATCH, MAX_TOKENS, ParallelPlan, Precision, Recompute, StepShape, TrainPlan
from .common import price_notes, refuse_gpu_count
from .single import check_positions
from .train import PRECISION_DTYPE, TrainRequest, matmul_params, multi_node_device, traced_options, train

J_PER_MWH = 3.6e9
RECOMPUTE_ORDER = ("none", "selective", "full")   # work added, lightest first; memory saved, least first
S_PER_HOUR = 3600.0


class PlanTrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    model: str
    tokens: float = Field(gt=0, le=1e16, description="tokens to train on (at most 1e16: 600x Llama 3's 15T)")
    seq: int = Field(ge=1, le=MAX_TOKENS)
    global_batch: int = Field(ge=1, le=MAX_BATCH, description="sequences per optimizer step")
    devices: list[str] = Field(min_length=1, description="GPU names (h100, a100) or multi-node systems")
    gpus: list[int] = Field(min_length=1, description="GPU counts to try")
    tp: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    pp: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    zero: list[Literal[0, 1, 2, 3]] = Field(default_factory=lambda: [0, 1, 2, 3], min_length=1)
    recompute: list[Recompute] = Field(default_factory=lambda: ["none", "full"], min_length=1)
    micro_batch: list[int] = Field(default_factory=lambda: [1, 2, 4])
    ep: list[int] | None = Field(None, description="MoE expert parallel degrees to try (Megatron's expert model "
                                 "parallel size, inside tp x dp); default 1 and each of 8 and 64 that divides the "
                                 "experts; a dense model only 1")
    precision: Precision = "bf16-mixed"
    prices: dict[str, float] = Field(default_factory=dict, description="GPU name -> USD per GPU-hour")
    electricity_usd_per_kwh: float = Field(0.10, ge=0)
    pue: float = Field(1.2, ge=1.0, le=3.0)


class TrainCandidate(BaseModel):
    device: str
    system: str
    gpus: int
    tp: int
    pp: int
    dp: int
    ep: int = 1
    zero: int
    recompute: str
    micro_batch: int
    grad_accum: int
    step_ms: float
    tokens_per_s: float
    mfu: float
    time_to_train_s: float
    time_to_train_days: float
    memory_per_gpu_gb: float
    capacity_gb: float
    usable_gb: float = Field(description="capacity less what the process holds outside PyTorch's allocator (CUDA "
                             "context, NCCL buffers)")
    price_usd_per_gpu_hour: float | None
    gpu_hours: float
    usd: float | None
    energy_mwh: float
    electricity_usd: float


class PlanTrainResult(BaseModel):
    model: str
    tokens: float
    seq: int
    global_batch: int
    considered: int = Field(description="candidate configurations, pruned ones included")
    pruned: dict[str, int] = Field(description="candidates pruned without a trace, by reason")
    evaluated: int
    not_fit: int = Field(description="evaluated candidates whose traced memory exceeds the GPU's")
    traces: int = Field(description="distinct micro-batch graphs traced (shared across DP and devices)")
    ranked: list[TrainCandidate] = Field(description="every plan that fits, fastest first")
    best_per_gpus: list[TrainCandidate] = Field(description="the fastest plan per (device, GPU count)")
    cheapest_per_device: dict[str, TrainCandidate]
    pareto: list[TrainCandidate] = Field(description="time to train vs $, non-dominated")
    not_feasible: dict[str, str] = Field(default_factory=dict)
    assumptions: list[str] = Field(default_factory=list)


# CLI flags by field name, for one-line errors (aisim plan train)
PLAN_TRAIN_FLAGS = {"tokens": "--tokens", "seq": "--seq", "global_batch": "--global-batch", "devices": "--devices",
                    "gpus": "--gpus", "tp": "--tp", "pp": "--pp", "zero": "--zero", "recompute": "--recompute",
                    "micro_batch": "--micro-batch", "ep": "--ep", "precision": "--precision", "prices": "--price",
                    "electricity_usd_per_kwh": "--electricity-usd-per-kwh", "pue": "--pue"}


def plan_train_request(**fields) -> PlanTrainRequest:
    from .serve import validated

    return validated(PlanTrainRequest, fields, PLAN_TRAIN_FLAGS)


def plan_train(req: PlanTrainRequest, progress: Callable[[str], None] | None = None) -> PlanTrainResult:
    counts = {"considered": 0, "evaluated": 0, "not_fit": 0}
    pruned: dict[str, int] = {}
    traced: set = set()
    found: list[TrainCandidate] = []
    infeasible: dict[str, str] = {}
    model, config = resolve_model(req.model)   # the resolved name, also where no (device, GPU count) exists
    check_positions(config, SimpleNamespace(phase="forward-backward", seq=req.seq, gen_tokens=0), learned_only=True)
    for ep in req.ep or ():
        check_ep_experts(config, ep)
    for name in req.devices:    # every entry checked before the search: a GPU name or a multi-node system
        refuse_gpu_count(name, "plan train", "--gpus", multi_node=True)
        if not _is_network_system(name):
            resolve_gpu(name)
    for name in req.devices:
        for gpus in sorted(set(req.gpus)):
            try:
                dev = cluster(name, gpus)
            except AisimError as exc:
                infeasible[f"{name} x {gpus}"] = str(exc)
                counts["considered"] += _space(req, config)
                pruned["no such cluster"] = pruned.get("no such cluster", 0) + _space(req, config)
                continue
            sc = scenario(req.model, dev, dtype=PRECISION_DTYPE[req.precision], tp=1, pp=1, dp=gpus, phase="train")
            before = (dict(counts), dict(pruned))
            mine = _search(req, sc, counts, pruned, traced)
            if not mine:
                infeasible[f"{dev.gpu.name} x {gpus}"] = _no_plan_reason(req, dev, counts, pruned, *before)
            found += mine
            if progress:
                progress(f"{dev.gpu.name} x {gpus}: {counts['considered'] - before[0]['considered']} candidates, "
                         f"{len(mine)} fit")
    ranked = sorted(found, key=lambda c: (c.time_to_train_s, c.usd or math.inf))
    best: dict[tuple, TrainCandidate] = {}
    cheapest: dict[str, TrainCandidate] = {}
    for c in ranked:
        best.setdefault((c.device, c.gpus), c)
        if c.device not in cheapest or (c.usd or math.inf) < (cheapest[c.device].usd or math.inf):
            cheapest[c.device] = c
    return PlanTrainResult(model=model, tokens=req.tokens, seq=req.seq, global_batch=req.global_batch,
                           considered=counts["considered"], pruned=pruned, evaluated=counts["evaluated"],
                           not_fit=counts["not_fit"], traces=len(traced), ranked=ranked,
                           best_per_gpus=sorted(best.values(), key=lambda c: (c.device, c.gpus)),
                           cheapest_per_device=cheapest, pareto=pareto(ranked), not_feasible=infeasible,
                           assumptions=_assumptions(req, config) + _tight_memory_notes(ranked)
                           + price_notes({d.gpu.name: d.gpu for d in map(resolve_device, req.devices)}, req.prices))


TIGHT_MEMORY_FRACTION = 0.95


def _tight_memory_notes(cands: list[TrainCandidate]) -> list[str]:
    """A note where a reported plan fills more than TIGHT_MEMORY_FRACTION of the usable GPU memory: aisim counts the
    tensors PyTorch allocates plus the CUDA context and NCCL's buffers, not the caching allocator's cached blocks."""
    tight = sorted({f"{c.device} x {c.gpus} {c.tp}.{c.pp}.{c.dp}{f' ep {c.ep}' if c.ep > 1 else ''} ZeRO {c.zero} "
                    f"mb {c.micro_batch} "
                    f"({c.memory_per_gpu_gb:.1f} of {c.usable_gb:.1f} GB usable)" for c in cands
                    if c.memory_per_gpu_gb > TIGHT_MEMORY_FRACTION * c.usable_gb})
    if not tight:
        return []
    return [f"plans that fill more than {TIGHT_MEMORY_FRACTION:.0%} of the usable GPU memory: {', '.join(tight[:6])}"
            f"{' ...' if len(tight) > 6 else ''}; the estimate counts the tensors PyTorch allocates beside the CUDA "
            "context and NCCL's buffers, and the caching allocator's cached-but-free blocks come on top (3-10% of the "
            "peak, median per workload, in the H100/H200 suite runs; not modelled): prefer a plan with room, or "
            "check it on a GPU"]


# what each kind of pruning means, for the reason a (device, GPU count) has no plan
PRUNE_WHY = {"states": "the weights, gradients and AdamW states alone exceed the GPU memory per GPU; give more "
                       "--tp / --pp, a higher --zero where 3 was not searched, or more GPUs",
             "activations": "a smaller micro-batch already did not fit",
             "dominated": "a cheaper recompute mode fits"}


def _no_plan_reason(req: PlanTrainRequest, dev, counts: dict, pruned: dict, counts_before: dict,
                    pruned_before: dict) -> str:
    """Why one (device, GPU count) has no plan: the candidates that were traced and did not fit, or, where none was
    traced, the reasons every candidate was pruned for (a global batch that no dp x micro-batch divides, say)."""
    evaluated = counts["evaluated"] - counts_before["evaluated"]
    not_fit = counts["not_fit"] - counts_before["not_fit"]
    if evaluated:
        return (f"no plan fits in memory: {not_fit} of {evaluated} traced plans exceed the "
                f"{dev.gpu.memory_bytes / 1e9:.0f} GB per GPU less what the CUDA context and NCCL hold")
    why = {k: n - pruned_before.get(k, 0) for k, n in pruned.items() if n - pruned_before.get(k, 0)}
    text = ", ".join(f"{k} ({n}{': ' + PRUNE_WHY[k] if k in PRUNE_WHY else ''})"
                     for k, n in sorted(why.items(), key=lambda kv: -kv[1]))
    hint = (f"; --global-batch {req.global_batch} must be a multiple of data parallel x micro-batch"
            if "batch split" in why else "")
    return f"no plan to trace: every candidate was pruned: {text}{hint}"


def _space(req: PlanTrainRequest, config: dict | None = None) -> int:
    eps = len(req.ep) if req.ep else len(expert_degrees(config)) if config is not None else 1
    return len(req.tp) * len(req.pp) * eps * len(req.zero) * len(req.recompute) * len(req.micro_batch)


DEFAULT_EP = (1, 8, 64)   # Mixtral, Qwen3-MoE, OLMoE: EP 8 (one node); DeepSeek-V3 trained at EP 64


def expert_degrees(config: dict, asked: list[int] | None = None) -> list[int]:
    """The expert-parallel degrees to search: ``asked``, else 1 and each of DEFAULT_EP dividing the expert count;
    [1] for a dense model."""
    from ..graph.engine import expert_count

    if asked:
        return sorted(set(asked))
    experts = expert_count(config) or 0
    return [e for e in DEFAULT_EP if e == 1 or (experts and experts % e == 0)]


def _is_network_system(name: str) -> bool:
    try:
        dev = resolve_device(name)
    except AisimError:
        return False
    return dev.system is not None and dev.system.network is not None


def cluster(name: str, gpus: int):
    """``gpus`` GPUs of kind ``name``: one node's device up to a node, else nodes of the multi-node system (one with
    a network) built from that GPU (aisim.studies.train.multi_node_device)."""
    from ..catalog import gpu_device, node_system, resolve_device, resolve_gpu

    try:
        base = resolve_device(name)
    except AisimError:
        base = None
    if base is None or base.system is None or base.system.network is None:
        gpu = resolve_gpu(name)
        system = node_system(gpu)
        if system is None:
            if gpus <= 8:
                return gpu_device(gpu, gpus)
            names = sorted(s.name for s in all_systems().values() if s.network)
            raise AisimError(f"{gpu.name}: no multi-node system spec (one with a network) for more than 8 GPUs; "
                             f"the shipped ones: {', '.join(names)}; add one under hardware_specs/systems/")
        base = resolve_device(system.name)
    per_node = base.system.gpus_per_node
    if gpus < per_node:
        return gpu_device(base.gpu, gpus)
    if gpus % per_node:
        raise AisimError(f"{gpus} GPUs are not whole nodes of {base.system.name} ({per_node} GPUs per node)")
    return multi_node_device(base, gpus // per_node)


def _search(req: PlanTrainRequest, sc: Scenario, counts: dict, pruned: dict, traced: set) -> list[TrainCandidate]:
    gpus = sc.device.count
    per_node = (sc.device.system.gpus_per_node if sc.device.system and sc.device.system.gpus_per_node
                else sc.device.count)
    params = matmul_params(sc.config, active=False)     # every expert of an MoE is held
    experts = params - matmul_params(sc.config, active=False, routed=False)
    out = []
    for tp in req.tp:
        for pp in req.pp:
            for ep in expert_degrees(sc.config, req.ep):
                for zero in req.zero:
                    why = _shape_reason(sc, gpus, per_node, tp, pp)
                    dp = gpus // (tp * pp) if not why else 1
                    why = why or ((tp * dp) % ep and "shape: ep does not divide tp x dp") or (
                        ep > tp and ep % tp and "shape: ep above tp is not a multiple of it")
                    plan = TrainPlan(precision=req.precision, zero=zero)
                    why = why or _states_reason(params - experts, experts, tp, pp, dp, ep, plan,
                                                sc.device.gpu.memory_bytes)
                    out += _micro_batches(req, sc, tp, pp, dp, ep, plan, why, counts, pruned, traced)
    return out


def _micro_batches(req, sc, tp, pp, dp, ep, plan, why, counts, pruned, traced) -> list[TrainCandidate]:
    """Micro-batches in increasing size, each with the lightest recompute first. Pruned without a trace: a heavier
    recompute where a lighter one fits at this micro-batch (recomputing only adds work; it saves memory), and a
    recompute mode at a micro-batch larger than one where it did not fit (activations grow with the micro-batch)."""
    out = []
    modes = [r for r in RECOMPUTE_ORDER if r in req.recompute]
    too_big: set[str] = set()
    for mb in sorted(req.micro_batch):
        fitted = None
        for recompute in modes:
            counts["considered"] += 1
            reason = why or (f"batch split: dp {dp} x micro-batch {mb} does not divide the global batch"
                             if req.global_batch % (dp * mb) else None)
            if reason is None and fitted is not None:
                reason = f"dominated: recompute {fitted} fits with less work"
            if reason is None and recompute in too_big:
                reason = "activations: a smaller micro-batch does not fit"
            if reason:
                # a shape reason keeps its detail (which degree does not divide what); the others their kind
                key = reason if reason.startswith("shape:") else reason.split(":")[0]
                pruned[key] = pruned.get(key, 0) + 1
                continue
            cand = _evaluate(req, sc, tp, pp, dp, ep,
                             plan.model_copy(update={"micro_batch": mb, "recompute": recompute}), counts, traced)
            if cand is None:
                too_big.add(recompute)
            else:
                fitted = recompute
                out.append(cand)
    return out


def _shape_reason(sc: Scenario, gpus: int, per_node: int, tp: int, pp: int) -> str | None:
    from ..graph.build import layer_count

    if gpus % (tp * pp):
        return "shape: tp x pp does not divide the GPUs"
    if tp > per_node:
        return "shape: tensor parallel beyond a node"
    if pp > layer_count(sc.config):
        return "shape: pp exceeds the layers"
    try:
        check_tp(sc.config, tp, "all")
    except AisimError:
        return "shape: tp does not divide the heads"
    return None


def _states_reason(dense: float, experts: float, tp: int, pp: int, dp: int, ep: int, plan: TrainPlan,
                   capacity_bytes: float) -> str | None:
    """Lower bound of the persistent training state per GPU (see aisim.cost.memory.train_breakdown): ``dense``
    parameters over tp x pp, sharded over dp; an MoE's routed ``experts`` over max(tp, ep) x pp, sharded over the
    tp x dp / max(tp, ep) GPUs that hold the same experts (aisim.step.state_groups)."""
    from ..cost.memory import ADAM_STATES, TRAIN_STATE_BYTES, kept_params

    weight_b, grad_b, compute_b = TRAIN_STATE_BYTES[plan.precision]
    split = max(tp, ep)
    parts = ((dense / (tp * pp), dp), (experts / (split * pp), tp * dp // split))
    held = lambda s: kept_params(parts, plan.stage, s)  # noqa: E731
    low = held(3) * min(weight_b, compute_b) + ADAM_STATES * weight_b * held(1)
    low += held(2) * min(grad_b, compute_b) if plan.stage >= 2 else 0.0
    return "states: weights and optimizer states alone exceed the GPU memory" if low > capacity_bytes else None


def _evaluate(req, sc, tp, pp, dp, ep, plan, counts, traced) -> TrainCandidate | None:
    # Megatron's tensor parallelism: the vocabulary too (VocabParallelEmbedding, output layer, cross entropy)
    sc = sc.with_plan(ParallelPlan(tp=tp, pp=pp, dp=dp, ep=ep, tp_scope="full" if tp > 1 else "all"))
    shape = StepShape(phase="forward-backward", batch=plan.micro_batch * dp, seq=req.seq)
    w = sc.workload(shape, **traced_options(plan))
    traced.add(share_trace(sc, w))
    counts["evaluated"] += 1
    r = train(sc, TrainRequest(batch=req.global_batch, seq=req.seq, plan=plan, token_budget=req.tokens))
    if not r.fits:
        counts["not_fit"] += 1
        return None
    energy_step_j = _step_energy_j(sc, shape, plan, r.step_ms / 1e3, r.grad_accum)
    steps = req.tokens / r.tokens_per_step
    time_s = r.time_to_train_s
    gpus = sc.plan.gpus
    price = req.prices.get(sc.device.gpu.name, sc.device.gpu.price_usd_per_gpu_hour)
    gpu_hours = gpus * time_s / S_PER_HOUR
    mwh = energy_step_j * steps * req.pue / J_PER_MWH
    return TrainCandidate(device=sc.device.gpu.name, system=sc.device.name, gpus=gpus, tp=tp, pp=pp, dp=dp,
                          ep=ep, zero=plan.stage, recompute=plan.recompute, micro_batch=r.micro_batch,
                          grad_accum=r.grad_accum, step_ms=r.step_ms, tokens_per_s=r.tokens_per_s, mfu=r.mfu,
                          time_to_train_s=time_s, time_to_train_days=time_s / 86400.0,
                          memory_per_gpu_gb=r.memory.total_gb, capacity_gb=r.memory.capacity_gb,
                          usable_gb=r.memory.usable_gb,
                          price_usd_per_gpu_hour=price, gpu_hours=gpu_hours,
                          usd=gpu_hours * price if price else None, energy_mwh=mwh,
                          electricity_usd=mwh * 1e3 * req.electricity_usd_per_kwh)


def _step_energy_j(sc: Scenario, shape: StepShape, plan: TrainPlan, step_s: float, grad_accum: int) -> float:
    """GPUs x (busy power x m x t_mb + waiting power x (step - m x t_mb)); the busy power from the micro-batch's
    step cost (its energy less the pipeline's waiting stages: aisim.step._device_half)."""
    from ..cost.energy import waiting_power_w

    mb = step_cost(sc, shape, **traced_options(plan))
    gpus, pp = sc.plan.gpus, sc.plan.pp
    stage_s = mb.runtime_s / pp
    wait_w = waiting_power_w(sc.device.gpu, sc.calibration)
    busy_w = (mb.energy_j - wait_w * (pp - 1) * stage_s * gpus) / (stage_s * gpus) if stage_s else 0.0
    compute_s = min(grad_accum * stage_s, step_s)
    return gpus * (busy_w * compute_s + wait_w * (step_s - compute_s))


def share_trace(sc: Scenario, w) -> str:
    """Trace the per-GPU graph once at DP = 1 (a replica traces batch / DP sequences) and file it under this plan's
    key as well, so every DP (GPU count) shares it. Returns the DP-free key."""
    from ..graph import cache, extract

    one_plan = sc.plan.model_copy(update={"dp": 1})
    one = w.model_copy(update={"batch": w.batch // sc.plan.dp})
    graph = extract.trace_workload(sc.config, one, one_plan)
    inputs = cache.key_inputs(sc.config, w.model_dump(exclude=extract.TRANSCRIPT_FIELDS), sc.plan.model_dump())
    extract._MEMORY.setdefault(cache.cache_key(inputs), graph)
    return cache.cache_key(cache.key_inputs(sc.config, one.model_dump(exclude=extract.TRANSCRIPT_FIELDS),
                                            one_plan.model_dump()))


def pareto(cands: list[TrainCandidate]) -> list[TrainCandidate]:
    """Non-dominated plans on (time to train, $), both lower is better (GPU-hours where no price is known)."""
    cost = lambda c: c.usd if c.usd is not None else c.gpu_hours  # noqa: E731
    front = [c for c in cands if not any(o.time_to_train_s <= c.time_to_train_s and cost(o) <= cost(c)
                                         and (o.time_to_train_s, cost(o)) != (c.time_to_train_s, cost(c))
                                         for o in cands)]
    unique = {(c.time_to_train_s, cost(c)): c for c in front}
    return sorted(unique.values(), key=lambda c: c.time_to_train_s)


def _assumptions(req: PlanTrainRequest, config: dict) -> list[str]:
    from ..graph.build import layer_count

    out = [f"training: {req.precision}, AdamW, 1F1B pipeline schedule, TP inside a node, DP = GPUs / (TP x PP); "
           "ZeRO stage 3 is FSDP FULL_SHARD's memory and traffic (aisim.studies.train)",
           f"$ = GPU-hours x price per GPU-hour (spec default or --price); MWh: GPU energy x PUE {req.pue}; "
           "communication and the optimizer at the waiting power; hosts and network not counted"]
    eps = expert_degrees(config, req.ep)
    if eps != [1]:
        out.append(f"MoE: expert parallel degrees {', '.join(map(str, eps))} tried where ep divides tp x dp (the 'ep' "
                   "of tp.pp.dp.ep: experts "
                   "spread over ep of the tp x dp GPUs, tokens and their gradients by all-to-all, on the critical "
                   "path; the experts' gradients and ZeRO shards over the GPUs holding the same experts); the experts "
                   "run as transformers' grouped GEMMs with its routing ops, routing taken as uniform")
    quantized = quantized_training_note(config)
    if quantized:
        out.append(quantized)
    uneven = sorted(p for p in req.pp if 1 < p <= layer_count(config) and layer_count(config) % p)
    if uneven:
        out.append(f"--pp {', '.join(map(str, uneven))} over {layer_count(config)} layers: uneven stages (Megatron's "
                   "--decoder-first/last-pipeline-num-layers), priced as pp stages of the largest")
    return out


COLUMNS = ("device", "gpus", "tp", "pp", "dp", "ep", "zero", "recompute", "micro_batch", "grad_accum", "step_ms",
           "mfu", "time_to_train_days", "memory_per_gpu_gb", "usd", "energy_mwh")


def table_rows(cands: list[TrainCandidate]) -> list[list]:
    """The ranked plans as rows of COLUMNS (for CSV and the CLI's table)."""
    return [[getattr(c, k) for k in COLUMNS] for c in cands]
