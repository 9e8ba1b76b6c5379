"""Energy of one step: a power model over the op timeline, never above board power.

Each kernel draws P = P_idle + max(u_c * (P_compute - P_idle), u_m * (P_memory - P_idle)), where u_c and u_m
are the fractions of peak FLOP/s and bandwidth it achieves and P_compute, P_memory the calibrated power at full
compute-bound and memory-bound load; the GPU draws P_idle while it waits. Energy is summed over all GPUs used.
Reference: the utilization-based GPU power models of Hong & Kim (ISCA 2010) and AccelWattch (MICRO 2021),
reduced to two activity factors. Known inaccuracies: clocks and temperature are taken as steady.
"""
from __future__ import annotations

import numpy as np

from ..specs import CalibrationSpec, HardwareSpec


def step_energy_j(gpu: HardwareSpec, cal: CalibrationSpec, gpu_s: np.ndarray, compute_s: np.ndarray,
                  memory_s: np.ndarray, repeats: np.ndarray, runtime_s: float, gpus: int) -> tuple[float, float]:
    """(energy in J over all GPUs, average power per GPU in W)."""
    idle_w = cal.idle_power_w if cal.idle_power_w is not None else gpu.idle_power_w
    compute_w = cal.power_compute_fraction * gpu.board_power_w
    memory_w = cal.power_memory_fraction * gpu.board_power_w
    busy = gpu_s > 0
    u_c = np.where(busy, compute_s / np.where(busy, gpu_s, 1.0), 0.0).clip(0, 1)
    u_m = np.where(busy, memory_s / np.where(busy, gpu_s, 1.0), 0.0).clip(0, 1)
    power_w = idle_w + np.maximum(u_c * max(compute_w - idle_w, 0), u_m * max(memory_w - idle_w, 0))
    power_w = np.minimum(power_w, gpu.board_power_w)
    busy_s = float(np.dot(gpu_s, repeats))
    energy = float(np.dot(power_w * gpu_s, repeats)) + idle_w * max(runtime_s - busy_s, 0.0)
    avg_w = energy / runtime_s if runtime_s > 0 else 0.0
    return energy * gpus, avg_w
