"""Record every aten op of a PyTorch run on the meta device, with shapes, dtypes, module scope and liveness.

A TorchDispatchMode sees each aten op after autograd (forward and backward); a TorchFunctionMode replaces
``F.scaled_dot_product_attention`` by one recorded attention op (what the GPU runs is one fused kernel, not the
math decomposition that the meta device would fall back to), and a float16 softmax to float32 by the one kernel
CUDA runs for it. Liveness: each new storage is counted from the op that allocates it until the last Python tensor
on it dies (weakref finalizers; autograd keeps saved tensors' Python objects alive, so saved activations stay live
until backward frees them).

Known inaccuracies: the caching allocator's rounding and fragmentation are not modelled; ``Tensor.item()`` on the
meta device has no value, so it returns True / 0 (the common case of HF's input checks) and is recorded as a
device-to-host sync.
"""
from __future__ import annotations

import contextlib

import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from ..units import FROM_TORCH_DTYPE as DTYPE_NAMES
from .ops import Op, TensorMeta

_ITEM = torch.ops.aten._local_scalar_dense.default


def tensor_meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(tuple(int(d) for d in t.shape), DTYPE_NAMES.get(str(t.dtype), str(t.dtype)))


def _describe(value):
    if isinstance(value, torch.Tensor):
        return tensor_meta(value)
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(value)
    return value


class Tracer:
    """Holds the recorded ops and the live-memory accounting while the dispatch modes are active."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.phase = "forward"
        self.scope: list[str] = []
        self.suppress = 0
        self._storage_refs: dict[int, int] = {}
        self._storage_bytes: dict[int, float] = {}
        self.live_bytes = 0.0
        self.peak_bytes = 0.0
        self.py_calls = 0  # Python-level torch calls since the last recorded op (eager CPU cost)
        self.param_storages: set[int] = set()  # storages of the model's parameters (weight bytes per op)

    @contextlib.contextmanager
    def suppressed(self):
        """Ops run inside are not recorded (building a cache, allocating an output); undone on exceptions too."""
        self.suppress += 1
        try:
            yield
        finally:
            self.suppress -= 1

    # ---- liveness
    def track(self, t: torch.Tensor, new: bool = True) -> None:
        """Count ``t``'s storage as live (once) until every tracked tensor on it has died.

        ``new=False`` (a view or in-place result) only adds a reference to a storage already tracked."""
        key = t.untyped_storage()._cdata
        if key not in self._storage_refs:
            if not new:
                return
            self._storage_refs[key] = 0
            self._storage_bytes[key] = float(t.untyped_storage().nbytes())
            self.live_bytes += self._storage_bytes[key]
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self._storage_refs[key] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        self._storage_refs[key] -= 1
        if self._storage_refs[key] == 0:
            self.live_bytes -= self._storage_bytes.pop(key)
            del self._storage_refs[key]

    # ---- recording
    def record(self, name: str, args, kwargs, outputs, alias: bool, attrs: dict | None = None) -> Op:
        op = Op(name=name, args=tree_map(_describe, tuple(args)), kwargs=tree_map(_describe, dict(kwargs)),
                outputs=tuple(tensor_meta(o) for o in outputs), alias=alias, phase=self.phase,
                scope=self.scope[-1] if self.scope else "", attrs=attrs or {})
        op.attrs["live_bytes"] = self.live_bytes
        op.attrs["py_calls"] = self.py_calls
        self.py_calls = 0
        self.ops.append(op)
        return op


class _Dispatch(TorchDispatchMode):
    def __init__(self, tracer: Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tracer = self.tracer
        if func is _ITEM:
            tracer.record("aten._local_scalar_dense", args, kwargs, (), alias=True, attrs={"sync": True})
            return True if args[0].dtype == torch.bool else 0
        out = _grouped_mm_16(func, args, kwargs) if func is _GROUPED_MM else func(*args, **kwargs)
        if tracer.suppress:
            return out
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
        inputs = _tensors(args, kwargs)
        in_storages = {a.untyped_storage()._cdata for a in inputs}
        alias = all(o.untyped_storage()._cdata in in_storages for o in outs) if outs else True
        name = f"aten.{func._schema.name.split('::')[-1]}" + (
            f".{func._overloadname}" if func._overloadname != "default" else "")
        attrs = {"view": bool(func.is_view), "pointwise": torch.Tag.pointwise in func.tags}
        if not func.is_view and any(_transposed(a) for a in inputs):
            attrs["transposed"] = True   # an operand read across its innermost dim (uncoalesced elementwise)
        if func is _CAT and _strided_cat(inputs, outs):
            attrs["strided_inputs"] = True
        if func in _MATMULS:
            unaligned = _unaligned(outs, inputs)
            if unaligned:
                attrs["unaligned"] = unaligned
        if func is _BADDBMM and outs and inputs[0].numel() < outs[0].numel():
            attrs["broadcast_input"] = True     # ATen copies it, expanded, into the output first (ops_time)
        if tracer.param_storages:
            weight = sum(a.numel() * a.element_size() for a in inputs
                         if a.untyped_storage()._cdata in tracer.param_storages)
            if weight:
                attrs["weight_bytes"] = float(weight)
        tracer.record(name, args, kwargs, outs, alias, attrs)
        for o in outs:
            tracer.track(o, new=not alias)
        tracer.ops[-1].attrs["live_bytes"] = tracer.live_bytes
        return out


_CAT = torch.ops.aten.cat.default
_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
            torch.ops.aten.baddbmm.default)
_BADDBMM = torch.ops.aten.baddbmm.default
ALIGN_BYTES = 16      # cuBLASLt's fast (TMA) kernels need 16-byte-aligned leading dimensions and pointers
_GROUPED_MM = getattr(torch.ops.aten, "_grouped_mm", None)
_GROUPED_MM = _GROUPED_MM.default if _GROUPED_MM is not None else None


def _grouped_mm_16(func, args, kwargs):
    """aten._grouped_mm's meta kernel takes bf16 only; serving engines' fused MoE kernels take fp16 as well, and
    on CUDA other dtypes run ATen's fallback, one mm per group (aten/src/ATen/native/cuda/GroupedBlas.cpp,
    _grouped_mm_fallback): HF's experts under autocast with fp32 weights call it in fp32 (grouped_mm is not
    autocast-enabled; transformers/integrations/moe.py casts the input to the weights' dtype). Such a grouped GEMM
    is shaped through bf16 and recorded with its own operands (priced at their dtype's rate; the fallback's copy of
    the offsets to the host, a sync, is not modelled)."""
    other = (torch.float16, torch.float32)
    dtype = next((a.dtype for a in args if isinstance(a, torch.Tensor) and a.dtype in other), None)
    if dtype is None:
        return func(*args, **kwargs)
    cast = [a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.dtype in other else a for a in args]
    return func(*cast, **kwargs).to(dtype)


def _strided_cat(inputs, outs) -> bool:
    """Whether PyTorch's CUDA cat runs its batched strided kernel (CatArrayBatchedCopy) for this call: two or more
    inputs (empty ones included), at most 4 dims, 32-bit indexing, a contiguous output format, and some non-empty
    input not contiguous. With every input contiguous it takes the vectorized copy; beyond those limits it copies
    input by input (aten/src/ATen/native/cuda/Shape.cu, cat_out_cuda). HF's DynamicCache.update with a key sliced
    from a fused QKV projection (BLOOM; GPT-2 from batch 2), rotate_half's halves of a transposed q or k."""
    if len(inputs) < 2 or not outs or outs[0].dim() > 4 or outs[0].numel() >= 2 ** 31:
        return False              # (an empty input counts: DynamicCache's first update cats onto an empty tensor)
    out = outs[0]
    if out.dim() == 4 and not out.is_contiguous() and out.is_contiguous(memory_format=torch.channels_last):
        return False              # channels_last: a format the strided branch does not take (Shape.cu)
    return any(a.numel() and not a.is_contiguous() for a in inputs)


def _misaligned(t: torch.Tensor) -> bool:
    """Whether a 16-bit matrix operand (its last two dims) has a leading dimension or start off 16 bytes."""
    if t.dim() < 2 or t.element_size() != 2 or 1 in t.shape[-2:]:
        return False
    rows, cols = t.stride(-2), t.stride(-1)
    lead = rows if cols == 1 else cols if rows == 1 else None
    step = ALIGN_BYTES // t.element_size()
    return lead is not None and (lead % step != 0 or t.storage_offset() % step != 0)


def _unaligned(outs, inputs) -> str | None:
    """A GEMM cuBLAS cannot give its aligned kernels: "output" if the output's leading dimension is off 16 bytes
    (an LM head over an odd vocabulary), "input" if only an operand's is, None if aligned (cost/ops_time.py)."""
    if any(_misaligned(o) for o in outs):
        return "output"
    return "input" if any(_misaligned(a) for a in inputs) else None


def _transposed(t: torch.Tensor) -> bool:
    """Whether ``t`` is laid out with its innermost dim strided (a transposed view), not broadcast along it."""
    return t.dim() >= 2 and t.shape[-1] > 1 and t.stride(-1) not in (0, 1)


def _tensors(args, kwargs):
    found = []
    tree_map(lambda v: found.append(v) if isinstance(v, torch.Tensor) else None, (args, kwargs))
    return found


def sdpa_backend(query, key, attn_mask) -> str:
    """The backend PyTorch's CUDA SDPA dispatcher picks among flash, a masked/fused kernel and math.

    "efficient" stands for the fused kernel that takes a mask: the memory-efficient one, or cuDNN's where the build
    ranks it first (torch 2.11 on H100 ran cuDNN for masked 16-bit calls: validation/data/profiles/cb-*-profile.txt;
    masked calls are costed from the calibration's masked table measured with that same kernel). cuDNN takes 16-bit
    only, so the fp32 choice below does not depend on it.

    aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (torch 2.5-2.11): flash needs fp16/bf16, head_dim <= 256 and
    no explicit mask (check_for_attn_mask), and admits grouped KV heads (check_batch_size_and_num_heads_dense<true>);
    memory-efficient takes fp32 too and a mask, but its dense constraints instantiate
    check_batch_size_and_num_heads_dense<false /*supports_grouped_query_attention*/>, so KV heads fewer than query
    heads rule it out. transformers passes enable_gqa=True exactly when the mask is None
    (integrations/sdpa_attention.py use_gqa_in_sdpa, v5.17 line 36; otherwise repeat_kv expands K/V first), so an
    fp32 model with grouped KV heads runs the math path: the full softmax(QK^T) matrix is materialised and, in
    training, kept for backward per layer."""
    head_dim = query.shape[-1]
    grouped = key.dim() >= 3 and query.dim() >= 3 and key.shape[-3] != query.shape[-3]
    if query.dtype in (torch.float16, torch.bfloat16) and head_dim <= 256 and attn_mask is None:
        return "flash"
    if not grouped and query.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return "efficient"
    return "math"


class _Attention(torch.autograd.Function):
    """One fused attention kernel (flash or memory-efficient), recorded instead of its decomposition."""

    @staticmethod
    def forward(ctx, tracer, attrs, q, k, v, mask):
        with tracer.suppressed():
            out = q.new_empty((*q.shape[:-1], v.shape[-1]))
        ctx.tracer, ctx.attrs = tracer, attrs
        ctx.save_for_backward(q, k, v, out)
        tracer.record(f"attention.{attrs['backend']}", (q, k, v, mask), {}, (out,), alias=False, attrs=dict(attrs))
        tracer.track(out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out = ctx.saved_tensors
        tracer = ctx.tracer
        with tracer.suppressed():
            grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
        tracer.record(f"attention.{ctx.attrs['backend']}_backward", (q, k, v, out, grad_out), {}, grads,
                      alias=False, attrs=dict(ctx.attrs))
        for g in grads:
            tracer.track(g)
        return None, None, *grads, None


_SOFTMAXES = {torch.nn.functional.softmax: (3, torch.ops.aten._softmax),
              torch.nn.functional.log_softmax: (3, torch.ops.aten._log_softmax),
              torch.softmax: (2, torch.ops.aten._softmax), torch.log_softmax: (2, torch.ops.aten._log_softmax),
              torch.Tensor.softmax: (2, torch.ops.aten._softmax),
              torch.Tensor.log_softmax: (2, torch.ops.aten._log_softmax)}


def _half_to_float_softmax(func, args, kwargs):
    """``softmax(x, dim, dtype=torch.float32)`` of a float16 ``x`` as CUDA runs it: one kernel reading the half input
    and writing float (aten/src/ATen/native/SoftMax.cpp softmax/log_softmax: ``input_.is_cuda() && Half &&
    dtype == Float`` -> ``_softmax(input_, dim_, true)``); the meta device would cast first (a separate copy of the
    whole input in float, a kernel that does not run on the GPU). None: not that case, run ``func`` as it is."""
    dtype_at, aten_op = _SOFTMAXES[func]
    x = args[0] if args else kwargs.get("input")
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    dtype = args[dtype_at] if len(args) > dtype_at else kwargs.get("dtype")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float16 or dtype != torch.float32 or dim is None:
        return None
    return aten_op(x, dim, True)


class _Functions(TorchFunctionMode):
    def __init__(self, tracer: Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.tracer.py_calls += 1
            return self._attention(*args, **kwargs)
        if func in _SOFTMAXES:
            fused = _half_to_float_softmax(func, args, kwargs)
            if fused is not None:
                self.tracer.py_calls += 1
                return fused
        if not self.tracer.suppress and getattr(func, "__name__", "") != "__get__":
            self.tracer.py_calls += 1
        return func(*args, **kwargs)

    def _attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
        backend = sdpa_backend(query, key, attn_mask)
        if backend == "math":   # traced as the aten ops PyTorch's math path runs (the meta device runs the same)
            return torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                enable_gqa=enable_gqa)
        attrs = {"is_causal": bool(is_causal) and query.shape[-2] > 1, "has_mask": attn_mask is not None,
                 "backend": backend, "dropout_p": float(dropout_p)}
        return _Attention.apply(self.tracer, attrs, query, key, value, attn_mask)


class ScopeHooks:
    """Module pre/post hooks that keep the tracer's module-path stack (forward pass only)."""

    def __init__(self, model: torch.nn.Module, tracer: Tracer):
        self.handles = []
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._push(name, tracer)))
            self.handles.append(module.register_forward_hook(self._pop(tracer)))

    @staticmethod
    def _push(name, tracer):
        def hook(module, args):
            tracer.scope.append(name)
            if not tracer.suppress:
                tracer.record("module.call", (), {}, (), alias=True, attrs={"module": type(module).__name__})
        return hook

    @staticmethod
    def _pop(tracer):
        def hook(module, args, output):
            if tracer.scope:
                tracer.scope.pop()
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class tracing:
    """Context manager: ``with tracing(model) as tracer: model(...)`` records ops into ``tracer.ops``."""

    def __init__(self, model: torch.nn.Module | None = None, tracer: Tracer | None = None):
        self.tracer = tracer or Tracer()
        self.model = model

    def __enter__(self) -> Tracer:
        self._hooks = ScopeHooks(self.model, self.tracer) if self.model is not None else None
        if self.model is not None:
            self.tracer.param_storages = {p.untyped_storage()._cdata for p in self.model.parameters()}
        self._fn = _Functions(self.tracer)
        self._dispatch = _Dispatch(self.tracer)
        self._fn.__enter__()
        self._dispatch.__enter__()
        return self.tracer

    def __exit__(self, *exc):
        self._dispatch.__exit__(*exc)
        self._fn.__exit__(*exc)
        if self._hooks:
            self._hooks.remove()
        return False
