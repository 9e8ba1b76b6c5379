"""Parallel plans: which model dimensions tensor parallelism must divide, and the default plan for N GPUs."""
from __future__ import annotations

from .errors import AisimError
from .graph.tp_rules import tp_dims
from .workload import ParallelPlan


def check_tp(config: dict, tp: int, scope: str, replicate_kv: bool = False) -> int:
    """Raise an AisimError naming the dimension that ``tp`` does not divide; returns the KV-head replicas (1, or
    tp / num_key_value_heads where ``replicate_kv`` lets a multiple of the KV heads replicate them, as vLLM)."""
    replicas = 1
    replicate_kv = replicate_kv and not config.get("kv_lora_rank")   # MLA caches its latent on every rank
    for name, value in tp_dims(config, scope).items():
        if tp > 1 and value % tp:
            if replicate_kv and name == "num_key_value_heads" and tp % value == 0:
                replicas = tp // value
                continue
            hint = (f"choose --tp among the divisors of {value}" if not replicate_kv or name != "num_key_value_heads"
                    else f"choose --tp among the divisors or the multiples of {value} (the engine replicates KV "
                         "heads over a multiple)")
            raise AisimError(f"tensor parallel degree {tp} does not divide {name} = {value}; {hint}")
    return replicas


def _check_degree(value: int | None, flag: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise AisimError(f"{flag} must be a positive integer (got {value!r})")


def choose_plan(config: dict, gpus: int, device_name: str, batch: int | None, tp: int | None, pp: int,
                dp: int | None, tp_scope: str, replicate_kv: bool = False, shard_states: str | None = None,
                gpu_name: str | None = None, node_gpus: int | None = None, cross_node: bool = False,
                pipeline_fallback: bool = False, ep: int = 1) -> tuple[ParallelPlan, list[str]]:
    """The given plan, checked; the rest filled in as Megatron and vLLM do. No --tp: tensor parallel over the
    largest number of the GPUs of one node (``node_gpus``: a degree dividing it) that the model's dimensions divide,
    the rest data parallel; where no such degree leaves a data parallel that divides the batch, under an engine
    that replicates KV heads (``replicate_kv``, vLLM) a degree past the KV heads, and on a multi-node system
    (``cross_node``) whole nodes of tensor parallelism (its all-reduces cross the network), unless
    ``pipeline_fallback`` (inference, no --pp or --dp given) takes the fewest pipeline stages whose replicas
    divide the batch (and hold ``ep``) first. Where a training plan shards its states over the data-parallel
    ranks (``shard_states``: e.g. "ZeRO stage 3"), data parallel over as many GPUs as divide the batch, as FSDP and
    DeepSpeed run. --tp without --dp: data parallel replicas = GPUs / (tp x pp). Every default is stated in the
    output."""
    for value, flag in ((tp, "--tp"), (pp, "--pp"), (dp, "--dp")):
        _check_degree(value, flag)
    note = None
    if tp is None:
        given_dp = dp or 1
        if gpus % (pp * given_dp):
            raise AisimError((f"--pp {pp} x --dp {given_dp} = {pp * given_dp}" if dp else f"--pp {pp}")
                             + f" does not divide the {gpus} GPUs of {device_name}")
        free = gpus // (pp * given_dp)
        dims = tp_dims(config, tp_scope)
        node = min(node_gpus or free, free)
        in_node = [t for t in _divisors(free) if node % t == 0]
        wider = [t for t in _divisors(free) if t > node and t % node == 0] if cross_node else []
        takes = lambda t: batch is None or batch % (given_dp * (free // t)) == 0   # noqa: E731
        fit = lambda t: all(v % t == 0 for v in dims.values())   # noqa: E731

        def taking(degrees: list[int]) -> list[int]:
            found = [t for t in degrees if fit(t) and takes(t)]
            if not found and replicate_kv:   # batch 1 on 8 GPUs of a 4-KV-head model: tp 8, KV heads replicated
                found = [t for t in degrees if _replicates(config, t, tp_scope) and takes(t)]
            return found

        divides, staged = taking(in_node), False   # inside a node first
        if not divides and pipeline_fallback and pp == 1 and dp is None and not shard_states:
            # no data-parallel degree takes the batch: the fewest pipeline stages whose replicas' count does
            # (vLLM's advice for GPUs past one node's tensor parallelism: tensor parallel within, pipeline across)
            tp_in = max(t for t in in_node if fit(t))
            rest = free // tp_in
            stages = next((p for p in _divisors(rest) if p > 1 and (batch is None or batch % (rest // p) == 0)
                           and (tp_in * (rest // p)) % ep == 0), None)
            if stages is not None:
                divides, pp, free, staged = [tp_in], stages, tp_in * (rest // stages), True
        if not divides:   # across whole nodes only where nothing inside one takes the batch
            divides = taking(wider)
        sharded = divides if shard_states else []
        tp = min(sharded) if sharded else max(divides or [t for t in in_node if fit(t)])
        dp = given_dp * (free // tp)
        if gpus > 1:
            note = f"default plan for {device_name}: tensor parallel {tp} x pipeline {pp} x data parallel {dp}" + (
                (f" ({shard_states} shards over the data-parallel ranks: as many as divide the batch)"
                 if not shard_states.startswith("DDP") else f" ({shard_states})") if sharded
                else f" (pipeline stages: no data-parallel degree of one-stage replicas divides batch {batch})"
                if staged
                else f" (tensor parallel inside a node of {node} GPUs)" if free > node and tp <= node else
                " (tensor parallel across nodes: no degree inside one takes the batch)" if tp > node else "")
    elif dp is None:
        if gpus % (tp * pp):
            raise AisimError(f"--tp {tp} x --pp {pp} = {tp * pp} does not divide the {gpus} GPUs of {device_name}; "
                             f"choose degrees whose product divides {gpus}")
        dp = gpus // (tp * pp)
        if dp > 1:
            note = (f"--dp not given: {dp} data-parallel replicas = {gpus} GPUs / (tp {tp} x pp {pp}), as Megatron "
                    "and vLLM infer it")
    plan = ParallelPlan(tp=tp, pp=pp, dp=dp, tp_scope=tp_scope)
    if plan.gpus != gpus:
        raise AisimError(f"the plan tp {plan.tp} x pp {plan.pp} x dp {plan.dp} = {plan.gpus} GPUs does not match "
                         f"the {gpus} GPU(s) of {device_name}; make the product equal {gpus}"
                         + (f", or name a device of {plan.gpus} GPUs (e.g. {gpu_name}"
                            f"{'x' + str(plan.gpus) if plan.gpus > 1 else ''})" if gpu_name else ""))
    if dp > 1 and batch is not None and batch % dp:
        raise AisimError(f"{note + ', but d' if note else 'D'}ata parallel {dp} does not divide batch {batch}; give "
                         f"a batch divisible by {dp} or choose --tp/--pp/--dp")
    replicas = check_tp(config, plan.tp, plan.tp_scope, replicate_kv)
    if replicas > 1:
        plan = plan.model_copy(update={"kv_replicas": replicas})
        return plan, [n for n in (note, f"each of the {plan.tp} GPUs holds one KV head, each KV head on {replicas} "
                                  "GPUs (the engine replicates KV heads when tp exceeds them)") if n]
    return plan, [note] if note else []


def _replicates(config: dict, tp: int, scope: str) -> bool:
    """Whether ``tp`` passes check_tp with the KV heads replicated over it."""
    try:
        check_tp(config, tp, scope, True)
    except AisimError:
        return False
    return True


def _divisors(n: int) -> list[int]:
    """Divisors of n in O(sqrt n): a 100,000-GPU device must not loop over every count."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def check_ep_experts(config: dict, ep: int) -> None:
    """The model-level part of check_ep (before any plan is chosen, so that its error comes first): --ep must be a
    positive degree and, above 1, divide the model's expert count."""
    _check_degree(ep, "--ep")
    if ep == 1:
        return
    from .graph.engine import expert_count

    experts = expert_count(config)
    if not experts:
        raise AisimError("--ep applies to mixture-of-experts models only; this config has no experts")
    if experts % ep:
        raise AisimError(f"--ep {ep} does not divide the {experts} experts; choose a divisor of {experts}")


def check_ep(config: dict, plan: ParallelPlan, ep: int) -> int:
    """The expert parallel degree, checked: it must divide the model's expert count and the tp x dp GPUs of a
    stage (the EP group, as vLLM forms it)."""
    check_ep_experts(config, ep)
    if ep == 1:
        return ep
    group = plan.tp * plan.dp
    if group % ep:
        raise AisimError(f"--ep {ep} must divide the tp x dp = {group} GPUs of a pipeline stage (the expert-parallel "
                         "group); choose --ep among its divisors or change --tp/--dp")
    if ep > plan.tp and ep % plan.tp:
        raise AisimError(f"--ep {ep} above --tp {plan.tp} must be a multiple of it (an expert-parallel group of whole "
                         "tensor-parallel groups); choose --ep among the multiples of --tp or change --tp")
    return ep
