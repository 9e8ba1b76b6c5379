"""Spec files: pydantic models for hardware, systems, runtimes and calibration, and their YAML loading.

Every spec is data (YAML shipped in ``aisim.hardware_specs``); adding a GPU means adding a file, never code.
Fields carry their unit in their name; extra fields are forbidden so a typo in a spec file is an error.
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

DType = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8"]


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PeakFlops(Spec):
    """Dense peak FLOP/s per dtype (no sparsity). ``None`` where the GPU has no such unit."""
    fp32: float
    tf32: float | None = None
    fp16: float
    bf16: float | None = None
    fp8: float | None = None
    int8: float | None = None


class PowerModeSpec(Spec):
    """A named operating mode of a GPU (a laptop's OS power profile): its power limit and/or clock cap."""
    power_limit_w: float | None = None
    gpu_clock_mhz: float | None = None
    source: str


class HardwareSpec(Spec):
    """One GPU model, from its datasheet. ``sources`` names a citation for each numeric field."""
    name: str
    display_name: str
    aliases: list[str] = Field(default_factory=list)
    vendor: str = "nvidia"
    architecture: str
    compute_capability: str
    has_tensor_cores: bool
    peak_flops_per_s: PeakFlops
    memory_bytes: float
    memory_bw_bytes_per_s: float
    l2_bytes: float
    sm_count: int
    boost_clock_mhz: float
    base_clock_mhz: float | None = None
    board_power_w: float
    idle_power_w: float
    pcie_gen: int
    pcie_lanes: int
    nvlink_bw_bytes_per_s: float = Field(0.0, description="total NVLink bandwidth per GPU, both directions; 0 if none")
    nvlink_kind: Literal["none", "bridge", "switch"] = "none"
    power_modes: dict[str, PowerModeSpec] = Field(default_factory=dict)
    sources: dict[str, str]
    notes: str = ""

    @model_validator(mode="after")
    def _every_number_cited(self) -> "HardwareSpec":
        needed = {"peak_flops_per_s", "memory_bytes", "memory_bw_bytes_per_s", "l2_bytes", "sm_count",
                  "boost_clock_mhz", "board_power_w", "idle_power_w", "pcie_gen"}
        if self.nvlink_bw_bytes_per_s:
            needed.add("nvlink_bw_bytes_per_s")
        missing = sorted(needed - set(self.sources))
        if missing:
            raise ValueError(f"hardware spec {self.name!r}: no source given for {missing}")
        return self

    def peak_for(self, dtype: str) -> float:
        """Dense peak FLOP/s for a compute dtype, falling back to the next wider unit the GPU has."""
        order = {"fp8": ["fp8", "fp16"], "int8": ["int8", "fp16"], "bf16": ["bf16", "fp16"],
                 "fp16": ["fp16"], "tf32": ["tf32", "fp32"], "fp32": ["fp32"]}[dtype]
        for d in order:
            value = getattr(self.peak_flops_per_s, d)
            if value:
                return value
        return self.peak_flops_per_s.fp32


class InterconnectSpec(Spec):
    """How the GPUs of one host talk to each other, as seen by a collective."""
    kind: Literal["pcie", "pcie-switch", "nvlink-bridge", "nvswitch", "none"]
    algorithm: Literal["ring", "tree", "switch"] = "ring"
    link_bw_bytes_per_s: float = Field(description="achievable one-direction bandwidth per GPU into the fabric")
    latency_s: float = Field(description="per-step latency of a collective (launch + sync)")
    allreduce_cpu_s: float | None = Field(None, description="CPU cost to issue one collective on this host "
                                          "(replaces the device calibration's, measured on another GPU count)")
    source: str


class SystemSpec(Spec):
    """N GPUs of one kind in one host and the links between them."""
    name: str
    aliases: list[str] = Field(default_factory=list)
    gpu: str
    gpu_count: int
    interconnect: InterconnectSpec
    host_power_w: float = 0.0
    notes: str = ""


class Curve(Spec):
    """Piecewise-linear curve in log10(x): achieved fraction of a peak as a function of op size."""
    x: list[float]
    efficiency: list[float]

    @model_validator(mode="after")
    def _same_length(self) -> "Curve":
        if len(self.x) != len(self.efficiency) or not self.x:
            raise ValueError("curve needs equal, non-empty x and efficiency lists")
        if any(b <= a for a, b in zip(self.x, self.x[1:])):
            raise ValueError("curve x must increase")
        return self


class GemmTable(Spec):
    """Measured GEMM efficiency (roofline time / measured time) on a grid of M, N, K (log-interpolated)."""
    m: list[int]
    n: list[int]
    k: list[int]
    efficiency: list[list[list[float]]]


class CalibrationSpec(Spec):
    """Efficiencies, overheads and power coefficients of one device, each with its provenance."""
    device: str
    measured: bool = Field(description="true: microbenchmarks on the device; false: documented default rules")
    provenance: dict[str, str]
    gemm_efficiency: dict[str, Curve] = Field(description="per dtype: efficiency vs FLOPs of one GEMM")
    gemm_tables: dict[str, GemmTable] = Field(default_factory=dict)
    attention_efficiency: dict[str, Curve] = Field(description="per dtype: efficiency vs FLOPs of one attention call")
    memory_efficiency: Curve = Field(description="achieved fraction of memory bandwidth vs bytes moved")
    transposed_memory_efficiency: Curve | None = Field(
        None, description="the same for elementwise ops with an operand whose innermost dim is strided (a "
                          "transpose: uncoalesced reads); absent: the memory curve is used")
    launch_overhead_s: float = Field(description="GPU-side gap between back-to-back kernels")
    eager_dispatch_s: float = Field(description="CPU time to dispatch one aten op in eager PyTorch")
    graphs_dispatch_s: float = Field(description="CPU time per kernel under CUDA graphs / fused engines")
    module_overhead_s: float = Field(0.0, description="extra Python time per nn.Module call in eager HF models")
    eager_python_call_s: float | None = Field(None, description="CPU time per Python-level torch call (fit)")
    eager_kernel_dispatch_s: float | None = Field(None, description="CPU time per kernel-launching aten op (fit)")
    eager_view_dispatch_s: float | None = Field(None, description="CPU time per view aten op (fit)")
    eager_framework_scale: float = Field(1.0, description="measured / predicted CPU time of tiny HF models "
                                         "(validation/framework_overhead.py): the Python between the ops")
    allreduce_cpu_s: float | None = Field(None, description="CPU time to issue one small NCCL all-reduce")
    power_compute_fraction: float = Field(description="power at full compute load / board power")
    power_memory_fraction: float = Field(description="power at full memory-bound load / board power")
    idle_power_w: float | None = None
    power_compute_curve: Curve | None = Field(None, description="x: fraction of peak FLOP/s a GEMM loop achieves; "
                                              "efficiency: its average power / power limit (linear in x)")
    power_memory_curve: Curve | None = Field(None, description="x: fraction of bandwidth a copy loop achieves; "
                                             "efficiency: its average power / power limit")
    active_power_w: float | None = Field(None, description="power while the GPU runs only tiny kernels (clocked "
                                         "up, nearly idle): the floor during a step")
    allreduce_bus_bw_bytes_per_s: float | None = None
    allreduce_latency_s: float | None = None
    notes: str = ""


class BackendEfficiency(Spec):
    """What an engine's own kernels reach on one class of GPU (matched on architecture and tensor cores): the
    large-GEMM fraction of the datasheet peak for the workload dtype and the fraction of memory bandwidth that its
    memory-bound kernels reach. They replace the plateaus of the device calibration, whose curve shapes are kept."""
    architecture: str | None = None
    has_tensor_cores: bool | None = None
    dtypes: list[str] | None = Field(None, description="workload dtypes the entry applies to (all if absent)")
    gemm_fraction_of_peak: float = Field(gt=0, le=1)
    memory_fraction_of_bw: float = Field(gt=0, le=1)
    source: str

    def matches(self, gpu: "HardwareSpec", dtype: str | None = None) -> bool:
        return ((self.architecture is None or self.architecture == gpu.architecture)
                and (self.has_tensor_cores is None or self.has_tensor_cores == gpu.has_tensor_cores)
                and (self.dtypes is None or dtype is None or dtype in self.dtypes))


class RequestLoopSpec(Spec):
    """A serving engine's per-request work after each forward (token chooser, stopping criteria, detokenizing,
    building the response), counted in its source: small kernels, host syncs, Python-level torch calls, and
    full-vocabulary memory passes over the logits rows it post-processes."""
    launches: int = Field(ge=0)
    syncs: int = Field(ge=0)
    py_calls: int = Field(ge=0)
    vocab_passes: int = Field(ge=0, description="reads + writes of a rows x vocab fp16 logits tensor")
    prefill_rows: Literal["last", "all"] = Field("last", description="all: prompt logprobs over every position")
    prefill_syncs: int = Field(0, ge=0, description="extra syncs per request at prefill (.tolist() of logprobs)")
    source: str


class RuntimeSpec(Spec):
    """A serving/execution engine profile: per-step overheads and efficiency factors, documented."""
    name: str
    description: str
    dispatch: Literal["eager", "graphs", "none"] = Field(
        description="eager: CPU dispatch per aten op; graphs: per kernel; none: kernel time only (profiler sums)")
    per_step_overhead_s: float = 0.0
    kernel_overhead_s: float | None = Field(None, description="graphs dispatch: CPU/queue cost per kernel, "
                                            "instead of the device calibration's graphs_dispatch_s")
    compute_efficiency_scale: float = 1.0
    memory_efficiency_scale: float = 1.0
    attn_impl: Literal["auto", "eager", "sdpa"] = Field(
        "auto", description="how the engine runs attention: fused (sdpa/auto) or explicit matmul + softmax (eager)")
    encode_cross_kv: bool = Field(False, description="the engine projects cross-attention K/V in the encode phase")
    kv_cache: Literal["concat", "preallocated"] = Field(
        "concat", description="concat: HF's DynamicCache re-copies the cache each step (torch.cat); preallocated: "
                              "the engine writes only the new tokens' K/V into a fixed buffer (ggml, vLLM)")
    beam_batching: Literal["batch", "unified"] = Field(
        "batch", description="beam search: beams as batch rows with their own caches (HF generate), or as tokens of "
                             "one decoder call over a unified KV cache with one shared cross-attention K/V "
                             "(whisper.cpp, llama.cpp)")
    efficiency: list[BackendEfficiency] = Field(default_factory=list)
    matvec_max_tokens: int = Field(0, ge=0, description="matmuls of at most this many tokens (rows) run as the "
                                   "engine's weight-streaming mat-vec kernels: costed on the memory curve")
    vendors: list[str] | None = Field(None, description="GPU vendors the engine runs on (all if absent)")
    prefill_logits: Literal["last", "all"] = Field("last", description="logits at prefill: last position only "
                                                   "(HF generate, logits_to_keep=1) or every position")
    request_loop: RequestLoopSpec | None = None
    source: str

    def backend_efficiency(self, gpu: "HardwareSpec", dtype: str | None = None) -> BackendEfficiency | None:
        return next((e for e in self.efficiency if e.matches(gpu, dtype)), None)


# ---------------------------------------------------------------- loading

def _spec_dir(sub: str) -> Path:
    return Path(str(resources.files("aisim.hardware_specs"))) / sub


def _load_yaml(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


@lru_cache(maxsize=None)
def all_hardware() -> dict[str, HardwareSpec]:
    return {p.stem: HardwareSpec(**_load_yaml(p)) for p in sorted(_spec_dir("gpus").glob("*.yaml"))}


@lru_cache(maxsize=None)
def all_systems() -> dict[str, SystemSpec]:
    return {p.stem: SystemSpec(**_load_yaml(p)) for p in sorted(_spec_dir("systems").glob("*.yaml"))}


@lru_cache(maxsize=None)
def all_runtimes() -> dict[str, RuntimeSpec]:
    return {p.stem: RuntimeSpec(**_load_yaml(p)) for p in sorted(_spec_dir("runtimes").glob("*.yaml"))}


@lru_cache(maxsize=None)
def load_calibration(device: str) -> CalibrationSpec:
    """The device's measured calibration file, else the documented default rules (``measured: false``)."""
    path = _spec_dir("calibration") / f"{device}.yaml"
    if not path.exists():
        path = _spec_dir("calibration") / "default.yaml"
    return CalibrationSpec(**_load_yaml(path))
