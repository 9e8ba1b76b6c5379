"""The operator graph: one record per traced aten op (shapes and dtypes only), and the graph that holds them."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..units import DTYPE_BYTES as ELEMENT_BYTES


@dataclass(frozen=True, slots=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> float:
        return self.numel * ELEMENT_BYTES.get(self.dtype, 4)


@dataclass(slots=True)
class Op:
    """One traced op. ``args`` keeps the call's arguments with tensors replaced by TensorMeta.

    ``alias`` is true when every output aliases an input (views, in-place ops): no new memory is allocated.
    ``phase`` is forward, backward or optimizer; ``scope`` the module path in the forward pass.
    """
    name: str
    args: tuple
    kwargs: dict
    outputs: tuple[TensorMeta, ...]
    alias: bool
    phase: str = "forward"
    scope: str = ""
    attrs: dict = field(default_factory=dict)

    @property
    def inputs(self) -> list[TensorMeta]:
        found: list[TensorMeta] = []
        _collect(self.args, found)
        _collect(tuple(self.kwargs.values()), found)
        return found

    @property
    def signature(self) -> tuple:
        """What makes two ops cost the same: name, argument shapes/values and outputs."""
        return (self.name, _freeze(self.args), _freeze(self.kwargs), self.outputs, self.phase)


def optimizer_op(optimizer: str, n_params: int, dtype: str, n_tensors: int, impl: str = "fused") -> Op:
    """The optimizer step as one op over ``n_params`` parameters in ``dtype`` held in ``n_tensors`` tensors, costed
    by the optimizer formulas (formulas._optimizer: ``impl`` fused or foreach)."""
    return Op(name=f"optimizer.{optimizer}", args=(TensorMeta((n_params,), dtype),), kwargs={}, outputs=(),
              alias=False, phase="optimizer", attrs={"n_tensors": n_tensors, "impl": impl})


def gemm_dims(op: Op) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a matmul-family op."""
    ins = op.inputs
    if op.name in ("aten.addmm", "aten.baddbmm"):
        a, b = ins[1], ins[2]
    else:
        a, b = ins[0], ins[1]
    batch = a.shape[0] if len(a.shape) == 3 else 1
    return batch, a.shape[-2], b.shape[-1], a.shape[-1]


def _collect(values, found: list) -> None:
    for v in values:
        if isinstance(v, TensorMeta):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            _collect(v, found)


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


@dataclass
class Graph:
    """A traced workload on one GPU: ops in execution order, each with a repeat count after layer scaling.

    ``peak_activation_bytes`` is the peak of live tensors over the trace (weights excluded), scaled to the full
    layer count; ``persistent_bytes`` what stays allocated after the step (KV cache).
    """
    ops: list[Op]
    repeats: list[float]
    param_count: int
    param_bytes: float
    peak_activation_bytes: float
    persistent_bytes: float
    layers: int
    traced_layers: tuple[int, int]
    meta: dict = field(default_factory=dict)
