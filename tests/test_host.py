"""Host files (`aisim calibrate --host-only`, `--host PATH`): HostSpec.apply swaps only the eager CPU costs of a
calibration, estimates feel them where the host bounds the step and not where the GPU does, the path/CLI errors are
one line, and the harness's host records (median over a run, errors recorded instead of raised). No GPU needed."""
from __future__ import annotations

import statistics

import pytest
import yaml
from typer.testing import CliRunner

import aisim
from aisim.cli import app
from aisim.errors import AisimError
from aisim.specs import HOST_FIELDS, HostSpec, load_calibration

DECODE = dict(model="Meta-Llama-3-8B", device="h100", workload="decode", batch=1, seq=128, dtype="bf16")
FORWARD_GPU_BOUND = dict(model="Meta-Llama-3-8B", device="h100", workload="forward", batch=16, seq=1024,
                         dtype="bf16")

runner = CliRunner()


@pytest.fixture(scope="module")
def cal():
    return load_calibration("h100-sxm")


def scaled_host(cal, factor: float) -> HostSpec:
    """The calibration's own host constants with every dispatch cost times ``factor``."""
    values = {f: getattr(cal, f) for f in HOST_FIELDS}
    for f in HOST_FIELDS:
        if f != "eager_framework_scale" and values[f] is not None:
            values[f] *= factor
    return HostSpec(**values, provenance={"cpu": "test host"})


# ---------------------------------------------------------------- HostSpec.apply

def test_apply_replaces_exactly_the_host_fields(cal):
    host = HostSpec(eager_dispatch_s=1.1e-5, graphs_dispatch_s=2.2e-6, module_overhead_s=3.3e-6,
                    eager_python_call_s=4.4e-6, eager_kernel_dispatch_s=2 * cal.eager_kernel_dispatch_s,
                    eager_view_dispatch_s=6.6e-6, eager_framework_scale=1.4)
    out = host.apply(cal)
    for f in HOST_FIELDS:
        assert getattr(out, f) == getattr(host, f), f
        assert getattr(out, f) != getattr(cal, f), f"{f}: the test host must differ from the calibration"
    before, after = cal.model_dump(), out.model_dump()
    changed = {k for k in before if before[k] != after[k]}
    assert changed == set(HOST_FIELDS) | {"eager_op_dispatch_s"}
    # the GPU curves are the very same data
    assert after["gemm_tables"] == before["gemm_tables"] and after["gemm_tables"]
    assert after["memory_efficiency"] == before["memory_efficiency"]
    assert after["gemm_efficiency"] == before["gemm_efficiency"]
    assert after["attention_efficiency"] == before["attention_efficiency"]
    assert out.launch_overhead_s == cal.launch_overhead_s and out.device == cal.device
    # the input calibration is not mutated
    assert load_calibration("h100-sxm").eager_dispatch_s == cal.eager_dispatch_s == before["eager_dispatch_s"]


def test_apply_scales_the_measured_op_costs_by_the_kernel_dispatch_ratio(cal):
    assert cal.eager_op_dispatch_s and cal.eager_kernel_dispatch_s
    host = HostSpec(eager_dispatch_s=1e-5, graphs_dispatch_s=1e-6, eager_kernel_dispatch_s=1.5e-5)
    ratio = 1.5e-5 / cal.eager_kernel_dispatch_s
    out = host.apply(cal)
    assert set(out.eager_op_dispatch_s) == set(cal.eager_op_dispatch_s)
    for op, value in cal.eager_op_dispatch_s.items():
        assert out.eager_op_dispatch_s[op] == pytest.approx(value * ratio), op
    # a host without a kernel-dispatch fit leaves them as they were
    bare = HostSpec(eager_dispatch_s=1e-5, graphs_dispatch_s=1e-6).apply(cal)
    assert bare.eager_op_dispatch_s == cal.eager_op_dispatch_s
    assert bare.eager_kernel_dispatch_s is None


def test_own_constants_as_host_change_nothing(cal):
    assert scaled_host(cal, 1.0).apply(cal).model_dump() == cal.model_dump()


# ---------------------------------------------------------------- estimates

def test_slower_host_slows_decode_and_none_is_the_default(cal):
    base = aisim.estimate(**DECODE)
    same = aisim.estimate(**DECODE, host=None)
    slow = aisim.estimate(**DECODE, host=scaled_host(cal, 2.0))
    assert same.runtime_ms == base.runtime_ms
    assert slow.runtime_ms > base.runtime_ms * 1.3, (slow.runtime_ms, base.runtime_ms)
    assert any(n.startswith("--host") and "test host" in n for n in slow.assumptions)
    assert not any(n.startswith("--host") for n in base.assumptions)


def test_gpu_bound_forward_barely_feels_the_host(cal):
    base = aisim.estimate(**FORWARD_GPU_BOUND)
    slow = aisim.estimate(**FORWARD_GPU_BOUND, host=scaled_host(cal, 2.0))
    assert slow.runtime_ms >= base.runtime_ms
    assert slow.runtime_ms < base.runtime_ms * 1.02, (slow.runtime_ms, base.runtime_ms)


def test_host_yaml_path_equals_the_spec(cal, tmp_path):
    host = scaled_host(cal, 2.0)
    path = tmp_path / "my.host.yaml"
    path.write_text("# a host file\n" + yaml.safe_dump(host.model_dump(), sort_keys=False))
    from_path = aisim.estimate(**DECODE, host=path)
    from_str = aisim.estimate(**DECODE, host=str(path))
    from_spec = aisim.estimate(**DECODE, host=host)
    assert from_path.runtime_ms == from_str.runtime_ms == from_spec.runtime_ms
    assert any(str(path) in n for n in from_path.assumptions)


def test_missing_host_path_is_one_line_naming_the_option(tmp_path):
    with pytest.raises(AisimError) as info:
        aisim.estimate(**DECODE, host=tmp_path / "nope.yaml")
    message = str(info.value)
    assert "--host" in message and "nope.yaml" in message and "\n" not in message


def test_cli_missing_host_exits_2_with_one_line():
    result = runner.invoke(app, ["estimate", "--model", "Meta-Llama-3-8B", "--device", "h100", "--workload",
                                 "decode", "--batch", "1", "--seq", "128", "--host", "/nonexistent.yaml"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "--host" in lines[0] and "/nonexistent.yaml" in lines[0] and "Traceback" not in result.output


def test_cli_calibrate_host_only_without_cuda_is_one_line(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: --host-only would measure it")
    out = tmp_path / "h.host.yaml"
    result = runner.invoke(app, ["calibrate", "--device", "h100-sxm", "--host-only", "--out", str(out)],
                           env={"COLUMNS": "200"})
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "CUDA" in lines[0] and "Traceback" not in result.output
    assert not out.exists()


# ---------------------------------------------------------------- harness records

def record(**constants) -> dict:
    return {"type": "host", "constants": constants, "provenance": {"hostname": "node-1", "cpu_count": 16}}


def test_host_spec_takes_the_median_of_the_records():
    from aisim.validation.host import host_spec

    dispatch = [1.0e-5, 3.0e-5, 1.2e-5]
    scale = [1.37, 1.41, 1.39]
    records = [record(eager_dispatch_s=d, graphs_dispatch_s=1e-6 * (i + 1), eager_kernel_dispatch_s=2 * d,
                      eager_framework_scale=s) for i, (d, s) in enumerate(zip(dispatch, scale))]
    spec = host_spec(records)
    assert spec.eager_dispatch_s == pytest.approx(statistics.median(dispatch)) == pytest.approx(1.2e-5)
    assert spec.eager_kernel_dispatch_s == pytest.approx(2.4e-5)
    assert spec.graphs_dispatch_s == pytest.approx(2e-6)
    assert spec.eager_framework_scale == pytest.approx(1.39)
    assert spec.provenance["hostname"] == "node-1" and spec.provenance["cpu_count"] == "16"
    assert "3" in spec.provenance["records"]
    # one record: its constants as they are, no "median of" note
    single = host_spec(records[1])
    assert single.eager_dispatch_s == 3.0e-5 and "records" not in single.provenance


def test_host_spec_without_optional_fields_builds():
    from aisim.validation.host import host_spec

    spec = host_spec([record(eager_dispatch_s=1e-5, graphs_dispatch_s=1e-6),
                      record(eager_dispatch_s=2e-5, graphs_dispatch_s=3e-6, eager_view_dispatch_s=5e-6)])
    assert spec.eager_dispatch_s == pytest.approx(1.5e-5) and spec.graphs_dispatch_s == pytest.approx(2e-6)
    assert spec.eager_view_dispatch_s == pytest.approx(5e-6)        # median of the one record that has it
    assert spec.eager_kernel_dispatch_s is None and spec.eager_python_call_s is None
    assert spec.module_overhead_s == 0.0 and spec.eager_framework_scale == 1.0
    cal = load_calibration("h100-sxm")
    applied = spec.apply(cal)
    assert applied.eager_kernel_dispatch_s is None and applied.eager_op_dispatch_s == cal.eager_op_dispatch_s


def test_host_record_records_a_failure_instead_of_raising(monkeypatch):
    import aisim.validation.host as host_module
    from aisim.validation.harness.common import host_record

    def broken(*args, **kwargs):
        raise RuntimeError("no CUDA GPU here")

    monkeypatch.setattr(host_module, "measure_host", broken)
    rec = host_record("start")
    assert rec["type"] == "host" and rec["when"] == "start"
    assert rec["status"] == "error"
    assert "RuntimeError" in rec["error"] and "no CUDA GPU here" in rec["error"]
    assert "constants" not in rec and rec["host_s"] >= 0


def test_host_record_keeps_a_measurement(monkeypatch):
    import aisim.validation.host as host_module
    from aisim.validation.harness.common import host_record

    monkeypatch.setattr(host_module, "measure_host", lambda: record(eager_dispatch_s=1e-5, graphs_dispatch_s=1e-6))
    rec = host_record("end")
    assert rec["when"] == "end" and rec["constants"]["eager_dispatch_s"] == 1e-5 and "error" not in rec


def test_phase_scale_multiplies_the_host_cost_of_training_steps_only():
    """cpu_costs: a forward-backward or train step's ops cost eager_phase_scale['train'] x a forward's; prefill
    and decode (no decode key in the shipped files) cost the same as the forward."""
    import numpy as np

    from aisim.cost.timeline import cpu_costs
    from aisim.scenario import scenario
    from aisim.step import op_arrays
    from aisim.workload import StepShape

    sc = scenario("gpt2", "h100", dtype="bf16")
    arrays = op_arrays(sc, sc.workload(StepShape(phase="forward", batch=1, seq=64)))
    cal = sc.calibration.model_copy(update={"eager_phase_scale": {"train": 1.5}})

    def total(phase):
        return float(np.sum(cpu_costs(arrays.ops, list(arrays.kinds), arrays.launches, cal, sc.runtime, phase)))

    base = total("forward")
    assert base > 0
    assert total("forward-backward") == pytest.approx(1.5 * base)
    assert total("train") == pytest.approx(1.5 * base)
    assert total("prefill") == pytest.approx(base)
    assert total("decode") == pytest.approx(base)


def test_fit_phase_scales_hand_worked():
    """Per family, (measured / predicted of the phase) / (the same of its forward); median over families."""
    from aisim.validation.framework_overhead import fit_phase_scales

    counts = {"kernels": 100.0, "views": 0.0, "modules": 0.0, "py_calls": 0.0}   # predicted 100 x 10 us = 1 ms
    records = []
    for family, fwd_s, bwd_s, dec_s in (("a", 2e-3, 6e-3, 2e-3), ("b", 1e-3, 4e-3, 1.1e-3)):
        records += [{"bench": "framework_phase", "family": family, "phase": "forward", "time_s": fwd_s,
                     "counts": counts},
                    {"bench": "framework_phase", "family": family, "phase": "forward-backward", "time_s": bwd_s,
                     "counts": {**counts, "kernels": 200.0}},
                    {"bench": "framework_phase", "family": family, "phase": "decode", "time_s": dec_s,
                     "counts": counts}]
    scales = fit_phase_scales(records, kernel_s=10e-6, view_s=5e-6, module_s=1e-6)
    # a: (6 / 2) / (2 / 1) = 1.5, b: (4 / 2) / (1 / 1) = 2.0 -> median 1.75; decode a 1.0, b 1.1 -> 1.05
    assert scales == {"train": pytest.approx(1.75), "decode": pytest.approx(1.05)}


def test_a_refit_calibration_keeps_the_documented_phase_scale():
    from aisim.specs import default_calibration, load_calibration

    assert default_calibration().eager_phase_scale.get("train", 1.0) > 1.0
    assert load_calibration("h100-sxm").eager_phase_scale == default_calibration().eager_phase_scale


def test_host_spec_skips_failed_host_lines():
    from aisim.validation.host import host_spec

    ok = {"type": "host", "constants": {"eager_dispatch_s": 1e-5, "graphs_dispatch_s": 1e-6}}
    failed = {"type": "host", "status": "error", "error": "ModuleNotFoundError: pydantic"}
    assert host_spec([failed, ok]).eager_dispatch_s == pytest.approx(1e-5)
    with pytest.raises(ValueError):
        host_spec([failed])


def test_framework_overhead_cli_bad_input_is_one_line(tmp_path):
    """--derive of a missing or non-JSONL file, and no --out/--derive, stop with one line, not a traceback; the
    committed rounds derive the calibrations' train scale."""
    from aisim.validation.framework_overhead import main

    for argv in (["--derive", str(tmp_path / "missing.jsonl")], ["--derive", __file__]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert str(exc.value).startswith("error: --derive") and "\n" not in str(exc.value)
    with pytest.raises(SystemExit):
        main([])


@pytest.mark.parametrize("name", ["h100-sxm", "h200"])
def test_committed_microbenchmarks_derive_the_calibrations_host_table(name):
    """derive_op_host on the committed op_host runs, the calibration's raw file and the phase rounds gives exactly
    the per-op table, add, framework scale and train scale in the calibration file (and the table and train scale
    in default.yaml, which a new calibration copies)."""
    from aisim.specs import default_calibration
    from aisim.validation.scripts.derive_op_host import derive

    fit = derive(name)
    cal = load_calibration(name)
    assert cal.eager_op_host_ratio == fit["eager_op_host_ratio"] == default_calibration().eager_op_host_ratio
    assert cal.eager_add_dispatch_s == fit["eager_add_dispatch_s"]
    assert cal.eager_framework_scale == fit["eager_framework_scale"]
    assert cal.eager_phase_scale == fit["eager_phase_scale"] == default_calibration().eager_phase_scale
    assert fit["eager_op_host_ratio"]["aten.mm"] > 1.5 > 0.5 > fit["eager_op_host_ratio"]["view"]


def test_extra_op_host_runs_fill_the_missing_ops_portably_and_are_printed_only(capsys):
    """--extra: the H200 host's runs add the ops the H100 file lacks (LayerNorm above one add, the MoE routing ops near
    one) without touching the ops the H100 file times; the ops both time agree within 20% between the hosts; the
    refitted framework scale is not the shipped one, and --extra --write is refused (docs/calibration.md)."""
    from aisim.validation.scripts.derive_op_host import EXTRA, derive, host_table, main, portable_check

    base, extra = host_table(), host_table(extra=EXTRA)
    assert "aten.native_layer_norm" not in base and extra["aten.native_layer_norm"] > 1.4
    assert all(0.8 < extra[k] < 1.4 for k in ("aten.floor_divide", "aten.ge.Scalar", "aten.clamp_",
                                                "aten.masked_fill_.Scalar", "aten.index_put_", "aten.arange"))
    assert {k: extra[k] for k in base} == base
    both = portable_check()
    assert len(both) >= 25 and all(abs(b / a - 1) < 0.2 for a, b in both.values() if a >= 0.5)
    shipped = load_calibration("h100-sxm").eager_framework_scale
    assert derive("h100-sxm", with_extra=True)["eager_framework_scale"] != shipped
    with pytest.raises(SystemExit) as exc:
        main(["--extra", "--write"])
    assert exc.value.code == 2 and "printed only" in capsys.readouterr().err


def test_per_op_host_table_prices_each_op_by_its_ratio(cal):
    """With eager_op_host_ratio and eager_add_dispatch_s, an op costs add x its ratio (x the framework scale); an op
    the table does not list, the 'kernel' ratio per launch or the 'view' ratio; without the add, the split."""
    import numpy as np

    from aisim.cost.timeline import cpu_costs
    from aisim.graph.ops import Op, TensorMeta
    from aisim.specs import all_runtimes

    t = TensorMeta((8, 64), "bf16")
    ops = [Op("aten.mm", (t, t), {}, (t,), False), Op("aten.view", (t,), {}, (t,), True),
           Op("aten.floor_divide", (t, t), {}, (t,), False), Op("aten.alias", (t,), {}, (t,), True)]
    table = {"aten.mm": 2.0, "aten.view": 0.1, "kernel": 1.5, "view": 0.3}
    per_op = cal.model_copy(update={"eager_op_host_ratio": table, "eager_add_dispatch_s": 10e-6,
                                    "eager_framework_scale": 2.0, "eager_op_dispatch_s": {}})
    launches = np.array([1.0, 0.0, 2.0, 0.0])
    got = cpu_costs(ops, ["gemm", "none", "memory", "none"], launches, per_op, all_runtimes()["eager"])
    assert got.tolist() == pytest.approx([40e-6, 2e-6, 60e-6, 6e-6])
    split = per_op.model_copy(update={"eager_add_dispatch_s": None})
    got = cpu_costs(ops, ["gemm", "none", "memory", "none"], launches, split, all_runtimes()["eager"])
    k, v = cal.eager_kernel_dispatch_s, cal.eager_view_dispatch_s
    assert got.tolist() == pytest.approx([2 * k, 2 * v, 2 * 2 * k, 2 * v])


def test_a_calibration_file_given_as_host_or_a_host_file_as_calibration_says_which_flag(tmp_path):
    from aisim.errors import AisimError

    host_file = tmp_path / "host.yaml"
    host_file.write_text(yaml.safe_dump({"eager_dispatch_s": 1e-5, "graphs_dispatch_s": 1e-6}))
    from pathlib import Path

    cal_file = Path(__file__).resolve().parent.parent / "hardware_specs/calibration/h100-sxm.yaml"
    with pytest.raises(AisimError, match="is a calibration file .* pass it as --calibration"):
        aisim.estimate(model="gpt2", device="h100", host=cal_file)
    with pytest.raises(AisimError, match="is a host file .* pass it as --host"):
        aisim.estimate(model="gpt2", device="h100", calibration=host_file)
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    with pytest.raises(AisimError) as exc:
        aisim.estimate(model="gpt2", device="h100", calibration=empty)
    assert "host file" not in str(exc.value)


def test_derive_op_host_bad_input_is_one_line(tmp_path, capsys):
    """A missing calibration or data file, or a file of the wrong kind, stops with one usage line, not a traceback."""
    from aisim.validation.scripts.derive_op_host import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    for argv in (["--calibration", "nosuch"], ["--data", str(tmp_path / "missing.jsonl")], ["--data", str(bad)]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("usage:") or "error:" in err[-1]
        assert "Traceback" not in "\n".join(err)


def test_step_host_s_is_scaled_per_call_work_on_eager_with_the_table_only(cal):
    """eager_step_host_adds plain adds x the framework and phase scales, once per call ('train' for a
    forward-backward, 'forward' otherwise); 0 without the per-op table, on graphs runtimes, or when unset (as in
    every shipped calibration: validation/scripts/step_host_whatif.py reports why)."""
    from aisim.cost.timeline import step_host_s
    from aisim.specs import all_runtimes, default_calibration

    rts = all_runtimes()
    c = cal.model_copy(update={"eager_add_dispatch_s": 10e-6, "eager_framework_scale": 2.0,
                               "eager_phase_scale": {"train": 1.5}, "eager_step_host_adds": {"forward": 30.0,
                                                                                           "train": 60.0}})
    assert step_host_s(c, rts["eager"], "decode") == pytest.approx(30 * 10e-6 * 2.0)
    assert step_host_s(c, rts["eager"], "forward-backward") == pytest.approx(60 * 10e-6 * 2.0 * 1.5)
    assert step_host_s(c, rts["vllm"], "decode") == 0.0
    assert step_host_s(c.model_copy(update={"eager_add_dispatch_s": None}), rts["eager"], "decode") == 0.0
    assert not any(shipped.eager_step_host_adds for shipped in (load_calibration("h100-sxm"),
                                                                load_calibration("h200"), default_calibration()))


def test_simulate_starts_the_host_after_the_per_call_work():
    """head_cpu_s delays every issue: a host-bound step grows by it, a GPU-bound one too (its first kernel waits
    for the head and its own dispatch), and the host busy time counts it."""
    import numpy as np

    from aisim.cost.timeline import simulate

    one = np.ones(3)
    host_bound = simulate(np.full(3, 1e-6), np.full(3, 10e-6), one, np.zeros(3, bool), head_cpu_s=50e-6)
    assert host_bound.runtime_s == pytest.approx(
        simulate(np.full(3, 1e-6), np.full(3, 10e-6), one, np.zeros(3, bool)).runtime_s + 50e-6)
    assert host_bound.cpu_busy_s == pytest.approx(80e-6)
    gpu_bound = simulate(np.full(3, 1e-3), np.full(3, 10e-6), one, np.zeros(3, bool), head_cpu_s=50e-6)
    assert gpu_bound.runtime_s == pytest.approx(50e-6 + 10e-6 + 3e-3)   # the first kernel waits for both


def test_fit_step_host_adds_recovers_the_per_call_work(cal):
    """Depth sweeps made as c + s x the per-op prediction give back c / (s x add) in plain adds (forward and decode
    sweeps pooled; forward-backward apart), whatever the host's add and scale."""
    from aisim.validation import framework_overhead as fo

    c = cal.model_copy(update={"eager_op_host_ratio": load_calibration("h100-sxm").eager_op_host_ratio,
                               "eager_add_dispatch_s": 10e-6})
    runs = []
    for add_s, scale, adds in ((10e-6, 1.8, 25.0), (8e-6, 2.3, 35.0)):
        unit = c.model_copy(update={"eager_add_dispatch_s": add_s})
        records = [{"bench": "overhead", "name": "add_out_s", "samples_s": [add_s]}]
        for family in ("llama", "opt"):
            for phase, per_call in (("forward", adds), ("decode", adds), ("forward-backward", 2 * adds)):
                for layers in (1, 2, 4):
                    p = fo.predicted_config_host_s(fo.depth_config(family, layers), unit, phase)
                    records.append({"bench": "framework_depth", "family": family, "layers": layers, "phase": phase,
                                    "time_s": scale * (p + per_call * add_s)})
        runs.append(records)
    fit = fo.fit_step_host_adds(runs, c)
    assert fit["forward"] == pytest.approx(30.0, abs=0.2)     # median of 25 x 4 sweeps and 35 x 4
    assert fit["train"] == pytest.approx(60.0, abs=0.2)


def test_depth_sweep_runs_on_a_cpu():
    """bench_framework_depth yields a record per family, depth and phase (forward-backward for dense only)."""
    from aisim.validation.framework_overhead import bench_framework_depth

    recs = list(bench_framework_depth(families=("opt", "olmoe"), depths=(1, 2), repeats=1, device="cpu"))
    assert [(r["family"], r["layers"], r["phase"]) for r in recs] == [
        ("opt", 1, "forward"), ("opt", 1, "decode"), ("opt", 1, "forward-backward"),
        ("opt", 2, "forward"), ("opt", 2, "decode"), ("opt", 2, "forward-backward"),
        ("olmoe", 1, "forward"), ("olmoe", 1, "decode"), ("olmoe", 2, "forward"), ("olmoe", 2, "decode")]
    assert all(r["time_s"] > 0 for r in recs)


def test_eager_collectives_cost_the_host_their_measured_in_model_adds(cal):
    """An eager all-reduce over g ranks costs max(allreduce_cpu_s, adds(g) x add) times the framework scale (the
    in-model figure includes the issue), per eager kernel op where the file has no add; a group size not listed
    takes the largest listed below it (the smallest if none). Other collectives and graphs runtimes keep the tight
    loop's issue cost."""
    import numpy as np

    from aisim.cost.timeline import collective_host_adds, cpu_costs
    from aisim.graph.ops import Op, TensorMeta
    from aisim.specs import all_runtimes

    t = TensorMeta((8, 64), "bf16")
    ops = [Op("nccl.all_reduce", (t,), {}, (t,), True, attrs={"group": g}) for g in (2, 4, 8, 1)]
    ops.append(Op("nccl.all_gather", (t,), {}, (t,), True, attrs={"group": 4}))
    c = cal.model_copy(update={"eager_add_dispatch_s": 10e-6, "eager_framework_scale": 2.0, "allreduce_cpu_s": 150e-6,
                               "eager_collective_host_adds": {2: 10.0, 4: 20.0}})
    assert [collective_host_adds(c, g) for g in (1, 2, 3, 4, 8)] == [10.0, 10.0, 10.0, 20.0, 20.0]
    kinds, launches = ["comm"] * 5, np.ones(5)
    costs = cpu_costs(ops, kinds, launches, c, all_runtimes()["eager"])
    # group 2 and 1: the tight loop's 150 us is larger than 10 adds; group 4 and 8: 20 adds; the all-gather: 150 us
    assert costs.tolist() == pytest.approx([2.0 * 150e-6, 2.0 * 200e-6, 2.0 * 200e-6, 2.0 * 150e-6, 2.0 * 150e-6])
    no_table = c.model_copy(update={"eager_add_dispatch_s": None, "eager_kernel_dispatch_s": 9e-6})
    assert cpu_costs(ops, kinds, launches, no_table, all_runtimes()["eager"]).tolist() == pytest.approx(
        [2.0 * 150e-6, 2.0 * 180e-6, 2.0 * 180e-6, 2.0 * 150e-6, 2.0 * 150e-6])
    graphs = cpu_costs(ops, kinds, launches, c, all_runtimes()["vllm"])
    assert graphs.tolist() == pytest.approx(cpu_costs(ops, kinds, launches, no_table, all_runtimes()["vllm"]).tolist())


def test_committed_tiny_tp_sweeps_derive_the_calibrations_collective_adds():
    """derive_collective_host on the committed tp-tiny runs gives exactly the adds in h100-sxm.yaml, h200.yaml and
    default.yaml; TP 4 costs more per all-reduce than TP 2, and both far more than a tight loop's issue cost."""
    from aisim.specs import default_calibration
    from aisim.validation.scripts.derive_collective_host import derive

    fit = derive()["eager_collective_host_adds"]
    for shipped in (load_calibration("h100-sxm"), load_calibration("h200"), default_calibration()):
        assert shipped.eager_collective_host_adds == fit
    h100 = load_calibration("h100-sxm")
    assert fit[4] > fit[2] and fit[2] * h100.eager_add_dispatch_s > 2 * 24e-6


def test_a_refit_calibration_keeps_the_per_op_table_and_collective_adds():
    """fit_overheads on the committed H100 raw records (as `aisim calibrate --refit`) copies default.yaml's per-op
    table and per-collective adds, which no calibration run measures."""
    import json
    from pathlib import Path

    from aisim.specs import default_calibration
    from aisim.validation.calibrate_fit import fit_overheads

    raw_path = Path(__file__).resolve().parents[1] / "hardware_specs" / "calibration" / "h100-sxm.raw.json"
    raw = json.loads(raw_path.read_text())["records"]
    fitted = fit_overheads([r for r in raw if r.get("bench") in ("overhead", "framework")], default_calibration())
    assert fitted["eager_op_host_ratio"] == default_calibration().eager_op_host_ratio
    assert fitted["eager_collective_host_adds"] == default_calibration().eager_collective_host_adds != {}


def test_framework_arch_scale_multiplies_the_host_of_its_architecture_only():
    """eager_framework_arch_scale: a host-bound eager decode step of a llama model takes (about) twice as long with
    llama's decode scale at 2; an OPT step and llama's forward (no forward entry: 1) do not move."""
    import aisim
    from aisim.specs import load_calibration

    cal = load_calibration("h100-sxm")
    scaled = cal.model_copy(update={"eager_framework_arch_scale": {"llama": {"decode": 2.0}}})

    def run(model, workload, c):
        return aisim.estimate(model, "h100", workload=workload, batch=1, seq=128, dtype="fp16", runtime="eager",
                              calibration=c).runtime_ms

    base, doubled = run("Llama-2-7b-hf", "decode", cal), run("Llama-2-7b-hf", "decode", scaled)
    assert 1.8 < doubled / base <= 2.05
    assert run("opt-1.3b", "decode", scaled) == run("opt-1.3b", "decode", cal)
    assert run("Llama-2-7b-hf", "forward", scaled) == run("Llama-2-7b-hf", "forward", cal)


def _walk_expanded(gpu, cpu, calls, syncs):
    """Reference: every call of every op walked one by one in the given order (no repeats)."""
    from aisim.cost.timeline import _step

    state = [0.0, 0.0]
    for g, c, n, s in zip(gpu, cpu, calls, syncs):
        for _ in range(n):
            _step(state, g, c, 1.0, s)
    return max(state)


def test_simulate_walks_repeated_layers_in_order_as_the_model_runs_them():
    """A traced layer (a host-bound norm, GEMMs and adds between them) repeated 40 times between an embedding and a head
    costs what the 40 layers walked one after another cost: the GEMMs' backlog covers the next layer's host-bound
    ops, so a balanced step takes about max(host, GPU), not the sum of per-op blocks (the walk before 2026-11-28
    ran each op's 40 calls back to back: 15.7 ms for opt-13b forward 1 x 128 on an H100, now 13.6, measured
    12.8-13.3)."""
    import numpy as np

    from aisim.cost.timeline import simulate

    gpu = np.array([5e-6, 2e-6, 80e-6, 2e-6, 60e-6, 2e-6, 200e-6])     # norm, q/k/v, add, MLP, add
    cpu = np.array([20e-6, 30e-6, 20e-6, 25e-6, 20e-6, 30e-6, 20e-6])
    reps = np.array([1.0, 40.0, 40.0, 40.0, 40.0, 40.0, 1.0])
    none = np.zeros(7, bool)
    t = simulate(gpu, cpu, reps, none)
    ref = _walk_expanded(np.concatenate([gpu[:1], np.tile(gpu[1:6], 40), gpu[6:]]),
                               np.concatenate([cpu[:1], np.tile(cpu[1:6], 40), cpu[6:]]),
                               [1] * 202, np.zeros(202, bool))
    assert t.runtime_s == pytest.approx(ref, rel=1e-12)
    # balanced: 40 x 145 us of host vs 40 x 146 us of GPU -> about max(host, GPU), well under the per-op blocks' sum
    assert t.runtime_s < 1.03 * max(t.cpu_busy_s, t.gpu_busy_s)


def test_simulate_keeps_forward_and_backward_layers_apart():
    """The backward's repeated layers run after the whole forward: each phase's layers are walked in rounds of
    their own, so a training step equals its forward layers walked in order, then its backward layers."""
    import numpy as np

    from aisim.cost.timeline import simulate

    gpu = np.array([90e-6, 2e-6, 300e-6, 4e-6, 150e-6])
    cpu = np.array([20e-6, 40e-6, 30e-6, 60e-6, 20e-6])
    reps = np.array([12.0, 12.0, 1.0, 12.0, 12.0])
    phases = ("forward", "forward", "forward", "backward", "backward")
    t = simulate(gpu, cpu, reps, np.zeros(5, bool), phases=phases)
    ref = _walk_expanded(np.concatenate([np.tile(gpu[:2], 12), gpu[2:3], np.tile(gpu[3:], 12)]),
                         np.concatenate([np.tile(cpu[:2], 12), cpu[2:3], np.tile(cpu[3:], 12)]),
                         [1] * 49, np.zeros(49, bool))
    assert t.runtime_s == pytest.approx(ref, rel=1e-12)
    merged = simulate(gpu, cpu, reps, np.zeros(5, bool))     # one phase: forward and backward layers interleaved
    assert merged.runtime_s != pytest.approx(ref, rel=1e-6)


def test_simulate_rounds_with_fractional_repeats_and_syncs_keep_the_totals():
    """Ops of a layer with other repeat counts than the layer's (shared signatures) take their share per round;
    a per-layer sync waits for the GPU each round; busy totals stay the dot products."""
    import numpy as np

    from aisim.cost.timeline import simulate

    gpu = np.array([50e-6, 3e-6, 1e-6, 40e-6])
    cpu = np.array([10e-6, 12e-6, 5e-6, 10e-6])
    reps = np.array([30.5, 20.0, 30.5, 30.5])
    syncs = np.array([False, False, True, False])
    t = simulate(gpu, cpu, reps, syncs)
    assert t.gpu_busy_s == pytest.approx(float(gpu @ reps))
    assert t.cpu_busy_s == pytest.approx(float(cpu @ reps))
    # with a sync in every layer nothing overlaps across layers: at least the per-layer critical path x 30.5
    assert t.runtime_s >= 30.5 * (gpu[0] + cpu[2]) * 0.999
    assert np.isfinite(t.runtime_s)


def test_simulate_rounds_shortcuts_are_exact_on_random_layers():
    """The rounds stop walking once the gap repeats or the GPU never waits and falls further behind: on random
    layers (host-bound, GPU-bound, balanced, with and without a sync) the result equals every layer walked."""
    import numpy as np

    from aisim.cost.timeline import simulate

    rng = np.random.default_rng(7)
    for case in range(200):
        n = int(rng.integers(2, 7))
        gpu = rng.uniform(0, 60e-6, n) * rng.choice([0.2, 1.0, 5.0])
        cpu = rng.uniform(1e-6, 30e-6, n)
        syncs = np.zeros(n, bool)
        if case % 5 == 0:
            syncs[rng.integers(n)] = True
        layers = int(rng.integers(2, 60))
        reps = np.concatenate([[1.0], np.full(n, float(layers)), [1.0]])
        g = np.concatenate([[rng.uniform(0, 1e-3)], gpu, [rng.uniform(0, 1e-3)]])
        c = np.concatenate([[10e-6], cpu, [10e-6]])
        s = np.concatenate([[False], syncs, [False]])
        ref = _walk_expanded(np.concatenate([g[:1], np.tile(gpu, layers), g[-1:]]),
                             np.concatenate([c[:1], np.tile(cpu, layers), c[-1:]]),
                             [1] * (n * layers + 2), np.concatenate([[False], np.tile(syncs, layers), [False]]))
        assert simulate(g, c, reps, s).runtime_s == pytest.approx(ref, rel=1e-9, abs=1e-12), case


def test_layer_walk_repeats_keep_the_embedding_and_head_out_of_the_rounds():
    """A signature shared by the layers and by ops outside them (the final norm, nn.Module calls) walks once per
    call outside and the rest inside: every in-layer op gets the layers' count, totals unchanged."""
    import numpy as np

    import aisim.step as step_module
    from aisim.scenario import scenario
    from aisim.workload import StepShape

    sc = scenario(model="opt-125m", device="h100", dtype="fp16")
    a = step_module.op_arrays(sc, sc.workload(StepShape(phase="forward", batch=1, seq=128)))
    inside = np.array([any(p.isdigit() for p in op.scope.split(".")) for op in a.ops])
    assert np.unique(np.round(a.walk_repeats[inside], 9)).tolist() == [6.0]        # 12 layers, 2 traced
    assert (a.walk_repeats[~inside] == 1.0).all()
    by_sig: dict = {}
    for op, r, w in zip(a.ops, a.repeats, a.walk_repeats):
        t = by_sig.setdefault(op.signature, [0.0, 0.0])
        t[0] += r
        t[1] += w
    assert all(abs(r - w) < 1e-9 for r, w in by_sig.values())
