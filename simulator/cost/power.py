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
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs import CalibrationSpec, HardwareSpec

ALPHA_COMPUTE = 3.0
ALPHA_MEMORY = 1.0


@dataclass(frozen=True)
class PowerMode:
    power_limit_w: float | None = None
    gpu_clock_mhz: float | None = None


def apply_power_mode(gpu: HardwareSpec, cal: CalibrationSpec, mode: PowerMode, gpu_s: np.ndarray,
                     compute_s: np.ndarray, memory_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kernel seconds, kernel watts) per op under ``mode``."""
    from .energy import op_power_w, waiting_power_w

    boost = gpu.boost_clock_mhz
    idle_w = waiting_power_w(gpu, cal)
    full_w = op_power_w(gpu, cal, gpu_s, compute_s, memory_s)
    compute_bound = compute_s >= memory_s
    alpha = np.where(compute_bound, ALPHA_COMPUTE, ALPHA_MEMORY)
    f_cap = min(mode.gpu_clock_mhz or boost, boost)
    dynamic_w = np.maximum(full_w - idle_w, 0.0)
    capped_w = idle_w + dynamic_w * (f_cap / boost) ** alpha
    clock = np.full(len(gpu_s), float(f_cap))
    if mode.power_limit_w is not None:
        over = (capped_w > mode.power_limit_w) & (dynamic_w > 0)
        headroom = max(mode.power_limit_w - idle_w, 1e-3)
        ratio = np.where(over, headroom / np.maximum(capped_w - idle_w, 1e-9), 1.0)
        clock = np.where(over, f_cap * ratio ** (1.0 / alpha), clock)
    power_w = idle_w + dynamic_w * (clock / boost) ** alpha
    power_w = np.where(gpu_s > 0, power_w, 0.0)
    floor = np.maximum(np.maximum(compute_s, memory_s), 1e-30)
    slow = np.maximum(1.0, compute_s / floor * boost / clock)
    return gpu_s * slow, power_w
