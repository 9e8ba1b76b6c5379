"""Peak memory per GPU: weights, live activations (traced liveness), KV cache, gradients, optimizer state, workspace.

Reported as PyTorch's allocator would count it (torch.cuda.max_memory_allocated), not NVML's used memory: the
CUDA context and the allocator's cached-but-free blocks are outside it. Known inaccuracies: the allocator's
rounding and fragmentation are not modelled.
"""
from __future__ import annotations

from ..specs import Device
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


def breakdown(graph: Graph, workload: Workload, device: Device) -> MemoryBreakdown:
    weights = weight_bytes(graph, workload)
    training = workload.phase in ("forward-backward", "train")
    grads = graph.param_bytes if training else 0.0
    optimizer = OPTIMIZER_STATES[workload.optimizer] * graph.param_bytes if workload.phase == "train" else 0.0
    kv = graph.persistent_bytes if workload.phase in ("prefill", "decode", "generate") else 0.0
    activations = max(graph.peak_activation_bytes - kv - grads, 0.0)
    workspace = CUBLAS_WORKSPACE_BYTES.get(device.gpu.architecture, CUBLAS_WORKSPACE_BYTES["default"])
    during_step = (grads + OPTIMIZER_TEMPORARIES[workload.optimizer] * graph.param_bytes
                   if workload.phase == "train" else 0.0)
    total = weights + max(graph.peak_activation_bytes, kv + grads, during_step) + optimizer + workspace
    return MemoryBreakdown(weights_gb=weights / GB, activations_gb=activations / GB, kv_cache_gb=kv / GB,
                           gradients_gb=grads / GB, optimizer_gb=optimizer / GB, workspace_gb=workspace / GB,
                           total_gb=total / GB, capacity_gb=device.gpu.memory_bytes / GB)
