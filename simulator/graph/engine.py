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


def moe_routing(config: dict, plan=None) -> dict | None:
    """{'experts': E, 'top_k': k, 'token_groups': g} of a mixture-of-experts config (Mixtral, Qwen-MoE, OLMoE,
    DeepSeek, gpt-oss key names), else None; g = ep / tp ranks send their tokens to each expert-parallel rank."""
    experts = next((config[k] for k in EXPERT_COUNT_KEYS if config.get(k)), None)
    top_k = next((config[k] for k in TOP_K_KEYS if config.get(k)), None)
    if not experts or not top_k:
        return None
    groups = max(plan.ep // plan.tp, 1) if plan is not None else 1
    return {"experts": int(experts), "top_k": int(top_k), "token_groups": groups}


def routed(op: Op, moe: dict) -> Op:
    """A grouped expert GEMM tagged with the routing it runs under (a copy: traced ops are shared by caches)."""
    return Op(name=op.name, args=op.args, kwargs=op.kwargs, outputs=op.outputs, alias=op.alias, phase=op.phase,
              scope=op.scope, attrs={**op.attrs, "moe": moe})


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
           batch: int, moe: dict | None = None) -> tuple[list[Op], list[float]]:
    """The graph's ops with the engine's own work expanded in (unchanged when there is none). ``moe``: the
    model's routing (moe_routing), tagged onto its grouped expert GEMMs."""
    bnb = w.quant == "bitsandbytes-int8"
    loop = rt.request_loop is not None and w.phase in ("prefill", "decode")
    if not bnb and not loop and moe is None:
        return ops, repeats
    out_ops, out_rep = [], []
    for op, r in zip(ops, repeats):
        if moe is not None and op.name == "aten._grouped_mm":
            op = routed(op, moe)
        extra = bnb_int8_ops(op) if bnb and _is_linear(op) else [op]
        out_ops += extra
        out_rep += [r] * len(extra)
    if loop:
        added = request_loop_ops(rt, w, vocab)
        out_ops += added
        out_rep += [float(batch)] * len(added)
    return out_ops, out_rep
