"""Per-op GPU time: roofline over the device's datasheet peaks, divided by the calibrated efficiency.

t_op = max(FLOPs / peak[dtype], bytes / bandwidth) / efficiency(op) + (launches - 1) * launch_overhead_s.
The efficiencies were measured on kernels run back to back, so they include one kernel's launch gap; an op
of several kernels (the foreach optimizer step) pays the gap for each further one. Replayed from a CUDA graph a
kernel sheds the eager gap (the graph credit) and, under an engine with a measured replay gap, pays that gap after
each of its kernels.
Collectives are costed in ``comm``; syncs and metadata ops take no GPU time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..specs import Device
from ..formulas import Cost, baddbmm_copies, gemm_dims, routed_rows
from ..graph.ops import ELEMENT_BYTES, Op
from ..specs import CalibrationSpec
from . import comm, efficiency

LAUNCH_BOUND_FACTOR = 10  # an op more than 10x over its roofline is labelled overhead-bound in reports


@dataclass(frozen=True, slots=True)
class OpTime:
    gpu_s: float           # kernel time including the launch gap
    compute_s: float       # FLOPs / peak (the compute floor)
    memory_s: float        # bytes / bandwidth (the memory floor)
    bound: str             # compute, memory, overhead, network or none


def compute_dtype(op: Op, workload_dtype: str, gpu=None) -> str:
    """The dtype an op's math runs in; fp32 matmuls under --dtype tf32 run as tf32 where ``gpu`` has tf32 units
    (Volta and older have none: PyTorch's allow_tf32 then leaves them fp32)."""
    ins = op.inputs
    dtype = ins[0].dtype if ins else workload_dtype
    if op.name in ("aten.addmm", "aten.baddbmm") and len(ins) > 1:
        dtype = ins[1].dtype
    if dtype == "fp32" and workload_dtype == "tf32":
        return "tf32" if gpu is None or gpu.peak_flops_per_s.tf32 else "fp32"
    return dtype if dtype in ("fp32", "fp16", "bf16", "fp8", "int8") else "fp32"


def innermost_broadcast(op: Op) -> bool:
    """A 16-bit elementwise op with an operand broadcast along the innermost dim: (S, 1) against (S, H), as the MoE
    routing's masked fills and weight multiply (transformers integrations/moe.py) and Qwen-MoE's sigmoid gate.
    The distinction is empirical: the grouped_gemm harness measured these shapes at 27-35% of HBM bandwidth where a
    copy reaches 80-89% (broadcast_memory_efficiency), while a broadcast along an outer dim (an (H,) weight over
    (S, H), as RMSNorm's) stays on the contiguous curve in the dense-model microbenchmarks."""
    outs = op.outputs
    if not (op.attrs.get("pointwise") or op.name.startswith("aten.masked_fill")) or not outs \
            or len(outs[0].shape) < 2 or outs[0].shape[-1] <= 1 or outs[0].dtype not in ("bf16", "fp16"):
        return False
    rank = len(outs[0].shape)
    return any(len(t.shape) == rank and t.shape[-1] == 1 for t in op.inputs)


def outer_broadcast(op: Op) -> bool:
    """An elementwise op with an operand of the output's rank that is broadcast along an outer dim but not the
    innermost ((B, 1, S, S) attention mask over (B, H, S, S), (B, 1, S, D) rotary tables over the heads): PyTorch's
    non-vectorized kernel, ``outer_broadcast_bandwidth_fraction`` (validation/harness/broadcast_ops.py). A
    lower-rank operand (a norm's (H,) weight) and an innermost broadcast (``innermost_broadcast``) are not this."""
    outs = op.outputs
    if not op.attrs.get("pointwise") or not outs or len(outs[0].shape) < 2:
        return False
    shape = outs[0].shape
    return any(len(t.shape) == len(shape) and t.shape[-1] == shape[-1] and 1 < t.numel < outs[0].numel
               and any(a == 1 < b for a, b in zip(t.shape[:-1], shape[:-1])) for t in op.inputs)


def baddbmm_copy_s(op: Op, cal: CalibrationSpec, gpu) -> float:
    """The copy ATen's baddbmm makes of ``input`` into the output before its GEMM when beta != 0 (formulas._addmm,
    LinearAlgebra.cpp common_checks_baddbmm_bmm): on the memory curve, or, when ``input`` is expanded (BLOOM's
    ALiBi bias, (B*H, 1, S)), no faster than PyTorch's non-vectorized kernel copies it
    (``broadcast_copy_bandwidth_fraction``; validation/harness/broadcast_ops.py)."""
    out, src = op.outputs[0], op.inputs[0]
    nbytes = out.nbytes + src.nbytes
    eff = efficiency.memory_efficiency(cal, nbytes, gpu)
    size = ELEMENT_BYTES.get(out.dtype, 4)
    fraction = (efficiency.broadcast_fraction(cal, "broadcast_copy_bandwidth_fraction", size, gpu)
                if op.attrs.get("broadcast_input") else None)
    if fraction is not None:     # the fraction is of the bytes written, as measured
        return max(out.nbytes / gpu.memory_bw_bytes_per_s / fraction, nbytes / gpu.memory_bw_bytes_per_s / eff)
    return nbytes / gpu.memory_bw_bytes_per_s / eff


def op_time(op: Op, cost: Cost, device: Device, cal: CalibrationSpec, workload_dtype: str,
            compute_scale: float = 1.0, memory_scale: float = 1.0, matvec_max_m: int = 0,
            graph_credit_s: float = 0.0, aten_kernels: bool = True, replay_gap_s: float = 0.0) -> OpTime:
    """``matvec_max_m``: the engine runs matmuls of at most this many rows as mat-vec kernels (memory curve).
    ``graph_credit_s``: replayed from a CUDA graph, a kernel takes this much less than the back-to-back eager
    stream the efficiencies were measured on (efficiency.graph_replay_credit_s), never less than its roofline or
    a graph replay's per-kernel time. ``replay_gap_s``: a replayed kernel's gap beyond the tiny-kernel replay
    that ``launch_overhead_s`` measures, added after each kernel (step.replay_kernel_gap_s). ``aten_kernels``: the
    runtime runs PyTorch's own kernels for the ops it does not fuse (eager, kernel-sum), so a cat with a strided
    input takes ATen's strided cat kernel and a GEMM off 16-byte alignment cuBLAS's slower kernels; engines with their own kernels or padded shapes (vLLM pads the
    vocabulary to a multiple of 64, vllm/model_executor/layers/vocab_parallel_embedding.py; Inductor pads mm shapes,
    torch/_inductor/config.py shape_padding; ggml) do not."""
    gpu = device.gpu
    if cost.kind == "comm":
        seconds = comm.collective_time_s(op, cost, device, cal)
        return OpTime(seconds, 0.0, 0.0, "network")
    if cost.kind in ("none", "sync", "module"):   # no kernel: an nn.Module call costs CPU time only
        return OpTime(0.0, 0.0, 0.0, "none")
    dtype = compute_dtype(op, workload_dtype, gpu)
    peak = gpu.peak_for(dtype) if cost.kind in ("gemm", "attention") else gpu.peak_for("fp32")
    compute_s = cost.flops / peak
    memory_s = cost.bytes / gpu.memory_bw_bytes_per_s
    roofline_s = max(compute_s, memory_s)
    if cost.kind == "gemm":
        batch, m, n, k = gemm_dims(op) if "conv" not in op.name else (1, 0, 0, 0)
        moe_streaming, grouped = False, None
        if "moe" in op.attrs:
            # a grouped expert GEMM is one kernel over every touched expert, m rows per touched expert. With the
            # calibration's grouped table: its efficiency at (m, n, k), streaming the experts' weights never above
            # the memory curve of the total bytes (launch-bound small calls). Without: streaming, the memory curve;
            # compute-bound, the efficiency of one expert's dense GEMM
            rows, touched = routed_rows(op)
            m = max(1, round(rows / max(touched, 1.0)))
            moe_streaming = memory_s > compute_s
            grouped = efficiency.grouped_gemm_efficiency(cal, dtype, m, n, k, cost.bytes, moe_streaming, gpu)
        if grouped is not None:
            eff = min(grouped, efficiency.memory_efficiency(cal, cost.bytes, gpu)) if moe_streaming else grouped
            eff *= memory_scale if moe_streaming else compute_scale
        elif moe_streaming:
            eff = efficiency.memory_efficiency(cal, cost.bytes) * memory_scale
        elif 0 < m <= matvec_max_m:
            eff = efficiency.memory_efficiency(cal, cost.bytes, gpu) * memory_scale
        elif batch > 1 and memory_s > compute_s:
            eff = efficiency.batched_gemm_memory_efficiency(cal, cost.bytes, gpu) * memory_scale
        else:
            eff = efficiency.gemm_efficiency(cal, dtype, batch * m, n, k, cost.flops, cost.bytes,
                                             memory_s > compute_s, gpu, batched=batch > 1)
            eff *= compute_scale if compute_s >= memory_s else memory_scale
            unaligned = op.attrs.get("unaligned") if aten_kernels else None
            plateau = efficiency.unaligned_gemm_efficiency(cal, gpu, unaligned, batch * m) if unaligned else None
            if plateau is not None and compute_s >= memory_s:
                eff = min(eff, plateau * compute_scale)
    elif cost.kind == "attention":
        variant = "backward" if op.name.endswith("_backward") else ("decode" if op.inputs[0].shape[-2] == 1 else "")
        q = op.inputs[0]
        masked = efficiency.masked_attention_efficiency(cal, gpu, q.shape[-2], op.inputs[1].shape[-2],
                                                        math.prod(q.shape[:-2])) \
            if op.attrs.get("masked_kernel") else None     # graph.engine.static_cache_decode
        eff = masked if masked is not None else efficiency.attention_efficiency(cal, dtype, variant, cost.flops,
                                                                                cost.bytes, gpu)
        eff *= compute_scale
    else:
        multi = (efficiency.multi_tensor_efficiency(cal, ELEMENT_BYTES.get(op.inputs[0].dtype, 4))
                 if op.name.startswith("optimizer.") and op.inputs else None)
        inner = innermost_broadcast(op)
        eff = multi if multi is not None else efficiency.memory_efficiency(
            cal, cost.bytes, gpu, bool(op.attrs.get("transposed")), inner, efficiency.MEMORY_OP_FAMILY.get(op.name))
        if multi is None and aten_kernels and not inner and outer_broadcast(op):
            fraction = efficiency.broadcast_fraction(cal, "outer_broadcast_bandwidth_fraction",
                                                     ELEMENT_BYTES.get(op.outputs[0].dtype, 4), gpu)
            eff = min(eff, fraction) if fraction is not None else eff
        eff *= memory_scale
    kernel_s = roofline_s / eff
    if aten_kernels and baddbmm_copies(op) and op.outputs:
        kernel_s += baddbmm_copy_s(op, cal, gpu)
    if aten_kernels and op.attrs.get("strided_inputs") and op.outputs:   # PyTorch cat's strided kernel
        kernel_s = max(kernel_s, efficiency.strided_cat_s(cal, gpu, op.outputs[0].numel))
    if graph_credit_s:   # never faster than the largest copies and adds stream (stream_bandwidth_fraction)
        stream_s = memory_s / cal.stream_bandwidth_fraction if cal.stream_bandwidth_fraction else 0.0
        kernel_s = max(kernel_s - graph_credit_s, roofline_s, stream_s, cal.launch_overhead_s)
    kernel_s += replay_gap_s
    launch_s = max(cost.launches - 1, 0) * (cal.launch_overhead_s + replay_gap_s)
    bound = "compute" if compute_s >= memory_s else "memory"
    if kernel_s > LAUNCH_BOUND_FACTOR * roofline_s:
        bound = "overhead"
    return OpTime(kernel_s + launch_s, compute_s, memory_s, bound)
