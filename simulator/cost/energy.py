"""Energy of one step: a power model over the op timeline, never above board power.

Each kernel draws P = P_idle + max(D_c, D_m) + overlap * min(D_c, D_m) (overlap on tensor-core kernels only), with
D_c = a_c * (P_compute - P_idle) and D_m = a_m * (P_memory - P_idle) its two activities' power above the waiting
power, where P_compute and P_memory are the calibrated power while looping the reference loads (an 8192^3 bf16
GEMM, a 1 GiB copy: see validation/calibrate.py bench_power), and a_c, a_m the kernel's activity relative to those
loads: the fraction of peak FLOP/s (bandwidth) it achieves divided by the fraction the reference load achieves, at
most 1 (a GEMM at the reference GEMM's efficiency draws the reference power, plus the overlap share of its own
memory activity). ``overlap`` (the calibration's power_overlap): a kernel that keeps both the tensor cores and HBM
busy (a GEMM of a few rows streaming its weights) draws more than either activity alone; 0 takes the larger alone.
The GPU draws P_idle while it waits. P_idle is the
calibrated power under back-to-back tiny kernels (clocks up, SMs nearly idle) where measured, else idle power. Energy is
summed over all GPUs used. Where the calibration has measured power curves (GEMM and copy loops at several
sizes), a kernel's power is read off them at its achieved fraction of peak instead (``_curve_power_w``). Under the
board's power limit (the calibration's ``power_limit_mix``) the step's tensor-core compute-bound kernels draw more
than their loops did and the step's average is held near the limit (``limited_energy_j``).
Reference: the utilization-based GPU power models of Hong & Kim (ISCA 2010) and AccelWattch (MICRO 2021),
reduced to two activity factors. Known inaccuracies: clocks and temperature are taken as steady.
"""
from __future__ import annotations

import numpy as np

from ..specs import CalibrationSpec, HardwareSpec


POWER_LOAD_GEMM_MNK = (8192, 8192, 8192)   # the compute-bound power load of aisim calibrate (bf16)
POWER_LOAD_COPY_BYTES = 2 * 2**30          # the memory-bound power load: a 1 GiB clone (read + write)


def reference_activity(gpu: HardwareSpec, cal: CalibrationSpec) -> tuple[float, float]:
    """Fractions of peak FLOP/s and bandwidth that the calibration's power loads achieve."""
    from .efficiency import gemm_efficiency, memory_efficiency

    m, n, k = POWER_LOAD_GEMM_MNK
    flops = 2.0 * m * n * k
    compute = gemm_efficiency(cal, "bf16" if gpu.peak_flops_per_s.bf16 else "fp16", m, n, k, flops)
    memory = memory_efficiency(cal, POWER_LOAD_COPY_BYTES)
    return compute, memory


def _combined_w(idle_w: float, compute_w: np.ndarray, memory_w: np.ndarray, overlap: np.ndarray | float,
                board_w: float) -> np.ndarray:
    """The larger activity's power above the waiting power plus ``overlap`` of the smaller's, at most board power."""
    d_c, d_m = np.maximum(compute_w - idle_w, 0.0), np.maximum(memory_w - idle_w, 0.0)
    return np.minimum(idle_w + np.maximum(d_c, d_m) + overlap * np.minimum(d_c, d_m), board_w)


def _curve_power_w(gpu: HardwareSpec, cal: CalibrationSpec, u_c: np.ndarray, u_m: np.ndarray,
                   overlap: np.ndarray | float = 0.0) -> np.ndarray:
    """Measured power curves: a kernel achieving a fraction u of peak FLOP/s (bandwidth) draws what a bf16 GEMM
    loop (a copy loop) achieving u drew in calibration; the two combined (_combined_w), at most board power."""
    p_c = np.interp(u_c, cal.power_compute_curve.x, cal.power_compute_curve.efficiency) * gpu.board_power_w
    p_m = np.interp(u_m, cal.power_memory_curve.x, cal.power_memory_curve.efficiency) * gpu.board_power_w
    if not np.any(overlap):
        return np.minimum(np.maximum(p_c, p_m), gpu.board_power_w)
    return _combined_w(waiting_power_w(gpu, cal), p_c, p_m, overlap, gpu.board_power_w)


def _linear_power_w(gpu: HardwareSpec, cal: CalibrationSpec, u_c: np.ndarray, u_m: np.ndarray,
                    idle_w: float, overlap: np.ndarray | float = 0.0) -> np.ndarray:
    """Two calibrated loads: power rises linearly with the activity relative to each load, at most board power."""
    ref_c, ref_m = reference_activity(gpu, cal)
    compute_w = cal.power_compute_fraction * gpu.board_power_w
    memory_w = cal.power_memory_fraction * gpu.board_power_w
    a_c, a_m = (u_c / ref_c).clip(0, 1), (u_m / ref_m).clip(0, 1)
    return _combined_w(idle_w, idle_w + a_c * max(compute_w - idle_w, 0), idle_w + a_m * max(memory_w - idle_w, 0),
                       overlap, gpu.board_power_w)


def waiting_power_w(gpu: HardwareSpec, cal: CalibrationSpec) -> float:
    """Power of a GPU that waits during a step: the active-idle load where measured, else idle power."""
    return cal.active_power_w or (cal.idle_power_w if cal.idle_power_w is not None else gpu.idle_power_w)


def op_power_w(gpu: HardwareSpec, cal: CalibrationSpec, gpu_s: np.ndarray, compute_s: np.ndarray,
               memory_s: np.ndarray, tensor_core: np.ndarray | None = None) -> np.ndarray:
    """Power each kernel draws at full clocks, from its achieved fractions of peak FLOP/s and bandwidth; the
    calibration's power_overlap applies to the tensor-core kernels (``tensor_core``; none where not given): the
    loads it was measured on, GEMMs streaming their weights. An elementwise kernel's FLOPs are CUDA-core work read
    against the tensor-core peak, and the reference loads already draw their own secondary activity."""
    busy = gpu_s > 0
    safe = np.where(busy, gpu_s, 1.0)
    u_c = np.where(busy, compute_s / safe, 0.0).clip(0, 1)   # achieved fraction of peak FLOP/s
    u_m = np.where(busy, memory_s / safe, 0.0).clip(0, 1)    # achieved fraction of bandwidth
    overlap = (np.where(tensor_core, cal.power_overlap, 0.0) if tensor_core is not None and cal.power_overlap
               else 0.0)
    if cal.power_compute_curve is not None and cal.power_memory_curve is not None:
        return _curve_power_w(gpu, cal, u_c, u_m, overlap)
    return _linear_power_w(gpu, cal, u_c, u_m, waiting_power_w(gpu, cal), overlap)


TENSOR_CORE_DTYPES = ("fp16", "bf16", "tf32", "fp8", "int8")


def limit_rule_kernels(gpu_s: np.ndarray, compute_s: np.ndarray, memory_s: np.ndarray,
                       tensor_core: np.ndarray | None = None) -> np.ndarray:
    """Per kernel: whether the power-limit rule applies to it: compute-bound kernels with FLOPs (not collectives) on
    tensor cores (``tensor_core``; default: every kernel). fp32 GEMMs run on CUDA cores, whose loops stay under the
    limit."""
    mask = (compute_s >= memory_s) & (compute_s > 0) & (gpu_s > 0)
    return mask & tensor_core if tensor_core is not None else mask


def limited_energy_j(gpu: HardwareSpec, cal: CalibrationSpec, power_w: np.ndarray, gpu_s: np.ndarray,
                     compute_s: np.ndarray, memory_s: np.ndarray, repeats: np.ndarray, runtime_s: float,
                     tensor_core: np.ndarray | None = None, limit_w: float | None = None,
                     ratio: np.ndarray | None = None) -> float:
    """Energy of one GPU over a step of ``runtime_s``: its kernels, and the waiting power while it waits. Under the
    board's power limit (``cal.power_limit_mix``) each compute-bound tensor-core kernel's power above the waiting
    power is scaled by ``compute_dynamic_ratio`` (a loop of it is held back by the limit; between other kernels or
    waits it runs unthrottled) and the step's average power is held to ``limit_fraction`` of board power. fp32
    GEMMs (CUDA cores: their loops stay under the limit) keep their loop power. ``tensor_core``: per kernel, whether
    it runs on tensor cores (default: every kernel). ``limit_w``: a power mode's lower limit (default: board
    power). ``ratio``: per kernel, the ratio under a power mode's clock cap (cost.power.mix_ratio; default the
    block's). Without the block: each kernel's own loop power."""
    idle_w = waiting_power_w(gpu, cal)
    busy_s = float(np.dot(gpu_s, repeats))
    waiting_j = idle_w * max(runtime_s - busy_s, 0.0)
    mix = cal.power_limit_mix
    if mix is None:
        return float(np.dot(power_w * gpu_s, repeats)) + waiting_j
    throttled = limit_rule_kernels(gpu_s, compute_s, memory_s, tensor_core)
    ratio = mix.compute_dynamic_ratio if ratio is None else ratio
    unthrottled = np.where(throttled, idle_w + (power_w - idle_w) * ratio, power_w)
    energy = float(np.dot(unthrottled * gpu_s, repeats)) + waiting_j
    limit = min(gpu.board_power_w, limit_w) if limit_w else gpu.board_power_w
    return min(energy, mix.limit_fraction * limit * max(runtime_s, busy_s))


def step_energy_j(gpu: HardwareSpec, cal: CalibrationSpec, gpu_s: np.ndarray, compute_s: np.ndarray,
                  memory_s: np.ndarray, repeats: np.ndarray, runtime_s: float, gpus: int,
                  power_w: np.ndarray | None = None, tensor_core: np.ndarray | None = None,
                  limit_w: float | None = None, ratio: np.ndarray | None = None) -> tuple[float, float]:
    """(energy in J over all GPUs, average power per GPU in W). ``power_w``: per-kernel power where a power mode
    (cost.power) has already set it, ``limit_w`` that mode's power limit; ``tensor_core``: per kernel, whether it
    runs on tensor cores, ``ratio`` the limit rule's per-kernel ratio under a clock cap (limited_energy_j)."""
    if power_w is None:
        power_w = op_power_w(gpu, cal, gpu_s, compute_s, memory_s, tensor_core)
    energy = limited_energy_j(gpu, cal, power_w, gpu_s, compute_s, memory_s, repeats, runtime_s, tensor_core, limit_w,
                              ratio)
    avg_w = energy / runtime_s if runtime_s > 0 else 0.0
    return energy * gpus, avg_w
