"""Power modes: a GPU clock cap and/or a board power limit, applied kernel by kernel.

A kernel's dynamic power (above the waiting power) scales as (f / f_boost)^alpha with the core clock f:
alpha = 3 for compute-bound kernels (P = C V^2 f with the voltage following the clock over the DVFS range) and
1 for memory-bound ones (their DRAM power does not follow the core clock; only the core's switching does).
The clock is the lower of the cap and the boost clock; where the kernel would still draw more than the power
limit, the clock drops until it does not: f = f_cap * ((limit - idle) / (P(f_cap) - idle))^(1/alpha).
A kernel's time grows by f_boost / f on its compute floor only: a memory-bound kernel keeps its time until its
compute floor, slowed, overtakes its memory floor. Rules, not measurements (docs/model.md "Power modes"):
the cube law is the textbook DVFS approximation (e.g. Mei, Wang, Chu, "A survey and measurement study of GPU
DVFS on energy conservation", Digital Communications and Networks 2017); memory clocks are taken as fixed.

The clock a kernel's calibrated time and power belong to is the boost clock, except for the kernels whose loops the
board limit holds: a 16-bit GEMM loop drawing the board's power runs at the calibration's
``power_limit_mix.gemm_loop_clock_mhz`` (NVML, validation/harness/power_mix.py: 1260-1350 MHz on H100, 1440-1470 MHz
on H200, against 1980 MHz boost). Such a kernel is slowed by a clock cap only below that clock, and its power scales
from there: ``--gpu-clock 1335`` barely changes an H100 prefill whose GEMMs already run near 1335 MHz.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs import CalibrationSpec, HardwareSpec

ALPHA_COMPUTE = 3.0
ALPHA_MEMORY = 1.0
# a compute-bound tensor-core kernel whose loop power is within this of board power is held by the limit: the
# power_mix GEMM loops drew 0.98-1.01 (H100) and 0.97 (H200) of it, aisim's loop power for them 0.98 / 0.99
HELD_POWER_FRACTION = 0.95


@dataclass(frozen=True)
class PowerMode:
    power_limit_w: float | None = None
    gpu_clock_mhz: float | None = None


def held_kernels(gpu: HardwareSpec, cal: CalibrationSpec, gpu_s: np.ndarray, compute_s: np.ndarray,
                 memory_s: np.ndarray, tensor_core: np.ndarray | None = None) -> np.ndarray:
    """Per kernel: whether a loop of it is held at the board limit (compute-bound, on tensor cores, its loop power
    within HELD_POWER_FRACTION of board power), where the calibration knows the clock it is held at."""
    from .energy import op_power_w

    mix = cal.power_limit_mix
    if mix is None or mix.gemm_loop_clock_mhz is None:
        return np.zeros(len(gpu_s), dtype=bool)
    held = (compute_s >= memory_s) & (compute_s > 0) & (gpu_s > 0)
    if tensor_core is not None:
        held &= tensor_core
    return held & (op_power_w(gpu, cal, gpu_s, compute_s, memory_s) >= HELD_POWER_FRACTION * gpu.board_power_w)


def apply_power_mode(gpu: HardwareSpec, cal: CalibrationSpec, mode: PowerMode, gpu_s: np.ndarray,
                     compute_s: np.ndarray, memory_s: np.ndarray, tensor_core: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(kernel seconds, kernel watts) per op under ``mode``; ``tensor_core``: per kernel, whether it runs on tensor
    cores (held_kernels; default: every kernel)."""
    from .energy import op_power_w, waiting_power_w

    boost = gpu.boost_clock_mhz
    idle_w = waiting_power_w(gpu, cal)
    full_w = op_power_w(gpu, cal, gpu_s, compute_s, memory_s)
    compute_bound = compute_s >= memory_s
    alpha = np.where(compute_bound, ALPHA_COMPUTE, ALPHA_MEMORY)
    # the clock each kernel's calibrated time and power belong to
    ref = np.where(held_kernels(gpu, cal, gpu_s, compute_s, memory_s, tensor_core),
                   min(cal.power_limit_mix.gemm_loop_clock_mhz, boost) if cal.power_limit_mix else boost, boost)
    f_cap = min(mode.gpu_clock_mhz or boost, boost)
    dynamic_w = np.maximum(full_w - idle_w, 0.0)
    clock = np.minimum(ref, f_cap)
    capped_w = idle_w + dynamic_w * (clock / ref) ** alpha
    if mode.power_limit_w is not None:
        over = (capped_w > mode.power_limit_w) & (dynamic_w > 0)
        headroom = max(mode.power_limit_w - idle_w, 1e-3)
        ratio = np.where(over, headroom / np.maximum(capped_w - idle_w, 1e-9), 1.0)
        clock = np.where(over, clock * ratio ** (1.0 / alpha), clock)
    power_w = idle_w + dynamic_w * (clock / ref) ** alpha
    power_w = np.where(gpu_s > 0, power_w, 0.0)
    floor = np.maximum(np.maximum(compute_s, memory_s), 1e-30)
    slow = np.maximum(1.0, compute_s / floor * ref / clock)
    return gpu_s * slow, power_w
