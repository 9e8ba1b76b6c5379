"""Work an engine adds around the model's own ops, expanded into ops that the formula registry and the timeline
cost like any other: bitsandbytes LLM.int8 matmuls, and a serving loop's per-request work after each forward.

bitsandbytes LLM.int8 (``--quant bitsandbytes-int8``; MatMul8bitLt.forward, inference path with int8 weights
and threshold 6.0, as TGI 0.x ran BLOOM): every linear layer becomes, per call,
  double_quant   absmax of the fp16 input by row and column, then int8 row- and column-quantized copies and a COO
                 list of the outliers (about 10 small kernels: absmax, 2 zeros, quantize, 3 COO allocations, a sort
                 and 2 gathers), with a host sync in between (``nnz_row_ptr[-1].item()``);
  outliers       ``torch.unique`` of the outlier columns (a host sync), the outlier weight columns extracted and
                 rescaled (about 4 elementwise ops) and the input's outlier columns split off (3 index ops);
  transform      the int8 input into the col32 layout the cuBLASLt int8 GEMM needs;
  igemmlt        the int8 GEMM (int32 out);
  mm_dequant     int32 -> fp16 with the row and column scales and the bias;
  outlier matmul the outlier columns in fp16, added to the output;
from the bitsandbytes source (TimDettmers/bitsandbytes, autograd/_functions.py and functional.py; the 0.37/0.38
sequence as read in a later copy). The outlier count is BNB_OUTLIER_COLUMNS, from the LLM.int8 paper. The host
syncs make the CPU wait for the GPU twice per layer, so the Python of every call is exposed.

MoE routing (``moe_routing``): HF's grouped-GEMM experts path (transformers 5.x
integrations/moe.py grouped_mm_experts_forward) passes the whole (E, K, N) expert tensor to ``torch._grouped_mm``
and lets the offsets pick the active experts; the traced op is tagged with top_k and the model's expert count so
the formula reads only the experts the step's tokens are expected to touch (formulas.expected_distinct_experts).

Serving loop (``RuntimeSpec.request_loop``): per request and step, the engine's own kernels, host syncs and
Python torch calls, and full-vocabulary passes over the logits rows it post-processes (all prompt positions at
prefill where the engine computes prompt logprobs there, as TGI 0.x did).
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

from ..specs import RuntimeSpec
from ..workload import Workload
from .ops import Op, TensorMeta

# LLM.int8 (Dettmers et al. 2022, arXiv:2208.07339, section 4): at 6.7B parameters and beyond, the outliers of
# magnitude >= 6 sit in about 6 feature dimensions of the hidden state.
BNB_OUTLIER_COLUMNS = 6
# Python-level torch calls per stage of MatMul8bitLt.forward (counted in the source: tensor ops, allocations,
# .item()/.unique, dtype casts, views), so the CPU side costs what an eager dispatch of each costs.
BNB_PY_CALLS = {"double_quant": 14, "outliers": 12, "transform": 3, "igemmlt": 5, "mm_dequant": 3, "outlier_mm": 3}
BNB_LAUNCHES = {"double_quant": 10, "outliers": 9, "transform": 1, "igemmlt": 1, "mm_dequant": 1}


def _sync(scope: str) -> Op:
    return Op(name="aten._local_scalar_dense", args=(), kwargs={}, outputs=(), alias=False, scope=scope,
              attrs={"engine": True, "py_calls": 1})


def _op(name: str, ins: tuple, outs: tuple, scope: str, **attrs) -> Op:
    return Op(name=name, args=ins, kwargs={}, outputs=outs, alias=False, scope=scope, attrs={"engine": True, **attrs})


def _is_linear(op: Op) -> bool:
    return (op.name in ("aten.addmm", "aten.mm") and op.attrs.get("weight_bytes", 0.0) > 0
            and not op.scope.endswith("lm_head"))


def bnb_int8_ops(op: Op) -> list[Op]:
    """The ops of one LLM.int8 linear call replacing the fp16 GEMM ``op`` (M rows x K in -> N out)."""
    from .ops import gemm_dims

    _, m, n, k = gemm_dims(op)
    s, o = op.scope, min(BNB_OUTLIER_COLUMNS, k)
    a16, a8 = TensorMeta((m, k), "fp16"), TensorMeta((m, k), "int8")
    w8 = TensorMeta((k, n), "int8")
    out32, out16 = TensorMeta((m, n), "fp32"), TensorMeta((m, n), "fp16")
    stats = (TensorMeta((m,), "fp32"), TensorMeta((k,), "fp32"))
    sub_a, sub_w = TensorMeta((m, o), "fp16"), TensorMeta((o, n), "fp16")
    return [
        _op("bnb.double_quant", (a16, a16), (a8, a8, *stats), s, launches=BNB_LAUNCHES["double_quant"],
            py_calls=BNB_PY_CALLS["double_quant"]),
        _sync(s),
        _op("bnb.outliers", (TensorMeta((o, n), "int8"), a16), (sub_w, sub_a), s, launches=BNB_LAUNCHES["outliers"],
            py_calls=BNB_PY_CALLS["outliers"]),
        _sync(s),
        _op("bnb.transform", (a8,), (a8,), s, launches=BNB_LAUNCHES["transform"], py_calls=BNB_PY_CALLS["transform"]),
        _op("bnb.igemmlt", (a8, w8), (out32,), s, py_calls=BNB_PY_CALLS["igemmlt"], weight_bytes=float(k * n)),
        _op("bnb.mm_dequant", (out32, *stats), (out16,), s, launches=BNB_LAUNCHES["mm_dequant"],
            py_calls=BNB_PY_CALLS["mm_dequant"]),
        _op("aten.mm", (sub_a, sub_w), (out16,), s, py_calls=BNB_PY_CALLS["outlier_mm"]),
        _op("aten.add.Tensor", (out16, out16), (out16,), s),
    ]


EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_top_k")


def expert_count(config: dict) -> int:
    """Routed experts per MoE layer (Mixtral, Qwen-MoE / OLMoE, DeepSeek key names); 0 for a dense model."""
    return next((config[k] for k in EXPERT_COUNT_KEYS if config.get(k)), 0)


def mxfp4_experts(config: dict) -> bool:
    """The checkpoint stores its experts MXFP4 (gpt-oss: config.json quantization_config quant_method mxfp4)."""
    q = config.get("quantization_config")
    return isinstance(q, dict) and q.get("quant_method") == "mxfp4"


def moe_layer_count(config: dict, layers: int | None = None) -> int:
    """How many decoder layers hold routed experts, as transformers builds them: DeepSeek-V2/V3 from layer
    first_k_dense_replace on, every moe_layer_freq-th (modeling_deepseek_v3.py DeepseekV3DecoderLayer); Qwen2/3-MoE
    every decoder_sparse_step-th layer not in mlp_only_layers (modeling_qwen2_moe.py Qwen2MoeDecoderLayer); every
    layer otherwise (Mixtral, OLMoE, gpt-oss). 0 for a dense model. ``layers``: among the model's first that many
    (a pipeline stage as traced)."""
    if not expert_count(config):
        return 0
    layers = min(layers or config["num_hidden_layers"], config["num_hidden_layers"])
    lead = int(config.get("first_k_dense_replace") or 0)
    freq = max(int(config.get("moe_layer_freq") or 1), 1)
    step = max(int(config.get("decoder_sparse_step") or 1), 1)
    dense_only = set(config.get("mlp_only_layers") or ())
    return sum(1 for i in range(layers)
               if i >= lead and i % freq == 0 and (i + 1) % step == 0 and i not in dense_only)


def moe_routing(config: dict, plan=None, quant: str = "none") -> dict | None:
    """{'experts': E, 'top_k': k, 'token_groups': g} of a mixture-of-experts config (Mixtral, Qwen-MoE, OLMoE,
    DeepSeek, gpt-oss key names), else None; g = ep / tp ranks send their tokens to each expert-parallel rank."""
    experts = expert_count(config)
    top_k = next((config[k] for k in TOP_K_KEYS if config.get(k)), None)
    if not experts or not top_k:
        return None
    groups = max(plan.ep // plan.tp, 1) if plan is not None else 1
    out = {"experts": int(experts), "top_k": int(top_k), "token_groups": groups}
    if plan is not None and plan.ep > plan.tp:
        # tokens travel by all-to-all: this GPU receives only its experts' rows, token_groups / ep of the traced
        # ones (formulas.expert_parallel_rows). With ep <= tp every GPU holds every token, and both vLLM
        # (TritonExperts: the activation over all num_tokens x top_k rows, expert_map marking other GPUs' experts)
        # and transformers (grouped_mm_experts_forward masks them) run the non-GEMM kernels over every routed row
        out["rows_share"] = groups / plan.ep
    element = expert_weight_bytes(config, quant)
    if (config.get("quantization_config") or {}).get("quant_method") == "mxfp4":
        out["packed"] = True          # the checkpoint's own MXFP4 experts: --quant does not re-quantize them
    return out if element is None else {**out, "weight_element_bytes": element}


def expert_weight_bytes(config: dict, quant: str = "none") -> float | None:
    """Bytes per expert weight element of a checkpoint whose experts are stored quantized (gpt-oss: MXFP4, 4-bit
    values with one 8-bit scale per 32, OCP Microscaling spec v1.0: 4.25 bits; transformers' Mxfp4 quantizer and
    vLLM keep them packed and dequantize inside the MoE kernel), or at the --quant width (vLLM's fp8 MoE keeps
    the experts fp8), else None (the model dtype)."""
    from ..formulas import QUANT_BYTES_PER_WEIGHT
    from ..units import DTYPE_BYTES

    if mxfp4_experts(config):
        return DTYPE_BYTES["mxfp4"]
    if quant in QUANT_BYTES_PER_WEIGHT and quant != "bitsandbytes-int8":   # --quant: experts stored like linears
        return QUANT_BYTES_PER_WEIGHT[quant]
    return None


def routed(op: Op, moe: dict) -> Op:
    """A grouped expert GEMM tagged with the routing it runs under (a copy: traced ops are shared by caches)."""
    return Op(name=op.name, args=op.args, kwargs=op.kwargs, outputs=op.outputs, alias=op.alias, phase=op.phase,
              scope=op.scope, attrs={**op.attrs, "moe": moe})


# fp8 W8A8 (vLLM Fp8LinearMethod on compute capability >= 8.9, --quantization fp8 of a 16-bit checkpoint): per
# linear, the activation is quantized with a dynamic per-tensor scale (scaled_fp8_quant: an absmax reduction, then
# the scaled cast: 2 kernels), and cutlass_scaled_mm multiplies fp8 x fp8 into a 16-bit output at the fp8 rate.
# The experts of a fused MoE the same way (vllm/model_executor/layers/quantization/fp8.py: Fp8Config returns
# Fp8MoEMethod for FusedMoE, which quantizes a 16-bit checkpoint's experts with scaled_fp8_quant and runs
# fused_experts / TritonOrDeepGemmExperts with use_fp8_w8a8=True, the activations quantized per call; Marlin,
# weight-only, below compute capability 8.9): each grouped expert GEMM fp8 x fp8 after its activation's quantization.
# Block-scaled fp8 (scenario.fp8_block_scaled) quantizes each 1 x 128 group of the activation in one kernel.
FP8_QUANT_LAUNCHES = 2
FP8_BLOCK_QUANT_LAUNCHES = 1


def fp8_linear_ops(op: Op, block: bool = False) -> list[Op]:
    """The ops of one W8A8 linear replacing the 16-bit GEMM ``op``: input quantization (``block``: per token group),
    then the fp8 GEMM (its activation and weight operands fp8, the bias and output 16-bit)."""
    def fp8(t):
        return TensorMeta(t.shape, "fp8") if isinstance(t, TensorMeta) and len(t.shape) >= 2 else t

    a = op.inputs[1] if op.name == "aten.addmm" else op.inputs[0]
    quant = _op("fp8.quantize", (a,), (TensorMeta(a.shape, "fp8"),), op.scope,
                launches=FP8_BLOCK_QUANT_LAUNCHES if block else FP8_QUANT_LAUNCHES)
    gemm = Op(name=op.name, args=tuple(fp8(x) for x in op.args), kwargs=op.kwargs, outputs=op.outputs,
              alias=op.alias, phase=op.phase, scope=op.scope, attrs={**op.attrs, "fp8": "w8a8"})
    return [quant, gemm]


def request_loop_ops(rt: RuntimeSpec, w: Workload, vocab: int) -> list[Op]:
    """One request's share of the serving loop after the forward of a prefill or decode step."""
    loop = rt.request_loop
    rows = w.seq if (w.phase == "prefill" and loop.prefill_rows == "all") else 1
    logits = TensorMeta((rows, vocab), "fp16")
    ops = [_op("engine.request_loop", (logits,) * int(loop.vocab_passes), (), "engine",
               launches=loop.launches, py_calls=loop.py_calls)]
    syncs = loop.syncs + (loop.prefill_syncs if w.phase == "prefill" else 0)
    return ops + [_sync("engine") for _ in range(syncs)]


def expand(ops: list[Op], repeats: list[float], w: Workload, rt: RuntimeSpec, vocab: int,
           batch: int, moe: dict | None = None, fp8_units: bool = False, fp8_block: bool = False
           ) -> tuple[list[Op], list[float]]:
    """The graph's ops with the engine's own work expanded in (unchanged when there is none). ``moe``: the
    model's routing (moe_routing), tagged onto its grouped expert GEMMs; ``fp8_units``: the GPU has fp8 tensor
    cores, so --quant fp8 runs W8A8 linears (fp8_linear_ops; ``fp8_block``: block-scaled); without them fp8 stays
    weight-only."""
    bnb = w.quant == "bitsandbytes-int8"
    w8a8 = w.quant == "fp8" and fp8_units
    loop = rt.request_loop is not None and w.phase in ("prefill", "decode")
    if not bnb and not loop and moe is None and not w8a8:
        return ops, repeats
    out_ops, out_rep = [], []
    for op, r in zip(ops, repeats):
        if moe is not None and op.name == "aten._grouped_mm":
            op = routed(op, moe)
        if bnb and _is_linear(op):
            extra = bnb_int8_ops(op)
        elif w8a8 and op.phase == "forward" and (_is_linear(op) or (
                op.name == "aten._grouped_mm" and "fused_moe" in rt.fusions and moe is not None
                and not moe.get("packed"))):
            extra = fp8_linear_ops(op, fp8_block)
        else:
            extra = [op]
        out_ops += extra
        out_rep += [r] * len(extra)
    if loop:
        added = request_loop_ops(rt, w, vocab)
        out_ops += added
        out_rep += [float(batch)] * len(added)
    return out_ops, out_rep


# ------------------------------------------------------------------ fused kernels of compiled / serving engines
# An engine that runs its own kernels (vLLM's csrc/layernorm_kernels.cu fused_add_rms_norm, csrc/activation_kernels.cu
# silu_and_mul, csrc/pos_encoding_kernels.cu rotary_embedding) or compiles the model (torch.compile's Inductor fuses
# a chain of pointwise ops and a reduction into one kernel) replaces the HF module's chain of small kernels by one
# kernel that reads the chain's inputs once and writes its outputs once. RuntimeSpec.fusions names the fusions.
FUSIONS = ("add_rms_norm", "silu_and_mul", "rotary", "native_gqa", "merged_projections", "kv_write_pair",
           "eager_attention", "fused_moe")
# native_gqa: no repeat_kv copies; merged_projections: the projections that read the same activations run as one
# GEMM over the concatenated weights (vLLM's QKVParallelLinear and MergedColumnParallelLinear); kv_write_pair: a
# layer's new K and V go into the cache in one kernel (vLLM's reshape_and_cache_flash takes both), not one each;
# eager_attention: a model HF runs with its explicit attention (Q K^T bmm, mask, softmax, P V bmm; gpt-oss's sinks)
# runs as the engine's one fused attention kernel; fused_moe: the router's softmax/top-k and the experts' routing
# bookkeeping run as the engine's MoE kernels (see fuse_moe)
MERGED_PROJECTIONS = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}
PROJECTION_GEMMS = frozenset({"aten.mm", "aten.addmm"})
ROPE_OPS = frozenset({"aten.mul.Tensor", "aten.neg", "aten.sub.Tensor", "aten.add.Tensor", "aten.cat"})
# rotate_half's form negates one half (Llama: x * cos + rotate_half(x) * sin); gpt-oss's _apply_rotary_emb subtracts
# (first * cos - second * sin, second * cos + first * sin, then a concatenation): one negation or one subtraction
# per rotated tensor
ROPE_SIGN_OPS = frozenset({"aten.neg", "aten.sub.Tensor"})
ACTIVATIONS = frozenset({"aten.silu", "aten.gelu", "aten.gelu_tanh"})


def _leaf(scope: str) -> str:
    return scope.rsplit(".", 1)[-1]


def _kernel(op: Op) -> bool:
    return op.name != "module.call" and not op.attrs.get("view") and op.outputs != ()


def _is_norm_scope(scope: str) -> bool:
    leaf = _leaf(scope).lower()
    return "norm" in leaf and "rotary" not in leaf


def _residual_add(op: Op, x) -> bool:
    """The residual add just before a norm: two same-shape inputs, its output the norm's input."""
    ins = op.inputs
    return (op.name == "aten.add.Tensor" and len(ins) == 2 and ins[0].shape == ins[1].shape
            and op.outputs[0].shape == x.shape)


def _fused(name: str, ins: tuple, outs: tuple, scope: str) -> Op:
    return Op(name=name, args=ins, kwargs={}, outputs=outs, alias=False, scope=scope, attrs={"fused": True})


def _last_kernel(ops: list[Op]) -> int | None:
    """Index of the last op in ``ops`` that launches a kernel, or None."""
    k = len(ops) - 1
    while k >= 0 and not _kernel(ops[k]):
        k -= 1
    return k if k >= 0 else None


def _norm_group(ops, i: int) -> int:
    """End (exclusive) of the run of kernel ops in the norm scope starting at i (views and module calls inside)."""
    scope, j, last = ops[i].scope, i, i
    while j < len(ops) and (ops[j].scope == scope or not _kernel(ops[j])):
        if ops[j].scope == scope and _kernel(ops[j]):
            last = j
        j += 1
    return last + 1


def fuse(ops: list[Op], repeats: list[float], fusions, kv_in_place: bool = False) -> tuple[list[Op], list[float]]:
    """Apply the engine's kernel fusions (see FUSIONS) to a traced op list; ``kv_in_place``: HF's KV-cache
    concatenations become the engine's in-place writes of the new tokens (kv_cache.write: vLLM's
    reshape_and_cache_flash, StaticCache's index_copy_)."""
    from ..formulas import is_kv_append

    fusions = set(fusions)
    if not fusions:
        return ops, repeats
    if "merged_projections" in fusions:
        ops, repeats = merge_projections(ops, repeats)
    if "fused_moe" in fusions:
        ops, repeats = fuse_moe(ops, repeats)
    out, rep = [], []
    i, kv_heads = 0, 0
    # per attention scope: bytes the dropped repeat_kv copies allocated (the rise of the live bytes at each), and
    # the traced live bytes at its attention (the copies are freed once the scope's live bytes fall below that level
    # less them)
    freed: dict[str, list[float]] = {}

    def unheld(op: Op) -> Op:   # the op's live bytes without the copies the engine never makes
        held = freed.get(op.scope)
        if not held or "live_bytes" not in op.attrs:
            return op
        live = op.attrs["live_bytes"]
        if held[1] and live <= held[1] - held[0] + 1.0:
            del freed[op.scope]
            return op
        if op.name in ATTENTION_OPS:
            held[1] = live
        return replace(op, attrs={**op.attrs, "live_bytes": max(live - held[0], 0.0), "gqa_freed": True})

    while i < len(ops):
        op, r = ops[i], repeats[i]
        j = _norm_group(ops, i) if "add_rms_norm" in fusions and _kernel(op) and _is_norm_scope(op.scope) else i
        group = [o for o in ops[i:j] if _kernel(o)]
        if group and not any(o.name == "aten.native_layer_norm" for o in group):   # RMSNorm chains only
            out += [o for o in ops[i:j] if not _kernel(o)]      # views and module calls inside stay (no kernel)
            rep += [rr for o, rr in zip(ops[i:j], repeats[i:j]) if not _kernel(o)]
            x, y = group[0].inputs[0], group[-1].outputs[0]
            weight = [t for o in group for t in o.inputs if len(t.shape) == 1][:1]
            ins, outs = (x, *weight), (y,)
            k = _last_kernel(out)
            if k is not None and _residual_add(out[k], x):       # the residual add joins the norm kernel
                res = out.pop(k)
                rep.pop(k)
                ins, outs = (*res.inputs, *weight), (y, res.outputs[0])
            out.append(_fused("fused.add_rms_norm", ins, outs, op.scope))
            rep.append(r)
            i = j
            continue
        if "silu_and_mul" in fusions and op.name in ACTIVATIONS and _next_mul(ops, i) is not None:
            j = _next_mul(ops, i)                                # the multiply that follows reads gate and up
            mul = ops[j]
            ops = [*ops[:j], _fused("fused.silu_and_mul", tuple(mul.inputs), mul.outputs, mul.scope), *ops[j + 1:]]
            i += 1
            continue
        if "native_gqa" in fusions and _is_repeat_kv(op):
            kv_heads = op.inputs[0].shape[1]                     # GQA read natively: no repeated K/V copy
            before = ops[i - 1].attrs.get("live_bytes") if i else None
            if before is not None and "live_bytes" in op.attrs:  # the clone allocates; the reshape after it does not
                freed.setdefault(op.scope, [0.0, 0.0])[0] += max(op.attrs["live_bytes"] - before, 0.0)
            i += 1
            continue
        if "eager_attention" in fusions and op.name == "aten.clone" and i + 2 < len(ops) \
                and _copied_operand(ops, i + 2) == i and _eager_attention_end(ops, i + 2) is not None:
            if "native_gqa" in fusions:                          # the kernel reads the KV heads themselves
                kv_heads = _heads_before_repeat(ops, i) or kv_heads
            i += 1                                               # matmul's K^T copy: the kernel reads K in place
            continue
        end = _eager_attention_end(ops, i) if "eager_attention" in fusions else None
        if end is not None:     # the chain's views go too: their live_bytes hold the scores no engine allocates
            op = _eager_attention(ops, i, end)
            i = end - 1                                          # the fused op stands at the chain's last index
        if kv_in_place and kv_heads and op.name in ATTENTION_OPS:
            op = _native_gqa(op, kv_heads)
            kv_heads = 0
        if kv_in_place and is_kv_append(op):
            new = op.inputs[1]                                   # the step's K or V, written into its slots
            k = _last_kernel(out)
            if "kv_write_pair" in fusions and k is not None and out[k].name == "kv_cache.write" \
                    and len(out[k].inputs) == 1 and out[k].scope == op.scope and rep[k] == r:
                out[k] = _fused("kv_cache.write", (*out[k].inputs, new), (*out[k].outputs, new), op.scope)
            else:
                out.append(_fused("kv_cache.write", (new,), (new,), op.scope))
                rep.append(r)
            i += 1
            continue
        if "rotary" in fusions and _leaf(op.scope).startswith("rotary_emb") and _kernel(op):
            i += 1                                               # cos/sin come from the engine's precomputed cache
            continue
        if "rotary" in fusions and op.name in ROPE_SIGN_OPS and "attn" in _leaf(op.scope):
            fused_op, start = _rotary(out, ops, i)
            if fused_op is not None:
                del out[start:], rep[start:]
                out.append(fused_op)
                rep.append(r)
                i = _rope_end(ops, i)
                continue
        out.append(unheld(op))
        rep.append(r)
        i += 1
    return out, rep


def merge_projections(ops: list[Op], repeats: list[float]) -> tuple[list[Op], list[float]]:
    """The q/k/v projections of an attention module, and the gate/up projections of an MLP, as one GEMM each: the
    first one's activations times the concatenated weights (N = the sum of theirs), the others' GEMMs dropped (their
    views and module calls stay; they launch nothing), with the fp8 activation quantization of each dropped one.
    Only forward GEMMs of traced weights with the same activation shape and repeat merge, one call of each
    projection: vLLM's model files build these as QKVParallelLinear and MergedColumnParallelLinear
    (hardware_specs/runtimes/vllm.yaml cites the lines)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, op in enumerate(ops):
        kind = MERGED_PROJECTIONS.get(_leaf(op.scope)) if op.name in PROJECTION_GEMMS else None
        if kind and op.phase == "forward" and op.attrs.get("weight_bytes") and not op.attrs.get("engine"):
            groups.setdefault((op.scope.rsplit(".", 1)[0], kind), []).append(i)
    merged: dict[int, Op] = {}
    for members in groups.values():
        first = ops[members[0]]
        x = _activation(first)
        same = [i for i in members if _activation(ops[i]) == x and repeats[i] == repeats[members[0]]]
        if len(same) < 2 or len({_leaf(ops[i].scope) for i in same}) < len(same):
            continue                           # one call of each projection (a module called twice: left alone)
        merged[same[0]] = _merged_gemm([ops[i] for i in same])
        for i in same[1:]:
            merged[i] = None
            if i and ops[i - 1].name == "fp8.quantize" and ops[i - 1].scope == ops[i].scope:
                merged[i - 1] = None                             # one activation quantization per merged GEMM
    if not merged:
        return ops, repeats
    out, rep = [], []
    for i, (op, r) in enumerate(zip(ops, repeats)):
        new = merged.get(i, op)
        if new is not None:
            out.append(new)
            rep.append(r)
    return out, rep


def _activation(op: Op):
    """The activation operand of a projection GEMM (mm(x, w_t) or addmm(bias, x, w_t))."""
    return op.inputs[1] if op.name == "aten.addmm" else op.inputs[0]


def _merged_gemm(gemms: list[Op]) -> Op:
    first = gemms[0]
    x = _activation(first)
    weights = [g.inputs[-1] for g in gemms]
    n = sum(w.shape[-1] for w in weights)
    w = TensorMeta((weights[0].shape[0], n), weights[0].dtype)
    y = TensorMeta((*first.outputs[0].shape[:-1], n), first.outputs[0].dtype)
    bias = next((g.inputs[0] for g in gemms if g.name == "aten.addmm"), None)  # vLLM zero-fills a missing one
    args = (TensorMeta((n,), bias.dtype), x, w) if bias is not None else (x, w)
    attrs = {**first.attrs, "merged": len(gemms),
             "weight_bytes": sum(g.attrs.get("weight_bytes", 0.0) for g in gemms)}
    return Op(name="aten.addmm" if bias is not None else "aten.mm", args=args, kwargs={}, outputs=(y,), alias=False,
              phase=first.phase, scope=first.scope, attrs=attrs)


ROUTER_SCOPES = ("gate", "router")


def fuse_moe(ops: list[Op], repeats: list[float]) -> tuple[list[Op], list[float]]:
    """HF's MoE block as a serving engine's fused MoE runs it (vLLM model_executor/layers/fused_moe: the router's
    softmax, top-k and renormalisation in one topk_softmax kernel; fused_experts: moe_align_block_size sorts the
    token-expert pairs, the two grouped expert GEMMs read the tokens through the sorted ids, one activation kernel
    between them, moe_sum writes the weighted sum): every other aten kernel of HF's router and experts modules
    (sort, histc, cumsum, index gathers, masked fills, the inverse permutation, bias adds, the per-token sum) goes.
    The grouped GEMMs, already-fused kernels and collectives stay as traced."""
    out, rep, i = [], [], 0
    while i < len(ops):
        op = ops[i]
        leaf = _leaf(op.scope)
        if leaf not in ("experts", *ROUTER_SCOPES) or not _kernel(op):
            out.append(op)
            rep.append(repeats[i])
            i += 1
            continue
        j = i                                  # the module's ops and its children's (the experts' act_fn)
        while j < len(ops) and (ops[j].scope == op.scope or ops[j].scope.startswith(op.scope + ".")):
            j += 1
        run = ops[i:j]
        fused = _fused_experts(run) if leaf == "experts" else _fused_router(run)
        out += run if fused is None else fused
        rep += repeats[i:j] if fused is None else [repeats[i]] * len(fused)
        i = j
    return out, rep


def _plain(op: Op) -> bool:
    """An aten kernel HF's MoE code launches (not a GEMM, a collective, or an engine kernel)."""
    return _kernel(op) and op.name.startswith("aten.") and op.name not in ("aten._grouped_mm", *PROJECTION_GEMMS)


def _fused_router(run: list[Op]) -> list[Op] | None:
    """The router's GEMM, then one topk_softmax kernel for its softmax / top-k / renormalisation."""
    if not any(o.name == "aten.topk" for o in run):
        return None
    plain = [o for o in run if _plain(o)]
    logits = next((o.outputs[0] for o in run if o.name in PROJECTION_GEMMS), plain[0].inputs[0])
    kept = [o for o in run if not _plain(o)]
    return [*kept, _fused("fused.topk_softmax", (logits,), tuple(plain[-1].outputs), run[0].scope)]


def _fused_experts(run: list[Op]) -> list[Op] | None:
    """moe_align, the first grouped GEMM, the activation (the engine's fused one where the run has it, else one
    kernel from the first GEMM's output to the second's input), the second grouped GEMM, moe_sum; other kernels
    (collectives) in place."""
    grouped = [k for k, o in enumerate(run) if o.name == "aten._grouped_mm"]
    if len(grouped) != 2:
        return None
    g1, g2 = grouped
    scope = run[0].scope
    ids = next((o.inputs[0] for o in run[:g1] if o.name == "aten.sort"), TensorMeta((run[g1].inputs[0].shape[0],),
                                                                                     "int32"))
    result = next((o.outputs[0] for o in reversed(run[g2 + 1:]) if _plain(o)), run[g2].outputs[0])
    out = [o for o in run[:g1] if not _plain(o)]
    out += [_fused("fused.moe_align", (ids,), (ids,), scope), run[g1]]
    middle = [o for o in run[g1 + 1:g2] if not _plain(o)]
    if not any(o.name.startswith("fused.") for o in middle):
        middle.append(_fused("fused.moe_act", (run[g1].outputs[0],), (run[g2].inputs[0],), scope))
    out += [*middle, run[g2], _fused("fused.moe_sum", (run[g2].outputs[0],), (result,), scope)]
    return out + [o for o in run[g2 + 1:] if not _plain(o)]


def _is_repeat_kv(op: Op) -> bool:
    """HF's repeat_kv (GQA K/V expanded to the query heads, then copied: (B, Hkv, rep, S, D) -> a clone, or the
    reshape's copy where the explicit attention path reshapes it) in an attention module; vLLM's and
    FlashAttention's kernels read the KV heads directly."""
    ins = op.inputs
    return (op.name in ("aten.clone", "aten._unsafe_view") and not op.attrs.get("view") and "attn" in _leaf(op.scope)
            and len(ins) == 1 and len(ins[0].shape) == 5)


def _eager_attention_end(ops: list[Op], i: int) -> int | None:
    """Where HF's explicit attention starting at the Q K^T bmm ``ops[i]`` ends (exclusive): after the P V bmm that
    follows its softmax in the same attention module, and the reshape of its output; None if ``ops[i]`` is not
    such a bmm."""
    op = ops[i]
    if op.name != "aten.bmm" or "attn" not in _leaf(op.scope) or not (op.attrs.get("transposed")
                                                                       or _copied_operand(ops, i) is not None):
        return None
    softmax = False
    for j in range(i + 1, min(i + 40, len(ops))):
        o = ops[j]
        if o.scope != op.scope:
            return None
        softmax = softmax or o.name in ("aten._softmax", "aten._safe_softmax")
        if o.name == "aten.bmm":
            if not softmax:
                return None
            end = j + 1
            if end < len(ops) and ops[end].name == "aten._unsafe_view" and ops[end].inputs[0] == o.outputs[0]:
                end += 1
            return end
    return None


def _copied_operand(ops: list[Op], i: int) -> int | None:
    """The index of the copy torch.matmul made of the bmm ``ops[i]``'s second operand (clone, then _unsafe_view
    into it), or None. matmul materialises a broadcast K^T that bmm cannot read as a view: with one KV head per
    GPU (gpt-oss at tp 8) repeat_kv's expand needs no copy, so K^T reaches matmul expanded over the query heads."""
    if i < 2 or ops[i - 1].name != "aten._unsafe_view" or ops[i - 2].name != "aten.clone":
        return None
    view, copy = ops[i - 1], ops[i - 2]
    if copy.scope != ops[i].scope or view.inputs[0] != copy.outputs[0] or ops[i].inputs[1] != view.outputs[0]:
        return None
    return i - 2


_REPEAT_VIEWS = ("aten.expand", "aten.view", "aten.transpose.int", "aten._unsafe_view", "aten.unsqueeze")


def _heads_before_repeat(ops: list[Op], c: int) -> int | None:
    """The KV heads of the keys that reach the copy ``ops[c]`` through repeat_kv's views (unsqueeze, expand,
    reshape, transpose) without a copy of their own: the head count of the 4D tensor repeat_kv unsqueezed."""
    t = ops[c].inputs[0]
    for j in range(c - 1, max(c - 40, -1), -1):
        o = ops[j]
        if not o.outputs or o.outputs[0] != t or o.scope != ops[c].scope:
            continue
        if o.name not in _REPEAT_VIEWS:
            return None
        if o.name == "aten.unsqueeze" and len(o.inputs[0].shape) == 4:
            return o.inputs[0].shape[1]
        t = o.inputs[0]
    return None


def _eager_attention(ops: list[Op], i: int, end: int) -> Op:
    """The fused attention op for the explicit chain ops[i:end]: Q (B, H, Sq, D), K and V (B, H, Skv, D) from the
    two bmms, heads from the reshape of the scores; causal where there is more than one query row."""
    qk, pv = ops[i], next(o for o in reversed(ops[i:end]) if o.name == "aten.bmm")
    q, kt = qk.inputs[0], qk.inputs[1]                    # (B*H, Sq, D), (B*H, D, Skv)
    scores = next((o.outputs[0] for o in ops[i + 1:end] if o.name == "aten._unsafe_view"
                   and len(o.outputs[0].shape) == 4), None)
    b, h = scores.shape[:2] if scores is not None else (1, q.shape[0])
    sq, d, skv = q.shape[1], q.shape[2], kt.shape[2]
    q4, kv4 = TensorMeta((b, h, sq, d), q.dtype), TensorMeta((b, h, skv, d), q.dtype)
    out = TensorMeta((b, h, sq, pv.outputs[0].shape[-1]), pv.outputs[0].dtype)
    first = _copied_operand(ops, i)          # matmul's copy of K^T goes with the chain
    first = i if first is None else first
    before = ops[first - 1].attrs.get("live_bytes", 0.0) if first else 0.0
    after = ops[end - 1].attrs.get("live_bytes", before + out.nbytes)
    # held: what the chain left allocated beyond its output (HF returns the probabilities with the output; the
    # decoder layer keeps them until it returns)
    return Op(name="attention.flash", args=(q4, kv4, kv4), kwargs={}, outputs=(out,), alias=False, phase=qk.phase,
              scope=qk.scope, attrs={"is_causal": sq > 1, "has_mask": False, "backend": "flash", "dropout_p": 0.0,
                                     "fused": True, "eager_attention": True, "live_bytes": before + out.nbytes,
                                     "held_bytes": max(after - before - out.nbytes, 0.0)})


def fused_attention_peak(graph, ops: list[Op]) -> float:
    """The traced activation peak less what HF's explicit attention held and the fused kernel does not (its
    S x S scores, probabilities and their copies, and the [B, 1, Sq, Skv] masks its base model built for it), and
    less what an engine's attention never allocates (ops marked gqa_freed: repeat_kv copies, MLA's up-projected
    cache): the trace's live-bytes peak minus the peak over the fused op list (the fused attention holding what was
    live before it plus its output); unchanged without such a fusion."""
    if not any(op.attrs.get("eager_attention") or op.attrs.get("gqa_freed") for op in ops):
        return graph.peak_activation_bytes
    traced = max((op.attrs.get("live_bytes", 0.0) for op in graph.ops), default=0.0)
    eager = any(op.attrs.get("eager_attention") for op in ops)
    fused, held, base, layer, masks, owner = 0.0, 0.0, 0.0, None, 0.0, None
    for op in ops:
        live = op.attrs.get("live_bytes")
        if eager and _attention_mask_op(op):
            # HF's [B, 1, Sq, Skv] masks for its explicit attention (masking_utils eager_mask: where(mask, 0, min)),
            # built once before the layers and held until the base model returns: the engine's kernel takes no mask
            # (34 GB each for gpt-oss at 131072 tokens)
            masks += op.outputs[0].nbytes if op.name == "aten.where.self" else 0.0
            owner = op.scope
            continue
        if masks and owner is not None and op.scope != owner and not op.scope.startswith(owner + "."):
            masks, owner = 0.0, None        # out of the module that built them (the LM head): freed, as traced
        if live is not None:
            live = max(live - masks, 0.0)
        if op.attrs.get("eager_attention"):
            held, base, layer = op.attrs["held_bytes"], live, op.scope.rpartition(".")[0]
        elif live is not None and layer is not None and op.scope.startswith(layer + "."):
            # HF's decoder layer keeps the returned probabilities (``hidden, _ = self_attn(...)``); whatever of them
            # is freed shows as live bytes falling toward the level after the fused kernel
            held = min(held, max(live - base, 0.0))
            live -= held
        elif live is not None:
            held, layer = 0.0, None
        fused = max(fused, live or 0.0)
    return max(graph.peak_activation_bytes - max(traced - fused, 0.0), 0.0)


def _attention_mask_op(op: Op) -> bool:
    """An op of the model's own forward, outside every decoder layer, that builds a 4D [B, 1, Sq, Skv] attention
    mask (comparisons, their conjunctions, the expand and the final where of masking_utils)."""
    if not op.outputs or op.alias and op.name != "aten.expand" or re.search(r"\.\d+(\.|$)", op.scope):
        return False
    shape = op.outputs[0].shape
    return len(shape) == 4 and shape[1] == 1 and shape[-2] > 1 and shape[-1] > 1


def _native_gqa(op: Op, kv_heads: int) -> Op:
    def heads(t):
        return TensorMeta((t.shape[0], kv_heads, *t.shape[2:]), t.dtype) if isinstance(t, TensorMeta) else t

    args = tuple(heads(t) if i in (1, 2) else t for i, t in enumerate(op.args))
    return Op(name=op.name, args=args, kwargs=op.kwargs, outputs=op.outputs, alias=op.alias, phase=op.phase,
              scope=op.scope, attrs=op.attrs)


def _next_mul(ops, i: int):
    shape = ops[i].outputs[0].shape
    for j in range(i + 1, min(i + 12, len(ops))):
        o = ops[j]
        if o.name == "aten.mul.Tensor" and len(o.inputs) == 2 and all(t.shape == shape for t in o.inputs):
            return j
    return None


def _rope_chain(op: Op) -> bool:
    return op.name in ROPE_OPS and (op.name != "aten.cat" or op.args[1:2] in ((-1,), (3,)))


def _rotary(out: list[Op], ops: list[Op], i: int):
    """One rotary kernel for q and k (in place) replacing HF's apply_rotary_pos_emb: the rope ops already emitted
    in this attention scope (from the first q-side multiply) and those up to the last add."""
    scope = ops[i].scope
    start = len(out)
    while start > 0 and (not _kernel(out[start - 1]) or (_rope_chain(out[start - 1]) and out[start - 1].scope == scope)):
        start -= 1
    while start < len(out) and not _kernel(out[start]):
        start += 1
    first = [o for o in out[start:] if o.name == "aten.mul.Tensor"]
    if not first:
        return None, start
    end = _rope_end(ops, i)
    muls = [o for o in (*out[start:], *ops[i:end]) if o.name == "aten.mul.Tensor"]
    qk = list({o.inputs[0].shape: o.inputs[0] for o in muls if o.inputs}.values())
    return _fused("fused.rotary_embedding", tuple(qk), tuple(qk), scope), start


def _rope_end(ops, i: int) -> int:
    """Index after the last rope op of the chain through op i (q's and k's halves: up to two negations or
    subtractions)."""
    scope, j, negs, last = ops[i].scope, i, 0, i
    while j < len(ops) and (not _kernel(ops[j]) or (_rope_chain(ops[j]) and ops[j].scope == scope)):
        if ops[j].name in ROPE_SIGN_OPS:
            negs += 1
            if negs > 2:
                break
        if _kernel(ops[j]):
            last = j
        j += 1
    return last + 1


# ------------------------------------------------------------------ KV cache element type and sliding windows
ATTENTION_OPS = frozenset({"attention.flash", "attention.efficient"})


def sliding_windows(config: dict) -> dict | None:
    """{'window': W, 'layer_types': [...] or None} where the model's attention is windowed (Mistral's
    sliding_window; per-layer ``layer_types`` as gpt-oss and Gemma give them; Qwen2's use_sliding_window false
    turns it off), else None."""
    window = config.get("sliding_window") or config.get("attention_chunk_size")
    if not window or config.get("use_sliding_window") is False:
        return None
    return {"window": int(window), "layer_types": config.get("layer_types")}


def windowed_fraction(config: dict) -> float:
    """The share of decoder layers whose attention is windowed (1.0 without per-layer ``layer_types``)."""
    windows = sliding_windows(config)
    if not windows:
        return 0.0
    types = windows["layer_types"]
    return 1.0 if not types else sum("full" not in str(t) for t in types) / len(types)


def windowed_layers(config: dict, layers: int) -> int:
    """How many of ``layers`` decoder layers (all, or one pipeline stage's) have windowed attention."""
    return round(windowed_fraction(config) * layers)


def _layer_index(scope: str) -> int | None:
    parts = scope.split(".")
    for a, b in zip(parts, parts[1:]):
        if a in ("layers", "h", "layer", "blocks") and b.isdigit():
            return int(b)
    return None


def _windowed(scope: str, windows: dict) -> bool:
    types = windows["layer_types"]
    i = _layer_index(scope)
    if not types or i is None:
        return True
    return "full" not in str(types[i % len(types)])


def kv_rewrite(ops: list[Op], kv_dtype: str | None, windows: dict | None) -> list[Op]:
    """Attention reading an ``kv_dtype`` KV cache (vLLM --kv-cache-dtype fp8: one byte per element) and, in
    windowed layers, the engine's sliding-window attention (FlashAttention's window_size, as vLLM's
    FlashAttentionImpl passes sliding_window): a decode reads only the last W keys of its window-sized cache; a
    prefill of several queries runs the causal kernel over the band of W keys per query (attrs ``window``), where
    HF's trace ran a masked kernel over every pair (transformers builds an explicit sliding-window mask once the
    sequence reaches the window); the in-place cache writes in ``kv_dtype`` too."""
    if kv_dtype is None and windows is None:
        return ops
    out = []
    for op in ops:
        if op.name in ATTENTION_OPS or op.name == "kv_cache.write":
            win = windows["window"] if windows and op.name != "kv_cache.write" and _windowed(op.scope, windows) \
                else None
            attrs, name = op.attrs, op.name
            if win is not None and op.name in ATTENTION_OPS:   # the engine's kernel takes the window, not a mask
                attrs = {**attrs, "has_mask": False, "backend": "flash", "masked_kernel": False}
                name = "attention.flash"
                if op.inputs[0].shape[-2] > 1:                   # several queries: the band, keys kept whole
                    attrs, win = {**attrs, "window": win, "is_causal": True}, None
            args = tuple(_kv_meta(t, i, op.name, kv_dtype, win) for i, t in enumerate(op.args))
            op = Op(name=name, args=args, kwargs=op.kwargs, outputs=op.outputs, alias=op.alias, phase=op.phase,
                    scope=op.scope, attrs=attrs)
        out.append(op)
    return out


def _kv_meta(t, i: int, name: str, kv_dtype: str | None, window: int | None):
    """K (arg 1) and V (arg 2) of an attention op, or the written tensors (K, or K and V) of a cache write."""
    is_kv = (i in (1, 2)) if name in ATTENTION_OPS else i in (0, 1)
    if not is_kv or not isinstance(t, TensorMeta) or len(t.shape) != 4:
        return t
    shape = t.shape if window is None else (*t.shape[:2], min(t.shape[2], window), t.shape[3])
    return TensorMeta(shape, kv_dtype or t.dtype)


def mla_absorb(ops: list[Op], repeats: list[float], config: dict) -> tuple[list[Op], list[float]]:
    """Decode of multi-head latent attention as serving engines run it (vLLM's MLA backends; DeepSeek-V2 paper,
    arXiv:2405.04434, section 2.1.3, absorbed up-projections): attention runs over the cached latent (kv_lora_rank
    + qk_rope_head_dim wide, one shared head) with the queries projected into it, instead of HF's per-step
    up-projection of the whole cache through kv_b_proj and the copies that assemble per-head K and V. The
    kv_b_proj GEMM keeps its weight read for the step's tokens only (q absorption and the output projection);
    the cache-wide copies go; the attention reads (B, 1, S, r + rope) keys and (B, 1, S, r) values, the values
    being the keys' first r columns (one latent cache, read once: FlashMLA / vLLM's MLA decode; attrs
    values_in_keys, formulas._attention)."""
    rank, rope = config.get("kv_lora_rank"), config.get("qk_rope_head_dim") or 0
    if not rank:
        return ops, repeats
    out, rep, tokens = [], [], None
    # activations HF allocated and the engine does not (the cache-wide up-projection and the per-head K/V it
    # assembles): taken off the live bytes of the attention module's ops until it returns (attrs gqa_freed, read by
    # fused_attention_peak)
    freed, module = 0.0, None
    for op, r in zip(ops, repeats):
        if module is not None and not op.scope.startswith(module):
            freed, module = 0.0, None
        if op.name in ("aten.mm", "fp8.quantize") and _leaf(op.scope) == "kv_b_proj":
            attn = [o for o in ops if o.name in ATTENTION_OPS and o.scope == op.scope.rpartition(".")[0]]
            q = attn[0].inputs[0] if attn else None
            if q is not None and q.shape[-2] < attn[0].inputs[1].shape[-2]:      # decode: fewer queries than keys
                tokens = q.shape[0] * q.shape[-2]
                a, o = op.inputs[0], op.outputs[0]
                freed += o.nbytes * (1 - tokens / o.shape[0]) if op.name == "aten.mm" else 0.0
                module = op.scope.rpartition(".")[0]
                op = Op(name=op.name, args=(TensorMeta((tokens, a.shape[1]), a.dtype), *op.args[1:]),
                        kwargs=op.kwargs, outputs=(TensorMeta((tokens, o.shape[1]), o.dtype), *op.outputs[1:]),
                        alias=op.alias, phase=op.phase, scope=op.scope, attrs=op.attrs)
        elif tokens and op.name == "aten.copy_" and "attn" in _leaf(op.scope) and len(op.inputs[0].shape) == 4:
            continue                                             # per-head K/V assembled from the whole cache
        elif tokens and op.name == "aten.new_empty" and "attn" in _leaf(op.scope) and op.outputs \
                and len(op.outputs[0].shape) == 4:
            freed += op.outputs[0].nbytes                        # ... into a buffer the engine never allocates
            continue
        elif tokens and op.name in ATTENTION_OPS:
            q, k, v = op.inputs[:3]
            b, h, s = q.shape[0], q.shape[1], k.shape[-2]
            args = (TensorMeta((b, h, q.shape[-2], rank + rope), q.dtype), TensorMeta((b, 1, s, rank + rope), k.dtype),
                    TensorMeta((b, 1, s, rank), v.dtype), *op.args[3:])
            op = Op(name=op.name, args=args, kwargs=op.kwargs, outputs=op.outputs, alias=op.alias, phase=op.phase,
                    scope=op.scope, attrs={**op.attrs, "values_in_keys": True})
            tokens = None
        if freed and "live_bytes" in op.attrs:
            op = replace(op, attrs={**op.attrs, "live_bytes": max(op.attrs["live_bytes"] - freed, 0.0),
                                    "gqa_freed": True})
        out.append(op)
        rep.append(r)
    return out, rep


# ------------------------------------------------------------------ HF StaticCache decode (--runtime graphs)
REPEAT_KV = "repeat_kv.copy"
FILL_LEVEL = "static_cache.fill_level"


def _traced_repeat_kv(done: list[Op], attention: Op) -> list[Op]:
    """The traced step's own repeat_kv copies of this attention's K and V (HF ran them because its step had a mask:
    a sliding window past its length): the last two ``aten.clone`` of a (B, Hkv, n_rep, L, D) expand in the same
    scope, as many elements as K, else []."""
    k = attention.inputs[1]
    numel = math.prod(k.shape)
    found = [o for o in done[-12:] if o.name == "aten.clone" and o.scope == attention.scope and o.outputs
             and len(o.outputs[0].shape) == 5 and math.prod(o.outputs[0].shape) == numel]
    return found[-2:] if len(found) >= 2 else []


def static_cache_decode(ops: list[Op], repeats: list[float], context: int, cache_len: int,
                        windows: dict | None = None) -> tuple[list[Op], list[float]]:
    """Decode attention as HF runs it with a ``StaticCache`` (transformers 5.17), compiled or not:

    - cache_utils.py StaticLayer (l. 400-503): K and V are preallocated (B, Hkv, max_cache_len, D) tensors;
      ``update`` writes the step's token with ``index_copy_`` at its fill level (l. 482-483; Inductor keeps it an
      in-place ``index_put_``: no copy of the cache, the kv_cache.write ops) and returns the *whole* tensors
      (l. 489); ``get_mask_sizes`` gives kv_length = max_cache_len (l. 491-495).
    - masking_utils.py create_causal_mask (l. 950-953): with a compileable cache and one query the mask is never
      skipped, so a (B, 1, 1, max_cache_len) mask masks the unwritten slots.
    - integrations/sdpa_attention.py (l. 27-36, 97-100): with a mask, ``use_gqa_in_sdpa`` is False and
      ``repeat_kv`` expands K and V to the query heads, ``expand(...).reshape(...)``: a copy of B x H x
      max_cache_len x D each (Inductor's post-grad graph keeps it as a clone of the expand).
    - PyTorch's SDPA with an explicit mask cannot take the flash kernel (sdp_utils.cpp check_for_attn_mask):
      it runs the masked kernel the calibration's masked_attention_table measured.
    So each decode attention op (one query per row) becomes two repeat_kv copies (where KV heads < query
    heads), the layer's fill-level update (its own small kernel: ``cumulative_length.add_``, l. 478) and a masked
    attention over max_cache_len keys of every query head. ``context``: the traced step's
    keys (self-attention over the cache; cross-attention over an encoder's output is left alone); ``cache_len``:
    max_cache_len; ``windows``: sliding-window layers keep min(max_cache_len, window) slots
    (StaticSlidingWindowLayer).
    Known inaccuracy: the mask's own construction (one small kernel per step) is not added."""
    out, rep = [], []
    for op, r in zip(ops, repeats):
        windowed = bool(windows) and _windowed(op.scope, windows)
        traced_keys = {context, min(context, windows["window"])} if windowed else {context}
        if (op.name not in ATTENTION_OPS or op.inputs[0].shape[-2] != 1 or len(op.inputs[1].shape) != 4
                or op.inputs[1].shape[-2] not in traced_keys):
            out.append(op)
            rep.append(r)
            continue
        q, k, v = op.inputs[:3]
        length = min(cache_len, windows["window"]) if windowed else cache_len
        b, heads, kv_heads = q.shape[0], q.shape[1], k.shape[1]
        traced = _traced_repeat_kv(out, op)
        if traced:   # the traced step already repeated the heads (a mask there too): its copies become ours
            kv_heads = traced[0].inputs[0].shape[1]
            for found in traced:
                i = next(j for j in range(len(out) - 1, -1, -1) if out[j] is found)
                del out[i], rep[i]
            k, v = (TensorMeta((b, kv_heads, *t.shape[2:]), t.dtype) for t in (k, v))
        keys, values = (TensorMeta((b, kv_heads, length, t.shape[-1]), t.dtype) for t in (k, v))
        if kv_heads < heads:
            expanded = [TensorMeta((b, heads, length, t.shape[-1]), t.dtype) for t in (keys, values)]
            for cached, full in zip((keys, values), expanded):
                out.append(_op(REPEAT_KV, (cached,), (full,), op.scope, static_cache=True))
                rep.append(r)
            keys, values = expanded
        level = TensorMeta((), "int64")       # the layer's cumulative_length.add_ (cache_utils.py l. 478)
        out.append(_op(FILL_LEVEL, (level,), (level,), op.scope, static_cache=True))
        rep.append(r)
        mask = TensorMeta((b, 1, 1, length), q.dtype)
        out.append(Op(name="attention.efficient", args=(q, keys, values, mask), kwargs={}, outputs=op.outputs,
                      alias=op.alias, phase=op.phase, scope=op.scope,
                      attrs={**op.attrs, "has_mask": True, "backend": "efficient", "masked_kernel": True}))
        rep.append(r)
    return out, rep
