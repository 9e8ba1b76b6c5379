"""Parallel plans: which model dimensions tensor parallelism must divide, and the default plan for N GPUs."""
from __future__ import annotations

from .errors import AisimError
from .workload import ParallelPlan


def tp_dims(config: dict, scope: str) -> dict[str, int]:
    """The config dimensions a tensor-parallel degree must divide (HF key names across families)."""
    dims: dict[str, int] = {}
    heads = config.get("num_attention_heads") or config.get("n_head") or config.get("encoder_attention_heads")
    hidden = config.get("hidden_size") or config.get("n_embd") or config.get("d_model") or 0
    if scope in ("all", "full", "attention") and heads:
        dims["num_attention_heads"] = heads
        if config.get("num_key_value_heads"):
            dims["num_key_value_heads"] = config["num_key_value_heads"]
    if scope in ("all", "full", "mlp"):
        ffn = (config.get("intermediate_size") or config.get("ffn_dim") or config.get("n_inner")
               or config.get("encoder_ffn_dim") or 4 * hidden)
        if ffn:
            dims["intermediate_size"] = ffn
    return dims


def check_tp(config: dict, tp: int, scope: str) -> None:
    """Raise an AisimError naming the dimension that ``tp`` does not divide."""
    for name, value in tp_dims(config, scope).items():
        if tp > 1 and value % tp:
            raise AisimError(f"tensor parallel degree {tp} does not divide {name} = {value}; "
                             f"choose --tp among the divisors of {value}")


def choose_plan(config: dict, gpus: int, device_name: str, batch: int, tp: int | None, pp: int, dp: int,
                tp_scope: str) -> tuple[ParallelPlan, str | None]:
    """The given plan, checked; or, when --tp is not given, tensor parallel over the largest number of the GPUs
    that the model's dimensions allow, with the rest as data parallel (stated in the output)."""
    note = None
    if tp is None:
        if gpus % (pp * dp):
            raise AisimError(f"--pp {pp} x --dp {dp} = {pp * dp} does not divide the {gpus} GPUs of {device_name}")
        free = gpus // (pp * dp)
        dims = tp_dims(config, tp_scope).values()
        tp = max(t for t in range(1, free + 1) if free % t == 0 and all(d % t == 0 for d in dims))
        dp *= free // tp
        if gpus > 1:
            note = f"default plan for {device_name}: tensor parallel {tp} x pipeline {pp} x data parallel {dp}"
            if dp > 1 and batch % dp:
                raise AisimError(f"{note}, but data parallel {dp} does not divide batch {batch}; give a batch "
                                 f"divisible by {dp} or choose --tp/--pp/--dp")
    try:
        plan = ParallelPlan(tp=tp, pp=pp, dp=dp, tp_scope=tp_scope)
    except ValueError as exc:
        errors = getattr(exc, "errors", lambda: [])()
        detail = "; ".join(f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}" for e in errors)
        raise AisimError(f"invalid parallel plan: {detail or exc}") from None
    if plan.gpus != gpus:
        raise AisimError(f"the plan tp {plan.tp} x pp {plan.pp} x dp {plan.dp} = {plan.gpus} GPUs does not match "
                         f"the {gpus} GPU(s) of {device_name}; make the product equal {gpus}")
    check_tp(config, plan.tp, plan.tp_scope)
    return plan, note
