"""`aisim calibrate`: microbenchmarks on the local GPU that write a calibration file (CalibrationSpec YAML).

The cost model's convention, followed exactly: for every op

    t_roofline = max(flops / peak_flops_datasheet[dtype], bytes / memory_bw_datasheet)
    efficiency = t_roofline / t_measured        (the estimate is then t_roofline / efficiency)

with bytes = each input read once + each output written once, and a multiply-add = 2 FLOPs
(GEMM M x K @ K x N = 2*M*N*K; attention formulas in ``attention_flops``).

Measurement and fitting are kept apart. The benchmarks (GPU, calibrate_bench.py) produce plain records, saved
next to the YAML as ``<stem>.raw.json``; ``fit_calibration(raw)`` and its helpers (calibrate_fit.py) are pure
(plain lists in, numbers out), so curves can be refit on a CPU:
``python -m aisim.validation.calibrate --refit X.raw.json --out X.yaml``.

Timing: one untimed call, a timed warm-up, then ``reps`` calls each between two CUDA events; the median.
A ``torch.cuda._sleep`` kernel is queued first for short ops, so the CPU enqueues every rep while the GPU
waits and the events time GPU work, not Python dispatch. Inputs are random normal (never zeros); where one
set of inputs fits in L2, the calls rotate among several sets (about 3x L2 in all) so reads come from HBM.

Known inaccuracies: efficiencies above 1 are kept (a datasheet peak can be beaten, e.g. by L2 hits on tiny
ops); the rotation does not flush L2 of the output; power is one steady-state average per load, not a model.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from .cli import new_app, run

from ..errors import AisimError, UnknownNameError
from ..specs import CalibrationSpec
from .calibrate_bench import (Budget, PowerMeter, _log, attention_plan, bench_attention, bench_gemm, bench_memory,
                              bench_overheads, bench_power, bench_power_curve, gemm_plan, memory_plan,
                              open_power_meter)
from .calibrate_fit import GEMM_DTYPES, GEMM_M, GEMM_NK, GEMM_QUICK, fit_calibration


# ---------------------------------------------------------------- orchestration

METHOD = ("CUDA-event timing (1 untimed call, 3 warm-up, then 5..100 reps, median; sleep kernel queued ahead of "
          "short ops), random-normal inputs rotated among sets of ~3x L2 where one set fits in L2; GEMM "
          "torch.matmul(x, W.t()) over M x N x K log grids in fp32 (TF32 off), tf32, fp16, bf16; SDPA forward "
          "and backward (prefill, causal and not) and decode (q_len 1), head_dim 128/64, 32 heads; memory-bound "
          "clone/add/gelu/silu/layer_norm/rms_norm/softmax at 4 KiB..2 GiB in fp16/fp32; overheads from a "
          "1000-kernel CUDA-graph replay, 2000 eager ops and 2000 nn.Linear vs F.linear calls; power by NVML "
          "while idle, while looping 8192^3 bf16 GEMMs and 1 GiB copies; all-reduce/all-gather by NCCL, one "
          "process per GPU, alpha-beta fit")


def run_calibration(device_name: str, out_path: Path, *, quick: bool = False, max_minutes: float = 4.0) -> Path:
    """Measure the local GPU (CUDA device 0, and all visible GPUs for collectives) and write ``out_path``
    (CalibrationSpec YAML) and ``<stem>.raw.json`` next to it. Returns ``out_path``.

    Raises AisimError when no CUDA GPU is visible or ``device_name`` is not a known GPU spec.
    """
    torch = _require_cuda()
    key, hw = resolve_device(device_name)
    out_path = Path(out_path)
    budget = Budget(total_s=max_minutes * 60.0, start=time.monotonic())
    peaks = {"flops_per_s": {d: hw.peak_for(d) for d in GEMM_DTYPES}, "memory_bw_bytes_per_s": hw.memory_bw_bytes_per_s,
             "source": f"hardware_specs/gpus/{key}.yaml (datasheet)"}
    props = torch.cuda.get_device_properties(0)
    from ..specs import all_hardware

    mismatch = gpu_name_mismatch(props.name, key, all_hardware())
    if mismatch:
        raise AisimError(mismatch)
    if props.name.strip().lower() not in {a.lower() for a in (hw.name, hw.display_name, *hw.aliases)}:
        print(f"warning: no GPU spec lists the local GPU name {props.name!r}; calibrating it as {key!r}", flush=True)
    l2_bytes = float(getattr(props, "L2_cache_size", 0) or hw.l2_bytes)
    _log(budget, f"calibrating {props.name} as {key!r} ({'quick' if quick else 'full'}, budget {max_minutes} min)")
    torch.randn(1024, 1024, device="cuda") @ torch.randn(1024, 1024, device="cuda")    # context, cuBLAS handle
    torch.cuda.synchronize()
    meter, records = open_power_meter(), []
    power_s = 1.0 if quick else 2.0
    if meter is not None:
        time.sleep(0.5)
        records.append(bench_power(meter, "idle", power_s))
    records += bench_overheads()
    from .framework_overhead import bench_framework_overhead
    records += bench_framework_overhead()
    _log(budget, "overheads done")
    todo, skipped = gemm_plan(quick, peaks, l2_bytes)
    records += skipped + bench_gemm(todo, budget)
    records += bench_attention(attention_plan(quick), budget, peaks, l2_bytes)
    records += bench_memory(memory_plan(quick), budget, peaks, l2_bytes)
    if meter is not None:
        records += [bench_power(meter, load, power_s) for load in ("compute", "memory", "active")]
        records += bench_power_curve(meter, 1.0 if quick else 1.5, peaks)
    records += _collectives(torch, budget, quick)
    raw = {"device": key, "peaks": peaks, "records": records,
           "grid": {"gemm": dict(zip("mnk", GEMM_QUICK if quick else (GEMM_M, GEMM_NK, GEMM_NK)))},
           "provenance": _provenance(torch, props, meter, quick, budget)}
    return write_outputs(raw, out_path, budget)


def add_transposed(device: str, raw_path: Path, out_path: Path, quick: bool = False) -> Path:
    """Measure the transposed-operand memory ops (calibrate_bench.bench_transposed) on the local GPU and refit an
    existing calibration's raw records with them (the other measurements are kept as they were)."""
    import torch

    from .calibrate_bench import transposed_plan
    from .gpu import driver_version

    key, hw = resolve_device(device)
    raw = json.loads(Path(raw_path).read_text())
    if raw["device"] != key:
        raise AisimError(f"{raw_path} is the calibration of {raw['device']!r}, not {key!r}")
    props = torch.cuda.get_device_properties(0)
    from ..specs import all_hardware

    mismatch = gpu_name_mismatch(props.name, key, all_hardware())
    if mismatch:
        raise AisimError(mismatch)
    budget = Budget(total_s=600.0, start=time.monotonic())
    l2_bytes = float(getattr(props, "L2_cache_size", 0) or hw.l2_bytes)
    torch.randn(8, device="cuda").sum().item()
    records = bench_memory(transposed_plan(quick), budget, raw["peaks"], l2_bytes)
    raw["records"] = [r for r in raw["records"] if r["bench"] != "memory_t"] + records
    raw["provenance"] = {**raw["provenance"], "transposed_memory": (
        f"added {time.strftime('%Y-%m-%d')} on {props.name}, torch {torch.__version__}, driver "
        f"{driver_version() or 'unknown'}: python -m aisim.validation.calibrate --add-transposed")}
    return write_outputs(raw, out_path, budget)


def write_outputs(raw: dict, out_path: Path, budget: Budget | None = None) -> Path:
    """Write ``<stem>.raw.json`` and the fitted YAML; the YAML is checked by loading it back."""
    import yaml

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    raw_path = out_path.with_name(out_path.stem + ".raw.json")
    raw_path.write_text(json.dumps(raw, indent=1))
    spec = fit_calibration(raw, defaults=load_default_rules())
    out_path.write_text(f"# written by aisim.validation.calibrate; raw measurements in {raw_path.name}\n"
                        + yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False, width=120))
    CalibrationSpec(**yaml.safe_load(out_path.read_text()))
    if budget is not None:
        _log(budget, f"wrote {out_path} and {raw_path.name}")
    return out_path


def load_default_rules() -> CalibrationSpec:
    """hardware_specs/calibration/default.yaml: the documented rules for a device with no calibration file."""
    from importlib import resources

    import yaml

    text = (resources.files("aisim.hardware_specs") / "calibration" / "default.yaml").read_text()
    return CalibrationSpec(**yaml.safe_load(text))


def resolve_device(name: str):
    """(file stem, HardwareSpec) for an aisim GPU name or alias, else UnknownNameError with close matches."""
    from ..specs import all_hardware

    hardware = all_hardware()
    for key, spec in hardware.items():
        if name.strip().lower() in {a.lower() for a in (key, spec.name, *spec.aliases)}:
            return key, spec
    raise UnknownNameError("GPU", name, sorted(hardware), "Calibration needs the GPU's datasheet spec in "
                           "hardware_specs/gpus/<name>.yaml (add one for a new GPU).")


def gpu_name_mismatch(local_name: str, key: str, hardware: dict) -> str | None:
    """An error message when the local GPU (torch's name for it) is another known GPU than ``key``, else None.

    Each GPU spec lists torch's device name among its aliases; a local name no spec lists passes (a new
    board name of a known GPU, say), with a printed warning by the caller.
    """
    def names(spec) -> set[str]:
        return {a.lower() for a in (spec.name, spec.display_name, *spec.aliases)}

    local = local_name.strip().lower()
    if local in names(hardware[key]):
        return None
    others = [k for k, spec in hardware.items() if local in names(spec)]
    if others:
        return (f"the local GPU is {local_name!r}, which aisim knows as {others[0]!r}, not {key!r}: "
                f"run with --device {others[0]} (a calibration file must describe the GPU it was measured on)")
    return None


def _require_cuda():
    try:
        import torch
    except ImportError as err:
        raise AisimError(f"`aisim calibrate` needs PyTorch with CUDA ({err}).") from None
    if not torch.cuda.is_available():
        raise AisimError(
            f"no CUDA GPU is visible (torch {torch.__version__}, CUDA build: {torch.version.cuda}). "
            "`aisim calibrate` measures the local GPU: run it on the machine whose GPU you want to calibrate, "
            "with a CUDA build of PyTorch. To refit curves from an existing raw file without a GPU, use "
            "`python -m aisim.validation.calibrate --refit <file>.raw.json --out <file>.yaml`.")
    return torch


def _collectives(torch, budget: Budget, quick: bool) -> list[dict]:
    from .collectives import measure_collectives

    n = torch.cuda.device_count()
    if n < 2:
        _log(budget, "collectives: one GPU visible, not measured (allreduce fields stay empty)")
        return []
    seconds_left = budget.deadline("collectives") - time.monotonic()
    if seconds_left < 20:
        _log(budget, f"collectives: only {seconds_left:.0f} s of budget left, not measured")
        return []
    _log(budget, f"collectives: {n} GPUs, NCCL, one process per GPU")
    return measure_collectives(n, quick=quick, timeout_s=seconds_left)


def _provenance(torch, props, meter: PowerMeter | None, quick: bool, budget: Budget) -> dict[str, str]:
    import datetime
    import importlib.metadata
    import shlex
    import socket

    try:
        transformers = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        transformers = "not installed"
    return {"gpu_name": props.name, "driver": meter.driver if meter else "unknown (pynvml unavailable)",
            "cuda": str(torch.version.cuda), "torch": torch.__version__, "transformers": transformers,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "power_limit_w": f"{meter.power_limit_w:.1f}" if meter else "unknown",
            "energy_method": meter.method if meter else "not measured",
            "command": shlex.join(sys.argv), "hostname": socket.gethostname(),
            "gpu_count": str(torch.cuda.device_count()), "mode": "quick" if quick else "full",
            "benchmark_wall_s": f"{budget.elapsed():.0f}", "method": METHOD}


# ---------------------------------------------------------------- CLI

app = new_app(__doc__.splitlines()[0])


@app.command()
def _calibrate(
        device: Optional[str] = typer.Option(None, help="aisim GPU name of the local GPU (hardware_specs/gpus/)"),
        out: Optional[Path] = typer.Option(None, help="YAML to write (default: the user spec directory's "
                                           "calibration/<device>.yaml, where estimates read it)"),
        quick: bool = typer.Option(False, help="small grids (about 20 s on an H100)"),
        max_minutes: float = typer.Option(4.0, help="wall-clock budget; grids shrink to fit"),
        refit: Optional[Path] = typer.Option(None, help="refit an existing .raw.json (no GPU needed)"),
        add_transposed_raw: Optional[Path] = typer.Option(
            None, "--add-transposed", metavar="RAW_JSON", help="measure only the transposed-operand memory ops on "
            "the local GPU, append them to this .raw.json's records and refit (written to --out)")) -> int:
    """python -m aisim.validation.calibrate --device h100-sxm [--out FILE.yaml]"""
    if add_transposed_raw:
        if not (device and out):
            raise AisimError("--add-transposed needs --device and --out")
        path = add_transposed(device, add_transposed_raw, out, quick=quick)
    elif refit:
        raw = json.loads(refit.read_text())
        target = out or refit.with_name(refit.name.removesuffix(".raw.json") + ".yaml")
        if target.with_name(target.stem + ".raw.json").resolve() != refit.resolve():
            raise AisimError(f"--out {target} would not sit next to {refit} (same stem, .raw.json)")
        path = write_outputs(raw, target)
    else:
        if not device:
            raise AisimError("--device is required (the aisim GPU name of the local GPU, e.g. h100-sxm)")
        path = run_calibration(device, out or default_output(device), quick=quick, max_minutes=max_minutes)
    print(f"calibration written to {path}")
    return 0


def default_output(device: str) -> Path:
    """Where ``aisim calibrate`` writes by default: the user spec directory, which estimates read first."""
    from ..specs import user_spec_dir

    key, _ = resolve_device(device)
    return user_spec_dir() / "calibration" / f"{key}.yaml"


def main(argv: list[str] | None = None) -> int:
    return run(app, argv, "python -m aisim.validation.calibrate")


if __name__ == "__main__":
    sys.exit(main())
