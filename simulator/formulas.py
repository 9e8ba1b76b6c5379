"""Per-op formulas: FLOPs, bytes read and written, kernel launches. One registry, filled by a decorator.

Convention (stated once, tested): a multiply-add is 2 FLOPs. Bytes are the fewest a kernel must move: each
input read once, each output written once. Formulas are pure functions of the traced shapes and dtypes.
An op that is neither registered, nor a view, nor tagged pointwise by PyTorch is *unknown*: it is costed by the
generic memory formula and listed in the estimate's ``unknown_ops`` (never silently zero).

References: torch/utils/flop_counter.py (GEMM, convolution and attention FLOPs); FlashAttention-2
(Dao 2023) for the causal half and the backward = 2.5x forward FLOPs; PyTorch's multi_tensor_apply for the
optimizer's foreach launches. Known inaccuracies: broadcast inputs are counted at their expanded size; the
flops of transcendental functions are counted as 1 per element.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .graph.ops import ELEMENT_BYTES, Op, TensorMeta, gemm_dims
from .units import DTYPE_BYTES

POINTWISE_FLOPS_PER_ELEMENT = 1
SOFTMAX_FLOPS_PER_ELEMENT = 5      # max, subtract, exp, sum, divide
NORM_FLOPS_PER_ELEMENT = 8         # mean, variance, normalise, scale, shift
FLASH_BACKWARD_FLOPS_RATIO = 2.5   # FlashAttention-2: 5 matmuls in backward vs 2 in forward
ADAMW_FLOPS_PER_PARAM = 12
# torch.optim.AdamW, as the kernels run (torch/optim/adam.py, torch 2.11-2.13):
# fused (_fused_adamw_): one kernel reads param, grad, exp_avg, exp_avg_sq and writes param, exp_avg, exp_avg_sq.
# foreach (_multi_tensor_adam, weight_decay != 0, no amsgrad, not capturable): 8 kernels, each a full pass:
#   _foreach_mul_(params)                  R1 W1   decoupled weight decay
#   _foreach_lerp_(exp_avgs, grads)        R2 W1
#   _foreach_mul_(exp_avg_sqs)             R1 W1
#   _foreach_addcmul_(exp_avg_sqs, g, g)   R2 W1   the same grad twice: one DRAM read
#   _foreach_sqrt(exp_avg_sqs)             R1 W1   a new parameter-sized list (cost/memory.py's temporary)
#   _foreach_div_(sqrt, bias_correction)   R1 W1
#   _foreach_add_(sqrt, eps)               R1 W1
#   _foreach_addcdiv_(params, m, sqrt)     R3 W1
# (the step counters are CPU tensors: their _foreach_add_ launches nothing on the GPU).
ADAMW_STREAMS = {"fused": (4, 3, 1), "foreach": (12, 8, 8)}      # (read, written, kernels) per parameter
SGD_STREAMS = {"fused": (2, 1, 1), "foreach": (2, 1, 1)}          # _foreach_add_(params, grads): one kernel
# Bytes per weight element of weight-only quantization (scales and zero points not counted).
QUANT_BYTES_PER_WEIGHT = {"bitsandbytes-int8": DTYPE_BYTES["int8"], "int8": DTYPE_BYTES["int8"], "fp8": DTYPE_BYTES["fp8"],
                          "int4": DTYPE_BYTES["int4"]}
# multi_tensor_apply (aten/src/ATen/native/cuda/MultiTensorApply.cuh): a launch takes at most 110 tensors (depth-1
# lists; fewer at greater depth, counted here at the depth-1 limit) and 320 blocks of 65536-element chunks.
FOREACH_TENSORS_PER_LAUNCH = 110
FOREACH_ELEMENTS_PER_LAUNCH = 320 * 65536


@dataclass(frozen=True, slots=True)
class Cost:
    """Counts for one op call. ``kind`` picks the efficiency curve: gemm, attention, memory, comm, none, sync."""
    flops: float
    bytes_read: float
    bytes_written: float
    launches: int
    kind: str

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written


FORMULAS: dict[str, Callable[[Op], Cost]] = {}
NO_COST = Cost(0.0, 0.0, 0.0, 0, "none")

# Ops that only change metadata or allocate without a kernel.
METADATA_OPS = {
    "aten._unsafe_view", "aten.alias", "aten.detach", "aten.lift_fresh", "aten._reshape_alias", "aten.empty",
    "aten.empty.memory_format", "aten.empty_strided", "aten.empty_like", "aten.new_empty", "aten.new_empty_strided",
    "aten.set_", "aten.resize_", "aten._has_compatible_shallow_copy_type", "aten.sym_size", "aten.sym_stride",
}


def formula(*names: str):
    def register(fn: Callable[[Op], Cost]) -> Callable[[Op], Cost]:
        for name in names:
            if name in FORMULAS:
                raise ValueError(f"formula for {name} registered twice")
            FORMULAS[name] = fn
        return fn
    return register


def _bytes(tensors) -> float:
    return float(sum(t.nbytes for t in tensors))


def memory_cost(op: Op, flops_per_element: float = POINTWISE_FLOPS_PER_ELEMENT) -> Cost:
    """Generic memory-bound kernel: inputs read once, outputs written once."""
    out_elems = sum(t.numel for t in op.outputs)
    return Cost(flops_per_element * out_elems, _bytes(op.inputs), _bytes(op.outputs), 1, "memory")


def is_known(op: Op) -> bool:
    return (op.name in FORMULAS or op.name in METADATA_OPS or op.attrs.get("view")
            or op.attrs.get("pointwise", False))


def op_cost(op: Op) -> Cost:
    """The cost of one call of ``op``; unknown ops fall back to ``memory_cost`` (and are reported)."""
    fn = FORMULAS.get(op.name)
    if fn is not None:
        return fn(op)
    if op.name in METADATA_OPS or op.attrs.get("view"):
        return NO_COST
    return memory_cost(op)


def expert_parallel_rows(cost: Cost, op: Op, share: float) -> Cost:
    """A forward kernel of an experts module under expert parallelism across data-parallel ranks (the
    activation, the routing-weight multiply, the engine's moe_align / moe_act / moe_sum): the trace runs it over
    every routed row of this rank's tokens, the all-to-all brings this GPU ``share`` of the rows (moe_routing's
    rows_share). Grouped GEMMs scale themselves (routed_rows); collectives and host-only ops stay."""
    if share >= 1.0 or op.phase != "forward" or op.name == "aten._grouped_mm" or cost.kind not in ("memory", "gemm"):
        return cost
    if "experts" not in op.scope.split("."):
        return cost
    return Cost(cost.flops * share, cost.bytes_read * share, cost.bytes_written * share, cost.launches, cost.kind)


def quantized(cost: Cost, op: Op, quant: str) -> Cost:
    """A GEMM that reads its weight in a weight-only quantized format: fewer weight bytes read (dequantization
    inside the kernel taken as free; bitsandbytes LLM.int8 is expanded into its own ops by graph.engine)."""
    weight = op.attrs.get("weight_bytes", 0.0)
    # routed expert GEMMs price their stored width themselves (_grouped_mm, moe weight_element_bytes)
    # the LM head stays 16-bit (cost.memory.weight_bytes; bitsandbytes, AWQ/GPTQ checkpoints and vLLM's fp8 leave it)
    if (quant not in QUANT_BYTES_PER_WEIGHT or cost.kind != "gemm" or not weight or "moe" in op.attrs
            or op.scope.endswith("lm_head")):
        return cost
    w = op.inputs[-1] if op.inputs else None     # the weight operand: mm(x, w_t), addmm(bias, x, w_t)
    element = w.nbytes / max(w.numel, 1) if w is not None else 2.0
    saved = weight * (1.0 - QUANT_BYTES_PER_WEIGHT[quant] / element)
    return Cost(cost.flops, max(cost.bytes_read - saved, 0.0), cost.bytes_written, cost.launches, cost.kind)


def kv_append_in_place(cost: Cost, op: Op) -> Cost:
    """An engine with a preallocated KV cache writes only the new tokens where HF's DynamicCache concatenates
    (``torch.cat([cache, new], dim=-2)`` inside an attention module): read and write the new part only."""
    if not is_kv_append(op):
        return cost
    new = op.inputs[1]
    return Cost(0.0, new.nbytes, new.nbytes, 1, "memory")


def is_kv_append(op: Op) -> bool:
    """HF's DynamicCache append: ``torch.cat([cache, new], dim=-2)`` of (B, H, S, D) tensors in an attention
    module; at prefill the cache is still the empty (0,) tensor of an unfilled layer."""
    ins = op.inputs
    dim = op.args[1] if len(op.args) > 1 else op.kwargs.get("dim", 0)
    leaf = op.scope.rsplit(".", 1)[-1]
    if op.name != "aten.cat" or len(ins) != 2 or not ("attn" in leaf or "attention" in leaf) \
            or dim not in (-2, 2) or len(ins[1].shape) != 4:      # the sequence axis (not RoPE's rotate_half, -1)
        return False
    if ins[0].numel == 0:
        return True
    return len(ins[0].shape) == 4 and ins[0].shape[:2] == ins[1].shape[:2] and ins[0].shape[-1] == ins[1].shape[-1]


# ------------------------------------------------------------------ matrix products

@formula("aten.mm", "aten.bmm", "bnb.igemmlt")
def _mm(op: Op) -> Cost:
    batch, m, n, k = gemm_dims(op)
    # (B, M, K) @ (B, K, N): 2 * B * M * N * K
    return Cost(2.0 * batch * m * n * k, _bytes(op.inputs), _bytes(op.outputs), 1, "gemm")


def expected_distinct_experts(tokens: float, top_k: int, experts: int) -> float:
    """Experts that T tokens touch when each picks top_k distinct of E uniformly and independently:
    E * (1 - (1 - k/E)^T). Near-uniform routing is what load-balanced training aims for (Switch Transformer's
    auxiliary loss, Fedus et al. 2021) and what random router weights give; a skewed real router touches fewer."""
    if tokens <= 0 or experts <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - min(top_k, experts) / experts) ** tokens)


def routed_rows(op: Op) -> tuple[float, float]:
    """(token rows this GPU's experts compute, distinct local experts touched) of a routed grouped GEMM: the op's
    ``moe`` attrs (graph.engine) give top_k, the model's expert count E and this GPU's E_local (expert
    parallelism); S = tokens x top_k rows are sorted by expert; this GPU computes S * E_local / E of them
    (``token_groups``: ranks whose tokens reach these experts through the all-to-all, ep / tp where ep > tp)."""
    moe = op.attrs["moe"]
    # expert parallelism across data-parallel ranks: the all-to-all brings every rank's routed rows here
    rows = op.inputs[0].shape[0] * moe.get("token_groups", 1)
    local = op.inputs[1].shape[0]
    tokens = rows / moe["top_k"]
    share = local / moe["experts"]
    return rows * share, local * (1.0 - (1.0 - moe["top_k"] / moe["experts"]) ** tokens)


@formula("aten._grouped_mm")
def _grouped_mm(op: Op) -> Cost:
    """Grouped GEMM over experts: input (S, K) sorted by expert, weight (E_local, K, N), offsets (E_local,).
    FLOPs 2 * S_local * N * K; bytes: the rows in and out plus the weights of the experts that the step's
    tokens touch (expected_distinct_experts), not the whole (E, K, N) tensor. Without routing attrs (a traced
    graph not expanded by graph.engine) every expert is read. Backward's weight gradient, (K, S) @ (S, N) grouped
    along S into (E, K, N): 2 * K * S * N, its operands read and the (E, K, N) gradient written."""
    a, w = op.inputs[0], op.inputs[1]
    out = op.outputs[0] if op.outputs else a
    if len(a.shape) == 2 and len(w.shape) == 2 and len(out.shape) == 3:
        # the weight gradient in backward: (K, S) @ (S, N) grouped along S into (E, K, N); every routed row of
        # this GPU's experts once (expert parallelism: E_local / E of the rows, from token_groups ranks)
        k_dim, rows, n = a.shape[0], a.shape[1], w.shape[1]
        share = 1.0
        if "moe" in op.attrs:
            moe = op.attrs["moe"]
            share = moe.get("token_groups", 1) * out.shape[0] / moe["experts"]
        return Cost(2.0 * k_dim * rows * n * share, (a.nbytes + w.nbytes) * share
                    + sum(t.nbytes for t in op.inputs[2:]), float(out.nbytes), 1, "gemm")
    n, k = w.shape[-1], w.shape[-2]
    if "moe" in op.attrs:
        rows, touched = routed_rows(op)
    else:
        rows, touched = float(a.shape[0]), float(w.shape[0])
    elem_a = a.nbytes / max(a.numel, 1)
    expert_bytes = w.nbytes / max(w.shape[0], 1)
    if "moe" in op.attrs and "weight_element_bytes" in op.attrs["moe"]:    # experts stored quantized (MXFP4)
        expert_bytes = w.numel / max(w.shape[0], 1) * op.attrs["moe"]["weight_element_bytes"]
    offs = sum(t.nbytes for t in op.inputs[2:])
    elem_out = out.nbytes / max(out.numel, 1)      # 16-bit under fp8 W8A8 inputs
    # (S_local, K) @ (K, N) per expert: 2 * S_local * N * K
    return Cost(2.0 * rows * n * k, rows * k * elem_a + touched * expert_bytes + offs,
                rows * n * elem_out, 1, "gemm")


def baddbmm_copies(op: Op) -> bool:
    """Whether an ``aten.baddbmm`` copies its input into the output first (beta != 0, the default 1)."""
    return op.name == "aten.baddbmm" and op.kwargs.get("beta", 1) != 0


@formula("aten.addmm", "aten.baddbmm")
def _addmm(op: Op) -> Cost:
    """addmm: the bias through cuBLASLt's epilogue, one kernel. baddbmm with beta != 0: ATen copies ``input``
    (expanded) into the output, then the batched GEMM reads it back as C (aten/src/ATen/native/LinearAlgebra.cpp,
    common_checks_baddbmm_bmm): two kernels, the output's bytes read once more (the copy is priced in
    cost/ops_time.py); with beta == 0 neither happens."""
    batch, m, n, k = gemm_dims(op)
    c_read = _bytes(op.outputs) if baddbmm_copies(op) else 0.0
    return Cost(2.0 * batch * m * n * k + batch * m * n, _bytes(op.inputs) + c_read, _bytes(op.outputs),
                2 if c_read else 1, "gemm")


@formula("aten.convolution", "aten.convolution_backward")
def _convolution(op: Op) -> Cost:
    w = op.inputs[1]
    if op.name == "aten.convolution_backward":
        grad_out, w = op.inputs[0], op.inputs[2]
        out_numel = grad_out.numel
        factor = 2  # grad input and grad weight, each a convolution of the forward's size
    else:
        out_numel = op.outputs[0].numel
        factor = 1
    per_output = w.shape[1] * math.prod(w.shape[2:])  # (C_in / groups) * kernel elements per output element
    return Cost(factor * 2.0 * out_numel * per_output, _bytes(op.inputs), _bytes(op.outputs), factor, "gemm")


# ------------------------------------------------------------------ attention

def attention_pairs(q: TensorMeta, k: TensorMeta, is_causal: bool, window: int | None = None) -> float:
    """Query-key pairs one head computes: Sq*Skv, or, causal with the queries aligned to the last keys,
    Sq*(Skv-Sq) + Sq*(Sq+1)/2 (query i sees Skv-Sq+i+1 keys), as flash attention skips masked blocks; with a
    sliding ``window`` query i sees min(Skv-Sq+i+1, window) keys (FlashAttention's window_size skips the blocks
    outside the band)."""
    sq, skv = q.shape[-2], k.shape[-2]
    if not is_causal:
        return float(sq * min(skv, window or skv))
    offset = skv - sq
    inside = min(max((window or skv) - offset, 0), sq)   # the first queries, whose keys are all within the window
    return float(inside * offset + inside * (inside + 1) / 2 + (sq - inside) * (window or skv))


def attention_flops(q: TensorMeta, k: TensorMeta, v: TensorMeta, is_causal: bool, window: int | None = None) -> float:
    """QK^T and PV: 2 matmuls of 2 * pairs * D FLOPs each, per batch and query head."""
    batch_heads = math.prod(q.shape[:-2])
    return 2.0 * 2.0 * batch_heads * attention_pairs(q, k, is_causal, window) * q.shape[-1]


@formula("attention.flash", "attention.efficient")
def _attention(op: Op) -> Cost:
    """Q, K and V read once, the output written; absorbed MLA decode (attrs values_in_keys: graph.engine.mla_absorb)
    reads its values as the first columns of the latent keys, not again."""
    q, k, v = op.inputs[:3]
    reads = _bytes(op.inputs) - (v.nbytes if op.attrs.get("values_in_keys") else 0.0)
    return Cost(attention_flops(q, k, v, op.attrs["is_causal"], op.attrs.get("window")), reads,
                _bytes(op.outputs), 1, "attention")


@formula("attention.flash_backward", "attention.efficient_backward")
def _attention_backward(op: Op) -> Cost:
    q, k, v = op.inputs[:3]
    flops = FLASH_BACKWARD_FLOPS_RATIO * attention_flops(q, k, v, op.attrs["is_causal"], op.attrs.get("window"))
    return Cost(flops, _bytes(op.inputs), _bytes(op.outputs), 1, "attention")


# ------------------------------------------------------------------ memory-bound ops with their own counts

@formula("aten._softmax", "aten._log_softmax", "aten._safe_softmax", "aten._softmax_backward_data",
         "aten._log_softmax_backward_data")
def _softmax(op: Op) -> Cost:
    return memory_cost(op, SOFTMAX_FLOPS_PER_ELEMENT)


@formula("aten.native_layer_norm", "aten.native_layer_norm_backward", "aten._fused_rms_norm",
         "aten._fused_rms_norm_backward", "aten.native_group_norm")
def _norm(op: Op) -> Cost:
    return memory_cost(op, NORM_FLOPS_PER_ELEMENT)


@formula("aten.sum", "aten.sum.dim_IntList", "aten.mean", "aten.mean.dim", "aten.amax", "aten.max", "aten.min",
         "aten.argmax", "aten.all", "aten.any", "aten.any.dim", "aten.cumsum", "aten.var_mean.correction",
         "aten.var.correction", "aten.prod", "aten.norm.Scalar", "aten.linalg_vector_norm", "aten.all.dim",
         "aten.max.dim", "aten.topk", "aten.sort", "aten.logsumexp")
def _reduction(op: Op) -> Cost:
    """Inputs read once, outputs written once. topk (sorted, as MoE routers call it) is two kernels on CUDA: the
    selection (sbtopk::gatherTopK) and a sort of the k winners (bitonicSortKVInPlace), one call each per router in
    validation/data/profiles/moe-h100-profile.txt."""
    in_elems = sum(t.numel for t in op.inputs)
    launches = 2 if op.name == "aten.topk" else 1
    return Cost(float(in_elems), _bytes(op.inputs), _bytes(op.outputs), launches, "memory")


@formula("aten.embedding", "aten.index_select", "aten.gather", "aten.index.Tensor")
def _gather(op: Op) -> Cost:
    """Reads only the selected rows (as many bytes as it writes) plus the indices."""
    out = _bytes(op.outputs)
    indices = sum(t.nbytes for t in op.inputs if t.dtype in ("int64", "int32", "bool"))
    return Cost(0.0, out + indices, out, 1, "memory")


@formula("aten.nll_loss_forward", "aten.nll_loss2d_forward")
def _nll(op: Op) -> Cost:
    target = op.inputs[1]
    return Cost(float(target.numel), 2.0 * target.nbytes, _bytes(op.outputs), 1, "memory")


@formula("aten.embedding_dense_backward", "aten.nll_loss_backward", "aten.slice_backward", "aten.select_backward",
         "aten.index_put", "aten.index_put_", "aten.scatter_add", "aten.scatter", "aten.scatter.src", "aten.cat",
         "aten.stack",
         "aten.constant_pad_nd", "aten.tril", "aten.triu", "aten.arange", "aten.arange.start",
         "aten.arange.start_step", "aten.ones", "aten.zeros", "aten.full", "aten.ones_like", "aten.zeros_like",
         "aten.full_like", "aten.scalar_tensor", "aten.clone", "aten.repeat", "aten.masked_fill_.Scalar",
         "aten.native_dropout", "aten.native_dropout_backward", "aten.new_zeros", "aten.new_ones",
         "aten.new_full", "aten.diff", "aten.roll", "aten.flip", "aten.linspace",
         "aten._index_put_impl_", "aten.bernoulli_.float", "aten.randint", "aten.rand", "aten.randn",
         "aten.unfold_backward", "aten._to_copy", "aten.histc", "aten.floor_divide", "aten.expand_copy", "aten.split_with_sizes_copy", "aten.unbind_copy",
         "repeat_kv.copy", "static_cache.fill_level")   # graph.engine.static_cache_decode
def _memory_kernel(op: Op) -> Cost:
    return memory_cost(op)


@formula("aten.copy_", "aten.fill_.Scalar", "aten.zero_", "aten.index_copy_")
def _overwrite(op: Op) -> Cost:
    """In-place writes that do not read what they overwrite: copy_ reads its source and writes its destination
    (ATen's copy kernel is a TensorIterator with self as output only, aten/src/ATen/native/Copy.cpp); fill_ and
    zero_ read nothing; index_copy_ reads the index and the source and writes as many elements as the source has,
    not the whole destination. A 512 MiB copy_ priced as dst + src read + dst written came out 52% slow against
    validation/data/kernels/power-mix-h100*.jsonl (its copy_ sequence)."""
    target = op.inputs[-1] if op.name == "aten.index_copy_" and len(op.inputs) > 1 else (
        op.inputs[0] if op.inputs else op.outputs[0])
    return Cost(POINTWISE_FLOPS_PER_ELEMENT * target.numel, _bytes(op.inputs[1:]), float(target.nbytes), 1, "memory")


@formula("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(op: Op) -> Cost:
    """Out-of-place masked_fill: ATen clones self and runs masked_fill_ on the copy (aten/src/ATen/native/
    TensorAdvancedIndexing.cpp masked_fill): two kernels, two dispatches. Bytes: the operands once, as the H100
    broadcast curve (calibration broadcast_memory_efficiency) was measured against them."""
    cost = memory_cost(op)
    return Cost(cost.flops, cost.bytes_read, cost.bytes_written, 2, cost.kind)


@formula("fused.add_rms_norm", "fused.rotary_embedding", "fused.silu_and_mul", "kv_cache.write",
         "fused.topk_softmax", "fused.moe_align", "fused.moe_act", "fused.moe_sum")
def _fused_kernel(op: Op) -> Cost:
    """An engine's fused kernel (graph.engine.fuse): its inputs read once, its outputs written once, one launch;
    FLOPs as a norm's per element."""
    return memory_cost(op, NORM_FLOPS_PER_ELEMENT)


@formula("module.call")
def _module_call(op: Op) -> Cost:
    """An nn.Module call: no kernel; the Python time it costs in eager mode is the timeline's."""
    return Cost(0.0, 0.0, 0.0, 0, "module")


@formula("bnb.double_quant", "bnb.outliers", "bnb.transform", "bnb.mm_dequant", "engine.request_loop",
         "fp8.quantize")
def _engine_memory(op: Op) -> Cost:
    """Engine-side memory-bound work (graph.engine): inputs read, outputs written, its kernel count."""
    return Cost(float(sum(t.numel for t in op.outputs)), _bytes(op.inputs), _bytes(op.outputs),
                int(op.attrs.get("launches", 1)), "memory")


@formula("aten._local_scalar_dense")
def _sync(op: Op) -> Cost:
    """Tensor.item(): a device-to-host copy that makes the CPU wait for the GPU queue to drain."""
    return Cost(0.0, 0.0, 0.0, 0, "sync")


# ------------------------------------------------------------------ collectives and optimizer

@formula("nccl.all_reduce", "nccl.all_gather", "nccl.reduce_scatter", "nccl.send_recv", "nccl.all_to_all")
def _collective(op: Op) -> Cost:
    """Collective bytes: the full (gathered / reduced) tensor size, a reduce-scatter's input; the cost model applies
    the algorithm."""
    full = op.inputs if op.name == "nccl.reduce_scatter" else op.outputs
    return Cost(0.0, 0.0, _bytes(full), 1, "comm")


def _optimizer(op: Op, flops_per_param: float, streams: dict[str, tuple[int, int, int]]) -> Cost:
    """An optimizer step over all parameters: ``streams[impl]`` full passes read and written and kernels; each
    kernel is launched once per multi_tensor_apply batch of tensors or chunks."""
    params = op.inputs[0]
    state_bytes = ELEMENT_BYTES.get(params.dtype, 4)
    read, written, kernels = streams[op.attrs.get("impl", "fused")]
    launches = kernels * max(math.ceil(op.attrs.get("n_tensors", 1) / FOREACH_TENSORS_PER_LAUNCH),
                             math.ceil(params.numel / FOREACH_ELEMENTS_PER_LAUNCH))
    return Cost(flops_per_param * params.numel, read * params.numel * state_bytes,
                written * params.numel * state_bytes, launches, "memory")


@formula("optimizer.adamw")
def _adamw(op: Op) -> Cost:
    """AdamW, fused (one pass over param, grad and both moments) or foreach (8 passes: ADAMW_STREAMS)."""
    return _optimizer(op, ADAMW_FLOPS_PER_PARAM, ADAMW_STREAMS)


@formula("optimizer.sgd")
def _sgd(op: Op) -> Cost:
    """Plain SGD: reads param and grad, writes param (one kernel, fused or foreach)."""
    return _optimizer(op, 2, SGD_STREAMS)
