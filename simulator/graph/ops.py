"""The operator graph: one record per traced aten op (shapes and dtypes only), and the graph that holds them."""
from __future__ import annotations

from dataclasses import dataclass, field

DTYPE_NAMES = {
    "torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float64": "fp64",
    "torch.int64": "int64", "torch.int32": "int32", "torch.int8": "int8", "torch.uint8": "uint8",
    "torch.bool": "bool", "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8", "torch.int16": "int16",
    "torch.complex64": "c64",
}
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8, "int64": 8, "int32": 4, "int8": 1, "uint8": 1,
                 "bool": 1, "fp8": 1, "int16": 2, "c64": 8, "int4": 0.5}


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
