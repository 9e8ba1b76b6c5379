"""One step: forward, prefill, decode, encode, forward-backward or train -> Estimate."""
from __future__ import annotations

from ..errors import AisimError
from ..results import Estimate
from ..scenario import Scenario
from ..step import step_cost
from ..workload import StepShape, Workload
from .common import estimate_from


def check_shape(sc: Scenario, w: Workload) -> None:
    """Refuse workloads the model or engine cannot run, with what to give instead."""
    config, rt = sc.config, sc.runtime
    enc_dec = bool(config.get("is_encoder_decoder"))
    if w.phase == "encode" and not enc_dec:
        raise AisimError("--workload encode needs an encoder-decoder model (e.g. whisper-medium.en); this one is "
                         "decoder-only: use forward or prefill")
    if enc_dec and w.phase in ("forward", "forward-backward", "train"):
        raise AisimError(f"--workload {w.phase} is not modelled for an encoder-decoder model: use encode (one 30 s "
                         "window), prefill / decode / generate (the decoder) or transcribe (a recording)")
    if w.phase == "transcribe":
        if w.batch != 1:
            raise AisimError("--workload transcribe estimates one recording: leave --batch at 1")
        if rt.request_loop is not None:
            raise AisimError(f"runtime {rt.name} is a text-serving engine; transcribe with ggml-cuda, ggml-vulkan "
                             "or eager")
    if w.phase == "decode" and w.seq < 2 and not enc_dec:
        raise AisimError("--workload decode --seq is the context after the step (cached tokens + the new one): "
                         "give at least 2")
    if sc.plan.dp > 1 and w.batch % sc.plan.dp:
        raise AisimError(f"data parallel degree {sc.plan.dp} does not divide batch {w.batch}; choose --dp among "
                         f"the divisors of {w.batch}")
    check_positions(config, w, learned_only=w.phase in ("forward-backward", "train"))


# model types whose positions come from a fixed-size table a longer sequence would index past (learned; GPT-J's
# precomputed sinusoids): rotary and ALiBi models train past their configured length when their context is extended
LEARNED_POSITIONS = frozenset({"opt", "gpt2", "gpt_neo", "gptj"})


def check_positions(config: dict, w, learned_only: bool = False) -> None:
    """Refuse a sequence longer than the model's position table; ``w``: a Workload or anything with its phase, seq
    and gen_tokens. ``learned_only`` (training): only where the positions are a learned table (LEARNED_POSITIONS)."""
    if learned_only and config.get("model_type") not in LEARNED_POSITIONS:
        return
    if config.get("is_encoder_decoder"):  # the decoder's table; encode takes a fixed 30 s window
        limit = config.get("max_target_positions")
        length = w.seq + (w.gen_tokens if w.phase == "generate" else 0)
        if limit and w.phase in ("decode", "prefill", "generate") and length > limit:
            given = f"seq {w.seq}" + (f" + {w.gen_tokens} generated" if w.phase == "generate" else "")
            raise AisimError(f"{given} exceeds the decoder's {limit} positions; give a shorter --seq"
                             + (" or fewer generated tokens (--gen)" if w.phase == "generate" else ""))
        return
    limit = config.get("max_position_embeddings") or config.get("n_positions")
    length = w.seq + (w.gen_tokens if w.phase == "generate" else 0)
    if limit and w.phase != "encode" and length > limit:
        given = f"seq {w.seq}" + (f" + {w.gen_tokens} generated" if w.phase == "generate" else "")
        raise AisimError(f"{given} exceeds the model's {limit} positions; give a shorter --seq"
                         + (" or fewer generated tokens (--gen, serve-bench's --decode-len)" if w.phase == "generate"
                            else ""))


def single_step(sc: Scenario, shape: StepShape) -> Estimate:
    w = sc.workload(shape)
    check_shape(sc, w)
    cost = step_cost(sc, shape)
    return estimate_from(sc, w, cost, cost.memory)
