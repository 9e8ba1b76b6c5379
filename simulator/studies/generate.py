"""Generate: a prefill of ``seq`` tokens, then gen - 1 decode steps at contexts seq + 1 .. seq + gen - 1."""
from __future__ import annotations

from ..results import Estimate
from ..scenario import Scenario
from ..step import StepCost, linear_total, step_cost
from ..units import MS_PER_S
from ..workload import StepShape
from .common import estimate_from, phase_rows
from .single import check_shape


def decode_steps(sc: Scenario, batch: int, first_context: int, steps: int,
                 static_cache_len: int | None = None) -> StepCost:
    """``steps`` decode steps of ``batch`` sequences at contexts first_context .. first_context + steps - 1
    (each step's context counts the new token). Linear in context: only the first and last are costed.
    ``static_cache_len``: a static-cache runtime's max_cache_len, which every step attends over."""
    last = first_context + max(steps, 1) - 1
    total = steps * first_context + steps * (steps - 1) / 2

    def at(context: float) -> StepCost:
        return step_cost(sc, StepShape(phase="decode", batch=batch, seq=int(context), logits_all=False,
                                       static_cache_len=static_cache_len))

    return linear_total(at, first_context, last, steps, total)


def generate(sc: Scenario, batch: int, seq: int, gen_tokens: int, static_cache_len: int | None = None) -> Estimate:
    """``static_cache_len``: under a static-cache runtime, the cache's max_cache_len (default seq + gen_tokens, as
    HF generate sizes a static cache: max_length = prompt + max_new_tokens)."""
    w = sc.workload(StepShape(phase="prefill", batch=batch, seq=seq)).model_copy(
        update={"phase": "generate", "gen_tokens": gen_tokens, "logits_all": False})
    check_shape(sc, w)
    steps = max(gen_tokens - 1, 0)
    prefill = step_cost(sc, StepShape(phase="prefill", batch=batch, seq=seq))
    cache_len = (static_cache_len or seq + gen_tokens) if sc.runtime.static_cache else None
    decode = decode_steps(sc, batch, seq + 1, steps, cache_len)
    runtime_s = prefill.runtime_s + decode.runtime_s
    total = StepCost(runtime_s, prefill.energy_j + decode.energy_j, 0.0, prefill.flops + decode.flops,
                     prefill.bytes + decode.bytes, (), tuple(sorted(set(prefill.unknown) | set(decode.unknown))))
    last = step_cost(sc, StepShape(phase="decode", batch=batch, seq=seq + max(steps, 1), logits_all=False,
                                   static_cache_len=cache_len))
    prefill_memory = prefill.memory
    if cache_len:   # HF generate allocates the static cache (max_cache_len slots) before the prefill runs
        kv = last.memory.kv_cache_gb
        prefill_memory = prefill_memory.model_copy(update={
            "kv_cache_gb": kv, "total_gb": prefill_memory.total_gb - prefill_memory.kv_cache_gb + kv})
    memory = max(last.memory, prefill_memory, key=lambda m: m.total_gb)
    table = sorted(phase_rows("prefill", prefill.table, runtime_s) + phase_rows("decode", decode.table, runtime_s),
                   key=lambda r: -r.time_ms)
    tpot_s = decode.runtime_s / steps if steps else 0.0   # one token: no decode step (vLLM's TPOT is 0 then)
    est = estimate_from(sc, w, total, memory, table=table, ttft_ms=prefill.runtime_s * MS_PER_S,
                        tpot_ms=tpot_s * MS_PER_S,
                        phases={"prefill_ms": prefill.runtime_s * MS_PER_S,
                                "decode_total_ms": decode.runtime_s * MS_PER_S})
    if sc.config.get("is_encoder_decoder"):
        est = est.model_copy(update={"assumptions": [*est.assumptions, (
            "generate is the decoder's prompt and new tokens only: the encoder's pass over the 30 s window "
            "(--workload encode) is not in the runtime or the time to first token; --workload transcribe prices a "
            "whole recording")]})
    return est
