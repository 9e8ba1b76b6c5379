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

from .errors import AisimError
from .results import SpeechPhase
from .workload import Workload
from .units import MS_PER_S

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
        lengths, past, decode_calls, batchd, contexts = [], 0.0, 0, 0.0, []
        for _ in range(windows):
            prompt = SOT_TOKENS + (1 + min(int(past), cap) if past else 0)  # <|prev|> + past text, then SOT
            if prompt == 1:
                decode_calls += 1          # whisper.cpp files a 1-token call under decode
            elif prompt < BATCHD_MAX_TOKENS:
                batchd += prompt           # ... and a call of under 16 tokens under batchd, counted in tokens
            else:
                lengths.append(prompt)
            contexts.append(prompt + per_window / 2)
            past += per_window
        steps = float(tokens)              # one decoder step per output token, every beam in it
        if beam > 1:
            batchd += beam * tokens
        else:
            decode_calls += tokens
        how = (f"{windows} windows of 30 s; {tokens} output tokens " +
               ("(given)" if given else f"(assumed {TOKENS_PER_AUDIO_S} tokens per second of audio)") +
               f"; one decoder step per token with all {beam} beam{'s' if beam > 1 else ''}; prompts carry up to "
               f"{cap} past tokens")
        return cls(windows, tokens, beam, decode_calls, int(batchd), tuple(lengths), steps,
                   sum(contexts) / len(contexts), how)

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


def transcribe(name, config, dev, cal, rt, w, plan, assumptions, power=None, counts: TranscriptCounts | None = None):
    """The Estimate of a transcribe workload, with whisper.cpp's phase lines in ``speech``. ``counts``: the decoder
    work when known (a printout's runs), else derived from ``w.audio_s``."""
    from .api import _phase_rows, _result, step_cost
    from .cost.memory import breakdown
    from .graph.extract import trace_workload

    if not config.get("is_encoder_decoder"):
        raise AisimError(f"{name} is not an encoder-decoder speech model; --workload transcribe needs one "
                         "(e.g. whisper-medium.en)")
    if plan.gpus > 1:
        raise AisimError("--workload transcribe runs on one GPU (whisper.cpp has no tensor parallelism); "
                         "give a single-GPU --device")
    n_text_ctx = config.get("max_target_positions", 448)
    if counts is None:
        if w.audio_s is None:
            raise AisimError("--workload transcribe needs the recording's length: give --audio-s SECONDS")
        counts = TranscriptCounts.from_audio(w.audio_s, w.beam, n_text_ctx, w.transcript_tokens, w.windows)
    # the phases' workloads keep only what shapes their trace (the graph cache is keyed by the workload)
    base = Workload(dtype=w.dtype, quant=w.quant, attn_impl=w.attn_impl)
    context = max(1, round(counts.context))

    def cost(workload):
        graph = trace_workload(config, workload, plan)
        return graph, step_cost(graph, dev, cal, rt, workload, plan, power)

    enc_w = base.model_copy(update={"phase": "encode", "encode_cross_kv": True})
    enc_graph, enc = cost(enc_w)
    step_w = base.model_copy(update={"phase": "decode", "seq": context + 1})
    _, one = cost(step_w)
    if counts.beam == 1:
        beam_w = step_w
    elif rt.beam_batching == "unified":  # beams = tokens of one call; the cache holds every beam's cells
        # positions run to beam x context: fine on the meta device (no bounds check), and the same work
        beam_w = base.model_copy(update={"phase": "decode", "seq": counts.beam * (context + 1),
                                         "step_tokens": counts.beam, "logits_all": True})
    else:
        beam_w = step_w.model_copy(update={"batch": counts.beam})
    beam_graph, beams = cost(beam_w)
    prompt = _prompt_cost(counts.prompt_lengths, base, cost)
    beam_calls = counts.batchd_tokens / counts.beam
    phases = {"encode": (counts.windows, "calls", enc, counts.windows),
              "decode": (counts.decode_calls, "calls", one, counts.decode_calls),
              "batchd": (counts.batchd_tokens, "tokens", beams, beam_calls),
              "prompt": (round(sum(counts.prompt_lengths)), "tokens", prompt, 1.0)}
    runtime_s = sum(c.runtime_s * n for _, _, c, n in phases.values())
    energy_j = sum(c.energy_j * n for _, _, c, n in phases.values())
    flops = sum(c.flops * n for _, _, c, n in phases.values())
    nbytes = sum(c.bytes * n for _, _, c, n in phases.values())
    unknown = sorted(set().union(*(c.unknown for _, _, c, _ in phases.values())))
    lines = [SpeechPhase(name="mel", on="cpu"), SpeechPhase(name="sample", on="cpu")]
    lines += [SpeechPhase(name=k, runs=int(r), run_unit=u, total_ms=c.runtime_s * n * MS_PER_S,
                          per_run_ms=c.runtime_s * n * MS_PER_S / r if r else None)
              for k, (r, u, c, n) in phases.items()]
    mem = max((breakdown(g, gw, dev) for g, gw in ((enc_graph, enc_w), (beam_graph, beam_w))),
              key=lambda m: m.total_gb)
    notes = list(assumptions) + [
        f"transcribe: {counts.source}; mean self-attention context of a decoder step {context} tokens",
        "transcribe: mel and sample run on the CPU and are not estimated (outside the GPU model); "
        "throughput is output tokens per second of GPU time",
        "transcribe: the decoder is traced from the transformers Whisper code at the workload dtype; beams "
        + ("step as tokens of one call over a unified KV cache sharing one cross-attention K/V (as whisper.cpp)"
           if rt.beam_batching == "unified" else "are batch rows, each with its own caches (as HF generate)")]
    table = _merge_rows([row for k, (_, _, c, n) in phases.items() for row in _phase_rows(k, c.table, n, 1.0)],
                        runtime_s)
    extra = {"phases": {f"{k}_ms": c.runtime_s * n * MS_PER_S for k, (_, _, c, n) in phases.items()}}
    est = _result(name, dev, cal, rt, w, plan, mem, runtime_s, energy_j, energy_j / runtime_s if runtime_s else None,
                  flops, nbytes, table, unknown, notes, extra)
    return est.model_copy(update={"speech": lines if est.fits else [], "tokens": counts.tokens,
                                  "throughput_tokens_per_s": counts.tokens / runtime_s if est.fits else None,
                                  "energy_j_per_token": energy_j / counts.tokens if est.fits else None})


def _prompt_cost(lengths, base, cost):
    """All prompt calls together. A call's cost is linear in its length (one token's work per token, attention
    aside), so the shortest and longest are traced and the others interpolated."""
    from .api import StepCost

    if not lengths:
        return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, [], [])
    lo, hi = min(lengths), max(lengths)
    at = {n: cost(base.model_copy(update={"phase": "decode", "seq": round(n), "step_tokens": round(n)}))[1]
          for n in {lo, hi}}

    def mix(attr: str) -> float:
        a, b = getattr(at[lo], attr), getattr(at[hi], attr)
        return sum(a + (b - a) * ((n - lo) / (hi - lo) if hi > lo else 0.0) for n in lengths)

    scale = sum(lengths) / round(hi)   # the longest call's op rows, stretched to every prompt token
    rows = [r.model_copy(update={"count": round(r.count * len(lengths)), "flops": r.flops * scale,
                                 "bytes": r.bytes * scale, "time_ms": r.time_ms * scale}) for r in at[hi].table]
    return StepCost(mix("runtime_s"), mix("energy_j"), at[hi].power_w, mix("flops"), mix("bytes"), rows,
                    sorted(set(at[lo].unknown) | set(at[hi].unknown)))


def _merge_rows(rows, runtime_s: float):
    """One row per op name (prompt calls of two lengths give two rows of a name), shares of the whole run."""
    merged = {}
    for r in rows:
        m = merged.get(r.name)
        merged[r.name] = r if m is None else m.model_copy(update={
            "count": m.count + r.count, "flops": m.flops + r.flops, "bytes": m.bytes + r.bytes,
            "time_ms": m.time_ms + r.time_ms})
    return sorted((r.model_copy(update={"share": r.time_ms / (runtime_s * MS_PER_S) if runtime_s else 0.0})
                   for r in merged.values()), key=lambda r: -r.time_ms)


def estimate_transcript(model: str, device: str, counts: TranscriptCounts, runtime: str | None = None,
                        dtype: str = "fp16", power_mode: str | None = None, power_limit_w: float | None = None,
                        gpu_clock_mhz: float | None = None):
    """Estimate a transcription whose decoder work is given as counts (e.g. a whisper.cpp printout's runs)."""
    from .api import estimate

    return estimate(model=model, device=device, workload="transcribe", dtype=dtype, runtime=runtime,
                    beam=counts.beam, transcript_counts=counts, power_mode=power_mode, power_limit_w=power_limit_w,
                    gpu_clock_mhz=gpu_clock_mhz)
