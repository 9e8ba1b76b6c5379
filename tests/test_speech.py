"""The transcribe workload (whisper.cpp's phases), encoder-decoder decoder steps, ggml runtime profiles, power
modes, and the whisper.cpp comparison."""
import json

import numpy as np
import pytest
from typer.testing import CliRunner

import aisim
from aisim.cli import app
from aisim.errors import AisimError
from aisim.api import estimate_transcript
from aisim.studies.transcribe import TranscriptCounts

DEV = "gtx-1650-mobile"


def test_counts_from_audio_follow_whisper_cpp_rules():
    c = TranscriptCounts.from_audio(61, beam=5, n_text_ctx=448, tokens=300)
    assert c.windows == 3 and c.tokens == 300 and c.batchd_tokens == 5 * 300
    # window 1: the SOT token alone (a 1-token call: whisper.cpp files it under decode); then <|prev|> + past + SOT
    assert c.decode_calls == 1
    assert c.prompt_lengths == (1 + 100 + 1, 1 + 200 + 1)
    capped = TranscriptCounts.from_audio(3000, beam=5, n_text_ctx=448, tokens=20000)
    assert max(capped.prompt_lengths) == 1 + 224 + 1  # at most n_text_ctx / 2 past tokens
    greedy = TranscriptCounts.from_audio(30, beam=1, n_text_ctx=448, tokens=50)
    assert greedy.batchd_tokens == 0 and greedy.decode_calls == 1 + 50


def test_counts_from_runs_split_prompt_tokens_into_full_calls():
    c = TranscriptCounts.from_runs(81, 73, 36718, 17764, 6991, 5, 448)
    assert c.windows == 81 and len(c.prompt_lengths) == 79 and sum(c.prompt_lengths) == pytest.approx(17764)


def test_transcribe_phases_are_consistent():
    e = aisim.estimate(model="whisper-tiny", device=DEV, workload="transcribe", audio_s=61, beam=5,
                       transcript_tokens=200, runtime="ggml-vulkan")
    lines = {p.name: p for p in e.speech}
    assert lines["mel"].on == "cpu" and lines["mel"].total_ms is None and lines["sample"].on == "cpu"
    assert lines["encode"].runs == 3 and lines["batchd"].runs == 1000 and lines["batchd"].run_unit == "tokens"
    enc = aisim.estimate(model="whisper-tiny", device=DEV, workload="encode", runtime="ggml-vulkan")
    assert lines["encode"].per_run_ms == pytest.approx(enc.runtime_ms)  # ggml-vulkan encodes with the cross K/V
    step = aisim.estimate(model="whisper-tiny", device=DEV, workload="decode", seq=3, runtime="ggml-vulkan")
    assert lines["decode"].per_run_ms == pytest.approx(step.runtime_ms, rel=0.05)  # the SOT call of window 1
    # the totals cover every phase: the op rows add up to the estimate's FLOPs
    full = aisim.estimate(model="whisper-tiny", device=DEV, workload="transcribe", audio_s=61, beam=5,
                          transcript_tokens=200, runtime="ggml-vulkan", top_ops=None)
    assert sum(r.flops for r in full.top_ops) == pytest.approx(full.flops, rel=1e-3)   # prompt rows: scaled
    r = CliRunner().invoke(app, ["estimate", "-m", "whisper-tiny", "-d", DEV, "--workload", "transcribe",
                                 "--audio-s", "61", "--runtime", "ggml-cuda"])
    assert r.exit_code == 0 and "batchd" in r.output and "CPU: not modelled" in r.output


def test_greedy_and_beam_contexts():
    greedy = TranscriptCounts.from_audio(60, beam=1, n_text_ctx=448, tokens=200)
    # window 1: SOT (1) + 50 generated; window 2: <|prev|> + 100 past + SOT, then 50 more; mean of the two
    assert greedy.context == pytest.approx(((1 + 50) + (102 + 50)) / 2)
    assert greedy.steps == 200 and greedy.decode_calls == 1 + 200
    silent = TranscriptCounts.from_audio(300, beam=5, n_text_ctx=448, tokens=20, windows=10)
    # 2 tokens per window: window k's prompt is <|prev|> + 2k + SOT; under 16 tokens whisper.cpp files it as batchd
    assert silent.prompt_lengths == (16, 18, 20)
    assert silent.batchd_tokens == 5 * 20 + sum(range(4, 16, 2))


def test_transcript_output_is_bounded_by_the_decoder():
    with pytest.raises(AisimError, match="per window"):
        aisim.estimate(model="whisper-tiny", device=DEV, workload="transcribe", audio_s=61, transcript_tokens=100000)
    with pytest.raises(AisimError, match="decoder's 448 positions"):
        aisim.estimate(model="whisper-tiny", device=DEV, workload="decode", seq=2000)
    with pytest.raises(AisimError, match="at least 3 windows"):
        aisim.estimate(model="whisper-tiny", device=DEV, workload="transcribe", audio_s=61, windows=1)
    with pytest.raises(AisimError, match="transcribe only"):
        aisim.estimate(model="whisper-tiny", device=DEV, workload="decode", seq=20, audio_s=3)


def test_transcript_counts_reach_the_cli_report():
    from aisim.report import print_estimate

    counts = TranscriptCounts.from_runs(3, 1, 2180, 218, 415, 5, 448)
    e = estimate_transcript("whisper-tiny", DEV, counts, runtime="ggml-vulkan")
    print_estimate(e)   # no audio length: the title says so instead of failing
    assert {p.name: p.runs for p in e.speech}["batchd"] == 2180


def test_transcribe_bad_input_is_explained():
    with pytest.raises(AisimError, match="--audio-s"):
        aisim.estimate(model="whisper-tiny", device=DEV, workload="transcribe")
    with pytest.raises(AisimError, match="encoder-decoder"):
        aisim.estimate(model="opt-125m", device=DEV, workload="transcribe", audio_s=10)
    with pytest.raises(AisimError, match="power-saver"):
        aisim.estimate(model="whisper-tiny", device=DEV, workload="encode", power_mode="turbo")
    with pytest.raises(AisimError, match="waiting power"):
        aisim.estimate(model="whisper-tiny", device=DEV, workload="encode", power_limit_w=1)


def test_encode_cross_kv_adds_the_decoder_projections():
    from aisim.graph.extract import trace_workload
    from aisim.workload import ParallelPlan, Workload

    cfg = aisim.catalog.resolve_model("whisper-tiny")[1]
    base = Workload(phase="encode", dtype="fp16")
    flops = {}
    for cross in (False, True):
        g = trace_workload(cfg, base.model_copy(update={"encode_cross_kv": cross}), ParallelPlan())
        from aisim.formulas import op_cost
        flops[cross] = sum(op_cost(op).flops * r for op, r in zip(g.ops, g.repeats) if op_cost(op).kind == "gemm")
    d, frames, layers = cfg["d_model"], cfg["max_source_positions"], cfg["decoder_layers"]
    # k_proj (no bias) and v_proj (bias) per decoder layer over the encoder output
    expected = layers * (2 * frames * d * d + (2 * frames * d * d + frames * d))
    assert flops[True] - flops[False] == pytest.approx(expected, rel=1e-9)


def test_decoder_step_reuses_cached_cross_attention():
    from aisim.graph.extract import trace_workload
    from aisim.workload import ParallelPlan, Workload

    cfg = aisim.catalog.resolve_model("whisper-tiny")[1]
    g = trace_workload(cfg, Workload(phase="decode", seq=50, dtype="fp16"), ParallelPlan())
    from aisim.formulas import gemm_dims

    linears = [(op, r) for op, r in zip(g.ops, g.repeats) if op.name in ("aten.addmm", "aten.mm")]
    assert all(gemm_dims(op)[1] == 1 for op, _ in linears)   # one token
    mats = sum(r for _, r in linears)
    # per layer: self q,k,v,o + cross q,o + fc1, fc2 = 8 (the cross k, v come from the encode phase); + the head
    assert mats == pytest.approx(8 * cfg["decoder_layers"] + 1)


def test_unified_beams_share_the_cross_attention_cache():
    cfg = "whisper-tiny"
    counts = TranscriptCounts.from_audio(30, beam=5, n_text_ctx=448, tokens=100)
    unified = estimate_transcript(cfg, DEV, counts, runtime="ggml-cuda")
    batch = estimate_transcript(cfg, DEV, counts, runtime="eager")
    assert unified.bytes < batch.bytes   # five copies of the 1500-frame cross K/V in HF's beam-as-batch


def test_backend_efficiency_replaces_plateaus_only_where_it_matches():
    from aisim.catalog import resolve_device
    from aisim.cost.efficiency import runtime_scales
    from aisim.specs import all_runtimes, load_calibration

    rt = all_runtimes()["ggml-cuda"]
    gtx, h100 = resolve_device(DEV).gpu, resolve_device("h100").gpu
    cal = load_calibration(gtx.name)
    compute, memory = runtime_scales(rt, gtx, cal, "fp16")
    from aisim.cost.efficiency import gemm_table_value

    table = cal.gemm_tables["fp16"]   # the plateau is the largest GEMM of the table, not its GEMV corner
    assert compute * gemm_table_value(table, 16384, 16384, 16384) == pytest.approx(0.13)
    assert memory * max(cal.memory_efficiency.efficiency) == pytest.approx(0.8)
    assert runtime_scales(rt, h100, load_calibration("h100-sxm"), "fp16") == (1.0, 1.0)


def test_ggml_vulkan_fraction_is_what_its_derivation_gives():
    from aisim.specs import all_runtimes
    from aisim.validation.scripts.derive_ggml_profiles import derive

    shipped = all_runtimes()["ggml-vulkan"].efficiency[0].gemm_fraction_of_peak
    assert derive() == pytest.approx(shipped, abs=0.002)


def test_power_mode_slows_compute_bound_kernels_only():
    from aisim.catalog import resolve_device
    from aisim.cost.power import PowerMode, apply_power_mode
    from aisim.specs import load_calibration

    gpu = resolve_device(DEV).gpu
    cal = load_calibration(gpu.name)
    gpu_s = np.array([1e-3, 1e-3])
    compute_s = np.array([0.8e-3, 0.1e-3])   # a compute-bound and a memory-bound kernel
    memory_s = np.array([0.1e-3, 0.8e-3])
    t, w = apply_power_mode(gpu, cal, PowerMode(gpu_clock_mhz=780), gpu_s, compute_s, memory_s)
    assert t[0] == pytest.approx(1e-3 * 2.0) and t[1] == pytest.approx(1e-3)   # half clock
    t_full, w_full = apply_power_mode(gpu, cal, PowerMode(), gpu_s, compute_s, memory_s)
    assert (w < w_full).all() and (t_full == gpu_s).all()
    t_lim, w_lim = apply_power_mode(gpu, cal, PowerMode(power_limit_w=10), gpu_s, compute_s, memory_s)
    assert (w_lim <= 10 + 1e-9).all() and t_lim[0] > 1e-3


def test_power_limit_binds_under_an_emulated_backend():
    kw = dict(model="whisper-tiny", device=DEV, workload="encode", runtime="ggml-cuda")
    full, limited = aisim.estimate(**kw), aisim.estimate(power_limit_w=20, **kw)
    assert full.power_w > 20 and limited.runtime_ms > full.runtime_ms and limited.power_w <= 20.5
    for bad, match in (({"gpu_clock_mhz": float("nan")}, "finite"), ({"power_limit_w": 500}, "board power"),
                       ({"gpu_clock_mhz": 5000}, "boost clock")):
        with pytest.raises(AisimError, match=match):
            aisim.estimate(**kw, **bad)


def test_power_saver_is_slower_and_draws_less():
    kw = dict(model="whisper-tiny", device=DEV, workload="encode", runtime="ggml-cuda")
    perf, saver = aisim.estimate(power_mode="performance", **kw), aisim.estimate(power_mode="power-saver", **kw)
    assert saver.runtime_ms > perf.runtime_ms and saver.power_w < perf.power_w
    assert any("power-saver" in a and "35 W" in a for a in saver.assumptions)


def test_whisper_reference_comparison():
    from aisim.validation.published import compare_reference

    out = json.loads(compare_reference("whisper-cpp", fmt="json"))
    rows = out["rows"]
    assert len(rows) == 12 and sum(r["label"][3] == "ok" for r in rows) == 8
    saver = [r for r in rows if r["label"][2] == "power_saver"]
    assert len(saver) == 4 and all(r["encode_measured"] is None and r["encode_estimate"] > 0 for r in saver)
    perf = {tuple(r["label"][:2]): r for r in rows if r["label"][2] == "performance"}
    for r in saver:
        assert r["encode_estimate"] > perf[tuple(r["label"][:2])]["encode_estimate"]
    assert all(r["errors"]["encode"] is not None for r in rows if r["label"][3] == "ok")
    # the summary is records a script can read: keyed by column, counts and percentages as numbers
    summary = out["summary"]
    assert summary and all(isinstance(r["n"], int) and isinstance(r["mape_pct"], float) for r in summary)
    assert {"backend", "metric", "n", "mape_pct", "max_abs_error_pct"} <= set(summary[0])


def test_whisper_generate_is_bounded_by_the_decoders_positions_and_forward_train_are_refused():
    """New-user test: generate --seq 448 --gen 1000 ran past whisper's 448 decoder positions; forward and train
    failed inside the model's code; generate's time to first token leaves out the encoder, now said."""
    with pytest.raises(AisimError, match="448 \\+ 1000 generated exceeds the decoder's 448 positions"):
        aisim.estimate("whisper-tiny", "h100", workload="generate", seq=448, gen=1000)
    for workload in ("forward", "train"):
        with pytest.raises(AisimError, match="encoder-decoder"):
            aisim.estimate("whisper-tiny", "h100", workload=workload, batch=2, seq=16)
    e = aisim.estimate("whisper-tiny", "h100", workload="generate", seq=4, gen=16)
    assert any("encoder's pass" in a for a in e.assumptions)
