"""torch.autocast emulated on the meta device (autocast has no meta backend: under ``torch.autocast("cuda")`` meta
tensors keep their dtype), as a TorchFunctionMode that applies autocast's CUDA op lists.

Source: pytorch aten/src/ATen/autocast_mode.cpp (torch 2.x), ``TORCH_LIBRARY_IMPL(aten, AutocastCUDA, m)``:
- ``lower_precision_fp`` ops run in the autocast dtype: every floating input is cast (linear, matmul, mm, bmm,
  addmm, baddbmm, conv*, scaled_dot_product_attention, ...);
- ``fp32`` ops run in float32 (pow, rsqrt, exp, log, layer_norm, group_norm, nll_loss, cross_entropy, mse_loss,
  ...): their inputs are cast;
- ``fp32_set_opt_dtype`` ops (softmax, log_softmax, sum, prod, cumsum, cumprod) are not cast: called without a
  dtype on a 16-bit input, they get ``dtype=torch.float32`` (so CUDA's softmax reads fp16 and writes fp32 in one
  kernel, graph/tracer.py);
- everything else runs in whatever dtype its inputs have (so a residual stream that starts as the fp32 embedding
  output stays fp32 while the linear outputs are bf16).
Casts of leaf tensors that require grad (the weights) are cached for the autocast region (autocast_mode.cpp,
``cached_cast``): one cast per weight per forward; the driver clears the cache when the forward ends, as leaving
the ``with torch.autocast`` block does. Recomputed layers (non-reentrant checkpointing re-enters autocast for each
layer) cast again. Known inaccuracies: the op lists are matched by the Python-level function name.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

LOWER = {"linear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm", "addbmm", "mv",
         "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "scaled_dot_product_attention",
         "prelu", "addmv", "addr", "chain_matmul"}
FP32 = {"acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "pow", "softplus", "layer_norm", "group_norm", "norm", "nll_loss", "cross_entropy",
        "mse_loss", "l1_loss", "smooth_l1_loss", "kl_div", "binary_cross_entropy_with_logits", "logsumexp",
        "cdist"}
SET_OPT_DTYPE = {"softmax", "log_softmax", "sum", "prod", "cumsum", "cumprod"}
_LOW = (torch.float16, torch.bfloat16)


class Autocast(TorchFunctionMode):
    """``with Autocast(torch.bfloat16):`` runs the model code as ``torch.autocast("cuda", torch.bfloat16)``."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype
        self.cache: dict[int, torch.Tensor] = {}
        self.caching = True

    def clear(self, caching: bool = True) -> None:
        self.cache.clear()
        self.caching = caching

    def without_cache(self) -> "Autocast":
        self.caching = False
        return self

    def _cast(self, value, dtype):
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.dtype == dtype:
            return value
        if dtype == torch.float32 and value.dtype not in _LOW:
            return value
        leaf = self.caching and value.is_leaf and value.requires_grad
        if leaf and id(value) in self.cache:
            return self.cache[id(value)]
        out = value.to(dtype)
        if leaf:
            self.cache[id(value)] = out
        return out

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in SET_OPT_DTYPE:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            given = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)
            if first is not None and first.dtype in _LOW and not given:
                kwargs = {**kwargs, "dtype": torch.float32}
            return func(*args, **kwargs)
        target = self.dtype if name in LOWER else (torch.float32 if name in FP32 else None)
        if target is not None:
            args = tuple(self._cast_tree(a, target) for a in args)
            kwargs = {k: self._cast_tree(v, target) for k, v in kwargs.items()}
        return func(*args, **kwargs)

    def _cast_tree(self, value, dtype):
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            return type(value)(self._cast(v, dtype) for v in value)
        return self._cast(value, dtype)
