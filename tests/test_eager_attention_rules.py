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
