"""Achieved fraction of peak for an op, read from the device's calibration data (curves and GEMM tables).

Efficiency is defined as t_roofline / t_measured with t_roofline = max(FLOPs / datasheet peak, bytes / datasheet
bandwidth); the estimate is t_roofline / efficiency. Curves are piecewise linear in log10(size) and flat outside
their range; GEMM tables are interpolated trilinearly in log2(M), log2(N), log2(K).

Portability (a calibration measured on one GPU, or rules written against one, applied to another): a curve's x is
read at the size that is equivalent on the reference GPU (``CalibrationSpec.reference_gpu``, default its device):
- memory-bound curves (bytes): equal roofline time, x * BW_ref / BW_gpu. By Little's law a kernel saturates
  bandwidth once bandwidth x latency bytes are in flight, so the ramp of achieved bandwidth over size moves with
  the bandwidth, and a small kernel's fixed duration (~2-5 us on H100 and H200 alike) stays a duration.
- compute-bound curves (FLOPs): equal work per SM, x * SMs_ref / SMs_gpu: how many waves of output tiles a GEMM
  fills depends on the SM count (NVIDIA, Matrix Multiplication Background User's Guide, "Wave quantization").
- GEMMs below the ridge point (arithmetic intensity < peak / bandwidth: decode, mat-vec) are memory-bound: a
  calibration without a GEMM table reads ``gemm_memory_efficiency`` over bytes, never the FLOPs curve (which gave
  a decode GEMM the efficiency of a tiny compute-bound GEMM: 25% of bandwidth at batch 1). A batched GEMM below
  the ridge point reads that curve with or without a table (``batched_gemm_memory_efficiency``).
- a memory-bound entry of a GEMM table (a decode GEMM) keeps its measured time less the part that streams at
  ``stream_bandwidth_fraction`` of the reference bandwidth as a duration (launch, ramp, the kernel's own limit on
  loads in flight) and streams the bytes at the same fraction of the target's bandwidth
  (``transferred_memory_efficiency``): a large copy or add reaches 0.89-0.92 of datasheet on H100 and H200
  alike, while the same decode GEMM reaches 0.75 of H100's 3.35 TB/s and 0.69 of H200's 4.8 TB/s. On the
  calibrations' raw GEMM records below the target's ridge point (bf16/fp16, 130-148 shapes), H100 -> H200 MAPE
  28.8% -> 10.0% (<= 64 MB) and 5.2% -> 3.2% (larger); H200 -> H100 41.3% -> 11.3% and 6.4% -> 3.9%
  (``python -m aisim.validation.scripts.derive_transfer_rules``).
- an op reading a transposed operand keeps its time at the same bytes, scaled by SMs x clock
  (``transposed_efficiency``): uncoalesced reads run at the same rate on H100 and H200.
Plateaus (the fraction of peak a large kernel reaches) are kept as fractions of the datasheet figure.
Known inaccuracy: a GEMM table is read by shape, unscaled (exact between GPUs of one SM count, H100/H200), and the
duration part of a transferred memory-bound entry is not rescaled to another SM count.
"""
from __future__ import annotations

import math

import numpy as np

from ..specs import CalibrationSpec, Curve, GemmTable, HardwareSpec, WaveTiles, all_hardware, default_calibration

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


def wave_fill(tiles: WaveTiles, m: int, n: int, sms: int) -> float:
    """The fraction of SM slots a GEMM's output tiles fill over its waves (1 below ``tiles.min_waves`` full waves,
    where cuBLAS picks smaller tiles)."""
    count = math.ceil(m / tiles.tile_m) * math.ceil(n / tiles.tile_n)
    slots = sms * tiles.ctas_per_sm
    if count < tiles.min_waves * slots:
        return 1.0
    return count / (math.ceil(count / slots) * slots)


def wave_factor(tiles: WaveTiles, table: GemmTable, m: int, n: int, sms: int) -> float:
    """The shape's wave fill over the fill the table's interpolation carries (its grid neighbours' fills, with the
    same log2 weights in M and N): a measured grid point keeps its value, a shape between points pays its own
    partial wave."""
    (m0, m1, fm), (n0, n1, fn) = _axis(table.m, m), _axis(table.n, n)
    carried = sum(wm * wn * wave_fill(tiles, table.m[mi], table.n[ni], sms)
                  for mi, wm in ((m0, 1 - fm), (m1, fm)) for ni, wn in ((n0, 1 - fn), (n1, fn)))
    return wave_fill(tiles, m, n, sms) / carried


def reference_gpu(cal: CalibrationSpec) -> HardwareSpec | None:
    """The GPU whose datasheet the calibration's x axes refer to (None: no such GPU spec, read x unscaled)."""
    return all_hardware().get(cal.reference_gpu or cal.device)


def size_scale(cal: CalibrationSpec, gpu: HardwareSpec | None, axis: str) -> float:
    """Multiplier on a curve's x that reads it at the equivalent size on the reference GPU: bandwidth ratio for
    ``axis='bytes'`` (equal roofline time), SM-count ratio for ``axis='flops'`` (equal work per SM); 1 on the
    reference GPU itself."""
    ref = reference_gpu(cal) if gpu is not None else None
    if ref is None or ref.name == gpu.name:
        return 1.0
    if axis == "bytes":
        return ref.memory_bw_bytes_per_s / gpu.memory_bw_bytes_per_s
    return ref.sm_count / gpu.sm_count


def _log_x(x: float, scale: float) -> float:
    return math.log10(max(x * scale, 1.0))


def transferred_memory_efficiency(cal: CalibrationSpec, efficiency: float, nbytes: float,
                                  gpu: HardwareSpec | None, flops: float = 0.0, dtype: str = "bf16") -> float:
    """A memory-bound efficiency measured on the calibration's reference GPU, read on ``gpu``: the measured time
    (the entry's roofline on the reference, FLOPs or bytes, over the efficiency) less its streaming part (bytes at
    ``stream_bandwidth_fraction`` of the reference's bandwidth) stays a duration, the bytes stream at that fraction
    of this GPU's bandwidth. Unchanged on the reference GPU itself."""
    ref = reference_gpu(cal) if gpu is not None else None
    if ref is None or ref.name == gpu.name or nbytes <= 0:
        return efficiency
    fraction = cal.stream_bandwidth_fraction or default_calibration().stream_bandwidth_fraction
    if not fraction:
        return efficiency
    measured_s = max(flops / ref.peak_for(dtype), nbytes / ref.memory_bw_bytes_per_s) / efficiency
    seconds = (max(measured_s - nbytes / (fraction * ref.memory_bw_bytes_per_s), 0.0)
               + nbytes / (fraction * gpu.memory_bw_bytes_per_s))
    roofline_s = max(flops / gpu.peak_for(dtype), nbytes / gpu.memory_bw_bytes_per_s)
    return max(roofline_s / seconds, MIN_EFFICIENCY)


def gemm_efficiency(cal: CalibrationSpec, dtype: str, m: int, n: int, k: int, flops: float, nbytes: float = 0.0,
                    memory_bound: bool = False, gpu: HardwareSpec | None = None, batched: bool = False) -> float:
    """From the M x N x K table where the op has GEMM dimensions (a memory-bound entry read on another GPU than the
    table's: ``transferred_memory_efficiency``); else, below the ridge point, from the dtype's own memory-bound curve
    over bytes (gemm_efficiency['<dtype>-memory'], e.g. fp8-memory), the file's memory-bound GEMM curve or the
    default rules' one; else (and for convolutions) from the FLOPs curve."""
    table = cal.gemm_tables.get(dtype)
    if table is not None and min(m, n, k) > 0:
        value = gemm_table_value(table, m, n, k)
        tiles = cal.gemm_wave_tiles.get(dtype)
        if tiles is not None and gpu is not None and not memory_bound and not batched:   # rule of 2-D mm sweeps
            value *= wave_factor(tiles, table, m, n, gpu.sm_count)
        return transferred_memory_efficiency(cal, value, nbytes, gpu, flops, dtype) if memory_bound else value
    if memory_bound:
        # this dtype's own memory-bound curve over bytes, else the file's, else the default rules' (a measured file
        # with tables only, e.g. h200.yaml, has neither for fp8: its FLOPs curve would be the fp16 one)
        streaming = (cal.gemm_efficiency.get(f"{dtype}-memory") or cal.gemm_memory_efficiency
                     or default_calibration().gemm_memory_efficiency)
        if streaming is not None:
            return curve_value(streaming, _log_x(nbytes, size_scale(cal, gpu, "bytes")))
    curve = cal.gemm_efficiency.get(dtype) or cal.gemm_efficiency.get("fp16")
    return curve_value(curve, _log_x(flops, size_scale(cal, gpu, "flops")))


def attention_efficiency(cal: CalibrationSpec, dtype: str, variant: str, flops: float, nbytes: float,
                         gpu: HardwareSpec | None = None) -> float:
    """``variant`` is '' (prefill), 'decode' (one query: x = log10 bytes) or 'backward'."""
    key = f"{dtype}-{variant}" if variant else dtype
    curve = cal.attention_efficiency.get(key) or cal.attention_efficiency.get(dtype) \
        or cal.attention_efficiency.get("fp16")
    if variant == "decode":
        return curve_value(curve, _log_x(nbytes, size_scale(cal, gpu, "bytes")))
    return curve_value(curve, _log_x(flops, size_scale(cal, gpu, "flops")))


# rows of queries per thread block of PyTorch's memory-efficient attention kernel (as studies/serve/timer.py reads it)
SDPA_QUERY_BLOCK = 64


def masked_attention_efficiency(cal: CalibrationSpec, gpu: HardwareSpec, q: int, k: int,
                                batch_heads: int) -> float | None:
    """SDPA with an explicit mask (PyTorch's masked kernel): the calibration's measured Q x K table (batch 1, its
    ``heads``; bilinear in log10 of both axes, clamped), rescaled from the table's grid of ceil(Q/64) x heads
    thread blocks to this call's ceil(Q/64) x batch x heads by SM occupancy (each block streams its head's keys
    alone, so fewer blocks than SMs leave SMs idle), and never beyond the best the table's row at this Q reached
    (its largest K). None where the calibration has no table.
    Known inaccuracy: the table was timed per call with CUDA events, so its small shapes carry the eager call's
    host dispatch (the q = 1 row: ~24 us at 256 keys, +5.3 ns per key); a CUDA graph replays without it."""
    table = cal.masked_attention_table
    if table is None:
        return None
    lq, lk = np.log10(table.q), np.log10(table.k)
    row = [float(np.interp(math.log10(max(q, 1)), lq, column)) for column in zip(*table.efficiency)]
    eff = float(np.interp(math.log10(max(k, 1)), lk, row))
    q_blocks = math.ceil(q / SDPA_QUERY_BLOCK)
    occupancy = min(1.0, q_blocks * batch_heads / gpu.sm_count) / min(1.0, q_blocks * table.heads / gpu.sm_count)
    return max(min(eff * occupancy, max(max(row), eff)), MIN_EFFICIENCY)


def grouped_gemm_efficiency(cal: CalibrationSpec, dtype: str, m: int, n: int, k: int, nbytes: float = 0.0,
                            memory_bound: bool = False, gpu: HardwareSpec | None = None) -> float | None:
    """A grouped expert GEMM (torch._grouped_mm) with m rows per touched expert: the calibration's measured grouped
    table for the dtype (trilinear in log2 m, n, k, clamped), None where it has none (the caller then reads the
    dense table). Read by shape, unscaled, like the dense tables (a memory-bound entry on another GPU:
    ``transferred_memory_efficiency``)."""
    table = cal.grouped_gemm_tables.get(dtype)
    if table is None or min(m, n, k) <= 0:
        return None
    value = gemm_table_value(table, m, n, k)
    return transferred_memory_efficiency(cal, value, nbytes, gpu, 2.0 * m * n * k, dtype) if memory_bound else value


# ATen ops -> the kernel family whose own measured curve prices them where the calibration has it
# (memory_op_efficiency). PyTorch's vectorized cat (a DynamicCache KV-cache append) plateaus at 0.85 (H100) and 0.82
# (H200) of bandwidth in its own microbenchmark (validation/harness/eager_attention.py, contiguous cats), where the
# median over calibrate's elementwise kernels (memory_efficiency) sits at 0.89 and 0.80 and a clone at 0.90 and 0.89
MEMORY_OP_FAMILY = {"aten.cat": "cat"}


def memory_efficiency(cal: CalibrationSpec, nbytes: float, gpu: HardwareSpec | None = None,
                      transposed: bool = False, broadcast: bool = False, family: str | None = None) -> float:
    """The memory-bound curve (``family``: that kernel family's own curve where the calibration has it,
    ``memory_op_efficiency``; ``transposed``: the strided-operand one where the calibration has it,
    ``transposed_efficiency``; ``broadcast``: the innermost-broadcast one where it has it, never above the contiguous
    curve, which holds the launch-bound small sizes the broadcast curve was not measured at)."""
    x = _log_x(nbytes, size_scale(cal, gpu, "bytes"))
    own = cal.memory_op_efficiency.get(family) if family else None
    contiguous = curve_value(own if own is not None else cal.memory_efficiency, x)
    if transposed and cal.transposed_memory_efficiency is not None:
        return min(transposed_efficiency(cal, nbytes, gpu), contiguous)
    if broadcast and not transposed and cal.broadcast_memory_efficiency is not None:
        return min(per_sm_cycle_efficiency(cal, cal.broadcast_memory_efficiency, nbytes, gpu), contiguous)
    return contiguous


def transposed_efficiency(cal: CalibrationSpec, nbytes: float, gpu: HardwareSpec | None = None) -> float:
    """An elementwise op reading an operand across its innermost dim (uncoalesced): a rate per SM-cycle, not a
    fraction of bandwidth. The raw copy_t / add_t records take 1.0-1.36x as long on an H100 as on an H200, whose
    bandwidth is 1.43x and whose SMs and clock are the H100's (python -m aisim.validation.scripts.
    derive_transfer_rules); so on another GPU than the reference the curve's time at the same bytes is kept,
    scaled by SMs x clock (an assumption beyond those two GPUs, as for strided_cat_elements_per_sm_cycle)."""
    return per_sm_cycle_efficiency(cal, cal.transposed_memory_efficiency, nbytes, gpu)


def per_sm_cycle_efficiency(cal: CalibrationSpec, curve, nbytes: float, gpu: HardwareSpec | None = None) -> float:
    """A curve of an SM-bound elementwise kernel (the transposed-operand curve; the innermost-broadcast curve of
    PyTorch's non-vectorized kernel, whose H100 records take 1.1x an H200's time at 1.43x less bandwidth:
    derive_transfer_rules): on the reference GPU its value at the bytes; on another GPU the reference's time at the
    same bytes, scaled by SMs x clock, as a fraction of this GPU's bandwidth."""
    eff = curve_value(curve, _log_x(nbytes, 1.0))
    ref = reference_gpu(cal) if gpu is not None else None
    if ref is None or ref.name == gpu.name:
        return eff
    return max(eff * _sm_cycle_scale(ref, gpu), MIN_EFFICIENCY)


def batched_gemm_memory_efficiency(cal: CalibrationSpec, nbytes: float, gpu: HardwareSpec | None = None) -> float:
    """A batched GEMM below the ridge point: explicit attention's Q K^T and P V at decode, batch x heads GEMVs over
    their own K or V blocks in one strided-batched cuBLAS call, streams its operands as a skinny GEMM does: the
    skinny-GEMM curve over bytes (``gemm_memory_efficiency``; the default rules' where the calibration has none),
    not a GEMM table read at (batch x M) x N x K, a dense GEMM of a fraction of the bytes (which made BLOOM's decode
    bmm 5-8x too slow on a calibrated H100). Measured: validation/harness/eager_attention.py (bmm section)."""
    owner = cal if cal.gemm_memory_efficiency is not None else default_calibration()
    return curve_value(owner.gemm_memory_efficiency, _log_x(nbytes, size_scale(owner, gpu, "bytes")))


def strided_cat_s(cal: CalibrationSpec, gpu: HardwareSpec, out_elements: float) -> float:
    """Kernel time of PyTorch's CUDA cat when an input is not contiguous (``strided_cat_elements_per_sm_cycle``;
    the default rules' rate where the calibration has none): output elements over a per-SM-cycle rate."""
    rate = cal.strided_cat_elements_per_sm_cycle or default_calibration().strided_cat_elements_per_sm_cycle
    return out_elements / (rate * gpu.sm_count * gpu.boost_clock_mhz * 1e6) if rate else 0.0


UNALIGNED_MIN_ROWS = 512     # gemm_align.py: 512 rows reach 0.93 of the plateau, 128 rows 0.80 (not applied)


def unaligned_gemm_efficiency(cal: CalibrationSpec, gpu: HardwareSpec, which: str, rows: int) -> float | None:
    """The plateau of a 16-bit GEMM of ``rows`` rows whose output (``which`` = "output") or an input ("input") has
    a leading dimension off the 16-byte alignment cuBLAS's fast kernels need, on this GPU's architecture (the
    default rules' where the calibration has none; validation/harness/gemm_align.py); None: not modelled (another
    architecture, or fewer rows than were measured)."""
    if rows < UNALIGNED_MIN_ROWS:
        return None
    return _rule(cal, "unaligned_gemm_efficiency").get(gpu.architecture, {}).get(which)


def _rule(cal: CalibrationSpec, field: str) -> dict:
    """A measured-rule table of the calibration, or the default rules' where the calibration has none."""
    return getattr(cal, field) or getattr(default_calibration(), field)


def broadcast_fraction(cal: CalibrationSpec, field: str, element_bytes: int,
                       gpu: HardwareSpec | None = None) -> float | None:
    """``broadcast_copy_bandwidth_fraction`` or ``outer_broadcast_bandwidth_fraction`` for this element size
    (validation/harness/broadcast_ops.py); None: not modelled. PyTorch's non-vectorized kernel is SM-bound: the H200
    copies from an expanded operand and adds an outer broadcast at the H100's absolute rate (0.21 against 0.30 and
    0.32 against 0.45 of their datasheet bandwidths, 16-bit; derive_broadcast_ops), so on ``gpu``, other than the
    GPU the fraction refers to (a file's own value: its reference GPU, as for its curves; else default.yaml's), the
    rate is kept, scaled by SMs x clock."""
    own = getattr(cal, field)
    value = (own or getattr(default_calibration(), field)).get(element_bytes)
    ref = reference_gpu(cal if own else default_calibration()) if gpu is not None else None
    if value is None or ref is None or ref.name == gpu.name:
        return value
    return value * _sm_cycle_scale(ref, gpu)


def _sm_cycle_scale(ref: HardwareSpec, gpu: HardwareSpec) -> float:
    """Factor on a fraction of ``ref``'s bandwidth that keeps its absolute rate per SM-cycle on ``gpu``."""
    return (ref.memory_bw_bytes_per_s / gpu.memory_bw_bytes_per_s
            * (gpu.sm_count * gpu.boost_clock_mhz) / (ref.sm_count * ref.boost_clock_mhz))


def multi_tensor_efficiency(cal: CalibrationSpec, element_bytes: int) -> float | None:
    """Fraction of datasheet bandwidth a multi_tensor_apply kernel (foreach or fused optimizer) reaches on elements
    of this size; None: price it on the memory curve."""
    return _rule(cal, "multi_tensor_bandwidth_fraction").get(element_bytes)


def graph_replay_credit_s(cal: CalibrationSpec, gpu: HardwareSpec) -> float:
    """GPU time a kernel saves when replayed from a CUDA graph instead of queued back to back on an eager stream
    (how every efficiency was measured): the memory curve's smallest kernel time (its first point: a few KB, a
    launch-bound kernel) minus a graph replay's per-kernel time (``launch_overhead_s``, measured as a 1000-kernel
    replay). H100: 8 KB copy 4.4 us back to back, 1.0 us per replayed kernel: 3.4 us. Equal on any GPU (a
    duration: the curve is read at equal roofline time)."""
    ref = reference_gpu(cal) or gpu
    nbytes = 10 ** cal.memory_efficiency.x[0]
    t_small = nbytes / ref.memory_bw_bytes_per_s / curve_value(cal.memory_efficiency, cal.memory_efficiency.x[0])
    return max(t_small - cal.launch_overhead_s, 0.0)


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
