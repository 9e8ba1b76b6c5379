"""The decode rules of HF's explicit attention against their committed microbenchmarks
(validation/data/kernels/eager-attention-h100.jsonl, -h200.jsonl; validation/scripts/derive_eager_attention.py):
cat with a strided input at its per-SM-cycle rate, batched decode GEMVs on the skinny-GEMM rule."""
from __future__ import annotations

from pathlib import Path

import pytest
from aisim_path import ensure_aisim

ensure_aisim("aisim.validation.scripts")
DATA = Path(__file__).resolve().parents[1] / "validation" / "data" / "kernels"


@pytest.mark.parametrize("gpu, card, bmm_ceiling", [("h100-sxm", "H100", 13.0), ("h200", "H200", 23.0)])
def test_rules_reproduce_the_microbenchmark(gpu, card, bmm_ceiling):
    from aisim.catalog import resolve_gpu
    from aisim.specs import load_calibration
    from aisim.validation.scripts import derive_eager_attention as derive

    header, rows = derive.load(DATA / f"eager-attention-{card.lower()}.jsonl")
    assert card in header["gpu_name"]
    cal = load_calibration(gpu)
    rate, n = derive.strided_rate(rows, resolve_gpu(gpu))
    assert n >= 80 and rate == pytest.approx(cal.strided_cat_elements_per_sm_cycle, abs=5e-5)
    mape = derive.check(rows, resolve_gpu(gpu), cal, rate)
    old, new, count = mape["cat, a strided input"]
    assert count >= 100 and old > 60 and new < 9       # the contiguous memory curve alone: 70-76%
    old, new, count = mape["cat, contiguous inputs"]
    assert new == old < 9
    old, new, count = mape["bmm decode, 16-bit, memory-bound"]
    assert count >= 300 and old > 200 and new < bmm_ceiling


def test_default_rate_is_the_mean_of_the_two_gpus():
    from aisim.specs import load_calibration

    rates = [load_calibration(g).strided_cat_elements_per_sm_cycle for g in ("h100-sxm", "h200")]
    assert load_calibration("default").strided_cat_elements_per_sm_cycle == pytest.approx(sum(rates) / 2, abs=1e-4)


def test_rewind_head_start_follows_the_harness():
    """validation/rewind.py: measure.py / moe_bench rewind the cache between decode steps without synchronizing,
    so a host-bound row is timed short by the copies' GPU time less their issue time."""
    from aisim.catalog import resolve_model
    from aisim.validation import rewind

    t0, rate = rewind.rewind_fit("h100-sxm")
    assert 1.5e12 < rate < 1.8e12 and 0 <= t0 < 5e-6          # about half of H100's 3.35 TB/s: a strided-view copy
    _, llama = resolve_model("Meta-Llama-3-8B")
    kv = 32 * 2 * 8 * 8 * 4095 * 128 * 2                        # batch 8 x 4095 cached tokens, 8 KV heads x 128
    head = rewind.head_start_s(llama, kv, "h100-sxm")
    copies = 64 * (t0 + 2 * kv / 64 / rate)
    assert 0.7 * copies < head < copies                        # less the host time that issued the 64 copies
    assert rewind.head_start_s(llama, 0.0, "h100-sxm") == 0.0
    assert rewind.head_start_s({**llama, "is_encoder_decoder": True}, kv, "h100-sxm") == 0.0   # whisper: crop only
    assert rewind.head_start_s(llama, kv, "rtx-a5000") == 0.0                                  # no measured copy
    # GPU-bound: the GPU's busy time; host-bound: the runtime less the head start
    assert rewind.measured_runtime_s(20e-3, 18e-3, 5e-3) == 18e-3
    assert rewind.measured_runtime_s(20e-3, 10e-3, 5e-3) == pytest.approx(15e-3)
    assert rewind.measured_runtime_s(20e-3, 10e-3, 0.0) == 20e-3


def test_validation_rows_are_estimated_as_the_harness_times_them():
    from aisim.validation.report import compare

    case = {"key": "k", "model": "Meta-Llama-3-8B", "gpu_name": "NVIDIA H100 80GB HBM3", "workload": "decode",
            "batch": 8, "seq": 4096, "dtype": "bf16", "tp": 1, "status": "ok", "runtime_ms_median": 15.0}
    plain, timed = compare([case]), compare([{**case, "kv_fill": "prefill"}])
    est_plain, est_timed = plain[0].metrics["runtime_ms"].estimated, timed[0].metrics["runtime_ms"].estimated
    assert est_timed < 0.9 * est_plain
