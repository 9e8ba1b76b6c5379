"""The rules by which a calibration measured on one GPU is read on another, from the calibrations' own raw
microbenchmark records (hardware_specs/calibration/h100-sxm.raw.json and h200.raw.json; nothing here is a judged row).

    python -m aisim.validation.scripts.derive_transfer_rules

- ``stream_bandwidth_fraction`` (each file, and default.yaml the median of both): the fraction of datasheet bandwidth
  a plain streaming kernel reaches, the median over the file's largest copy and add records (>= 1 GiB tensors, fp16
  and fp32; bytes moved = read + written, validation/calibrate_fit.MEMORY_OPS). H100 and H200 give nearly the same
  (printed), where their memory curves' plateaus (medians over copy, add, activations, norms and softmax) differ:
  0.89 and 0.80. The softmax and fp16 activations run at about the same absolute rate on both GPUs (same SMs and
  clock), not the same fraction.
  The check: every bf16/fp16 GEMM record of one file below the ridge point (memory-bound on both GPUs), predicted
  from the other file's record of the same shape (a) as aisim read tables before (the same fraction of datasheet
  bandwidth) and (b) with efficiency.transferred_memory_efficiency (the time less its streaming part kept as a
  duration, the bytes streamed at this fraction of the target's bandwidth). MAPE per direction, split at 64 MB.
- default.yaml ``transposed_memory_efficiency``: elementwise ops with a transposed operand (copy_t, add_t) take
  1.0-1.36x as long on the H100 as on the H200 (printed), whose bandwidth is 1.43x and whose SMs and clock are the
  same: a rate per SM-cycle. The default curve, at the reference GPU (h100-sxm), is at each point of the two files'
  common grid the mean of the two files' times at the same bytes (the H200's scaled by SMs x clock, here 1), as an
  efficiency; efficiency.transposed_efficiency reads it on any GPU by SMs x clock.
- default.yaml ``broadcast_memory_efficiency``: PyTorch's non-vectorized elementwise kernel on an innermost (S, 1)
  broadcast (the MoE path's masked fills and routing-weight multiply, measured by validation/harness/grouped_gemm.py
  on both GPUs: validation/data/kernels/grouped-gemm-h100.jsonl, grouped-gemm-h200.jsonl) takes about 1.1x as long on
  the H100 as on the H200 (printed): nearer a rate per SM-cycle than a fraction of bandwidth. Built as the transposed
  curve is, from the two calibrations' broadcast curves (derive_grouped_gemm); efficiency.per_sm_cycle_efficiency.
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

from aisim.errors import AisimError

from . import run_main

ROOT = Path(__file__).resolve().parents[2]
CAL_DIR = ROOT / "hardware_specs" / "calibration"
DEVICES = ("h100-sxm", "h200")
SMALL_BYTES = 64e6                  # the check's split


@functools.cache
def raw_records(device: str) -> list[dict]:
    """The calibration's raw records with a time (read once per device; callers only filter them)."""
    path = CAL_DIR / f"{device}.raw.json"
    try:
        records = json.loads(path.read_text())["records"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise AisimError(f"{path}: cannot read aisim calibrate's raw records ({type(exc).__name__}); rerun "
                         "aisim calibrate for this GPU")
    return [r for r in records if isinstance(r, dict) and r.get("time_s")]


def _bandwidth(device: str) -> float:
    from aisim.specs import all_hardware

    return all_hardware()[device].memory_bw_bytes_per_s


def stream_fraction(device: str) -> float:
    """The file's own value, as aisim calibrate fits it (calibrate_fit.fit_stream_fraction)."""
    from aisim.validation.calibrate_fit import fit_stream_fraction

    value = fit_stream_fraction(raw_records(device), _bandwidth(device))
    if value is None:
        raise AisimError(f"{device}.raw.json: no copy/add records of >= 1 GiB; rerun aisim calibrate")
    return value


def gemm_records(device: str) -> dict[tuple, float]:
    return {(r["dtype"], r["m"], r["n"], r["k"]): r["time_s"] for r in raw_records(device)
            if r.get("bench") == "gemm" and r.get("dtype") in ("bf16", "fp16")}


def check(source: str, target: str, fraction: float) -> dict[str, tuple[int, float, float]]:
    """'small' / 'large' -> (n, MAPE % reading the same fraction, MAPE % with the transfer rule) for the target's
    memory-bound GEMM records predicted from the source's."""
    from aisim.cost.efficiency import transferred_memory_efficiency
    from aisim.specs import all_hardware, load_calibration

    src, dst = all_hardware()[source], all_hardware()[target]
    cal = load_calibration(source).model_copy(update={"stream_bandwidth_fraction": fraction})
    ridge = dst.peak_for("bf16") / dst.memory_bw_bytes_per_s     # memory-bound on the target, as ops_time decides
    measured_src = gemm_records(source)
    errors: dict[str, tuple[list[float], list[float]]] = {"small": ([], []), "large": ([], [])}
    for key, seconds in gemm_records(target).items():
        dtype, m, n, k = key
        nbytes, flops = 2 * (m * k + k * n + m * n), 2.0 * m * n * k
        if key not in measured_src or flops / nbytes >= ridge:
            continue
        roof_src = max(flops / src.peak_for(dtype), nbytes / src.memory_bw_bytes_per_s)
        roof_dst = max(flops / dst.peak_for(dtype), nbytes / dst.memory_bw_bytes_per_s)
        eff_src = roof_src / measured_src[key]              # the table entry: relative to the source's roofline
        same = roof_dst / eff_src
        rule = roof_dst / transferred_memory_efficiency(cal, eff_src, nbytes, dst, flops, dtype)
        bucket = errors["small" if nbytes <= SMALL_BYTES else "large"]
        bucket[0].append(abs(same / seconds - 1))
        bucket[1].append(abs(rule / seconds - 1))
    return {k: (len(a), 100 * statistics.fmean(a), 100 * statistics.fmean(b)) for k, (a, b) in errors.items() if a}


def transposed_default(field: str = "transposed_memory_efficiency") -> dict[str, list[float]]:
    """default.yaml's ``field`` (an SM-bound elementwise curve: transposed_memory_efficiency or
    broadcast_memory_efficiency) at the reference GPU (h100-sxm): the mean time of the two files' curves at each
    common point, the other GPU's scaled to the reference by SMs x clock."""
    from aisim.specs import all_hardware, load_calibration

    ref_name = DEVICES[0]
    ref = all_hardware()[ref_name]
    curves = {d: getattr(load_calibration(d), field) for d in DEVICES}
    if any(c is None for c in curves.values()) or len({tuple(c.x) for c in curves.values()}) != 1:
        raise AisimError(f"the calibrations' {field} curves are missing or on different grids; rerun aisim "
                         "calibrate --add-transposed (transposed) or derive_grouped_gemm --write (broadcast) on both "
                         "GPUs")
    x = curves[ref_name].x
    efficiency = []
    for i in range(len(x)):
        seconds = []
        for device, curve in curves.items():
            gpu = all_hardware()[device]
            per_byte = 1.0 / (gpu.memory_bw_bytes_per_s * curve.efficiency[i])
            seconds.append(per_byte * (gpu.sm_count * gpu.boost_clock_mhz) / (ref.sm_count * ref.boost_clock_mhz))
        efficiency.append(round(1.0 / (ref.memory_bw_bytes_per_s * statistics.fmean(seconds)), 5))
    return {"x": list(x), "efficiency": efficiency}


def transposed_ratios() -> list[float]:
    """H100 time / H200 time of every transposed (copy_t, add_t) record both files hold."""
    def times(device: str) -> dict[tuple, float]:
        return {(r["op"], r["dtype"], r["size_bytes"]): r["time_s"] for r in raw_records(device)
                if r.get("bench") == "memory_t"}

    a, b = times(DEVICES[0]), times(DEVICES[1])
    ratios = sorted(a[k] / b[k] for k in a if k in b)
    if not ratios:
        raise AisimError("no transposed (memory_t) records in both raw files; rerun aisim calibrate "
                         "--add-transposed on both GPUs")
    return ratios


KERNELS = ROOT / "validation" / "data" / "kernels"
BROADCAST_FILES = {"h100-sxm": KERNELS / "grouped-gemm-h100.jsonl", "h200": KERNELS / "grouped-gemm-h200.jsonl"}


def broadcast_ratios() -> list[float]:
    """H100 time / H200 time of every device-bound innermost-broadcast record (the grouped_gemm harness's model
    section: the MoE path's masked fills and routing-weight multiply, derive_grouped_gemm.BROADCAST_OPS) both GPUs
    measured at the same model, op and tokens."""
    from aisim.validation.scripts.derive_gemm_align import load_jsonl
    from aisim.validation.scripts.derive_grouped_gemm import BROADCAST_OPS

    def times(path: Path) -> dict[tuple, float]:
        _, records = load_jsonl(path, "grouped_gemm")
        return {(r["model"], r["op"], r["tokens"]): r["median_ms"] for r in records
                if r.get("section") == "model" and r.get("status") == "ok"
                and str(r.get("op", "")).startswith(BROADCAST_OPS) and not r.get("host_bound")
                and r.get("median_ms")}

    a, b = (times(BROADCAST_FILES[d]) for d in DEVICES)
    ratios = sorted(a[k] / b[k] for k in a if k in b)
    if not ratios:
        raise AisimError("no device-bound broadcast records in both grouped_gemm files")
    return ratios


def family_curves(device: str) -> dict:
    """Each memory-benchmark family's own curve (calibrate_fit.fit_memory's per-op curves: median over fp16 and
    fp32 at each size), for the rate ratios printed; the calibration files carry only the cat curve
    (derive_eager_attention)."""
    from aisim.validation.calibrate_fit import fit_memory

    return fit_memory(raw_records(device), _bandwidth(device))[1]


def family_rate_ratios() -> dict[str, float]:
    """Per family: the H200's achieved bytes/s over the H100's at the largest size both measured (the curves'
    last points). Near the bandwidth ratio (1.43): a fraction of bandwidth; near 1: a rate per SM-cycle (the two
    GPUs have the same SMs and clock)."""
    curves = {device: family_curves(device) for device in DEVICES}
    return {family: curves[DEVICES[1]][family].efficiency[-1] * _bandwidth(DEVICES[1])
            / (curves[DEVICES[0]][family].efficiency[-1] * _bandwidth(DEVICES[0]))
            for family in sorted(set(curves[DEVICES[0]]) & set(curves[DEVICES[1]]))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    try:
        ratios = family_rate_ratios()
        print("memory benchmark families, H200 / H100 rate at the largest size:",
              {f: round(r, 2) for f, r in ratios.items()})
        own = {device: stream_fraction(device) for device in DEVICES}
        print("stream_bandwidth_fraction:", own, "default.yaml (median):", round(statistics.median(own.values()), 3))
        for source, target in (DEVICES, DEVICES[::-1]):
            for size, (n, same, rule) in check(source, target, own[source]).items():
                print(f"{source} -> {target}, memory-bound GEMMs, {size} (<= or > {SMALL_BYTES / 1e6:.0f} MB): n = "
                      f"{n}, same fraction of bandwidth {same:.1f}%, transfer rule {rule:.1f}%")
        ratios = transposed_ratios()
        print(f"transposed records, {DEVICES[0]} time / {DEVICES[1]} time: {ratios[0]:.2f}-{ratios[-1]:.2f} "
              f"(median {statistics.median(ratios):.2f}, n = {len(ratios)}); bandwidth ratio "
              f"{_bandwidth(DEVICES[1]) / _bandwidth(DEVICES[0]):.2f}")
        print("default.yaml transposed_memory_efficiency:", transposed_default())
        ratios = broadcast_ratios()
        print(f"innermost-broadcast records, {DEVICES[0]} time / {DEVICES[1]} time: {ratios[0]:.2f}-{ratios[-1]:.2f} "
              f"(median {statistics.median(ratios):.2f}, n = {len(ratios)})")
        print("default.yaml broadcast_memory_efficiency:", transposed_default("broadcast_memory_efficiency"))
    except (AisimError, KeyError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
