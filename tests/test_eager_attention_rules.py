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
    assert new < 9                                     # the contiguous memory curve prices the vectorized copy
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
    # encoder-decoder rows (whisper) are left as estimated: their KV estimate holds the cross-attention cache too
    assert rewind.head_start_s({**llama, "is_encoder_decoder": True}, kv, "h100-sxm") == 0.0
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


def test_each_gpus_strided_rate_predicts_the_other_gpus_rows():
    """Out of sample: the strided-cat rows of one GPU estimated with the rate measured on the other."""
    from aisim.catalog import resolve_gpu
    from aisim.specs import load_calibration
    from aisim.validation.scripts import derive_eager_attention as derive

    for gpu, card, other in (("h100-sxm", "h100", "h200"), ("h200", "h200", "h100-sxm")):
        _, rows = derive.load(DATA / f"eager-attention-{card}.jsonl")
        rate = load_calibration(other).strided_cat_elements_per_sm_cycle
        _, new, count = derive.check(rows, resolve_gpu(gpu), load_calibration(gpu), rate)["cat, a strided input"]
        assert count >= 100 and new < 10


def test_write_lines_replaces_in_place_and_is_idempotent(tmp_path):
    from aisim.validation.scripts.derive_eager_attention import write_lines

    path = tmp_path / "cal.yaml"
    path.write_text("device: x\nnotes: 'strided_cat_elements_per_sm_cycle: 0.5 in prose'\n")
    lines = {"strided_cat_elements_per_sm_cycle": "strided_cat_elements_per_sm_cycle: 0.6"}
    write_lines(path, lines, "# strided_cat_elements_per_sm_cycle: note")
    once = path.read_text()
    write_lines(path, lines, "# strided_cat_elements_per_sm_cycle: note")
    assert path.read_text() == once
    assert once.endswith("# strided_cat_elements_per_sm_cycle: note\nstrided_cat_elements_per_sm_cycle: 0.6\n")
    assert "notes: 'strided_cat_elements_per_sm_cycle: 0.5 in prose'" in once


def test_strided_cat_is_charged_only_where_pytorchs_cat_runs():
    """BLOOM's KV append: eager pays ATen's strided cat; vLLM writes the new token in place (its attention module
    is `self_attention`); ggml runs its own kernels."""
    import aisim

    def cat_ms(runtime):
        est = aisim.estimate(model="bloom-7b1", device="h100", workload="decode", batch=8, seq=1024, dtype="fp16",
                             runtime=runtime)
        return sum(o.time_ms for o in est.top_ops if o.name == "aten.cat"), {o.name for o in est.top_ops}

    eager, _ = cat_ms("eager")
    vllm, vllm_ops = cat_ms("vllm")
    ggml, _ = cat_ms("ggml-cuda")
    # 60 cats of 8 x 32 x 1025 x 128 elements at 0.648 per SM-cycle, 132 SMs, 1.98 GHz: about 12.4 ms
    assert 10 < eager < 14
    assert vllm == 0 and "kv_cache.write" in vllm_ops
    assert ggml < 2


def test_only_the_batched_strided_path_is_flagged():
    torch = pytest.importorskip("torch")
    from aisim.graph.tracer import Tracer, tracing

    tracer = Tracer()
    x = torch.zeros(2, 4, 8, 16, device="meta")
    with tracing(None, tracer):
        torch.cat([x.transpose(1, 2)])                                              # one input: a copy
        torch.cat([x.unsqueeze(0).transpose(1, 3), x.unsqueeze(0).transpose(1, 3)], dim=-1)   # 5 dims: per input
        torch.cat([x.transpose(1, 2), x.transpose(1, 2)], dim=-1)                   # the strided kernel
        torch.cat([x, x], dim=-1)                                                   # the vectorized copy
        torch.cat([torch.zeros(0, device="meta"), x.transpose(1, 2)], dim=-2)      # DynamicCache's first update
    assert [bool(o.attrs.get("strided_inputs")) for o in tracer.ops if o.name == "aten.cat"] == [False, False, True,
                                                                                                False, True]


def test_view_copy_efficiency_is_the_crop_copy_microbenchmark():
    """view_copy_efficiency of each calibration is the crop_contiguous fit of its GPU's eager_attention run (over the
    datasheet bandwidth), and both GPUs reach about the same absolute rate (not bandwidth-bound)."""
    import json
    from pathlib import Path

    from aisim.catalog import resolve_gpu
    from aisim.specs import load_calibration
    from aisim.validation.rewind import crop_copy_fit

    data = Path(__file__).resolve().parents[1] / "validation" / "data" / "kernels"
    rates = {}
    for gpu, name in (("h100-sxm", "eager-attention-h100.jsonl"), ("h200", "eager-attention-h200-run2.jsonl")):
        rows = [json.loads(line) for line in (data / name).read_text().splitlines() if '"case"' in line]
        rates[gpu] = crop_copy_fit(rows)[1]
        expected = rates[gpu] / resolve_gpu(gpu).memory_bw_bytes_per_s
        assert load_calibration(gpu).view_copy_efficiency == pytest.approx(expected, abs=6e-4)
    assert rates["h200"] / rates["h100-sxm"] == pytest.approx(1.0, abs=0.1)
