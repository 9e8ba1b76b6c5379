"""TorchCAP's harness as a profile (validation/harness_profiles/torchcap.yaml) and the RTX A5000 rules built from its
published microbenchmark (hardware_specs/calibration/rtx-a5000.yaml): hand-worked numbers, no GPU."""
import math

import pytest
from aisim.specs import all_hardware, load_calibration
from aisim.validation.published import (
    _harness_profile,
    loss_tail_bytes_per_element,
    torchcap_revision,
    torchcap_rows,
    torchcap_runtime_correction_ms,
    torchcap_summary,
)


def _paths():
    return _harness_profile("torchcap")["single_gpu"]["loss_paths"]


def test_loss_tail_keeps_the_logits_on_eight_gpus():
    """The x8 script returns (loss, logits): the fp16 logits stay live. Llama: 2 + 4 + 4 = 10 bytes per logits
    element (logits, fp32 shift copy, fp32 log_softmax); OPT: 2 + 2 + 2 = 6."""
    keep = _harness_profile("torchcap")["multi_gpu"]["keep"]
    assert loss_tail_bytes_per_element(_paths()["llama"]["steps"], keep) == 10
    assert loss_tail_bytes_per_element(_paths()["opt"]["steps"], keep) == 6
    # without keep (the wrapped single-GPU module): 4 + 4 and 2 + 2
    assert loss_tail_bytes_per_element(_paths()["llama"]["steps"]) == 8
    assert loss_tail_bytes_per_element(_paths()["opt"]["steps"]) == 4


def test_which_harness_revision_ran_each_row():
    """OPT x 8 rows were uploaded before TorchCAP's 2025-04-12 switch of its TP pass (not modelled); clm x 8 after."""
    assert torchcap_revision("facebook/opt-1.3b", 1) is None
    assert torchcap_revision("facebook/opt-6.7b", 8)["modelled"] is False
    assert torchcap_revision("AICrossSim/clm-1.1b", 8)["modelled"] is True


def _config(**kw):
    base = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 4096, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 32000}
    return {**base, **kw}


def test_masked_attention_is_the_other_half_of_the_pairs_at_the_plateau():
    """64 x 4096 tokens, 32 heads of 128: causal 4*64*32*128*4096*4097/2 = 8.80e12 FLOPs per layer, full
    4*64*32*128*4096^2 = 8.80e12 * 2*4096/4097; both far past the default attention curve's last point (0.6 at 1e11
    on the H100; x scaled by 132/84 on the A6000), compute-bound, so the difference per layer is
    (full - causal) / (154.8e12 * 0.6)."""
    got = torchcap_runtime_correction_ms(_config(), "rtx-a6000", 64, 4096, "fp16")
    causal = 4.0 * 64 * 32 * 128 * 4096 * 4097 / 2
    full = 4.0 * 64 * 32 * 128 * 4096 * 4096
    assert got["attention"] == pytest.approx(2 * (full - causal) / (154.8e12 * 0.6) * 1e3, rel=1e-9)


def test_repeat_kv_only_with_grouped_kv_heads():
    gqa = torchcap_runtime_correction_ms(_config(), "rtx-a6000", 16, 1024, "fp16")
    mha = torchcap_runtime_correction_ms(_config(num_key_value_heads=32), "rtx-a6000", 16, 1024, "fp16")
    assert gqa["repeat_kv"] > 0 and "repeat_kv" not in mha


def test_loss_kernels_differ_by_the_bytes_the_two_paths_move():
    """Llama adds the fp32 shift copy (4 + 4 bytes per logits element) to the traced path; OPT runs fp16 shift +
    fp16 log_softmax (8 bytes) instead of the traced fp32 upcast + fp32 log_softmax (6 + 8 = 14): fewer bytes.
    The copy of 16 x 1024 x 32000 x 8 = 4.19 GB on a 768 GB/s card at the memory curve's plateau (0.8065):
    6.77 ms."""
    llama = torchcap_runtime_correction_ms(_config(), "rtx-a6000", 16, 1024, "fp16")["loss"]
    opt = torchcap_runtime_correction_ms(_config(model_type="opt", num_key_value_heads=32), "rtx-a6000", 16, 1024,
                                         "fp16")["loss"]
    assert llama == pytest.approx(16 * 1024 * 32000 * 8 / 768e9 / 0.8065 * 1e3, rel=1e-3)
    assert opt < 0


def test_rtx_a5000_gemm_plateau_is_torchcaps_measured_matmul_rate():
    """configs/a5000_24g_gala1.json: median 71.7 TFLOP/s of the square fp16 torch.mm of >= 2e11 FLOPs = 0.646 of
    111.1; a 16384 x 8192 x 2048 GEMM (5.5e11 FLOPs) reads the curve's end."""
    from aisim.cost import efficiency

    cal = load_calibration("rtx-a5000")
    gpu = all_hardware()["rtx-a5000"]
    assert cal.measured is False and cal.device == "rtx-a5000"
    flops = 2.0 * 16384 * 8192 * 2048
    eff = efficiency.gemm_efficiency(cal, "fp16", 16384, 8192, 2048, flops, 0.0, False, gpu)
    assert eff == pytest.approx(0.646)
    assert eff * gpu.peak_for("fp16") / 1e12 == pytest.approx(71.7, abs=0.1)
    # x axis: an A5000 call reads at log10(F x 132 / 64)
    assert math.log10(132 / 64) == pytest.approx(0.314, abs=1e-3)


def test_modelled_rows_beat_torchcaps_own_estimate():
    """Regression gate for the TorchCAP table (figures when set + 0.5): over the 20 rows whose harness is modelled
    (12 single-GPU, 8 clm x 8) runtime MAPE 4.35% (TorchCAP's own: 7.36%), memory 1.12%."""
    rows = torchcap_rows(__import__("aisim").estimate)
    summary = {(r[0], r[1]): float(r[3].rstrip("%")) for r in torchcap_summary(rows)}
    assert summary[("runtime, rows whose harness is modelled", "aisim")] <= 4.35 + 0.5
    assert summary[("runtime, 1 GPU", "aisim")] <= 5.41 + 0.5
    assert summary[("runtime, 8 GPUs, harness modelled (clm rows)", "aisim")] <= 3.42 + 0.5
    assert summary[("memory, rows whose harness is modelled", "aisim")] <= 1.12 + 0.5
