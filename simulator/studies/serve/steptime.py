"""The one interface between the request-level simulator and a step-cost model: a batch shape in, seconds and
joules out.

One engine step is one forward pass over a mixed batch (vLLM v1 "there is no prefill or decode phase in the
scheduler", vllm/v1/core/sched/scheduler.py `Scheduler.schedule`): some sequences add a chunk of prompt tokens,
the others add one decode token. :class:`BatchShape` carries only the aggregates a step-cost model needs, so a
decode step is one shape whatever the batch size.

:class:`LinearStepTimer` is the fallback and test timer. The real timer, fitted from aisim's step-cost model, is
supplied by the caller through the :class:`StepTimer` protocol.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable

from aisim.errors import AisimError


@dataclass(frozen=True, slots=True)
class BatchShape:
    """One engine step (one forward) of a mixed batch.

    prefill_tokens: new prompt tokens computed this step (sum over prefill chunks).
    prefill_attn_pairs: sum over prefill chunks of new_tokens * (context after the chunk): the query-key pairs of
        the chunk's attention, counting the causal triangle as a full rectangle (an upper bound; a kernel that
        skips the masked half does about half of the last chunk's pairs).
    prefill_seqs: number of sequences with a prefill chunk this step.
    decode_seqs: sequences decoding one token this step.
    decode_ctx_tokens: sum of their contexts, the new token included (KV tokens read by decode attention).
    prefill_ctx_tokens: sum over prefill chunks of the context after the chunk (KV tokens a chunk attends to).
    """

    prefill_tokens: int
    prefill_attn_pairs: float
    prefill_seqs: int
    decode_seqs: int
    decode_ctx_tokens: float
    prefill_ctx_tokens: float = 0.0

    @property
    def tokens(self) -> int:
        """Tokens in the forward: prefill tokens plus one per decoding sequence."""
        return self.prefill_tokens + self.decode_seqs

    @property
    def seqs(self) -> int:
        return self.prefill_seqs + self.decode_seqs


@runtime_checkable
class StepTimer(Protocol):
    """Time and energy of one engine step. Implementations must be pure functions of the shape and fast: the
    simulator calls them once per step (tens of thousands of times per run). Optional: ``idle_power_w``, the
    replica's GPUs' power while they wait (between steps, and during a graph build); an engine that builds an
    attention graph per new shape has ``graph_build_s`` (> 0) and ``attention_shapes(shape)`` (hashable keys of the
    step's attention calls): simulate charges a replica's first step of each key (timer.StepCostTimer)."""

    def step_time_s(self, shape: BatchShape) -> float: ...

    def step_energy_j(self, shape: BatchShape) -> float: ...


@dataclass(frozen=True)
class LinearStepTimer:
    """A step time linear in the shape's aggregates, and a constant power.

    time_s = base_s + per_token_s * tokens + per_attn_pair_s * prefill_attn_pairs
             + per_decode_ctx_token_s * decode_ctx_tokens + per_seq_s * seqs
    energy_j = power_w * time_s

    base_s is the weight-read time of a memory-bound step plus launch overhead; per_token_s the dense-layer
    compute per token (2 * parameters FLOPs / achieved FLOP/s); per_attn_pair_s the attention compute per
    query-key pair (4 * hidden * layers FLOPs / achieved FLOP/s); per_decode_ctx_token_s the KV bytes per token /
    achieved HBM bandwidth; per_seq_s sampling and per-sequence bookkeeping. Known inaccuracies: no roofline
    (compute and memory time add instead of overlapping), no wave quantization, constant power.
    """

    base_s: float
    per_token_s: float = 0.0
    per_attn_pair_s: float = 0.0
    per_decode_ctx_token_s: float = 0.0
    per_seq_s: float = 0.0
    power_w: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (value >= 0.0 and value < float("inf")):
                raise AisimError(f"LinearStepTimer.{f.name} must be a finite number >= 0, got {value!r}")

    def step_time_s(self, shape: BatchShape) -> float:
        return (self.base_s + self.per_token_s * (shape.prefill_tokens + shape.decode_seqs)
                + self.per_attn_pair_s * shape.prefill_attn_pairs
                + self.per_decode_ctx_token_s * shape.decode_ctx_tokens
                + self.per_seq_s * (shape.prefill_seqs + shape.decode_seqs))

    def step_energy_j(self, shape: BatchShape) -> float:
        return self.power_w * self.step_time_s(shape)


def share(shape: BatchShape, m: int) -> BatchShape:
    """One of ``m`` balanced micro-batches of ``shape`` (a pipeline engine's batch per stage): each count a 1/m
    share, the sequence counts rounded up."""
    return BatchShape(prefill_tokens=-(-shape.prefill_tokens // m), prefill_attn_pairs=shape.prefill_attn_pairs / m,
                      prefill_seqs=-(-shape.prefill_seqs // m), decode_seqs=-(-shape.decode_seqs // m),
                      decode_ctx_tokens=shape.decode_ctx_tokens / m, prefill_ctx_tokens=shape.prefill_ctx_tokens / m)
