"""aisim calibrate: the pure fitting path (raw measurements -> CalibrationSpec) with hand-worked numbers,
the written files, the default rules, and the no-GPU error. No GPU needed."""
from __future__ import annotations

import json
from pathlib import Path
import math

import pytest
import yaml

from aisim.errors import AisimError, UnknownNameError
from aisim.specs import CalibrationSpec
from aisim.validation import calibrate as cal
from aisim.validation import calibrate_bench as bench
from aisim.validation import calibrate_fit as fit
from aisim.validation.collectives import bus_bytes, fit_alpha_beta, fit_collectives

REPO = Path(__file__).resolve().parents[1]

PEAKS = {"flops_per_s": {"fp32": 50e12, "tf32": 400e12, "fp16": 800e12, "bf16": 800e12},
         "memory_bw_bytes_per_s": 2e12}
BW = PEAKS["memory_bw_bytes_per_s"]


# ---------------------------------------------------------------- formulas

def test_gemm_and_attention_formulas_hand_worked():
    assert fit.gemm_flops(2, 3, 4) == 48                         # 2 * 2 * 3 * 4
    assert fit.gemm_bytes(2, 3, 4, 2) == (8 + 12 + 6) * 2       # x 2x4, W 3x4, out 2x3, fp16
    # B=1, H=2, S=4, D=8: non-causal 4*1*2*4*4*8 = 1024; causal 4*1*2*8*(4*5/2) = 640
    assert fit.attention_flops(1, 2, 4, 4, 8, causal=False) == 1024
    assert fit.attention_flops(1, 2, 4, 4, 8, causal=True) == 640
    # decode (Sq = 1) attends every key: 4*B*H*Skv*D = 4*1*2*10*8 = 640, causal or not
    assert fit.attention_flops(1, 2, 1, 10, 8, causal=True) == fit.attention_flops(1, 2, 1, 10, 8, False) == 640
    # bytes: q, out (Sq rows) + k, v (Skv rows): 1*2*8*(2*1 + 2*10) * 2 B = 704
    assert fit.attention_bytes(1, 2, 1, 10, 8, 2) == 704
    # backward reads q, k, v, out, dout and writes dq, dk, dv: 1*2*8*(4*4 + 4*4) * 2 = 1024
    assert fit.attention_bytes(1, 2, 4, 4, 8, 2, backward=True) == 1024


def test_counts_match_the_cost_models_formulas():
    # calibration must measure efficiency against the very counts the estimate divides by
    from aisim.formulas import op_cost
    from aisim.graph.ops import Op, TensorMeta

    x, w_t, out = TensorMeta((64, 256), "bf16"), TensorMeta((256, 512), "bf16"), TensorMeta((64, 512), "bf16")
    mm = op_cost(Op("aten.mm", (x, w_t), {}, (out,), False))
    assert (mm.flops, mm.bytes) == (fit.gemm_flops(64, 512, 256), fit.gemm_bytes(64, 512, 256, 2))
    q, kv, o = (TensorMeta((2, 8, s, 64), "fp16") for s in (100, 300, 100))
    for causal in (True, False):
        att = op_cost(Op("attention.flash", (q, kv, kv), {}, (o,), False, attrs={"is_causal": causal}))
        assert att.flops == fit.attention_flops(2, 8, 100, 300, 64, causal)
        assert att.bytes == fit.attention_bytes(2, 8, 100, 300, 64, 2)


def test_efficiency_is_roofline_over_measured():
    # m=n=k=1000 fp16: 2e9 FLOPs / 800e12 = 2.5 us; 6e6 B / 2e12 = 3 us (memory-bound); measured 6 us -> 0.5
    flops, nbytes = fit.gemm_flops(1000, 1000, 1000), fit.gemm_bytes(1000, 1000, 1000, 2)
    assert fit.roofline_time_s(flops, nbytes, 800e12, BW) == pytest.approx(3e-6)
    assert fit.efficiency(flops, nbytes, 6e-6, 800e12, BW) == pytest.approx(0.5)


# ---------------------------------------------------------------- curves and tables

def test_binned_curve_hand_worked():
    # bins of 0.5 decade: 6.1, 6.2, 6.4 -> bin [6.0, 6.5); 7.0, 7.3 -> bin [7.0, 7.5)
    sizes = [10**6.1, 10**6.2, 10**6.4, 10**7.0, 10**7.3]
    curve = fit.binned_curve(sizes, [0.1, 0.2, 0.3, 0.5, 0.7])
    assert curve.x == pytest.approx([6.2, 7.15])
    assert curve.efficiency == pytest.approx([0.2, 0.6])


def _gemm_records(grid, eff_of, skip=()):
    recs = []
    for dtype in ("fp16", "fp32"):
        for m in grid["m"]:
            for n in grid["n"]:
                for k in grid["k"]:
                    if (m, n, k) in skip:
                        continue
                    t = fit.roofline_time_s(fit.gemm_flops(m, n, k), fit.gemm_bytes(m, n, k, fit.ELEM_BYTES[dtype]),
                                            PEAKS["flops_per_s"][dtype], BW) / eff_of(m, n, k)
                    recs.append({"bench": "gemm", "dtype": dtype, "m": m, "n": n, "k": k, "time_s": t})
    return recs


GRID = {"m": [1, 128, 4096], "n": [512, 8192], "k": [512, 8192]}


def _eff(m, n, k):   # a known efficiency, different at every grid point
    return 0.1 + 0.2 * GRID["m"].index(m) + 0.1 * GRID["n"].index(n) + 0.05 * GRID["k"].index(k)


def test_gemm_efficiency_recovered_exactly_and_gaps_filled():
    skip = {(4096, 8192, 8192)}
    curves, tables, notes = fit.fit_gemm(_gemm_records(GRID, _eff, skip), PEAKS, GRID)
    assert set(tables) == {"fp16", "fp32"}
    table = tables["fp16"]
    for i, m in enumerate(GRID["m"]):
        for j, n in enumerate(GRID["n"]):
            for l, k in enumerate(GRID["k"]):
                if (m, n, k) not in skip:
                    assert table.efficiency[i][j][l] == pytest.approx(_eff(m, n, k))
    # the skipped corner (indices 2,1,1) has three neighbours at distance 1; the first in (m, n, k) order,
    # (1, 1, 1) = m=128 n=8192 k=8192, wins: 0.1 + 0.2 + 0.1 + 0.05 = 0.45
    assert table.efficiency[2][1][1] == pytest.approx(0.45)
    assert "m=4096 n=8192 k=8192 <- m=128 n=8192 k=8192" in notes[0]
    # curve: median efficiency in half-decade bins of log10(FLOPs); smallest GEMM 2*1*512*512 = 524288 FLOPs,
    # alone in bin [5.5, 6.0) with efficiency 0.1
    assert curves["fp16"].x[0] == pytest.approx(math.log10(524288), abs=1e-4)
    assert curves["fp16"].efficiency[0] == pytest.approx(0.1)
    assert all(b > a for a, b in zip(curves["fp16"].x, curves["fp16"].x[1:]))


def test_memory_curve_hand_worked():
    # bw 2e12. 1 MB input: copy moves 2e6 B -> 1 us roofline, measured 2 us -> 0.5; add moves 3e6 -> 1.5 us,
    # measured 2 us -> 0.75. One point: median efficiency 0.625 at x = (log10 2e6 + log10 3e6) / 2 = 6.3891.
    # 100 MB copy: 2e8 B / 2e12 = 100 us roofline, measured 125 us -> 0.8 at x = log10(2e8) = 8.30103.
    recs = [{"bench": "memory", "op": "copy", "dtype": "fp16", "size_bytes": 10**6, "time_s": 2e-6},
            {"bench": "memory", "op": "add", "dtype": "fp16", "size_bytes": 10**6, "time_s": 2e-6},
            {"bench": "memory", "op": "copy", "dtype": "fp16", "size_bytes": 10**8, "time_s": 1e-4 / 0.8}]
    curve, per_op, _ = fit.fit_memory(recs, BW)
    assert curve.x == pytest.approx([6.3891, 8.30103], abs=1e-4)
    assert curve.efficiency == pytest.approx([0.625, 0.8])
    assert per_op["add"].efficiency == pytest.approx([0.75])


def _attention_records():
    recs = []
    for direction, factor in (("forward", 1.0), ("backward", fit.ATTN_BACKWARD_FLOPS_FACTOR)):
        for b, s in ((1, 4096), (16, 1024)):
            flops = fit.attention_flops(b, 32, s, s, 128, True) * factor
            nbytes = fit.attention_bytes(b, 32, s, s, 128, 2, backward=direction == "backward")
            t = fit.roofline_time_s(flops, nbytes, PEAKS["flops_per_s"]["bf16"], BW) / 0.6   # efficiency 0.6
            recs.append({"bench": "attention", "dtype": "bf16", "direction": direction, "batch": b, "heads": 32,
                         "q_len": s, "kv_len": s, "head_dim": 128, "causal": True, "time_s": t})
    nbytes = fit.attention_bytes(8, 32, 1, 4096, 128, 2)                # decode: memory-bound
    recs.append({"bench": "attention", "dtype": "bf16", "direction": "forward", "batch": 8, "heads": 32,
                 "q_len": 1, "kv_len": 4096, "head_dim": 128, "causal": False, "time_s": nbytes / BW / 0.4})
    return recs


def test_attention_curves_keys_and_recovered_efficiency():
    curves, _ = fit.fit_attention(_attention_records(), PEAKS)
    assert set(curves) == {"bf16", "bf16-backward", "bf16-decode"}
    # both prefill shapes have 4*32*128*S*(S+1)/2*B = 1.37e11 FLOPs: one bin
    assert curves["bf16"].efficiency == pytest.approx([0.6])
    assert curves["bf16-backward"].efficiency == pytest.approx([0.6])  # 2.5x forward FLOPs convention
    assert curves["bf16-decode"].efficiency == pytest.approx([0.4])
    # decode x is log10(bytes): 8*32*128*(2*1 + 2*4096)*2 B
    assert curves["bf16-decode"].x == pytest.approx([math.log10(8 * 32 * 128 * 8194 * 2)], abs=1e-4)


def test_overheads_and_power():
    recs = [{"bench": "overhead", "name": "graph_kernel_s", "samples_s": [2.1e-6, 2.0e-6, 2.2e-6]},
            {"bench": "overhead", "name": "eager_op_s", "samples_s": [7e-6, 8e-6, 9e-6]},
            {"bench": "overhead", "name": "module_call_s", "samples_s": [12e-6]},
            {"bench": "overhead", "name": "functional_call_s", "samples_s": [8e-6]}]
    out = fit.fit_overheads(recs)
    assert out["launch_overhead_s"] == out["graphs_dispatch_s"] == pytest.approx(2.1e-6)
    assert out["eager_dispatch_s"] == pytest.approx(8e-6)
    assert out["module_overhead_s"] == pytest.approx(4e-6)           # 12 us - 8 us
    power = [{"bench": "power", "load": "idle", "avg_power_w": 70.0},
             {"bench": "power", "load": "compute", "avg_power_w": 630.0},
             {"bench": "power", "load": "memory", "avg_power_w": 490.0}]
    assert fit.fit_power(power, 700.0) == pytest.approx(
        {"idle_power_w": 70.0, "power_compute_fraction": 0.9, "power_memory_fraction": 0.7})


# ---------------------------------------------------------------- collectives

def test_alpha_beta_fit_hand_worked():
    # plain least squares through (0, 1), (1, 2), (2, 4): slope = sum dx*dt / sum dx^2 = 3 / 2 = 1.5,
    # intercept = mean t - 1.5 * mean x = 7/3 - 1.5 = 5/6; bandwidth = 1 / slope
    lat, bw = fit_alpha_beta([0.0, 1.0, 2.0], [1.0, 2.0, 4.0], relative=False)
    assert lat == pytest.approx(5 / 6)
    assert bw == pytest.approx(1 / 1.5)
    # exact alpha-beta data is recovered exactly by either weighting: 20 us + bus bytes / 300 GB/s
    x = [bus_bytes("all_reduce", s, 4) for s in (4096, 2**20, 2**26, 2**30)]
    assert x[0] == 1.5 * 4096                                        # 2*(4-1)/4 = 1.5
    t = [20e-6 + xi / 300e9 for xi in x]
    for relative in (True, False):
        lat, bw = fit_alpha_beta(x, t, relative=relative)
        assert lat == pytest.approx(20e-6, rel=1e-9)
        assert bw == pytest.approx(300e9, rel=1e-9)


def test_fit_collectives_records_and_single_gpu():
    recs = [{"bench": "collective", "op": "all_reduce", "world_size": 2, "size_bytes": s,
             "time_s": 10e-6 + bus_bytes("all_reduce", s, 2) / 200e9} for s in (4096, 2**24, 2**30)]
    fields, notes = fit_collectives(recs)
    assert fields["allreduce_latency_s"] == pytest.approx(10e-6)
    assert fields["allreduce_bus_bw_bytes_per_s"] == pytest.approx(200e9)
    assert "3 sizes" in notes[0]
    assert fit_collectives([]) == ({"allreduce_latency_s": None, "allreduce_bus_bw_bytes_per_s": None}, [])
    # the GPU-side times where recorded: host-paced small messages (a 45 us issue cost) do not become latency
    paced = [{**r, "gpu_time_s": r["time_s"], "time_s": max(r["time_s"], 45e-6)} for r in recs]
    assert fit_collectives(paced)[0]["allreduce_latency_s"] == pytest.approx(10e-6)
    assert "gpu_time_s" in fit_collectives(paced)[1][0]


# ---------------------------------------------------------------- the whole fit, the files, the CLI

def _raw():
    recs = _gemm_records(GRID, _eff) + _attention_records()
    recs += [{"bench": "memory", "op": op, "dtype": "fp16", "size_bytes": s,
              "time_s": fit.MEMORY_OPS[op] * s / BW / 0.8} for op in ("copy", "add") for s in (4096, 2**26)]
    recs += [{"bench": "overhead", "name": n, "samples_s": [v]} for n, v in
             (("graph_kernel_s", 2e-6), ("eager_op_s", 7e-6), ("module_call_s", 11e-6), ("functional_call_s", 8e-6))]
    recs += [{"bench": "power", "load": ld, "avg_power_w": w} for ld, w in (("idle", 70), ("compute", 630),
                                                                            ("memory", 490))]
    return {"device": "h100-sxm", "peaks": PEAKS, "records": recs, "grid": {"gemm": GRID},
            "provenance": {"gpu_name": "synthetic", "power_limit_w": "700.0", "method": "synthetic test data"}}


def test_fit_calibration_writes_valid_yaml_and_raw_json(tmp_path):
    out = cal.write_outputs(_raw(), tmp_path / "h100-sxm.yaml")
    spec = CalibrationSpec(**yaml.safe_load(out.read_text()))
    assert spec.measured and spec.device == "h100-sxm"
    assert spec.gemm_tables["fp16"].efficiency[2][1][1] == pytest.approx(_eff(4096, 8192, 8192))
    assert spec.memory_efficiency.efficiency == pytest.approx([0.8, 0.8])
    assert spec.module_overhead_s == pytest.approx(3e-6)
    assert spec.power_compute_fraction == pytest.approx(0.9)
    assert spec.allreduce_bus_bw_bytes_per_s is None                 # one GPU: no collectives
    assert "2.5x forward" in spec.notes
    raw = json.loads((tmp_path / "h100-sxm.raw.json").read_text())
    assert len(raw["records"]) == len(_raw()["records"])


def test_missing_power_falls_back_to_default_rules():
    raw = _raw()
    raw["records"] = [r for r in raw["records"] if r["bench"] != "power"]
    spec = fit.fit_calibration(raw, defaults=cal.load_default_rules())
    assert spec.power_compute_fraction == 0.9 and "power: not measured" in spec.notes
    with pytest.raises(AisimError, match="no usable power records"):
        fit.fit_calibration(raw)


def test_refit_cli_without_gpu(tmp_path, capsys):
    raw_path = tmp_path / "x.raw.json"
    raw_path.write_text(json.dumps(_raw()))
    assert cal.main(["--refit", str(raw_path)]) == 0
    CalibrationSpec(**yaml.safe_load((tmp_path / "x.yaml").read_text()))
    assert "calibration written" in capsys.readouterr().out


def test_no_cuda_is_a_clear_error_not_a_traceback(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(AisimError, match="no CUDA GPU is visible"):
        cal.run_calibration("h100-sxm", tmp_path / "h100-sxm.yaml")
    assert cal.main(["--device", "h100-sxm", "--out", str(tmp_path / "h.yaml")]) == 2
    err = capsys.readouterr().err
    assert "error: no CUDA GPU is visible" in err and "Traceback" not in err
    assert not (tmp_path / "h.yaml").exists()


def test_unknown_device_lists_close_matches():
    with pytest.raises(UnknownNameError, match="h100-sxm"):
        cal.resolve_device("h100-sxmm")


def test_local_gpu_must_be_the_named_device():
    from aisim.specs import all_hardware

    hw = all_hardware()
    assert cal.gpu_name_mismatch("NVIDIA H100 80GB HBM3", "h100-sxm", hw) is None
    msg = cal.gpu_name_mismatch("NVIDIA H200", "h100-sxm", hw)
    assert "--device h200" in msg
    assert cal.gpu_name_mismatch("Some Future GPU", "h100-sxm", hw) is None     # unknown name: warn only


# ---------------------------------------------------------------- plans and the default rules

def test_gemm_plan_skips_slow_and_huge_and_orders_coarse_first():
    h100 = {"flops_per_s": {"fp32": 66.9e12, "tf32": 494.7e12, "fp16": 989.4e12, "bf16": 989.4e12},
            "memory_bw_bytes_per_s": 3.35e12}
    todo, skipped = bench.gemm_plan(False, h100, 50e6)
    assert len(todo) + len(skipped) == 4 * 8 * 4 * 4
    # fp32 32768^3: 7.0e13 FLOPs / 66.9e12 / 0.6 = 1.75 s predicted -> skipped
    assert any(r["dtype"] == "fp32" and r["m"] == r["n"] == r["k"] == 32768 for r in skipped)
    assert all(r["time_s"] is None and r["skipped"] for r in skipped)
    levels = [it["level"] for it in todo]
    assert levels == sorted(levels)
    quick, quick_skipped = bench.gemm_plan(True, h100, 50e6)
    assert len(quick) + len(quick_skipped) == 4 * 3 * 2 * 2


def test_rotation_sets():
    assert bench.rotation_sets(100e6, 50e6) == 1                       # one set exceeds L2
    assert bench.rotation_sets(10e6, 50e6) == 15                       # ceil(3 * 50 / 10)
    assert bench.rotation_sets(4096, 50e6) == 64                       # capped


def test_default_rules_documented_and_valid():
    spec = cal.load_default_rules()
    assert spec.measured is False
    assert "rules, not measurements" in spec.provenance["kind"]
    for key in ("gemm", "attention", "memory", "overheads", "power"):
        assert "http" in spec.provenance[key] or "arXiv" in spec.provenance[key] or "#" in spec.provenance[key]
    assert spec.gemm_efficiency["bf16"].efficiency[0] == pytest.approx(0.05)
    assert spec.gemm_efficiency["bf16"].efficiency[-1] == pytest.approx(0.75)
    assert spec.gemm_efficiency["fp32"].efficiency[-1] == pytest.approx(0.85)
    # t = 5 us + bytes / (0.81 BW) at the H100 reference bandwidth: 10**3.6 B -> 1.19 ns / 5 us = 0.00024
    assert spec.memory_efficiency.efficiency[0] == pytest.approx(10**3.6 / 3.35e12 / 5e-6, rel=0.05)
    assert spec.memory_efficiency.efficiency[-1] == pytest.approx(0.81, abs=0.01)
    assert spec.gemm_memory_efficiency.efficiency[-1] == pytest.approx(0.88, abs=0.01)
    assert spec.reference_gpu == "h100-sxm"
    assert (spec.eager_dispatch_s, spec.module_overhead_s) == (8e-6, 4e-6)
    # a graph replay's per-kernel time: the one measured on H100 SXM and H200 (provenance.overheads)
    from aisim.specs import load_calibration
    measured = [load_calibration(g).launch_overhead_s for g in ("h100-sxm", "h200")]
    assert spec.launch_overhead_s == spec.graphs_dispatch_s == pytest.approx(sum(measured) / 2, rel=0.02)
    assert (spec.power_compute_fraction, spec.power_memory_fraction) == (0.9, 0.7)


def test_default_rules_take_the_architecture_gemm_plateau():
    """An uncalibrated Hopper GPU gets the GEMM curves scaled to the Hopper plateau per dtype (the H100/H200
    calibrations' sustained large-GEMM median); other architectures keep the rule; measured files are untouched."""
    import statistics

    from aisim.specs import calibration_for, load_calibration

    rule = cal.load_default_rules()
    hopper = rule.architecture_gemm_plateau["hopper"]
    assert (hopper["fp16"], hopper["bf16"]) == (0.70, 0.70)
    for dtype in ("tf32", "fp32"):   # the mean of the two raw files' medians of the >= 1e11-FLOP records, 2 places
        medians = []
        for gpu in ("h100-sxm", "h200"):
            raw = json.loads((REPO / "hardware_specs" / "calibration" / f"{gpu}.raw.json").read_text())
            peak = raw["peaks"]["flops_per_s"][dtype]
            medians.append(statistics.median(
                2 * r["m"] * r["n"] * r["k"] / r["time_s"] / peak for r in raw["records"]
                if r["bench"] == "gemm" and r.get("time_s") and r["dtype"] == dtype
                and 2 * r["m"] * r["n"] * r["k"] >= 1e11))
        assert hopper[dtype] == pytest.approx(sum(medians) / 2, abs=0.005)
    assert max(calibration_for("h20", "hopper").gemm_efficiency["fp32"].efficiency) == pytest.approx(0.75)
    top = {d: max(calibration_for(d, a).gemm_efficiency["bf16"].efficiency)
           for d, a in (("h20", "hopper"), ("a100-sxm4-80gb", "ampere"), ("b200", "blackwell"))}
    assert top == pytest.approx({"h20": 0.70, "a100-sxm4-80gb": 0.75, "b200": 0.75})
    h20 = calibration_for("h20", "hopper").gemm_efficiency["fp16"]
    assert h20.efficiency[0] == pytest.approx(0.05 * 0.70 / 0.75) and h20.x == rule.gemm_efficiency["fp16"].x
    assert calibration_for("a100-sxm4-80gb", "ampere").gemm_efficiency["fp32"] == rule.gemm_efficiency["fp32"]
    measured = calibration_for("h100-sxm", "hopper")
    assert measured.measured and measured.gemm_efficiency == load_calibration("h100-sxm").gemm_efficiency
    assert max(calibration_for("h100-sxm", "hopper", default=True).gemm_efficiency["bf16"].efficiency) == \
        pytest.approx(0.70)                                         # --calibration none on an H100


def test_power_meter_aligns_to_energy_counter_steps():
    # a fake NVML whose energy counter (mJ) advances in 100 ms steps at 250 W; a window that started or ended
    # between steps would be off by up to 0.1 s / 0.5 s = 20 %, aligned to steps it is off by one 5 ms poll
    import time

    class FakeNvml:
        t0 = time.perf_counter()

        def nvmlDeviceGetTotalEnergyConsumption(self, handle):
            return int((time.perf_counter() - self.t0) // 0.1) * 0.1 * 250.0 * 1e3

    meter = bench.PowerMeter(FakeNvml(), None, "energy counter", 700.0, "test")
    assert meter.average_w(0.5) == pytest.approx(250.0, rel=0.05)


def test_framework_scale_is_the_median_ratio_of_measured_to_predicted():
    from aisim.validation.framework_overhead import fit_framework_scale

    counts = {"kernels": 100, "views": 50, "py_calls": 0, "modules": 10}
    # predicted = 100 * 8us + 50 * 4us + 10 * 2us = 1020 us; measured 1.5x, 2x and 3x that
    records = [{"bench": "framework", "counts": counts, "time_s": f * 1020e-6} for f in (1.5, 2.0, 3.0)]
    assert fit_framework_scale(records, 8e-6, 4e-6, 2e-6) == pytest.approx(2.0)
    assert fit_framework_scale([], 8e-6, 4e-6, 2e-6) is None


def test_framework_overhead_bench_runs_on_the_cpu():
    from aisim.validation.framework_overhead import bench_framework_overhead

    records = bench_framework_overhead(repeats=1, calls=2, device="cpu")
    assert {r["family"] for r in records} == {"llama", "opt", "gpt2", "bloom"}
    assert all(r["time_s"] > 0 and r["counts"]["kernels"] > 0 for r in records)


def test_power_curves_are_fitted_monotone_from_the_active_floor():
    from aisim.validation.calibrate_fit import fit_power

    records = [{"bench": "power", "load": "idle", "avg_power_w": 100.0},
               {"bench": "power", "load": "active", "avg_power_w": 140.0},
               {"bench": "power", "load": "compute", "avg_power_w": 690.0},
               {"bench": "power", "load": "memory", "avg_power_w": 520.0},
               {"bench": "power_curve", "kind": "compute", "activity": 0.2, "avg_power_w": 420.0},
               {"bench": "power_curve", "kind": "compute", "activity": 0.5, "avg_power_w": 700.0},
               {"bench": "power_curve", "kind": "compute", "activity": 0.6, "avg_power_w": 690.0},
               {"bench": "power_curve", "kind": "memory", "activity": 0.4, "avg_power_w": 350.0, "size": 2**28},
               {"bench": "power_curve", "kind": "memory", "activity": 0.7, "avg_power_w": 200.0, "size": 2**23}]
    fitted = fit_power(records, 700.0)
    curve = fitted["power_compute_curve"]
    assert curve.x == [0.0, 0.2, 0.5, 0.6]
    assert curve.efficiency == pytest.approx([0.2, 0.6, 1.0, 1.0])  # 140/700, 420/700, 700/700, kept at 1.0
    assert fitted["power_memory_curve"].efficiency == pytest.approx([0.2, 0.5])


def test_transposed_records_fit_their_own_curve():
    from aisim.validation.calibrate_fit import fit_transposed

    bw = 1e12
    recs = [{"bench": "memory_t", "op": "copy_t", "dtype": "fp16", "size_bytes": s, "time_s": 2 * s / bw / 0.2}
            for s in (2**20, 2**24, 2**28)]
    curve, notes = fit_transposed(recs + [{"bench": "memory", "op": "copy", "size_bytes": 1, "time_s": 1}], bw)
    assert curve is not None and all(e == pytest.approx(0.2) for e in curve.efficiency) and notes
    assert fit_transposed([], bw) == (None, [])


def test_a_users_own_rules_file_is_not_rescaled(tmp_path, monkeypatch):
    """A user's calibration for a Hopper GPU with measured: false (a copy of the default rules with their own GEMM
    plateau) is used as written: the architecture rule applies only where the default rules stand in."""
    from importlib import resources

    from aisim import specs

    shipped = Path(str(resources.files("aisim.hardware_specs")))
    (tmp_path / "calibration").mkdir()
    text = (shipped / "calibration" / "default.yaml").read_text().replace("device: default", "device: h20", 1)
    text = text.replace("efficiency: [0.05, 0.12, 0.25, 0.42, 0.6, 0.75]",
                        "efficiency: [0.05, 0.12, 0.25, 0.42, 0.7, 0.9]")
    (tmp_path / "calibration" / "h20.yaml").write_text(text)
    monkeypatch.setenv("AISIM_SPECS_DIR", str(tmp_path))
    specs.clear_caches()
    try:
        own = specs.calibration_for("h20", "hopper")
        assert not own.measured and max(own.gemm_efficiency["bf16"].efficiency) == pytest.approx(0.9)
        rules = specs.calibration_for("h20", "hopper", default=True)
        assert max(rules.gemm_efficiency["bf16"].efficiency) == pytest.approx(0.70)
    finally:
        monkeypatch.delenv("AISIM_SPECS_DIR")
        specs.clear_caches()
