"""Achieved fraction of peak for an op, read from the device's calibration data (curves and GEMM tables).

Efficiency is defined as t_roofline / t_measured with t_roofline = max(FLOPs / datasheet peak, bytes / datasheet
bandwidth); the estimate is t_roofline / efficiency. Curves are piecewise linear in log10(size) and flat outside
their range; GEMM tables are interpolated trilinearly in log2(M), log2(N), log2(K).
"""
from __future__ import annotations

import math

import numpy as np

from ..specs import CalibrationSpec, Curve, GemmTable

MIN_EFFICIENCY = 1e-6  # guards against a zero or negative point in a calibration file


def curve_value(curve: Curve, x: float) -> float:
    return max(float(np.interp(x, curve.x, curve.efficiency)), MIN_EFFICIENCY)


def _axis(grid: list[int], value: float) -> tuple[int, int, float]:
    logs = np.log2(np.asarray(grid, dtype=float))
    v = math.log2(max(value, 1.0))
    if v <= logs[0]:
        return 0, 0, 0.0
    if v >= logs[-1]:
        last = len(grid) - 1
        return last, last, 0.0
    hi = int(np.searchsorted(logs, v))
    lo = hi - 1
    return lo, hi, (v - logs[lo]) / (logs[hi] - logs[lo])


def gemm_table_value(table: GemmTable, m: int, n: int, k: int) -> float:
    eff = np.asarray(table.efficiency, dtype=float)
    (m0, m1, fm), (n0, n1, fn), (k0, k1, fk) = _axis(table.m, m), _axis(table.n, n), _axis(table.k, k)
    total = 0.0
    for mi, wm in ((m0, 1 - fm), (m1, fm)):
        for ni, wn in ((n0, 1 - fn), (n1, fn)):
            for ki, wk in ((k0, 1 - fk), (k1, fk)):
                total += wm * wn * wk * eff[mi, ni, ki]
    return max(total, MIN_EFFICIENCY)


def gemm_efficiency(cal: CalibrationSpec, dtype: str, m: int, n: int, k: int, flops: float) -> float:
    """From the M x N x K table where the op has GEMM dimensions, else (convolutions) from the FLOPs curve."""
    table = cal.gemm_tables.get(dtype)
    if table is not None and min(m, n, k) > 0:
        return gemm_table_value(table, m, n, k)
    curve = cal.gemm_efficiency.get(dtype) or cal.gemm_efficiency.get("fp16")
    return curve_value(curve, math.log10(max(flops, 1.0)))


def attention_efficiency(cal: CalibrationSpec, dtype: str, variant: str, flops: float, nbytes: float) -> float:
    """``variant`` is '' (prefill), 'decode' (one query: x = log10 bytes) or 'backward'."""
    key = f"{dtype}-{variant}" if variant else dtype
    curve = cal.attention_efficiency.get(key) or cal.attention_efficiency.get(dtype) \
        or cal.attention_efficiency.get("fp16")
    x = nbytes if variant == "decode" else flops
    return curve_value(curve, math.log10(max(x, 1.0)))


def memory_efficiency(cal: CalibrationSpec, nbytes: float) -> float:
    return curve_value(cal.memory_efficiency, math.log10(max(nbytes, 1.0)))


def runtime_scales(runtime, gpu, cal: CalibrationSpec, dtype: str) -> tuple[float, float]:
    """(compute, memory) efficiency multipliers of an engine on this GPU: its documented plateaus (RuntimeSpec
    .efficiency) over the calibration's (the largest GEMM of the curve, the largest copy), times the profile's
    plain scale factors."""
    backend = runtime.backend_efficiency(gpu, dtype)
    compute, memory = runtime.compute_efficiency_scale, runtime.memory_efficiency_scale
    if backend is None:
        return compute, memory
    curve = cal.gemm_efficiency.get(dtype) or cal.gemm_efficiency.get("fp16")
    table = cal.gemm_tables.get(dtype)
    # the plateau: the largest GEMM of the table (not its maximum, which may be a memory-bound GEMV corner)
    gemm_plateau = (gemm_table_value(table, table.m[-1], table.n[-1], table.k[-1]) if table is not None
                    else max(curve.efficiency))
    memory_plateau = max(cal.memory_efficiency.efficiency)
    return (compute * backend.gemm_fraction_of_peak / gemm_plateau,
            memory * backend.memory_fraction_of_bw / memory_plateau)
