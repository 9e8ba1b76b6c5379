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
    """Decoder work of one transcription. ``prompt_lengths``: the token count of each prompt call."""
    windows: int
    tokens: int
    beam: int
    decode_calls: int
    batchd_tokens: int
    prompt_lengths: tuple[int, ...]
    source: str

    @property
    def steps_per_window(self) -> float:
        return self.batchd_tokens / self.beam / self.windows

    @classmethod
    def from_audio(cls, audio_s: float, beam: int, n_text_ctx: int, tokens: int | None = None,
                   windows: int | None = None) -> "TranscriptCounts":
        given = tokens is not None
        windows = windows or max(1, math.ceil(audio_s / WINDOW_S))
        tokens = tokens or max(1, round(audio_s * TOKENS_PER_AUDIO_S))
        per_window = tokens / windows
        cap = n_text_ctx // 2
        lengths, past, decode_calls = [], 0.0, 0
        for _ in range(windows):
            prompt = SOT_TOKENS + (1 + min(int(past), cap) if past else 0)  # <|prev|> + past text, then SOT
            if prompt == 1:
                decode_calls += 1
            elif prompt < BATCHD_MAX_TOKENS:
                pass  # counted with the beam steps below (rare: a window after a nearly silent one)
            else:
                lengths.append(prompt)
            past += per_window
        batchd = beam * tokens if beam > 1 else 0
        decode_calls += 0 if beam > 1 else tokens
        how = (f"{windows} windows of 30 s; {tokens} output tokens " +
               ("(given)" if given else f"(assumed {TOKENS_PER_AUDIO_S} tokens per second of audio)") +
               f"; one decoder step per token with all {beam} beams; prompts carry up to {cap} past tokens")
        return cls(windows, tokens, beam, decode_calls, batchd, tuple(lengths), how)

    @classmethod
    def from_runs(cls, encode_runs: int, decode_runs: int, batchd_runs: int, prompt_runs: int, tokens: int,
                  beam: int, n_text_ctx: int) -> "TranscriptCounts":
        """The counts of a whisper.cpp printout; prompt tokens split into calls of the usual full length."""
        full = n_text_ctx // 2 + 1 + SOT_TOKENS
        calls = max(1, round(prompt_runs / full)) if prompt_runs else 0
        lengths = tuple([prompt_runs / calls] * calls) if calls else ()
        return cls(encode_runs, tokens, beam, decode_runs, batchd_runs, lengths,
                   "run counts of the measured printout (workload, not fitted)")


def transcribe(name, config, dev, cal, rt, w, plan, assumptions, power=None):
    """The Estimate of a transcribe workload, with whisper.cpp's phase lines in ``speech``."""
    if not config.get("is_encoder_decoder"):
        raise AisimError(f"{name} is not an encoder-decoder speech model; --workload transcribe needs one "
                         "(e.g. whisper-medium.en)")
    if w.audio_s is None:
        raise AisimError("--workload transcribe needs the recording's length: give --audio-s SECONDS")
    if plan.gpus > 1:
        raise AisimError("--workload transcribe runs on one GPU (whisper.cpp has no tensor parallelism); "
                         "give a single-GPU --device")
    n_text_ctx = config.get("max_target_positions", 448)
    counts = TranscriptCounts.from_audio(w.audio_s, w.beam, n_text_ctx, w.transcript_tokens, w.windows)
    return transcribe_counts(name, config, dev, cal, rt, w, plan, assumptions, counts, power)


def transcribe_counts(name, config, dev, cal, rt, w, plan, assumptions, counts: TranscriptCounts, power=None):
    from .api import _phase_rows, _result, step_cost
    from .cost.memory import breakdown
    from .graph.extract import trace_workload

    base = w.model_copy(update={"audio_s": None, "transcript_tokens": None, "windows": None, "beam": 5,
                                "batch": 1, "gen_tokens": 128})
    prompt_mean = sum(counts.prompt_lengths) / len(counts.prompt_lengths) if counts.prompt_lengths else 0.0
    context = max(1, round(prompt_mean + counts.steps_per_window / 2))  # mean self-attention context of a step

    def cost(workload):
        graph = trace_workload(config, workload, plan)
        return graph, step_cost(graph, dev, cal, rt, workload, plan, power)

    enc_w = base.model_copy(update={"phase": "encode", "encode_cross_kv": True})
    enc_graph, enc = cost(enc_w)
    step_w = base.model_copy(update={"phase": "decode", "seq": context + 1})
    _, one = cost(step_w)
    if rt.beam_batching == "unified":  # beams = tokens of one call; the cache holds every beam's cells
        beam_w = base.model_copy(update={"phase": "decode", "seq": counts.beam * (context + 1),
                                         "step_tokens": counts.beam, "logits_all": True})
    else:
        beam_w = step_w.model_copy(update={"batch": counts.beam})
    beam_graph, beams = cost(beam_w)
    prompt_s = prompt_j = 0.0
    prompt_rows = []
    for length in sorted(set(round(p) for p in counts.prompt_lengths)):
        n = sum(1 for p in counts.prompt_lengths if round(p) == length)
        pw = base.model_copy(update={"phase": "decode", "seq": length, "step_tokens": length})
        _, pc = cost(pw)
        prompt_s += pc.runtime_s * n
        prompt_j += pc.energy_j * n
        prompt_rows += _phase_rows("prompt", pc.table, n, 1.0)
    beam_calls = counts.batchd_tokens / counts.beam
    phases = {"encode": (counts.windows, "calls", enc.runtime_s * counts.windows, enc.energy_j * counts.windows),
              "decode": (counts.decode_calls, "calls", one.runtime_s * counts.decode_calls,
                         one.energy_j * counts.decode_calls),
              "batchd": (counts.batchd_tokens, "tokens", beams.runtime_s * beam_calls, beams.energy_j * beam_calls),
              "prompt": (round(sum(counts.prompt_lengths)), "tokens", prompt_s, prompt_j)}
    runtime_s = sum(p[2] for p in phases.values())
    energy_j = sum(p[3] for p in phases.values())
    lines = [SpeechPhase(name="mel", on="cpu")] + [SpeechPhase(name="sample", on="cpu")]
    lines += [SpeechPhase(name=k, runs=int(r), run_unit=u, total_ms=s * MS_PER_S,
                          per_run_ms=s * MS_PER_S / r if r else None) for k, (r, u, s, _) in phases.items()]
    mems = [breakdown(g, gw, dev) for g, gw in ((enc_graph, enc_w), (beam_graph, beam_w))]
    mem = max(mems, key=lambda m: m.total_gb)
    notes = list(assumptions) + [
        f"transcribe: {counts.source}; mean self-attention context of a beam step {context} tokens",
        "transcribe: mel and sample run on the CPU and are not estimated (outside the GPU model); "
        "throughput is output tokens per second of GPU time",
        "transcribe: the decoder is traced from the transformers Whisper code at the workload dtype; beams "
        + ("step as tokens of one call over a unified KV cache sharing one cross-attention K/V (as whisper.cpp)"
           if rt.beam_batching == "unified" else "are batch rows, each with its own caches (as HF generate)")]
    table = _phase_rows("encode", enc.table, counts.windows, 1.0) + _phase_rows("decode", one.table,
                                                                                 counts.decode_calls, 1.0)
    table += _phase_rows("batchd", beams.table, beam_calls, 1.0) + prompt_rows
    table = sorted((r.model_copy(update={"share": r.time_ms / (runtime_s * MS_PER_S)}) for r in table),
                   key=lambda r: -r.time_ms)
    extra = {"phases": {f"{k}_ms": v[2] * MS_PER_S for k, v in phases.items()}}
    est = _result(name, dev, cal, rt, w, plan, mem, runtime_s, energy_j, energy_j / runtime_s if runtime_s else None,
                  enc.flops * counts.windows + beams.flops * beam_calls, enc.bytes * counts.windows +
                  beams.bytes * beam_calls, table, sorted(set(enc.unknown) | set(beams.unknown)), notes, extra)
    return est.model_copy(update={"speech": lines if est.fits else [], "tokens": counts.tokens,
                                  "throughput_tokens_per_s": counts.tokens / runtime_s if est.fits else None,
                                  "energy_j_per_token": energy_j / counts.tokens if est.fits else None})


def estimate_transcript(model: str, device: str, counts: TranscriptCounts, runtime: str = "ggml-cuda",
                        dtype: str = "fp16", power_mode: str | None = None, power_limit_w: float | None = None,
                        gpu_clock_mhz: float | None = None):
    """Estimate a transcription whose decoder work is given as counts (e.g. a whisper.cpp printout's runs)."""
    from . import catalog
    from .api import _assumptions, _runtime, resolve_power_mode
    from .plan import choose_plan
    from .specs import load_calibration
    from .workload import Workload

    name, config = catalog.resolve_model(model)
    dev = catalog.resolve_device(device)
    cal = load_calibration(dev.gpu.name)
    rt = _runtime(runtime)
    w = Workload(phase="transcribe", dtype=dtype, attn_impl=rt.attn_impl, encode_cross_kv=True,
                 audio_s=None, beam=counts.beam)
    plan, note = choose_plan(config, dev.count, dev.name, 1, None, 1, 1, "all")
    power, power_note = resolve_power_mode(dev.gpu, cal, power_mode, power_limit_w, gpu_clock_mhz)
    assumptions = _assumptions(dev, cal, w, plan, config, note) + ([power_note] if power_note else [])
    return transcribe_counts(name, config, dev, cal, rt, w, plan, assumptions, counts, power)
