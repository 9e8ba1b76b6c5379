"""Power modes: a GPU clock cap and/or a board power limit, applied kernel by kernel.

A kernel's dynamic power (above the waiting power) scales as (f / f_ref)^alpha with the core clock f, from the
clock f_ref its calibrated time and power belong to (below): alpha = 3 for compute-bound kernels (P = C V^2 f with
the voltage following the clock over the DVFS range) and 1 for memory-bound ones (their DRAM power does not follow
the core clock; only the core's switching does). The clock is the lower of the cap and f_ref; where the kernel
would still draw more than the power limit, the clock drops until it does not: f = f * ((limit - idle) /
(P(f) - idle))^(1/alpha). A kernel's time grows by f_ref / f on its compute floor only: a memory-bound kernel keeps
its time until its compute floor, slowed, overtakes its memory floor. Rules, not measurements (docs/model.md "Power
modes"): the cube law is the textbook DVFS approximation (e.g. Mei, Wang, Chu, "A survey and measurement study of
GPU DVFS on energy conservation", Digital Communications and Networks 2017); memory clocks are taken as fixed.

f_ref is the boost clock, except for the compute-bound tensor-core kernels (GEMMs, attention) whose loops the board
limit holds: a loop drawing the board's power runs below boost, at about the calibration's
``power_limit_mix.gemm_loop_clock_mhz`` (the SM clock sampled through the power_mix GEMM loops,
validation/harness/power_mix.py: 1443 MHz on H100, 1567 MHz on H200, against 1980 MHz boost; NVML reports
sw_power_cap) and never below the clock its achieved FLOP/s needs (u x boost, u its fraction of the datasheet peak:
no cap makes a kernel beat the peak at its clock). Between loop powers of HELD_BAND x board power f_ref moves from
boost to that clock. A cap above f_ref leaves such a kernel as it is: ``--gpu-clock 1500`` does not slow an H100
prefill whose GEMMs already run near 1443 MHz. In a mix, the kernels the limit rule lets draw more than their loops
(cost.energy.limited_energy_j) cannot draw more than the cap allows: ``mix_ratio``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs import CalibrationSpec, HardwareSpec

ALPHA_COMPUTE = 3.0
ALPHA_MEMORY = 1.0
# loop power / board power over which a compute-bound tensor-core kernel goes from running at boost to being held by
# the limit: the power_mix GEMM loops that NVML reported held (sw_power_cap) drew 0.97-1.01 of board power, aisim's
# loop power for them is 0.98 (H100) / 0.99 (H200); a GEMM drawing 0.90 of it is taken as unthrottled
HELD_BAND = (0.90, 0.97)


@dataclass(frozen=True)
class PowerMode:
    power_limit_w: float | None = None
    gpu_clock_mhz: float | None = None


def reference_clock_mhz(gpu: HardwareSpec, cal: CalibrationSpec, gpu_s: np.ndarray, compute_s: np.ndarray,
                        memory_s: np.ndarray, tensor_core: np.ndarray | None = None) -> np.ndarray:
    """Per kernel, the clock its calibrated time and power belong to (module docstring): boost, or for a
    compute-bound tensor-core kernel whose loop the limit holds, max(gemm_loop_clock_mhz, u x boost), blended
    over HELD_BAND of its loop power; boost everywhere where the calibration has no loop clock."""
    from .energy import limit_rule_kernels, op_power_w

    boost = gpu.boost_clock_mhz
    mix = cal.power_limit_mix
    ref = np.full(len(gpu_s), float(boost))
    if mix is None or mix.gemm_loop_clock_mhz is None:
        return ref
    low, high = HELD_BAND
    share = op_power_w(gpu, cal, gpu_s, compute_s, memory_s, tensor_core) / gpu.board_power_w
    weight = np.where(limit_rule_kernels(gpu_s, compute_s, memory_s, tensor_core),
                      np.clip((share - low) / (high - low), 0.0, 1.0), 0.0)
    achieved = np.where(gpu_s > 0, compute_s / np.where(gpu_s > 0, gpu_s, 1.0), 0.0).clip(0, 1)   # u <= 1
    held = np.maximum(min(mix.gemm_loop_clock_mhz, boost), achieved * boost)
    return ref + weight * (held - ref)


def mix_ratio(gpu: HardwareSpec, cal: CalibrationSpec, mode: "PowerMode | None", ref: np.ndarray
              ) -> np.ndarray | None:
    """Per kernel, the power limit rule's ratio (power_limit_mix.compute_dynamic_ratio: a kernel that a loop holds
    at the limit draws more between other kernels, at a higher clock) under a clock cap: at most the cube law's
    (cap / f_ref)^3 (``ref``: reference_clock_mhz), and 1 where the cap is at or below f_ref. None without a cap
    below boost or without a mix block (the block's own ratio: a cap at the boost clock changes nothing)."""
    mix = cal.power_limit_mix
    if mix is None or mode is None or mode.gpu_clock_mhz is None or mode.gpu_clock_mhz >= gpu.boost_clock_mhz:
        return None
    return np.minimum(mix.compute_dynamic_ratio, np.maximum(1.0, (mode.gpu_clock_mhz / ref) ** ALPHA_COMPUTE))


def apply_power_mode(gpu: HardwareSpec, cal: CalibrationSpec, mode: PowerMode, gpu_s: np.ndarray,
                     compute_s: np.ndarray, memory_s: np.ndarray, tensor_core: np.ndarray | None = None,
                     ref: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(kernel seconds, kernel watts) per op under ``mode``; ``tensor_core``: per kernel, whether it runs on tensor
    cores, ``ref``: the kernels' reference clocks where the caller has them (reference_clock_mhz)."""
    from .energy import op_power_w, waiting_power_w

    boost = gpu.boost_clock_mhz
    idle_w = waiting_power_w(gpu, cal)
    full_w = op_power_w(gpu, cal, gpu_s, compute_s, memory_s, tensor_core)
    compute_bound = compute_s >= memory_s
    alpha = np.where(compute_bound, ALPHA_COMPUTE, ALPHA_MEMORY)
    ref = reference_clock_mhz(gpu, cal, gpu_s, compute_s, memory_s, tensor_core) if ref is None else ref
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
