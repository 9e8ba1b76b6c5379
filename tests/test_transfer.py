"""GPUs we never measured: the portable efficiency model, decode bandwidth on every shipped NVIDIA GPU, and the
leave-one-GPU-out / --calibration none accuracy (validation/transfer.py), with regression ceilings."""
from __future__ import annotations

import pytest

from aisim.cost.efficiency import gemm_efficiency, graph_replay_credit_s, memory_efficiency, size_scale
from aisim.specs import all_hardware, default_calibration, load_calibration

# Goal of the issue: >= 70% of datasheet bandwidth for the Llama-3-8B decode step (batch 1, context 1024) under the
# serving-engine runtime (transfer.DECODE_RUNTIME, vllm; the issue's `graphs` before graphs became HF's StaticCache),
# on every shipped NVIDIA GPU. The GEMMs it rests on are checked against a CUDA-graph replay measured on an H100
# (harness/graph_gemv.py) below.
DECODE_BW_GOAL = 0.70


@pytest.fixture(scope="module")
def decode_rows():
    from aisim.validation.transfer import decode_rows

    return {r.device: r for r in decode_rows()}


def nvidia_gpus():
    return sorted(name for name, gpu in all_hardware().items() if gpu.vendor == "nvidia")


def test_size_scale_is_one_on_the_reference_and_a_ratio_elsewhere():
    h100, h200, a5000 = (all_hardware()[n] for n in ("h100-sxm", "h200", "rtx-a5000"))
    cal = load_calibration("h100-sxm")
    assert size_scale(cal, h100, "bytes") == 1.0
    assert size_scale(cal, h200, "bytes") == pytest.approx(3.35e12 / 4.8e12)     # equal roofline time
    assert size_scale(cal, h200, "flops") == pytest.approx(1.0)                  # 132 SMs on both
    assert size_scale(default_calibration(), a5000, "flops") == pytest.approx(132 / 64)


def test_memory_curve_transfers_as_a_duration():
    """A small kernel's time stays a time: 8 KB on an H100 and its equal-roofline-time size on an H200."""
    cal = load_calibration("h100-sxm")
    h100, h200 = all_hardware()["h100-sxm"], all_hardware()["h200"]
    t_h100 = 8192 / h100.memory_bw_bytes_per_s / memory_efficiency(cal, 8192, h100)
    b_h200 = 8192 * 4.8 / 3.35
    t_h200 = b_h200 / h200.memory_bw_bytes_per_s / memory_efficiency(cal, b_h200, h200)
    assert t_h200 == pytest.approx(t_h100, rel=1e-6)


def test_memory_bound_gemm_reads_the_bytes_curve_not_the_flops_curve():
    """Default rules, Llama-3-8B q_proj at batch 1 on an A100: 4096 x 4096 bf16 = 33.6 MB read; rule
    t = 6.5 us + b / (0.88 BW) at equal roofline time: 16.5 us + 6.5 us -> efficiency 16.5 / 25.2 = 0.65."""
    cal, a100 = default_calibration(), all_hardware()["a100-sxm4-80gb"]
    nbytes = 2 * (4096 * 4096 + 2 * 4096)
    eff = gemm_efficiency(cal, "bf16", 1, 4096, 4096, 2 * 4096 * 4096, nbytes, True, a100)
    roof = nbytes / a100.memory_bw_bytes_per_s
    assert eff == pytest.approx(roof / (6.5e-6 + roof / 0.88), rel=0.03)
    flops_curve = gemm_efficiency(cal, "bf16", 1, 4096, 4096, 2 * 4096 * 4096, nbytes, False, a100)
    assert flops_curve < 0.5 * eff            # what the old rules charged


def test_graph_replay_credit_hand_worked():
    """H100: the memory curve's first point, 10**3.9134 B at 0.0005499 of 3.35 TB/s = 4.45 us back to back,
    minus 1.013 us per kernel in a graph replay = 3.43 us."""
    cal = load_calibration("h100-sxm")
    t_small = 10 ** 3.9134 / 3.35e12 / 0.0005499
    assert graph_replay_credit_s(cal, all_hardware()["h100-sxm"]) == pytest.approx(t_small - 1.013e-6, rel=1e-3)
    assert graph_replay_credit_s(cal, all_hardware()["h100-sxm"]) == pytest.approx(3.43e-6, rel=0.01)


@pytest.mark.parametrize("gpu", nvidia_gpus())
def test_decode_step_time_does_not_fall_with_batch(decode_rows, gpu):
    if gpu not in decode_rows:
        pytest.skip(f"{gpu}: neither decode model fits")
    row = decode_rows[gpu]
    assert row.monotone, row.step_ms


def test_decode_check_covers_every_shipped_gpu(decode_rows):
    """GPUs too small for Llama-3-8B in 16 bits (T4, the 4 GiB laptop GPU, the 10 GiB Radeon) run the check on the
    small model instead of dropping out of the table."""
    from aisim.validation.transfer import DECODE_MODEL, DECODE_SMALL_MODEL

    assert set(decode_rows) == set(all_hardware())
    assert decode_rows["t4"].model == DECODE_SMALL_MODEL and decode_rows["h100-sxm"].model == DECODE_MODEL


@pytest.mark.parametrize("gpu", sorted(all_hardware()))
def test_decode_bandwidth(decode_rows, gpu):
    if gpu not in decode_rows:
        pytest.skip(f"{gpu}: neither decode model fits")
    assert decode_rows[gpu].bandwidth_fraction >= DECODE_BW_GOAL


def test_decode_gemms_match_their_measured_graph_replay():
    """A decode step's GEMMs replayed from one CUDA graph on an H100 (validation/data/kernels/graph-gemv-h100*.jsonl,
    two models x 4 batches x 2 runs) against aisim's GPU time for them: mean absolute error of the H100 calibration
    and of the default rules that price every uncalibrated GPU, under ceilings (value when set + 0.5)."""
    import statistics

    from aisim.validation.transfer import graph_gemv_rows

    rows = graph_gemv_rows()
    assert len(rows) == 8 and all(len(r.measured_ms) == 2 for r in rows)
    assert statistics.mean(abs(r.err_pct(r.own_ms)) for r in rows) <= 1.5
    assert statistics.mean(abs(r.err_pct(r.rules_ms)) for r in rows) <= 3.9


# Regression ceilings (MAPE %, value when set + 0.5) of validation/transfer.py's tables; lower them as they improve.
TRANSFER_CEILINGS = {
    # decode 13.16 -> 11.28 and forward 9.22 -> 8.84 on 2026-11-27 (memory-bound GEMM-table entries transferred by
    # efficiency.transferred_memory_efficiency)
    # decode 11.02 -> 10.56 on 2026-11-27: a KV-cache cat reads its own measured curve (memory_op_efficiency)
    # forward 8.78 -> 7.91, decode 10.57 -> 9.96 on 2026-11-28: the timeline walks the repeated layers in order
    ("h100.jsonl", "h200"): {"forward/prefill runtime": 8.5, "decode runtime": 10.5,
                             "forward-backward/train runtime": 11.2},
    # forward 11.39 -> 11.56 on 2026-11-27, a stated regression: H200's m = 128 GEMMs priced from H100's table are
    # slower (as the raw records say), on host-bound rows already estimated 13-40% slow
    # forward 10.76 -> 10.16 on 2026-11-28 (the layers walked in order)
    ("h200.jsonl", "h100-sxm"): {"forward/prefill runtime": 10.7, "decode runtime": 8.8,
                                 "forward-backward/train runtime": 9.2},
    # 2026-11-28, the layers walked in order: forward 8.91 -> 7.26, decode 13.15 -> 11.35, and a stated regression,
    # train 11.17 -> 11.82 (its bf16 forward-backward rows are host-bound and short: the old walk's idle GPU hid it)
    ("h100.jsonl", "none"): {"forward/prefill runtime": 7.8, "decode runtime": 11.9,
                             "forward-backward/train runtime": 12.4},
    ("h200.jsonl", "none"): {"forward/prefill runtime": 12.4, "decode runtime": 8.5,
                             "forward-backward/train runtime": 8.8},
    # the fifth H100 run (2026-11-27, the slowest host yet) joined the median: none train 8.86 -> 9.69 with no model
    # change; transferred decode 8.94 -> 7.97 (the run and the transfer rule)
    ("median of the 5 H100 runs", "h200"): {"forward/prefill runtime": 7.7, "decode runtime": 8.5,
                                            "forward-backward/train runtime": 9.6},
    ("median of the 5 H100 runs", "none"): {"forward/prefill runtime": 7.7, "decode runtime": 8.2,
                                            "forward-backward/train runtime": 10.2},
    # the other H200 datasets, in the table since 2026-11-27
    ("tp2-h200.jsonl", "h100-sxm"): {"forward/prefill runtime": 10.7, "decode runtime": 11.5, "tp runtime": 10.7},
    ("tp2-h200.jsonl", "none"): {"forward/prefill runtime": 10.6, "decode runtime": 10.7, "tp runtime": 11.4},
    ("tp4-h200.jsonl", "h100-sxm"): {"forward/prefill runtime": 8.9, "decode runtime": 8.3, "tp runtime": 16.0},
    ("tp4-h200.jsonl", "none"): {"forward/prefill runtime": 9.6, "decode runtime": 7.3, "tp runtime": 17.6},
    # encode 10.91 -> 8.07 (h100-sxm.yaml) and 18.34 -> 11.83 (none) on 2026-11-27: transposed-operand ops read as a
    # rate per SM-cycle on another GPU, and a default transposed curve (efficiency.transposed_efficiency)
    ("whisper-h200.jsonl", "h100-sxm"): {"encode runtime": 8.6, "decode runtime": 13.4},
    ("whisper-h200.jsonl", "none"): {"encode runtime": 12.4, "decode runtime": 18.3},
}


@pytest.mark.parametrize("dataset,calibration", sorted(TRANSFER_CEILINGS))
def test_transfer_mape_ceilings(dataset, calibration):
    from aisim.validation.transfer import CAL_DIR, TABLE_CATEGORIES, runtime_mape

    choice = "none" if calibration == "none" else str(CAL_DIR / f"{calibration}.yaml")
    mape = runtime_mape(dataset, choice, TABLE_CATEGORIES)
    over = {c: round(mape[c], 2) for c, ceiling in TRANSFER_CEILINGS[(dataset, calibration)].items()
            if mape[c] is None or mape[c] > ceiling}
    assert not over, f"{dataset} with {calibration}: {over}"


def test_run_to_run_spread_is_measured_from_all_runs_of_each_gpu():
    """The noise floor rows: every ordered pair of the H100 runs and of the H200 runs, spreads that are neither zero
    (the same file twice) nor absurd, and both rows in the table."""
    from aisim.validation.transfer import DATA_DIR, H100_RUNS, H200_RUNS, run_to_run_mape, transfer_table

    assert len(H100_RUNS) == 5 and len(H200_RUNS) == 2
    assert all((DATA_DIR / r).exists() for r in H100_RUNS + H200_RUNS)
    for files in (H100_RUNS, H200_RUNS):
        spread = run_to_run_mape(files)
        assert all(v is not None and 2.0 < v < 40.0 for v in spread.values()), spread
    assert run_to_run_mape(H200_RUNS) != run_to_run_mape()
    labels = [row[0] for row in transfer_table()[1]]
    assert labels[-2:] == ["H100 run vs H100 run", "H200 run vs H200 run"] and "`h200-rerun.jsonl`" in labels


def test_torchcap_loss_tail_hand_worked():
    """Exported liveness over the loss tail (validation/harness_profiles/torchcap.yaml): OPT (fp16, shift copy):
    logits + shift copy = 2 + 2 = 4 bytes per logits element; Llama (fp32 upcast, log_softmax): 4 + 4 = 8."""
    from aisim.validation.published import _harness_profile, loss_tail_bytes_per_element

    paths = _harness_profile("torchcap")["single_gpu"]["loss_paths"]
    assert loss_tail_bytes_per_element(paths["opt"]["steps"]) == 4
    assert loss_tail_bytes_per_element(paths["llama"]["steps"]) == 8


def test_torchcap_single_gpu_memory_is_weights_plus_loss_tail():
    """opt-1.3b, 16 x 1024, vocab 50272: 4 B x 16 x 1024 x 50272 = 3.29 GB over the fp16 weights (2.63 GB)."""
    import aisim
    from aisim.validation.published import torchcap_single_gpu_memory_bytes

    e = aisim.estimate(model="facebook/opt-1.3b", device="rtx-a5000", workload="forward", batch=16, seq=1024,
                       dtype="fp16", with_loss=True, runtime="kernel-sum", top_ops=0)
    got = torchcap_single_gpu_memory_bytes(e, "facebook/opt-1.3b", 16, 1024)
    assert got == pytest.approx((e.memory.weights_gb + e.memory.workspace_gb) * 1e9 + 4 * 16 * 1024 * 50272)


def test_measured_train_rows_are_estimated_with_the_optimizer_they_ran():
    """validation/measure.py steps torch.optim.AdamW with its defaults (foreach on CUDA), and says so in the record;
    only such train rows get the foreach plan, in the row's precision."""
    from aisim.validation.report import _train_plan

    plan = _train_plan({"workload": "train", "dtype": "bf16", "optimizer": "adamw (foreach default)"})["train"]
    assert (plan.precision, plan.optimizer_impl) == ("bf16-true", "foreach")
    assert _train_plan({"workload": "forward-backward", "dtype": "bf16", "optimizer": None}) == {}
    assert _train_plan({"workload": "train", "dtype": "fp32", "optimizer": "torch.optim.AdamW (fused)"}) == {}


def test_transferred_memory_efficiency_hand_worked():
    """100 MB measured at 0.70 of H200's 4.8 TB/s: 29.76 us, of which 100e6 / (0.9 x 4.8e12) = 23.15 us streams;
    on an H100 (3.35 TB/s) 6.61 us + 100e6 / (0.9 x 3.35e12) = 33.17 us + 6.61 us = 39.78 us: 0.750 of its
    bandwidth (the same fraction would have given 0.70). On the reference GPU itself: unchanged."""
    from aisim.cost.efficiency import transferred_memory_efficiency
    from aisim.specs import all_hardware, load_calibration

    cal = load_calibration("h200").model_copy(update={"stream_bandwidth_fraction": 0.9})
    h100, h200 = all_hardware()["h100-sxm"], all_hardware()["h200"]
    assert transferred_memory_efficiency(cal, 0.70, 100e6, h100) == pytest.approx(0.7504, abs=2e-4)
    assert transferred_memory_efficiency(cal, 0.70, 100e6, h200) == 0.70
    # faster than the streaming part: clamped to the streaming rate
    assert transferred_memory_efficiency(cal, 0.95, 100e6, h100) == pytest.approx(0.9)


def test_stream_fraction_is_derived_and_transfers_gemm_records():
    """The shipped stream_bandwidth_fraction of each file is its raw records' (derive_transfer_rules), and the
    rule that reads it predicts the other GPU's memory-bound GEMM records better than the same fraction did."""
    from aisim.specs import load_calibration
    from aisim.validation.scripts import derive_transfer_rules as d

    own = {device: d.stream_fraction(device) for device in d.DEVICES}
    for device, value in own.items():
        assert load_calibration(device).stream_bandwidth_fraction == value
    assert load_calibration("none").stream_bandwidth_fraction == round(sorted(own.values())[0] / 2
                                                                         + sorted(own.values())[1] / 2, 3)
    for source, target in (d.DEVICES, d.DEVICES[::-1]):
        for size, (n, same, rule) in d.check(source, target, own[source]).items():
            assert n > 20 and rule < same, (source, target, size, same, rule)


def test_transposed_ops_keep_their_time_on_another_gpu():
    """A transposed-operand op read from the H100 file on an H200 (same SMs and clock) keeps its H100 time: the
    efficiency drops by the bandwidth ratio 3.35 / 4.8; on the H100 itself the curve is read as is; the default
    rules carry the derived curve (derive_transfer_rules)."""
    from aisim.cost.efficiency import curve_value, transposed_efficiency
    from aisim.specs import all_hardware, load_calibration
    from aisim.validation.scripts import derive_transfer_rules as d

    cal = load_calibration("h100-sxm")
    h100, h200 = all_hardware()["h100-sxm"], all_hardware()["h200"]
    own = curve_value(cal.transposed_memory_efficiency, 8.0)
    assert transposed_efficiency(cal, 1e8, h100) == pytest.approx(own)
    assert transposed_efficiency(cal, 1e8, h200) == pytest.approx(own * 3.35 / 4.8)
    assert load_calibration("none").transposed_memory_efficiency.model_dump() == d.transposed_default()
    # half the SMs at the same clock and bandwidth: twice the time, half the efficiency
    half = h200.model_copy(update={"name": "half-h200", "sm_count": 66})
    assert transposed_efficiency(cal, 1e8, half) == pytest.approx(own * 3.35 / 4.8 / 2)
    ratios = d.transposed_ratios()
    assert len(ratios) == 36 and 0.9 < ratios[len(ratios) // 2] < 1.2     # about the same time, not 1.43x


def test_innermost_broadcast_ops_keep_their_time_on_another_gpu():
    """PyTorch's non-vectorized broadcast kernel (masked fills with an (S, 1) mask, RMSNorm's and the routing weights'
    (S, 1) multiplies) is SM-bound like the transposed ops: read from one GPU's file on another it keeps its time by
    SMs x clock; each calibrated GPU reads its own curve; the default rules carry the two GPUs' mean, and the records
    behind it take about the same time on H100 and H200 (1.43x apart in bandwidth)."""
    from aisim.cost.efficiency import curve_value, memory_efficiency
    from aisim.specs import all_hardware, load_calibration
    from aisim.validation.scripts import derive_transfer_rules as d

    h100, h200 = all_hardware()["h100-sxm"], all_hardware()["h200"]
    nbytes = 1e9       # a point where the broadcast curve is below the contiguous one on both GPUs
    for cal, gpu in ((load_calibration("h100-sxm"), h100), (load_calibration("h200"), h200)):
        assert memory_efficiency(cal, nbytes, gpu, broadcast=True) == pytest.approx(
            curve_value(cal.broadcast_memory_efficiency, 9.0))
    cal = load_calibration("h100-sxm")
    assert memory_efficiency(cal, nbytes, h200, broadcast=True) == pytest.approx(
        curve_value(cal.broadcast_memory_efficiency, 9.0) * 3.35 / 4.8)
    assert load_calibration("none").broadcast_memory_efficiency.model_dump() == \
        d.transposed_default("broadcast_memory_efficiency")
    ratios = d.broadcast_ratios()
    assert len(ratios) >= 30 and 0.95 < ratios[len(ratios) // 2] < 1.25


def test_broadcast_fractions_keep_their_rate_on_another_gpu():
    """default.yaml's broadcast-copy and outer-broadcast fractions (H100 microbenchmark) read on the H200 keep the
    H100's absolute rate: the H200 run of the same harness measured that, within 12% (fp32 outer broadcast: 10.3%
    slow), where reading them as fractions would be 29-43% fast; on the H100 itself they are read as they are, a
    file's own value on its own GPU unscaled, and on a GPU with many SM-cycles per byte (RTX A5000) the op still
    takes no less than the contiguous curve gives."""
    from aisim.catalog import resolve_device
    from aisim.cost.efficiency import broadcast_fraction, memory_efficiency
    from aisim.cost.ops_time import op_time
    from aisim.formulas import op_cost
    from aisim.graph.ops import Op, TensorMeta
    from aisim.specs import all_hardware, load_calibration
    from aisim.validation.scripts.derive_broadcast_ops import DATA, H200_DATA, fractions, transfer_check

    h100, h200 = all_hardware()["h100-sxm"], all_hardware()["h200"]
    for cal in (load_calibration("h100-sxm"), load_calibration("h200"), load_calibration("none")):
        assert broadcast_fraction(cal, "broadcast_copy_bandwidth_fraction", 2, h100) == 0.3
        assert broadcast_fraction(cal, "broadcast_copy_bandwidth_fraction", 2, h200) == pytest.approx(0.3 * 3.35 / 4.8)
    own = load_calibration("h200").model_copy(update={"broadcast_copy_bandwidth_fraction": {2: 0.21}})
    assert broadcast_fraction(own, "broadcast_copy_bandwidth_fraction", 2, h200) == 0.21
    _, _, h100_ops = fractions(DATA)
    _, _, h200_ops = fractions(H200_DATA)
    for field, table in transfer_check().items():
        for size, (_, same, kept) in table.items():
            op = "broadcast_copy" if field.startswith("broadcast_copy") else "add_outer_broadcast"
            measured = h200_ops[op]["float32" if size == 4 else "float16"]
            assert abs(kept / measured - 1) < 0.12 < 0.25 < same / measured - 1, (field, size, measured)
    # the op-level cap: a (16, 12, 1024, 1024) fp16 add of a (16, 1, 1024, 1024) mask on an RTX A5000
    big, mask = TensorMeta((16, 12, 1024, 1024), "fp16"), TensorMeta((16, 1, 1024, 1024), "fp16")
    add = Op("aten.add.Tensor", (big, mask), {}, (big,), False, attrs={"pointwise": True})
    cal = load_calibration("none")
    for name, capped in (("rtx-a5000", True), ("h200", False)):
        device = resolve_device(name)
        t, nbytes = op_time(add, op_cost(add), device, cal, "fp16"), op_cost(add).bytes
        contiguous_s = nbytes / device.gpu.memory_bw_bytes_per_s / memory_efficiency(cal, nbytes, device.gpu)
        assert t.gpu_s == pytest.approx(contiguous_s) if capped else t.gpu_s > 1.5 * contiguous_s, name


def test_kv_cache_cat_reads_its_own_measured_curve():
    """Each file's memory_op_efficiency['cat'] is derive_eager_attention's fit of its GPU's contiguous cats (as
    written by --write); aten.cat reads it (0.82 of bandwidth at 2 GiB on the H200, where the median curve of
    calibrate's elementwise kernels gives 0.79 there, 0.80 at its last point); other ops and files without it keep the median curve. Out of sample
    across GPUs: the H100 file's cat curve read on the H200 predicts the H200's measured cats (>= 64 MB) with a mean
    error of 5.1%, where the H100's median curve read the same way is 9.8% off."""
    import statistics

    from aisim.cost import efficiency
    from aisim.validation.scripts import derive_eager_attention as derive
    from aisim.validation.transfer import DATA_DIR, EAGER_ATTENTION_RUNS

    gpus = all_hardware()
    rows = {}
    for device, path in EAGER_ATTENTION_RUNS:
        rows[device] = derive.load(DATA_DIR / path)[1]
        cal = load_calibration(device)
        assert cal.memory_op_efficiency == {"cat": derive.cat_curve(rows[device], gpus[device], cal)}
    assert efficiency.MEMORY_OP_FAMILY == {"aten.cat": "cat"}
    h200, gpu = load_calibration("h200"), gpus["h200"]
    assert memory_efficiency(h200, 2.15e9, gpu, family="cat") == pytest.approx(0.82, abs=0.01)
    assert memory_efficiency(h200, 2.15e9, gpu) == pytest.approx(0.79, abs=0.01)
    none = default_calibration()
    assert memory_efficiency(none, 2.15e9, gpu, family="cat") == memory_efficiency(none, 2.15e9, gpu)
    h100 = load_calibration("h100-sxm")
    errors = {"cat": [], None: []}
    for r in rows["h200"]:
        if r.get("section") == "cat" and derive.contiguous_cat(r) and r["bytes"] >= 64e6:
            for family in errors:
                t = r["bytes"] / gpu.memory_bw_bytes_per_s / memory_efficiency(h100, r["bytes"], gpu, family=family)
                errors[family].append(abs(t / (r["median_ms"] * 1e-3 + efficiency.graph_replay_credit_s(h200, gpu))
                                          - 1))
    assert len(errors["cat"]) > 20
    assert statistics.mean(errors["cat"]) < 0.06 and statistics.mean(errors[None]) > 0.09


def test_op_time_prices_a_cat_on_the_cat_curve():
    from aisim.cost.ops_time import op_time
    from aisim.formulas import Cost
    from aisim.graph.ops import Op, TensorMeta
    from aisim.scenario import scenario

    sc = scenario("Meta-Llama-3-8B", "h200", dtype="bf16")
    past, new, out = (TensorMeta((64, 8, s, 128), "bf16") for s in (4096, 1, 4097))
    op = Op("aten.cat", ([past, new], -2), {}, (out,), False)
    nbytes = past.nbytes + new.nbytes + out.nbytes
    cost = Cost(flops=0.0, bytes_read=past.nbytes + new.nbytes, bytes_written=out.nbytes, launches=1, kind="memory")
    t = op_time(op, cost, sc.device, sc.calibration, "bf16")
    gpu = sc.device.gpu
    cat = memory_efficiency(sc.calibration, nbytes, gpu, family="cat")
    assert t.gpu_s == pytest.approx(nbytes / gpu.memory_bw_bytes_per_s / cat, rel=1e-6)
    assert cat > memory_efficiency(sc.calibration, nbytes, gpu) * 1.02
