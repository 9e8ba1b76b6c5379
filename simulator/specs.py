"""Spec files: pydantic models for hardware, systems, runtimes and calibration, and their YAML loading.

Every spec is data (YAML shipped in ``aisim.hardware_specs``); adding a GPU means adding a file, never code.
Fields carry their unit in their name; extra fields are forbidden so a typo in a spec file is an error.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import AisimError

MAX_SPEC_FILE_BYTES = 8 * 2**20

DType = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8"]


class SpecFileError(AisimError):
    """A spec file that cannot be read or does not validate; the message names the file and the field."""


class SpecWarning(UserWarning):
    """A spec file skipped while loading all of one kind."""


# Constrained numbers for spec fields: finite (allow_inf_nan=False on every spec), and
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
Count = Annotated[int, Field(ge=1)]
# a measured average power over the limit: boards briefly draw above it (the H100 GEMM loop averaged 1.002)
PowerFraction = Annotated[float, Field(gt=0, le=1.2)]


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class PeakFlops(Spec):
    """Dense peak FLOP/s per dtype (no sparsity). ``None`` where the GPU has no such unit."""
    fp32: Positive
    tf32: Positive | None = None
    fp16: Positive
    bf16: Positive | None = None
    fp8: Positive | None = None
    int8: Positive | None = None


class PowerModeSpec(Spec):
    """A named operating mode of a GPU (a laptop's OS power profile): its power limit and/or clock cap."""
    power_limit_w: Positive | None = None
    gpu_clock_mhz: Positive | None = None
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
    memory_bytes: Positive
    memory_bw_bytes_per_s: Positive
    l2_bytes: Positive
    sm_count: Count
    boost_clock_mhz: Positive
    base_clock_mhz: Positive | None = None
    board_power_w: Positive
    idle_power_w: Positive
    pcie_gen: Annotated[int, Field(ge=1, le=7)]
    pcie_lanes: Annotated[int, Field(ge=1, le=32)]
    nvlink_bw_bytes_per_s: NonNegative = Field(0.0, description="total NVLink bandwidth per GPU, both directions; 0 if none")
    nvlink_kind: Literal["none", "bridge", "switch"] = "none"
    power_modes: dict[str, PowerModeSpec] = Field(default_factory=dict)
    min_power_limit_w: Positive | None = Field(None, description="the lowest power limit the board accepts "
                                               "(nvidia-smi power.min_limit); cite it in sources")
    price_usd_per_gpu_hour: float | None = Field(None, gt=0, description="a default on-demand cloud price per GPU "
                                                  "hour (planner input; override with --price); cite it in sources")
    sources: dict[str, str]
    notes: str = ""

    @model_validator(mode="after")
    def _every_number_cited(self) -> "HardwareSpec":
        needed = {"peak_flops_per_s", "memory_bytes", "memory_bw_bytes_per_s", "l2_bytes", "sm_count",
                  "boost_clock_mhz", "board_power_w", "idle_power_w", "pcie_gen"}
        if self.nvlink_bw_bytes_per_s:
            needed.add("nvlink_bw_bytes_per_s")
        if self.price_usd_per_gpu_hour is not None:
            needed.add("price_usd_per_gpu_hour")
        if self.min_power_limit_w is not None:
            needed.add("min_power_limit_w")
            if self.min_power_limit_w > self.board_power_w:
                raise ValueError(f"min_power_limit_w {self.min_power_limit_w:g} W is above board_power_w "
                                 f"{self.board_power_w:g} W")
        missing = sorted(needed - set(self.sources))
        if missing:
            raise ValueError(f"hardware spec {self.name!r}: no source given for {missing}")
        if self.idle_power_w >= self.board_power_w:
            raise ValueError(f"idle_power_w {self.idle_power_w:g} must be below board_power_w {self.board_power_w:g}")
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
    link_bw_bytes_per_s: NonNegative = Field(description="achievable one-direction bandwidth per GPU into the "
                                             "fabric (0 only for a single GPU)")
    latency_s: NonNegative = Field(description="per-step latency of a collective (launch + sync)")
    allreduce_cpu_s: NonNegative | None = Field(None, description="CPU cost to issue one collective on this host "
                                          "(replaces the device calibration's, measured on another GPU count)")
    source: str


class NetworkSpec(Spec):
    """The links between the nodes of a multi-node system, as a collective sees them."""
    kind: Literal["infiniband", "roce", "ethernet"]
    nics_per_node: Annotated[int, Field(ge=1, le=1024)]
    nic_bw_bytes_per_s: Annotated[float, Field(gt=0)] = Field(description="line rate of one NIC, one direction")
    bus_bw_fraction: Annotated[float, Field(gt=0, le=1)] = Field(
        description="achieved NCCL bus bandwidth across nodes over the line rate")
    latency_s: NonNegative = Field(description="fixed cost of one inter-node collective phase")
    rail_optimized: bool = Field(True, description="GPU i of every node on the same leaf switch (rail): the "
                                 "ring between nodes stays on its rail")
    non_rail_penalty: Annotated[float, Field(ge=1)] = Field(1.0, description="bandwidth divisor when not "
                                                            "rail-optimised (traffic crosses the spine)")
    source: str


class SystemSpec(Spec):
    """N GPUs of one kind in one host and the links between them; or, with ``gpus_per_node`` and ``network``,
    ``gpu_count`` GPUs in nodes of ``gpus_per_node`` (``interconnect``: the links inside a node)."""
    name: str
    aliases: list[str] = Field(default_factory=list)
    gpu: str
    gpu_count: Annotated[int, Field(ge=1, le=100_000)]
    interconnect: InterconnectSpec
    host_power_w: NonNegative = 0.0
    gpus_per_node: Annotated[int, Field(ge=1, le=1024)] | None = None
    network: NetworkSpec | None = None

    @model_validator(mode="after")
    def _links(self) -> "SystemSpec":
        if self.gpu_count > 1 and self.interconnect.link_bw_bytes_per_s <= 0:
            raise ValueError(f"interconnect.link_bw_bytes_per_s must be positive for {self.gpu_count} GPUs")
        return self
    notes: str = ""


class Curve(Spec):
    """Piecewise-linear curve in log10(x): achieved fraction of a peak as a function of op size."""
    x: list[float]
    efficiency: list[Fraction]

    @model_validator(mode="after")
    def _same_length(self) -> "Curve":
        if len(self.x) != len(self.efficiency) or not self.x:
            raise ValueError("curve needs equal, non-empty x and efficiency lists")
        if any(b <= a for a, b in zip(self.x, self.x[1:])):
            raise ValueError("curve x must increase")
        return self


class WaveTiles(Spec):
    """The output tile (tile_m x tile_n, ``ctas_per_sm`` resident per SM) whose partial last wave a GEMM of >=
    ``min_waves`` full waves pays; below that cuBLAS picks smaller tiles and the table's own interpolation stands."""
    tile_m: Count
    tile_n: Count
    ctas_per_sm: Count = 1
    min_waves: Count = 2


class PowerLimitMix(Spec):
    """A GEMM loop holds the GPU at its power limit by lowering the clocks; between memory-bound kernels a GEMM runs
    unthrottled and draws more, and the limiter then holds the whole mix near the limit. ``compute_dynamic_ratio``:
    a compute-bound kernel's power above the waiting power, in a mix, over what its loop drew; ``limit_fraction``:
    the average a limited step holds, over board power."""
    compute_dynamic_ratio: Annotated[float, Field(ge=1.0, le=3.0)]
    limit_fraction: Annotated[float, Field(gt=0.5, le=1.0)]
    gemm_loop_clock_mhz: Positive | None = Field(
        None, description="the SM clock at which the limit holds a 16-bit GEMM loop (NVML, sampled through the "
        "power_mix gemm and gemm_small loops, median): about the clock the calibrated times of such GEMMs ran at, "
        "from which a --gpu-clock cap slows them (cost.power.reference_clock_mhz); absent: the boost clock")


class GemmTable(Spec):
    """Measured GEMM efficiency (roofline time / measured time) on a grid of M, N, K (log-interpolated)."""
    m: list[Count]
    n: list[Count]
    k: list[Count]
    efficiency: list[list[list[Fraction]]]

    @model_validator(mode="after")
    def _grid(self) -> "GemmTable":
        shape = (len(self.m), len(self.n), len(self.k))
        if (len(self.efficiency) != shape[0] or any(len(row) != shape[1] for row in self.efficiency)
                or any(len(col) != shape[2] for row in self.efficiency for col in row)):
            raise ValueError(f"efficiency must be an m x n x k = {shape} grid")
        return self


class MaskedAttentionTable(Spec):
    """Measured efficiency (roofline time / measured time) of SDPA with an explicit [1, 1, Q, K] mask (what
    transformers' paged|sdpa runs: cuDNN's attention kernel under PyTorch 2.11 on H100, per the engine's profile in
    validation/data/profiles/cb-*-profile.txt) on a Q x K grid, log-interpolated."""
    q: list[Count]
    k: list[Count]
    heads: Count
    efficiency: list[list[Fraction]]


class CalibrationSpec(Spec):
    """Efficiencies, overheads and power coefficients of one device, each with its provenance."""
    device: str
    measured: bool = Field(description="true: microbenchmarks on the device; false: documented default rules")
    provenance: dict[str, str]
    gemm_efficiency: dict[str, Curve] = Field(description="per dtype: efficiency vs log10 FLOPs of one GEMM; "
                                              "'<dtype>-memory' (e.g. fp8-memory): the dtype's memory-bound calls, "
                                              "efficiency vs log10 bytes moved (cost.efficiency.gemm_efficiency)")
    gemm_tables: dict[str, GemmTable] = Field(default_factory=dict)
    attention_efficiency: dict[str, Curve] = Field(description="per dtype: efficiency vs FLOPs of one attention call")
    memory_efficiency: Curve = Field(description="achieved fraction of memory bandwidth vs bytes moved")
    memory_op_efficiency: dict[str, Curve] = Field(
        default_factory=dict, description="per kernel family measured on its own: that family's curve, read by the "
        "ATen ops that run the kernel (efficiency.MEMORY_OP_FAMILY: 'cat', PyTorch's vectorized cat of contiguous "
        "inputs, from validation/harness/eager_attention.py via derive_eager_attention --write) instead of the "
        "median over calibrate's elementwise kernels (memory_efficiency), whose plateau is 0.89 / 0.80 of bandwidth "
        "on H100 / H200 where the cat's is 0.85 / 0.82; read on another GPU as the median curve is (a fraction of "
        "bandwidth at equal roofline time); absent: the median curve")
    transposed_memory_efficiency: Curve | None = Field(
        None, description="the same for elementwise ops with an operand whose innermost dim is strided (a "
                          "transpose: uncoalesced reads); absent: the memory curve is used")
    gemm_memory_efficiency: Curve | None = Field(
        None, description="GEMMs below the ridge point (skinny M: decode, mat-vec) where the calibration has no GEMM "
                          "table for the dtype: achieved fraction of memory bandwidth vs bytes moved; absent: the FLOPs "
                          "curve (which charges a memory-bound GEMM a compute efficiency)")
    view_copy_efficiency: Fraction | None = Field(
        None, description="a large copy out of a view whose innermost dim is contiguous but whose outer dims are "
                          "permuted or sliced (PyTorch's generic elementwise copy kernel: .contiguous() of a "
                          "transposed [1, H, K, D] view of cached keys): achieved fraction of datasheet bandwidth, "
                          "bytes read + written (H100 0.495, H200 0.363: the same ~1.7 TB/s, so not bandwidth-bound; "
                          "a file applied to another GPU is read as a fraction, an approximation); absent: the "
                          "strided-operand curve")
    strided_cat_elements_per_sm_cycle: Positive | None = Field(
        None, description="PyTorch's CUDA cat with a non-contiguous input (its strided kernel, CatArrayBatchedCopy, "
                          "for the whole output): output elements per SM per boost-clock cycle. Not bound by "
                          "bandwidth (the same rate on H100 and H200, which differ 1.43x in bandwidth); that it "
                          "scales with SMs x clock on other GPUs is an assumption (only those two were measured); "
                          "absent: the default rules' value")
    unaligned_gemm_efficiency: dict[str, dict[Literal["output", "input"], Fraction]] = Field(
        default_factory=dict, description="per GPU architecture: 16-bit GEMMs with a leading dimension that is not "
        "a multiple of 8 elements (an odd vocabulary's LM head), which cuBLAS runs on older kernels: the achieved "
        "fraction of the 16-bit peak when the output's (``output``) or only an input's (``input``) is odd; "
        "compute-bound GEMMs of the measured row range take the lower of it and the aligned efficiency; absent: "
        "the default rules'; an architecture in neither: not modelled")
    broadcast_copy_bandwidth_fraction: dict[int, Fraction] = Field(
        default_factory=dict, description="a copy from an expanded operand (baddbmm's input, BLOOM's ALiBi bias), "
        "PyTorch's non-vectorized kernel: fraction of the reference GPU's datasheet bandwidth of the bytes written, "
        "per element size, read on another GPU at the same rate by SMs x clock (efficiency.broadcast_fraction); "
        "absent: the default rules', else the memory curve")
    outer_broadcast_bandwidth_fraction: dict[int, Fraction] = Field(
        default_factory=dict, description="an elementwise op with an operand of its own rank broadcast along an "
        "outer dim ((B, 1, S, S) mask over (B, H, S, S)), PyTorch's non-vectorized kernel: fraction of the reference "
        "GPU's datasheet bandwidth per output element size, read elsewhere by SMs x clock, a ceiling on the memory "
        "curve; absent: the default rules'")
    multi_tensor_bandwidth_fraction: dict[int, Fraction] = Field(
        default_factory=dict, description="multi_tensor_apply kernels (the foreach and fused optimizers): fraction "
        "of datasheet bandwidth per element size in bytes; absent: the default rules', else the memory curve")
    cuda_context_bytes: NonNegative | None = Field(
        None, description="device memory a PyTorch process holds outside its caching allocator (the CUDA context and "
        "the kernels it loaded): not PyTorch's to allocate, so a configuration fits when its peak plus this is "
        "within the GPU's memory (validation/scripts/derive_runtime_memory.py: NVML used less torch reserved in the "
        "suite runs); absent: the default rules'")
    nccl_buffer_bytes: NonNegative | None = Field(
        None, description="NCCL's communicator buffers beside the context once a process group exists (tensor, "
        "pipeline or data parallel); absent: the default rules'")
    stream_bandwidth_fraction: Fraction | None = Field(
        None, description="fraction of datasheet bandwidth a plain streaming kernel (a large copy or add) reaches, "
        "taken as the same on every HBM GPU: on another GPU than the reference, a memory-bound GEMM-table entry "
        "keeps its measured time less this streaming part as a duration and streams at this GPU's bandwidth "
        "(cost/efficiency.py transferred_memory_efficiency); absent: the default rules'")
    reference_gpu: str | None = Field(
        None, description="the GPU whose datasheet the curves' x axes refer to (default: `device`, if it names a GPU "
                          "spec). On another GPU a curve over bytes (FLOPs) is read at equal roofline time: x scaled by "
                          "the reference's bandwidth (peak) over the target's (Little's law: a kernel needs bandwidth x "
                          "latency bytes in flight to saturate; cost/efficiency.py)")
    launch_overhead_s: NonNegative = Field(description="GPU-side gap between back-to-back kernels")
    eager_dispatch_s: NonNegative = Field(description="CPU time to dispatch one aten op in eager PyTorch")
    graphs_dispatch_s: NonNegative = Field(description="CPU time per kernel under CUDA graphs / fused engines")
    module_overhead_s: NonNegative = Field(0.0, description="extra Python time per nn.Module call in eager HF models")
    eager_python_call_s: NonNegative | None = Field(None, description="CPU time per Python-level torch call (fit)")
    eager_kernel_dispatch_s: NonNegative | None = Field(None, description="CPU time per kernel-launching aten op "
                                                        "(fit)")
    eager_view_dispatch_s: NonNegative | None = Field(None, description="CPU time per view aten op (fit)")
    eager_op_dispatch_s: dict[str, NonNegative] = Field(
        default_factory=dict, description="CPU time to dispatch one call of these aten ops, which do more host work "
        "than one kernel launch (torch.sort, torch._grouped_mm, cumsum, histc: validation/harness/grouped_gemm.py, "
        "relative to a masked_fill_ in the same loop); replaces eager_kernel_dispatch_s for them")
    eager_add_dispatch_s: NonNegative | None = Field(
        None, description="CPU time of one eager torch.add of two small tensors (calibrate_bench add_out_s): the unit "
        "of eager_op_host_ratio")
    eager_op_host_ratio: dict[str, Positive] = Field(
        default_factory=dict, description="per aten op: the host cost of one eager call relative to a plain add "
        "(validation/harness/op_host.py, tiny non-judged shapes; keys 'kernel' and 'view' for the ops not listed). "
        "Where set (with eager_add_dispatch_s), an op costs eager_add_dispatch_s x its ratio instead of the "
        "kernel/view split")
    eager_framework_scale: Positive = Field(1.0, description="measured / predicted CPU time of tiny HF models "
                                         "(validation/framework_overhead.py): the Python between the ops")
    eager_phase_scale: dict[Literal["decode", "train"], Positive] = Field(
        default_factory=dict, description="multiplies eager_framework_scale in steps of this phase: the tiny models' "
        "host time per predicted op in a DynamicCache decode step (decode) or a forward-backward (train: autograd's "
        "recording and backward engine) over the same in their forward, timed in one loop "
        "(validation/framework_overhead.py bench_framework_phases); absent: 1")
    eager_framework_arch_scale: dict[str, dict[Literal["forward", "decode", "train"], Positive]] = Field(
        default_factory=dict, description="per HF model_type and phase ('forward' for forward and prefill steps): "
        "multiplies eager_framework_scale x eager_phase_scale. The tiny model of that architecture's host time per "
        "predicted op over the median of the four tiny families that eager_framework_scale is fitted on, in the same "
        "round (validation/harness/framework_arch.py: width 64, never a judged model; "
        "validation/scripts/derive_framework_arch.py). A phase not listed takes the architecture's 'forward'; an "
        "architecture not listed, 1. The shipped files set none: measured on one H100 host, the table did not make "
        "the measured suites better overall (derive_framework_arch --evaluate)")
    eager_step_host_adds: dict[Literal["forward", "train"], NonNegative] = Field(
        default_factory=dict, description="HF's host work once per model call outside the per-op costs (mask "
        "creation, the model-level Python and output wrappers), in plain adds (eager_add_dispatch_s), before "
        "eager_framework_scale and eager_phase_scale; 'forward' for forward, prefill and decode steps, 'train' for "
        "a forward-backward. The intercept of host time over depth of tiny non-judged models "
        "(validation/framework_overhead.py bench_framework_depth). Applies with the per-op host table only")
    allreduce_cpu_s: NonNegative | None = Field(None, description="CPU time to issue one small NCCL all-reduce")
    eager_collective_host_adds: dict[int, NonNegative] = Field(
        default_factory=dict, description="per group size: host work of one all-reduce issued from eager HF code "
        "(the TP suites' forward hook calling torch.distributed.all_reduce, validation/tp.py), in plain adds "
        "(eager_add_dispatch_s) before eager_framework_scale: the extra time per all-reduce of tiny non-judged "
        "models at TP 2 and TP 4 over their TP 1 twins (validation/scripts/derive_collective_host.py). A group "
        "size not listed takes the largest listed size below it (the smallest above it if none). An eager "
        "all-reduce costs the host the larger of it and allreduce_cpu_s (a tight loop's issue cost; the in-model "
        "figure includes the issue: on the measuring hosts aisim charged none); in a file without "
        "eager_add_dispatch_s (default.yaml) the unit is its per-op dispatch cost. Like every host cost it takes "
        "the train phase scale in a forward-backward (backward all-reduces were not measured)")
    power_compute_fraction: PowerFraction = Field(description="power at full compute load / board power")
    power_memory_fraction: PowerFraction = Field(description="power at full memory-bound load / board power")
    idle_power_w: Positive | None = None
    power_compute_curve: Curve | None = Field(None, description="x: fraction of peak FLOP/s a GEMM loop achieves; "
                                              "efficiency: its average power / power limit (linear in x)")
    power_memory_curve: Curve | None = Field(None, description="x: fraction of bandwidth a copy loop achieves; "
                                             "efficiency: its average power / power limit")
    active_power_w: Positive | None = Field(None, description="power while the GPU runs only tiny kernels (clocked "
                                         "up, nearly idle): the floor during a step")
    power_limit_mix: PowerLimitMix | None = Field(
        None, description="how a step's power follows the board's power limit when compute-bound kernels mix with "
        "memory-bound ones (cost/energy.py limited_energy_j; validation/harness/power_mix.py); absent: each "
        "kernel draws what a loop of it drew")
    power_overlap: Annotated[float, Field(ge=0.0, le=2.0)] = Field(
        0.0, description="a kernel busy on tensor cores and HBM at once draws the larger of its two activities' power "
        "above the waiting power plus this share of the smaller (cost/energy.py; 0: the larger alone). Fitted to "
        "weight-streaming GEMM loops of 1-4096 rows (validation/harness/power_mix.py --skinny, "
        "validation/scripts/derive_power_overlap.py)")
    allreduce_bus_bw_bytes_per_s: Positive | None = None
    allreduce_latency_s: NonNegative | None = None
    gemm_wave_tiles: dict[str, WaveTiles] = Field(
        default_factory=dict, description="per dtype: the output tile of the GEMM kernels cuBLAS runs (its SIMT "
        "sgemm for fp32), so that a shape between the table's grid points pays its partial last wave over the SMs "
        "(efficiency.wave_factor; validation/scripts/derive_gemm_waves.py from gemm_layout.py's dense sweeps); "
        "absent: the table is read as measured")
    grouped_gemm_tables: dict[str, GemmTable] = Field(
        default_factory=dict, description="per dtype: efficiency of the grouped expert GEMM (torch._grouped_mm, one "
        "CUTLASS kernel over all experts) on a grid of rows per expert (m) x N x K, every expert of the grid's E "
        "getting m rows (validation/harness/grouped_gemm.py); absent: the dense GEMM table at rows per touched expert")
    broadcast_memory_efficiency: Curve | None = Field(
        None, description="16-bit elementwise ops with an operand broadcast along the innermost dim (an (S, 1) mask "
                          "or column against (S, H): MoE routing masked fills and weight multiplies), which PyTorch "
                          "runs in its non-vectorized kernel: fraction of bandwidth vs bytes; absent: the memory curve")
    masked_attention_table: MaskedAttentionTable | None = Field(
        None, description="SDPA with an explicit mask (validation/harness/sdpa_mask.py; absent: the attention curve)")
    architecture_gemm_plateau: dict[str, dict[Literal["fp32", "tf32", "fp16", "bf16"], Fraction]] = Field(
        default_factory=dict, description="default rules only: per GPU architecture and GEMM dtype, the large-GEMM "
        "plateau where the measured GPUs of that architecture sit off the rule's (provenance.gemm); that dtype's "
        "curve is scaled to it for a GPU of that architecture without a calibration")
    notes: str = ""

    def for_architecture(self, architecture: str) -> "CalibrationSpec":
        """These rules as they apply to a GPU of ``architecture``: measured files unchanged; the default rules with
        their GEMM curves scaled to that architecture's plateau per dtype where it has one."""
        plateaus = self.architecture_gemm_plateau.get(architecture)
        if self.measured or not plateaus:
            return self
        curves = dict(self.gemm_efficiency)
        for dtype, plateau in plateaus.items():
            if dtype in curves:
                c = curves[dtype]
                scale = plateau / max(c.efficiency)
                curves[dtype] = Curve(x=c.x, efficiency=[e * scale for e in c.efficiency])
        return self.model_copy(update={"gemm_efficiency": curves})


class HostSpec(Spec):
    """The host half of a calibration (``aisim calibrate --host-only``): CPU costs of eager PyTorch measured on one
    machine (tight op loops and tiny HF models, validation/framework_overhead.py). Two VMs of the same GPU kind
    differ here by up to 1.5x (docs/accuracy.md), so a host file replaces these fields of the GPU's calibration
    (``--host PATH``); the GPU curves stay."""
    eager_dispatch_s: NonNegative
    graphs_dispatch_s: NonNegative
    module_overhead_s: NonNegative = 0.0
    eager_python_call_s: NonNegative | None = None
    eager_kernel_dispatch_s: NonNegative | None = None
    eager_view_dispatch_s: NonNegative | None = None
    eager_add_dispatch_s: NonNegative | None = None
    eager_framework_scale: Positive = 1.0
    provenance: dict[str, str] = Field(default_factory=dict)

    def apply(self, cal: "CalibrationSpec") -> "CalibrationSpec":
        """``cal`` with this host's constants. The ops with their own measured host cost (eager_op_dispatch_s,
        stored in units of the calibration's per-kernel cost) scale with the per-kernel cost."""
        update = {f: getattr(self, f) for f in HOST_FIELDS}
        ratio = (self.eager_kernel_dispatch_s / cal.eager_kernel_dispatch_s
                 if self.eager_kernel_dispatch_s and cal.eager_kernel_dispatch_s else 1.0)
        update["eager_op_dispatch_s"] = {k: v * ratio for k, v in cal.eager_op_dispatch_s.items()}
        return cal.model_copy(update=update)


# host-side constants of a calibration (the machine's CPU, Python and driver, not the GPU): HostSpec's fields
HOST_FIELDS = tuple(f for f in HostSpec.model_fields if f != "provenance")


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


class SmallGpuDefaults(Spec):
    """Scheduler defaults an engine picks on smaller GPUs (vLLM's EngineArgs.get_batch_defaults: under 70 GiB of
    device memory, or an A100 by name)."""
    max_num_seqs: int = Field(ge=1, le=65536)
    max_num_batched_tokens: int = Field(ge=1, le=1_048_576)
    below_memory_gib: Positive = Field(description="a GPU with less memory than this takes these defaults")
    names: list[str] = Field(default_factory=list, description="... and a GPU whose name contains one of these")


class ServingSpec(Spec):
    """A continuous-batching engine's scheduler defaults and memory policy, each cited from its source
    (aisim serve and aisim plan read them; the CLI overrides them)."""
    max_num_seqs: int = Field(ge=1, le=65536, description="most sequences running in one step")
    max_num_batched_tokens: int = Field(ge=1, le=1_048_576, description="token budget of one step")
    small_gpu: SmallGpuDefaults | None = Field(None, description="the two defaults above on smaller GPUs")
    enable_chunked_prefill: bool = True
    block_size: int = Field(ge=1, le=4096, description="KV cache block (page) size in tokens")
    gpu_memory_utilization: Fraction = Field(description="fraction of GPU memory the engine may use (weights, "
                                             "activations, KV cache)")
    memory_of: Literal["total", "free"] = Field("total", description="what the fraction applies to: total GPU "
                                                "memory (vLLM) or the memory free after loading (transformers CB)")
    activation_reserve_bytes_per_token: NonNegative = Field(0.0, description="transient memory per batched token "
                                                            "reserved beside the KV cache")
    cuda_graph_reserve_bytes: NonNegative = Field(0.0, description="memory the engine keeps for CUDA graphs")
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    enable_prefix_caching: bool = Field(False, description="a request preempted by recompute finds the computed "
                                        "blocks it freed still cached when it is readmitted, unless other "
                                        "requests' allocations reused them (EngineConfig.enable_prefix_caching)")
    pipeline_batches: bool = Field(False, description="with pipeline parallel stages, one batch in flight per stage "
                                   "(vLLM V1's batch queue): the running requests split into up to pp disjoint "
                                   "batches that follow each other through the stages, each with its own token "
                                   "budget; false: a step runs its stages one after another")
    scheduler_overhead_s: NonNegative = Field(0.0, description="CPU time per engine step outside the model's "
                                              "forward (scheduling, batch preparation, sampling, detokenizing)")
    scheduler_overhead_per_seq_s: NonNegative = Field(0.0, description="the part of it that grows with each "
                                                      "running sequence")
    prefill_slack_tokens: int = Field(0, ge=0, le=65_536, description="room a prompt chunk's KV block allocation leaves "
                                      "beyond the chunk's tokens (EngineConfig.prefill_slack_tokens)")
    attention_graph_build_s: NonNegative = Field(
        0.0, description="host time to build the attention kernel's execution graph for a query and key count the "
        "engine has not run before (cuDNN SDPA caches one graph per exact shape for the engine's lifetime); added "
        "to a step once per new attention shape in it, per simulated replica run")
    attention: Literal["varlen", "packed-mask"] = Field(
        "varlen", description="varlen: each sequence attends to its own context (flash varlen / paged kernels); "
        "packed-mask: one SDPA over all the step's queries and keys with a block-diagonal mask (transformers CB)")
    extra_layer_ops: int = Field(0, ge=0, description="packed-mask: kernel-launching ops per layer the engine adds "
                                 "around attention (cache writes and reads, KV head repeats)")
    extra_layer_views: int = Field(0, ge=0, description="packed-mask: view ops per layer it adds")
    prepare_s: NonNegative = Field(0.0, description="host time per step to build the batch's index tensors, fixed")
    prepare_per_seq_s: NonNegative = Field(0.0, description="... per sequence in the step")
    prepare_per_kv_token_s: NonNegative = Field(0.0, description="... per KV token the step reads")
    source: str


class RuntimeSpec(Spec):
    """A serving/execution engine profile: per-step overheads and efficiency factors, documented."""
    name: str
    description: str
    framework: Literal["pytorch", "ggml"] = Field(
        "pytorch", description="what runs the steps: pytorch (a CUDA context and NCCL buffers outside its caching "
        "allocator, calibration's cuda_context_bytes / nccl_buffer_bytes, count against the GPU's memory) or ggml "
        "(its own allocator and context, not modelled)")
    dispatch: Literal["eager", "graphs", "none"] = Field(
        description="eager: CPU dispatch per aten op; graphs: per kernel; none: kernel time only (profiler sums)")
    per_step_overhead_s: NonNegative = 0.0
    kernel_overhead_s: NonNegative | None = Field(None, description="graphs dispatch: CPU/queue cost per kernel, "
                                            "instead of the device calibration's graphs_dispatch_s")
    compute_efficiency_scale: Fraction = 1.0
    memory_efficiency_scale: Fraction = 1.0
    attn_impl: Literal["auto", "eager", "sdpa"] = Field(
        "auto", description="how the engine runs attention: fused (sdpa/auto) or explicit matmul + softmax (eager)")
    encode_cross_kv: bool = Field(False, description="the engine projects cross-attention K/V in the encode phase")
    kv_cache: Literal["concat", "preallocated"] = Field(
        "concat", description="concat: HF's DynamicCache re-copies the cache each step (torch.cat); preallocated: "
                              "the engine writes only the new tokens' K/V into a fixed buffer (ggml, vLLM)")
    replay_kernel_gap_s: NonNegative | None = Field(
        None, description="graphs dispatch: GPU time added after each kernel of a replayed CUDA graph beyond the "
        "calibration's tiny-kernel replay (launch_overhead_s), fitted on compiled models "
        "(validation/scripts/derive_graphs_replay.py); None: no such gap")
    static_cache: bool = Field(False, description="decode with HF's StaticCache (kv_cache preallocated): every step "
                               "attends over the whole max_cache_len buffer with an explicit mask, so SDPA repeats "
                               "the KV heads (repeat_kv copies) and runs its masked kernel "
                               "(aisim.graph.engine.static_cache_decode)")
    beam_batching: Literal["batch", "unified"] = Field(
        "batch", description="beam search: beams as batch rows with their own caches (HF generate), or as tokens of "
                             "one decoder call over a unified KV cache with one shared cross-attention K/V "
                             "(whisper.cpp, llama.cpp)")
    efficiency: list[BackendEfficiency] = Field(default_factory=list)
    matvec_max_tokens: int = Field(0, ge=0, description="matmuls of at most this many tokens (rows) run as the "
                                   "engine's weight-streaming mat-vec kernels: costed on the memory curve")
    vendors: list[str] | None = Field(None, description="GPU vendors the engine runs on (all if absent)")
    min_compute_capability: dict[Literal["bf16", "fp8", "mxfp4"], Annotated[str, Field(pattern=r"^\d+\.\d+$")]] = Field(
        default_factory=dict, description="the lowest NVIDIA compute capability on which the engine runs bf16 models "
        "(bf16), fp8 quantization (fp8) or a checkpoint's MXFP4 weights (mxfp4); cite the check in source")
    prefill_logits: Literal["last", "all"] = Field("last", description="logits at prefill: last position only "
                                                   "(HF generate, logits_to_keep=1) or every position")
    request_loop: RequestLoopSpec | None = None
    fusions: list[Literal["add_rms_norm", "silu_and_mul", "rotary", "native_gqa", "merged_projections",
                          "kv_write_pair", "eager_attention", "fused_moe"]] = Field(
        default_factory=list, description="the engine's fused kernels replacing HF's chains of small ones "
        "(aisim.graph.engine.fuse): residual add + RMSNorm, SiLU-and-mul, rotary embedding of q and k, K/V read "
        "natively for GQA, q/k/v and gate/up projections as one GEMM each, a layer's K and V cache writes as one "
        "kernel, HF's explicit attention (bmm, softmax, bmm) as the engine's fused attention kernel, HF's MoE "
        "routing bookkeeping as the engine's fused MoE kernels")
    serving: ServingSpec | None = Field(None, description="continuous-batching engine defaults (aisim serve)")
    vocab_parallel_head: bool = Field(False, description="under tensor parallelism the engine shards the LM head "
                                      "over the vocabulary and gathers the logits (tp scope 'full' where 'all' "
                                      "was asked)")
    replicate_kv_heads: bool = Field(False, description="under tensor parallelism over more GPUs than the model "
                                     "has KV heads, each GPU holds one KV head, replicated tp / num_key_value_heads "
                                     "times (tp must be a multiple of num_key_value_heads); false: tp must divide "
                                     "num_key_value_heads")
    source: str

    def backend_efficiency(self, gpu: "HardwareSpec", dtype: str | None = None) -> BackendEfficiency | None:
        return next((e for e in self.efficiency if e.matches(gpu, dtype)), None)


@dataclass(frozen=True)
class Device:
    """A resolved device: one GPU spec, a count, and the interconnect between the GPUs."""
    gpu: HardwareSpec
    count: int
    system: SystemSpec | None
    interconnect: InterconnectSpec
    assumptions: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        if self.system is not None:
            return self.system.name
        return self.gpu.name if self.count == 1 else f"{self.gpu.name}x{self.count}"


# ---------------------------------------------------------------- loading

USER_SPECS_ENV = "AISIM_SPECS_DIR"
USER_SPECS_DEFAULT = Path("~/.config/aisim/specs")
KINDS = {"gpus": "HardwareSpec", "systems": "SystemSpec", "runtimes": "RuntimeSpec"}


def user_spec_dir() -> Path:
    """The user's own spec files (gpus/, systems/, runtimes/, calibration/): ``$AISIM_SPECS_DIR``, else
    ``~/.config/aisim/specs``. Files there add to (or, by file name, replace) the shipped ones; ``aisim calibrate``
    writes its calibration there, where estimates read it."""
    return Path(os.environ.get(USER_SPECS_ENV) or USER_SPECS_DEFAULT).expanduser()


def _spec_dirs(sub: str) -> list[Path]:
    return [Path(str(resources.files("aisim.hardware_specs"))) / sub, user_spec_dir() / sub]


def load_yaml(path: Path) -> dict:
    """One spec file as a mapping; anything else is a SpecFileError naming the file."""
    try:
        if path.stat().st_size > MAX_SPEC_FILE_BYTES:
            raise SpecFileError(f"{path}: larger than {MAX_SPEC_FILE_BYTES} bytes; not a spec file")
        with open(path) as f:
            data = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise SpecFileError(f"{path}: not readable YAML ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SpecFileError(f"{path}: a spec file must be a YAML mapping of fields, got {type(data).__name__}")
    return data


def parse_spec(cls: type[BaseModel], data: dict, path: Path):
    """``cls(**data)`` with pydantic's errors turned into one line naming the file and the fields."""
    try:
        return cls(**data)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(file)'}: {e['msg']}" for e in exc.errors())
        raise SpecFileError(f"{path}: {fields}") from None


def load_spec_file(cls: type[BaseModel], path: Path):
    return parse_spec(cls, load_yaml(path), path)


def _load_all(sub: str, cls: type[BaseModel]) -> dict:
    """Every spec of one kind by file stem, shipped first, then the user's. A broken file is skipped with a
    warning (one bad file must not break every command); a name or alias claimed twice is a warning too, and the
    first claim keeps it."""
    out: dict = {}
    for folder in _spec_dirs(sub):
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
            try:
                out[path.stem] = load_spec_file(cls, path)
            except SpecFileError as exc:
                warnings.warn(f"skipped spec file {exc}", SpecWarning, stacklevel=2)
    return _unique_names(out, sub)


def _unique_names(specs: dict, sub: str) -> dict:
    seen: dict[str, str] = {}
    kept = {}
    for key, spec in specs.items():
        names = {key.lower()} | {n.lower() for n in [getattr(spec, "name", key), *getattr(spec, "aliases", [])]}
        taken = {n: seen[n] for n in names if n in seen and seen[n] != key}
        if taken:
            warnings.warn(f"skipped {sub} spec {key!r}: it claims {sorted(taken)} already taken by "
                          f"{sorted(set(taken.values()))}; rename or remove the alias", SpecWarning, stacklevel=2)
            continue
        seen.update({n: key for n in names})
        kept[key] = spec
    return kept


@lru_cache(maxsize=None)
def all_hardware() -> dict[str, HardwareSpec]:
    return _load_all("gpus", HardwareSpec)


@lru_cache(maxsize=None)
def all_systems() -> dict[str, SystemSpec]:
    return _load_all("systems", SystemSpec)


@lru_cache(maxsize=None)
def all_runtimes() -> dict[str, RuntimeSpec]:
    return _load_all("runtimes", RuntimeSpec)


def calibration_path(device: str) -> Path | None:
    """Where the device's calibration file is: the user's directory first (``aisim calibrate`` writes there),
    then the shipped ones; None when there is none."""
    for folder in reversed(_spec_dirs("calibration")):
        path = folder / f"{device}.yaml"
        if path.exists():
            return path
    return None


@lru_cache(maxsize=None)
def load_calibration(device: str) -> CalibrationSpec:
    """The device's calibration file, else the documented default rules (``measured: false``)."""
    path = calibration_path(device) or calibration_path("default")
    return load_spec_file(CalibrationSpec, path)


@lru_cache(maxsize=64)
def _calibration_file(path: str, mtime_ns: int, size: int) -> CalibrationSpec | None:
    """A calibration YAML given by path, parsed once per version of the file (None: it is a host file)."""
    data = load_yaml(Path(path))
    if data and "device" not in data and set(data) <= set(HostSpec.model_fields):
        return None
    spec_keys = "peak_flops_per_s" in data or "gpu_count" in data if isinstance(data, dict) else False
    if spec_keys and "gemm_efficiency" not in data:
        kind = "system" if "gpu_count" in data else "GPU"
        raise AisimError(f"{path}: a {kind} spec, not a calibration file; give it to --device, and to --calibration "
                         "a calibration YAML (hardware_specs/calibration/, or what `aisim calibrate` writes)")
    return parse_spec(CalibrationSpec, data, Path(path))


def calibration_file(path: Path) -> CalibrationSpec | None:
    """The calibration in the YAML at ``path`` (None where it holds a host file's fields only); read again only
    when the file changed (its modification time or size), so sweeps over a --calibration path parse it once."""
    st = path.stat()
    return _calibration_file(str(path.resolve()), st.st_mtime_ns, st.st_size)


def default_calibration() -> CalibrationSpec:
    return load_calibration("default")


@lru_cache(maxsize=None)
def calibration_for(device: str, architecture: str, default: bool = False) -> CalibrationSpec:
    """The calibration a GPU runs with: its own file where it has one (user directory first), as written; else (and
    with ``default``, --calibration none) the default rules with the GPU's architecture rules applied
    (CalibrationSpec.for_architecture). A file passed by path is used as written too."""
    if not default and calibration_path(device) is not None:
        return load_calibration(device)              # the GPU's own file, measured or not, as written
    return default_calibration().for_architecture(architecture)


def clear_caches() -> None:
    """Forget loaded spec files (after a user directory changed)."""
    for fn in (all_hardware, all_systems, all_runtimes, load_calibration, calibration_for, _calibration_file):
        fn.cache_clear()
