"""Peak memory per GPU: weights, live activations (traced liveness), KV cache, gradients, optimizer state, workspace.

Reported as PyTorch's allocator would count it (torch.cuda.max_memory_allocated), not NVML's used memory: the
CUDA context and the allocator's cached-but-free blocks are outside it. The fit check adds the context (and NCCL's
buffers with a process group) to it: ``with_runtime_reserve``, measured per calibration. Known inaccuracies: the
allocator's rounding and fragmentation are not modelled (its cached-but-free blocks were 3-10% of the peak, median
per workload, in the H100/H200 suite runs).
"""
from __future__ import annotations

from ..specs import CalibrationSpec, Device, default_calibration
from ..formulas import QUANT_BYTES_PER_WEIGHT
from ..graph.ops import Graph
from ..results import MemoryBreakdown
from ..units import GB
from ..workload import Workload

CUBLAS_WORKSPACE_BYTES = {"hopper": 32 * 2**20, "default": 4096 * 2**10 * 2 + 16 * 2**10 * 8}
# PyTorch's default CUBLAS_WORKSPACE_CONFIG: ':4096:8' on Hopper (sm90), ':4096:2:16:8' before it.
OPTIMIZER_STATES = {"adamw": 2, "sgd": 0}  # exp_avg and exp_avg_sq, in the parameters' dtype
# Parameter-sized temporaries inside the step: torch.optim.adamw._multi_tensor_adamw allocates
# exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs) while the gradients are still alive.
OPTIMIZER_TEMPORARIES = {"adamw": 1, "sgd": 0}
def weight_bytes(graph: Graph, workload: Workload) -> float:
    """Weight bytes per GPU; weight-only quantization applies to the linear layers (embeddings, norms and the LM
    head stay in the model dtype, as bitsandbytes and most int4/fp8 weight-only schemes leave them)."""
    if workload.quant not in QUANT_BYTES_PER_WEIGHT:
        return graph.param_bytes
    linear = graph.meta.get("linear_weights", 0)
    element = graph.param_bytes / max(graph.param_count, 1)
    return graph.param_bytes - linear * (element - QUANT_BYTES_PER_WEIGHT[workload.quant])


def with_runtime_reserve(mem: MemoryBreakdown, cal: CalibrationSpec, framework: str, group: bool
                         ) -> MemoryBreakdown:
    """The breakdown with the device memory a PyTorch process holds outside its allocator: the CUDA context, and
    NCCL's buffers where a process group exists (``group``); the calibration's figures, else the default rules'.
    ggml's own context is not modelled (0)."""
    if framework != "pytorch":
        return mem
    rules = default_calibration()
    context = cal.cuda_context_bytes if cal.cuda_context_bytes is not None else rules.cuda_context_bytes or 0.0
    nccl = cal.nccl_buffer_bytes if cal.nccl_buffer_bytes is not None else rules.nccl_buffer_bytes or 0.0
    nccl = nccl if group else 0.0
    return mem.model_copy(update={"runtime_reserved_gb": (context + nccl) / GB, "nccl_reserved_gb": nccl / GB})


def breakdown(graph: Graph, workload: Workload, device: Device) -> MemoryBreakdown:
    weights = weight_bytes(graph, workload)
    training = workload.phase in ("forward-backward", "train")
    grads = graph.param_bytes if training else 0.0
    optimizer = OPTIMIZER_STATES[workload.optimizer] * graph.param_bytes if workload.phase == "train" else 0.0
    kv = graph.persistent_bytes if workload.phase in ("prefill", "decode", "generate") else 0.0
    # a training step's activations peak at the forward's end, before any gradient exists
    forward = graph.meta.get("peak_forward_bytes", 0.0) if training else 0.0
    activations = max(graph.peak_activation_bytes - kv - grads, forward, 0.0)
    workspace = CUBLAS_WORKSPACE_BYTES.get(device.gpu.architecture, CUBLAS_WORKSPACE_BYTES["default"])
    during_step = (grads + OPTIMIZER_TEMPORARIES[workload.optimizer] * graph.param_bytes
                   if workload.phase == "train" else 0.0)
    total = weights + max(graph.peak_activation_bytes, kv + grads, during_step) + optimizer + workspace
    return MemoryBreakdown(weights_gb=weights / GB, activations_gb=activations / GB, kv_cache_gb=kv / GB,
                           gradients_gb=grads / GB, optimizer_gb=optimizer / GB, workspace_gb=workspace / GB,
                           total_gb=total / GB, capacity_gb=device.gpu.memory_bytes / GB)


# ---------------------------------------------------------------- training (aisim.studies.train)
# Bytes per parameter of each training state, by precision mode. Mixed precision keeps fp32 master weights and
# fp32 AdamW states (Rajbhandari et al. 2020, "ZeRO", sec. 3.1: 2 + 2 + K = 12 bytes per parameter with fp16
# compute weights and gradients); a plain/DDP run under torch.autocast holds only the fp32 weights (the bf16 copies
# are autocast's per-forward casts, in the traced graph) and fp32 gradients; FSDP2 with MixedPrecisionPolicy keeps
# the sharded parameters and gradients in fp32 (torch/distributed/fsdp/_fully_shard/_fsdp_param.py: the sharded
# param keeps its original dtype, the unsharded one is cast to param_dtype; reduce_dtype fp32 gradients are
# reduce-scattered into the fp32 sharded grad).
TRAIN_STATE_BYTES = {  # precision -> (weights, gradients, compute copy) bytes per parameter
    "bf16-mixed": (4, 4, 2), "16-mixed": (4, 4, 2), "bf16-true": (2, 2, 2), "16-true": (2, 2, 2),
    "32-true": (4, 4, 4)}
ADAM_STATES = 2               # exp_avg, exp_avg_sq, in the weights' dtype
FSDP_PREFETCHED_UNITS = 2     # the unit computing and the one being all-gathered (FSDP2 implicit prefetch)


def kept_params(parts, stage: int, from_stage: int) -> float:
    """Parameters one GPU keeps of ``parts`` ((count, group, ...) per data-parallel group: aisim.step.state_groups):
    each part divided by its group from ZeRO stage ``from_stage`` on (1: optimizer states, 2: gradients, 3: weights),
    whole below it."""
    return sum(n / (g if stage >= from_stage else 1) for n, g, *_ in parts)


def train_breakdown(graph: Graph, w: Workload, tp_plan, dp: int, device: Device, in_flight: float = 1.0,
                    accumulating: bool = False, groups: tuple | None = None, pp: int = 1,
                    root_less: float = 0.0) -> MemoryBreakdown:
    """Peak memory per GPU of a training step (``tp_plan``: aisim.workload.TrainPlan).

    persistent = weights + optimizer states (+ sharded gradients for ZeRO-2/3), each divided by ``dp`` from its
    ZeRO stage on (stage 1: optimizer, 2: + gradients, 3: + weights); DDP's gradient buckets (a second copy of the
    gradients, gradient_as_bucket_view=False); plus the largest of three moments:
      forward end  = held + F (+ the gradients when ``accumulating``: an earlier micro-batch's backward of the
                     same step made them, and .grad accumulates, so they live through the later forwards)
      backward     = held + the traced peak (full gradients growing as activations are freed)
      late step    = gradients + one unit's full gradient and its reduce copy (ZeRO-2/3) + AdamW temporaries
    held = (``in_flight`` - 1) x layers x saved-per-layer: what the forwards of the other micro-batches a 1F1B
    stage holds saved for their backward (Narayanan et al. 2021, SC21, sec. 2.2: the first stage holds
    min(pp, m) micro-batches; interleaved, pp (1 + (pp - 1) / (pp v)); Korthikanti et al. 2022 sec. 4.2.3);
    F = the traced forward's peak (its saved activations and the loss's working set); for stage 3 the unsharded
    compute copy of the prefetched units and the root unit (embeddings and head stay unsharded between forward
    and backward in FSDP2).
    ``activations_gb`` is held + the larger of F and the backward's non-gradient peak; the parts are each at
    their largest, so when the activation peak comes before any gradient exists their sum exceeds ``total_gb``.
    ``groups`` (aisim.step.state_groups): the heaviest stage's parameters by the data-parallel group holding
    copies of them, each sharded over its own group (an MoE's experts under expert parallelism over the
    expert-data-parallel ranks); default the traced ones, all over ``dp``.
    With ``pp`` stages the first one holds ``in_flight`` micro-batches of its layers but not the head and loss,
    the last one a single micro-batch with them: the larger of the two (the loss tail: the forward's peak above
    its layers' saved activations); ``root_less``: parameters of the traced root unit (embeddings, final norm,
    head) no stage holds (aisim.step.pipeline_vocab_params).
    Known inaccuracies: the allocator's rounding and fragmentation; the first stage's activations leave out the
    largest temporaries inside a layer along with the loss tail (small beside the logits of a large vocabulary)."""
    p = sum(n for n, *_ in groups) if groups else graph.param_count
    weight_b, grad_b, compute_b = TRAIN_STATE_BYTES[tp_plan.precision]
    stage = tp_plan.stage
    parts = groups or ((p, dp, 1),)
    on_gpu = lambda s: kept_params(parts, stage, s)  # noqa: E731
    weights = on_gpu(3) * weight_b
    if stage >= 1 and weight_b != compute_b and tp_plan.fsdp == "none":
        # DeepSpeed-style ZeRO: compute-dtype model weights (sharded at stage 3) + fp32 master copy (sharded)
        weights = on_gpu(3) * compute_b + on_gpu(1) * weight_b
    elif tp_plan.fsdp == "grad-op":
        # SHARD_GRAD_OP (FSDP2 reshard_after_forward=False): the parameters are stored sharded in their own dtype and
        # all-gathered in the compute dtype before forward, the unsharded copy kept until after backward (PyTorch's
        # fully_shard docstring: "False ... keeps the unsharded parameters in memory after forward")
        weights = kept_params(parts, 3, 3) * weight_b + p * compute_b
    optimizer = ADAM_STATES * weight_b * on_gpu(1) if w.optimizer == "adamw" else 0.0
    # in the traced weights' dtype; the stage's share of the traced parameters
    traced_grads = 0.0 if w.grad_release else graph.param_bytes * p / max(graph.param_count, 1)
    if stage >= 1 and tp_plan.fsdp == "none":
        grad_b = compute_b   # DeepSpeed ZeRO reduces and keeps 16-bit gradients (ZeRO paper: 2 bytes)
    sharded_grads = on_gpu(2) * grad_b if stage >= 2 else 0.0
    peak = graph.peak_activation_bytes
    forward = graph.meta.get("peak_forward_bytes", max(peak - traced_grads, 0.0))
    held = graph.meta.get("saved_per_layer_bytes", 0.0) * graph.layers * (in_flight - 1)
    kept = traced_grads + sharded_grads if accumulating else 0.0
    # DDP's buckets hold the gradients it all-reduces: the parts replicated on other ranks
    buckets = traced_grads * sum(n for n, g, *_ in parts if g > 1) / max(p, 1) if stage == 0 else 0.0
    layer = graph.meta.get("layer_params", 0)
    # at the loss no gradient of this micro-batch exists yet (zero_grad(set_to_none) freed the last step's);
    # stage 3 then holds the root unit (embeddings, final norm, head: FSDP2 never reshards the root after
    # forward) and the last layer's parameters, prefetched for backward, unsharded in the compute dtype.
    # Later in backward the sharded gradients grow while one unit's full gradient and its reduce-dtype copy wait
    # for the reduce-scatter; the optimizer step adds its temporaries.
    # the root unit from the traced stage (a heavier stage's extra MoE layers are sharded units, not root)
    root = max(graph.param_count - layer * graph.layers - root_less, 0)
    unsharded = (root + layer) * compute_b if stage >= 3 else 0.0
    grad_unit = layer * (compute_b + grad_b) if stage >= 2 else 0.0
    temporaries = (OPTIMIZER_TEMPORARIES[w.optimizer] * on_gpu(1) * weight_b
                   if tp_plan.optimizer_impl == "foreach" else 0.0)
    workspace = CUBLAS_WORKSPACE_BYTES.get(device.gpu.architecture, CUBLAS_WORKSPACE_BYTES["default"])
    late = sharded_grads if accumulating else 0.0
    live = held + max(forward + kept, max(peak, traced_grads) + late)
    activations = held + max(forward, peak - traced_grads, 0.0)
    if pp > 1:
        tail = max(forward - graph.meta.get("saved_per_layer_bytes", 0.0) * graph.layers, 0.0)
        live = max(held + max(forward - tail + kept, max(peak - tail, traced_grads) + late),
                   max(forward + kept, max(peak, traced_grads) + late))
        activations = max(held + max(forward - tail, peak - tail - traced_grads, 0.0),
                          max(forward, peak - traced_grads, 0.0))
    activations += unsharded
    total = (weights + optimizer + buckets + workspace
             + max(live + unsharded, traced_grads + sharded_grads + grad_unit + temporaries))
    return MemoryBreakdown(weights_gb=weights / GB, activations_gb=activations / GB,
                           kv_cache_gb=0.0, gradients_gb=(traced_grads + sharded_grads + buckets) / GB,
                           optimizer_gb=optimizer / GB, workspace_gb=workspace / GB, total_gb=total / GB,
                           capacity_gb=device.gpu.memory_bytes / GB)
