"""The transcribe workload: a recording through an encoder-decoder speech model, in whisper.cpp's phases.

whisper.cpp (src/whisper.cpp, whisper_full_with_state) cuts the audio into 30 s windows. Per window it runs
``encode`` once (conv front end, encoder layers and every decoder layer's cross-attention K/V), one decoder
call on the prompt (the previous window's text, at most n_text_ctx / 2 tokens, after a <|prev|> token, then the
start-of-transcript token), then one decoder call per step with one token per live beam. It files each decoder
call by its token count: 1 token under ``decode``, fewer than 16 under ``batchd``, 16 or more under ``prompt``,
and counts runs in tokens for the last two. ``mel`` and ``sample`` run on the CPU: outside this GPU model.

Counts are a workload, not a fit: ``TranscriptCounts.from_audio`` derives them from the audio length, beam size and
an assumed speech rate (printed with the estimate); ``TranscriptCounts.from_runs`` takes the run counts a
whisper.cpp printout shows, which is how the validation compares per-run times. A decoder step's time is linear
in its context, so each phase is costed at its mean context.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import AisimError
from ..results import Estimate, SpeechPhase
from ..scenario import Scenario
from ..step import EMPTY, StepCost, linear_total, step_cost
from ..units import MS_PER_S
from ..workload import StepShape, Workload
from .common import estimate_from, merge_rows, phase_rows
from .single import check_shape

WINDOW_S = 30.0
# Assumption (printed): English speech at ~150 words per minute (conversational and broadcast rates are
# 140-180) and ~1.3 GPT-2 BPE tokens per word, plus whisper's timestamp tokens (a pair per ~5 s segment):
# 2.5 * 1.3 + 0.4 = 3.65 tokens per second of speech.
TOKENS_PER_AUDIO_S = 3.65
BATCHD_MAX_TOKENS = 16   # whisper.cpp: a decoder call of >= 16 tokens is timed as prompt
SOT_TOKENS = 1           # English-only models start with <|startoftranscript|> alone (no language/task tokens)


@dataclass(frozen=True)
class TranscriptCounts:
    """Decoder work of one transcription. ``prompt_lengths``: the token count of each prompt call (>= 16 tokens);
    ``steps``: decoder steps after the prompts (one token per live beam each); ``context``: the mean
    self-attention context of those steps."""
    windows: int
    tokens: int
    beam: int
    decode_calls: int
    batchd_tokens: int
    prompt_lengths: tuple[float, ...]
    steps: float
    context: float
    source: str

    @classmethod
    def from_audio(cls, audio_s: float, beam: int, n_text_ctx: int, tokens: int | None = None,
                   windows: int | None = None) -> "TranscriptCounts":
        given = tokens is not None
        least = max(1, math.ceil(audio_s / WINDOW_S))
        if windows is not None and windows < least:
            raise AisimError(f"--windows {windows}: {audio_s:g} s of audio needs at least {least} windows of 30 s")
        windows = windows or least
        tokens = tokens or max(1, round(audio_s * TOKENS_PER_AUDIO_S))
        per_window = tokens / windows
        cap = n_text_ctx // 2
        if per_window > cap:
            raise AisimError(f"{tokens} output tokens in {windows} windows is {per_window:.0f} per window; whisper's "
                             f"decoder emits at most about {cap} per 30 s window (n_text_ctx / 2): give fewer "
                             f"--tokens or more --windows")
        # window i's prompt: <|prev|> + the past text (i x per_window tokens, at most cap), then SOT; window 0 has
        # no past. Vectorised over windows (a year of audio is a million windows).
        index = np.arange(windows)
        past = np.minimum(np.floor(index * per_window), cap).astype(np.int64)
        prompts = np.where(index > 0, SOT_TOKENS + 1 + past, SOT_TOKENS)
        decode_calls = int(np.count_nonzero(prompts == 1))   # whisper.cpp files a 1-token call under decode
        short = (prompts > 1) & (prompts < BATCHD_MAX_TOKENS)
        batchd = int(prompts[short].sum())   # ... and a call of under 16 tokens under batchd, counted in tokens
        lengths = prompts[prompts >= BATCHD_MAX_TOKENS].tolist()
        mean_context = float(prompts.mean()) + per_window / 2
        steps = float(tokens)              # one decoder step per output token, every beam in it
        if beam > 1:
            batchd += beam * tokens
        else:
            decode_calls += tokens
        how = (f"{windows} windows of 30 s; {tokens} output tokens " +
               ("(given)" if given else f"(assumed {TOKENS_PER_AUDIO_S} tokens per second of audio)") +
               f"; one decoder step per token with all {beam} beam{'s' if beam > 1 else ''}; prompts carry up to "
               f"{cap} past tokens")
        return cls(windows, tokens, beam, decode_calls, int(batchd), tuple(lengths), steps, mean_context, how)

    @classmethod
    def from_runs(cls, encode_runs: int, decode_runs: int, batchd_runs: int, prompt_runs: int, tokens: int,
                  beam: int, n_text_ctx: int) -> "TranscriptCounts":
        """The counts of a whisper.cpp printout; prompt tokens split into calls of the usual full length."""
        full = n_text_ctx // 2 + 1 + SOT_TOKENS
        calls = max(1, round(prompt_runs / full)) if prompt_runs else 0
        lengths = tuple([prompt_runs / calls] * calls) if calls else ()
        steps = batchd_runs / beam if beam > 1 else float(decode_runs)
        # windows without a prompt call start from the SOT token alone
        context = (sum(lengths) + (encode_runs - calls) * SOT_TOKENS) / encode_runs + steps / encode_runs / 2
        return cls(encode_runs, tokens, beam, decode_runs, batchd_runs, lengths, steps, context,
                   "run counts of the measured printout (workload, not fitted)")


def transcribe(sc: Scenario, w: Workload, counts: TranscriptCounts | None = None) -> Estimate:
    """The Estimate of a transcribe workload, with whisper.cpp's phase lines in ``speech``. ``counts``: the decoder
    work when known (a printout's runs), else derived from ``w.audio_s``."""
    config, rt = sc.config, sc.runtime
    if not config.get("is_encoder_decoder"):
        raise AisimError(f"{sc.model} is not an encoder-decoder speech model; --workload transcribe needs one "
                         "(e.g. whisper-medium.en)")
    if sc.plan.gpus > 1:
        raise AisimError("--workload transcribe runs on one GPU (whisper.cpp has no tensor parallelism); "
                         "give a single-GPU --device")
    check_shape(sc, w)
    n_text_ctx = config.get("max_target_positions", 448)
    if counts is None:
        if w.audio_s is None:
            raise AisimError("--workload transcribe needs the recording's length: give --audio-s SECONDS")
        counts = TranscriptCounts.from_audio(w.audio_s, w.beam, n_text_ctx, w.transcript_tokens, w.windows)
    context = max(1, round(counts.context))
    enc = step_cost(sc, StepShape(phase="encode"), encode_cross_kv=True)  # whisper.cpp projects them there
    step = StepShape(phase="decode", seq=context + 1)
    one = step_cost(sc, step)
    if counts.beam == 1:
        beams = one
    elif rt.beam_batching == "unified":  # beams = tokens of one call; the cache holds every beam's cells
        # positions run to beam x context: fine on the meta device (no bounds check), and the same work
        beams = step_cost(sc, StepShape(phase="decode", seq=counts.beam * (context + 1), step_tokens=counts.beam,
                                        logits_all=True))
    else:
        beams = step_cost(sc, step.model_copy(update={"batch": counts.beam}))
    prompt = _prompt_cost(sc, counts.prompt_lengths)
    beam_calls = counts.batchd_tokens / counts.beam
    phases = {"encode": (counts.windows, "calls", enc.times(counts.windows)),
              "decode": (counts.decode_calls, "calls", one.times(counts.decode_calls)),
              "batchd": (counts.batchd_tokens, "tokens", beams.times(beam_calls)),
              "prompt": (round(sum(counts.prompt_lengths)), "tokens", prompt)}
    costs = [c for _, _, c in phases.values()]
    runtime_s = sum(c.runtime_s for c in costs)
    total = StepCost(runtime_s, sum(c.energy_j for c in costs), 0.0, sum(c.flops for c in costs),
                     sum(c.bytes for c in costs), (), tuple(sorted(set().union(*(c.unknown for c in costs)))))
    lines = [SpeechPhase(name="mel", on="cpu"), SpeechPhase(name="sample", on="cpu")]
    lines += [SpeechPhase(name=k, runs=int(r), run_unit=u, total_ms=c.runtime_s * MS_PER_S,
                          per_run_ms=c.runtime_s * MS_PER_S / r if r else None)
              for k, (r, u, c) in phases.items()]
    memory = max((enc.memory, beams.memory), key=lambda m: m.total_gb)
    notes = [
        f"transcribe: {counts.source}; mean self-attention context of a decoder step {context} tokens",
        "transcribe: mel and sample run on the CPU and are not estimated (outside the GPU model); "
        "throughput is output tokens per second of GPU time",
        "transcribe: the decoder is traced from the transformers Whisper code at the workload dtype; beams "
        + ("step as tokens of one call over a unified KV cache sharing one cross-attention K/V (as whisper.cpp)"
           if rt.beam_batching == "unified" else "are batch rows, each with its own caches (as HF generate)")]
    table = merge_rows([row for k, (_, _, c) in phases.items() for row in phase_rows(k, c.table, 1.0)], runtime_s)
    est = estimate_from(sc, w, total, memory, notes, tokens=counts.tokens, table=table,
                        phases={f"{k}_ms": c.runtime_s * MS_PER_S for k, (_, _, c) in phases.items()})
    return est.model_copy(update={"speech": lines if est.fits else [],
                                  "power_w": total.energy_j / runtime_s if est.fits and runtime_s else None})


def _prompt_cost(sc: Scenario, lengths) -> StepCost:
    """All prompt calls together. A call's cost is linear in its length (one token's work per token, attention
    aside), so the shortest and longest are traced and the others interpolated."""
    if not lengths:
        return EMPTY
    lo, hi = min(lengths), max(lengths)

    def at(n: float) -> StepCost:
        return step_cost(sc, StepShape(phase="decode", seq=round(n), step_tokens=round(n)))

    return linear_total(at, lo, hi, len(lengths), sum(lengths), row_scale=sum(lengths) / round(hi))
