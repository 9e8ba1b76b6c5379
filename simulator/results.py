"""Estimate results: pydantic objects that the API returns and the CLI only renders (stable JSON)."""
from __future__ import annotations

from pydantic import BaseModel, Field, computed_field

from .workload import ParallelPlan, Workload


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
    """Peak memory per GPU as PyTorch's allocator counts it (``total_gb``: torch.cuda.max_memory_allocated), the GPU's
    memory (``capacity_gb``) and what the process holds outside the allocator (``runtime_reserved_gb``: the CUDA
    context, and NCCL's buffers with a process group). It fits when ``total_gb <= usable_gb``."""
    weights_gb: float
    activations_gb: float
    kv_cache_gb: float
    gradients_gb: float
    optimizer_gb: float
    workspace_gb: float
    total_gb: float
    capacity_gb: float
    runtime_reserved_gb: float = 0.0
    nccl_reserved_gb: float = Field(0.0, description="the part of runtime_reserved_gb that is NCCL's buffers")

    @computed_field
    @property
    def usable_gb(self) -> float:
        return self.capacity_gb - self.runtime_reserved_gb


class SpeechPhase(BaseModel):
    """One line of whisper.cpp's timing printout, estimated. CPU phases carry no times (outside the GPU model)."""
    name: str
    runs: int | None = None
    run_unit: str = Field("calls", description="calls, or tokens for batchd and prompt (as whisper.cpp counts)")
    total_ms: float | None = None
    per_run_ms: float | None = None
    on: str = Field("gpu", description="gpu (estimated) or cpu (not modelled)")


class TrainFigures(BaseModel):
    """A training step's plan and figures beside the Estimate's runtime and memory (``aisim estimate --workload
    train``): what ``aisim plan train`` reports per plan."""
    precision: str = Field(description="Lightning's name: bf16-mixed, 16-mixed, bf16-true, 16-true, 32-true")
    zero_stage: int
    fsdp: str
    recompute: str
    optimizer: str
    micro_batch: int
    grad_accum: int
    pp_schedule: str
    tokens_per_step: int
    tokens_per_s_per_gpu: float | None
    model_tflops_per_gpu: float | None = Field(description="6 N + causal attention FLOPs per token x tokens/s / GPUs")
    hardware_tflops_per_gpu: float | None = Field(description="traced FLOPs (recompute included) / step / GPUs")
    mfu: float | None = Field(description="model TFLOP/s per GPU / mfu_peak_tflops")
    mfu_peak_tflops: float = Field(description="the GPU's dense peak in the precision's compute dtype")
    time_to_train_s: float | None = None


class Estimate(BaseModel):
    """Top level of ``aisim estimate --json``. Runtime is per step of the workload; memory is the peak per GPU."""
    model: str
    device: str
    workload: Workload
    plan: ParallelPlan
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
    gpu_busy_ms: float | None = Field(None, description="kernel time on one GPU of one pipeline stage, launch gaps "
                                      "included (the runtime where the GPU sets the pace)")
    host_busy_ms: float | None = Field(None, description="host (CPU) time issuing the ops of one pipeline stage (the "
                                       "runtime where the host sets the pace: small eager steps)")
    phases: dict[str, float] = Field(default_factory=dict, description="phase name -> ms")
    speech: list[SpeechPhase] = Field(default_factory=list, description="transcribe: whisper.cpp's phase lines")
    top_ops: list[OpCost] = Field(default_factory=list)
    unknown_ops: list[str] = Field(default_factory=list)
    calibrated: bool = Field(description="a measured calibration of this GPU (not the default rules, not another "
                                         "GPU's file given with --calibration)")
    assumptions: list[str] = Field(default_factory=list)
    not_fit_reason: str | None = None
    training: TrainFigures | None = Field(None, description="train workload: the plan and its figures")
