"""Estimate results: pydantic objects that the API returns and the CLI only renders (stable JSON)."""
from __future__ import annotations

from pydantic import BaseModel, Field


class OpCost(BaseModel):
    """One op kind (aten op name plus shape class) aggregated over the graph, per GPU."""
    name: str
    count: int
    flops: float
    bytes: float
    time_ms: float
    bound: str = Field(description="compute, memory, overhead or network")
    share: float


class MemoryBreakdown(BaseModel):
    weights_gb: float
    activations_gb: float
    kv_cache_gb: float
    gradients_gb: float
    optimizer_gb: float
    workspace_gb: float
    total_gb: float
    capacity_gb: float


class Estimate(BaseModel):
    """Top level of ``aisim estimate --json``. Runtime is per step of the workload; memory is the peak per GPU."""
    model: str
    device: str
    workload: dict
    plan: dict
    runtime: str
    runtime_ms: float | None
    memory_gb: float
    memory: MemoryBreakdown
    energy_j: float | None
    energy_j_per_token: float | None
    power_w: float | None
    throughput_tokens_per_s: float | None
    tokens: int
    fits: bool
    flops: float
    bytes: float
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    phases: dict[str, float] = Field(default_factory=dict, description="phase name -> ms")
    top_ops: list[OpCost] = Field(default_factory=list)
    unknown_ops: list[str] = Field(default_factory=list)
    calibrated: bool
    assumptions: list[str] = Field(default_factory=list)
    not_fit_reason: str | None = None
