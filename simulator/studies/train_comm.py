"""The ops a training step adds to the traced micro-batch: data-parallel collectives (DDP, ZeRO, FSDP) with their
overlap, FSDP2's copy and cast kernels, the optimizer step over the (sharded) parameters, pipeline p2p sends.

Each is priced by the formula registry and the device's calibrated op time (collectives by aisim.cost.comm), and
shown as a row of the step's op table (``network`` rows: whole collective time, ``share``: of the step).
Formulas in aisim.studies.train's docstring.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..results import OpCost
from ..scenario import Scenario
from ..units import MS_PER_S
from ..workload import TrainPlan

MB = 2 ** 20  # DDP's bucket_cap_mb is MiB (torch/nn/parallel/distributed.py: int(bucket_cap_mb * 1024 * 1024))


@dataclass
class Added:
    """Time on the step's critical path and the op rows behind it."""
    time_s: float = 0.0
    exposed_s: float = 0.0
    total_s: float = 0.0
    rows: list[OpCost] = field(default_factory=list)


def _row(name: str, count: int, nbytes: float, seconds: float, bound: str, flops: float = 0.0) -> OpCost:
    return OpCost(name=name, count=int(count), flops=flops, bytes=nbytes, time_ms=seconds * MS_PER_S, bound=bound,
                  share=0.0)


def _coll(sc: Scenario, kind: str, nbytes: float, group: int, stride: int | None = None) -> float:
    """One collective over ``group`` data-parallel ranks ``stride`` apart (default tp: Megatron's order, tp
    innermost, then dp), placed on nodes of the system's size."""
    from ..cost.comm import collective_s

    system = sc.device.system
    per_node = getattr(system, "gpus_per_node", None) if system is not None else None
    ranks_per_node = max(1, per_node // (stride or sc.plan.tp)) if per_node else None
    return collective_s(kind, nbytes, group, sc.device, sc.calibration, ranks_per_node)


def _memory_op_s(sc: Scenario, nbytes: float) -> float:
    """A memory-bound copy/cast kernel moving ``nbytes`` (read + write), at the calibrated memory efficiency."""
    from ..cost.efficiency import memory_efficiency

    if nbytes <= 0:
        return 0.0
    return nbytes / sc.device.gpu.memory_bw_bytes_per_s / memory_efficiency(sc.calibration, nbytes)


def dp_comm(sc: Scenario, graph, plan: TrainPlan, m: int, fwd_s: float, bwd_s: float, autocast: bool,
            groups: tuple | None = None) -> Added:
    """Data-parallel collectives of one step (``fwd_s``/``bwd_s``: one micro-batch's forward and backward).
    ``groups`` (aisim.step.state_groups): (parameters, group, stride) per data-parallel group, each part reduced
    and sharded over its own ranks (an MoE's experts under expert parallelism over the expert-data-parallel ones);
    default every parameter over dp. The collectives of the parts run one after another on one NCCL stream."""
    from ..cost.memory import TRAIN_STATE_BYTES

    dp = sc.plan.dp
    out = Added()
    parts = [(n, g, st) for n, g, st in (groups or ((graph.param_count, dp, sc.plan.tp),)) if g > 1 and n > 0]
    if dp <= 1 or not parts:
        return out

    def coll(kind: str, per_param: float, size=lambda g, st: g) -> float:
        """The parts' collectives, back to back: each part's full tensor over ``size`` of its ranks."""
        return sum(_coll(sc, kind, n * per_param, size(g, st), st) for n, g, st in parts)

    p = sum(n for n, _, _ in parts)
    weight_b, grad_b, compute_b = TRAIN_STATE_BYTES[plan.precision]
    stage = plan.stage
    if stage == 0:
        per_param = weight_b if autocast else compute_b   # DDP reduces the .grad dtype (fp32 under autocast)
        grads = p * per_param
        bucket = plan.bucket_mb * MB
        total, last, n_buckets = 0.0, None, 0
        for n, g, st in parts:
            part = n * per_param
            k = max(1, math.ceil(part / bucket))
            tail = _coll(sc, "all_reduce", part - (k - 1) * bucket, g, st)
            total += tail + (k - 1) * (_coll(sc, "all_reduce", bucket, g, st) if k > 1 else 0.0)
            last = tail if last is None else last      # the first parameters' bucket is reduced last
            n_buckets += k
        copies = _memory_op_s(sc, 2 * grads)             # grads copied into the flat buckets and back
        out.total_s = total
        out.exposed_s = max(0.0, total - last - bwd_s) + last + copies
        out.rows += [_row(f"nccl.all_reduce (DDP gradients, {plan.bucket_mb:g} MiB buckets)", n_buckets, grads,
                          total, "network"), _row("ddp.bucket_copy", 2 * n_buckets, 2 * grads, copies, "memory")]
        return out
    grad_reduce_b = grad_b if plan.fsdp != "none" else compute_b   # FSDP2 reduce_dtype, ZeRO: 16-bit grads
    params = p * compute_b
    grads = p * grad_reduce_b
    units = graph.layers + 1
    if stage in (1, 2):
        rs_per = 1 if stage == 1 else m
        rs = coll("reduce_scatter", grad_reduce_b)
        ag = coll("all_gather", compute_b)
        out.total_s = rs * rs_per + ag
        out.exposed_s = max(0.0, rs - bwd_s) + rs / units + (rs * (rs_per - 1) / units) + ag
        if plan.fsdp == "grad-op":   # SHARD_GRAD_OP: one all-gather per micro-batch before forward, kept
            out.exposed_s = max(0.0, ag - fwd_s) + ag / units + max(0.0, rs - bwd_s) + rs / units
            out.exposed_s *= m
            out.total_s = (rs + ag) * m
        out.rows += [_row("nccl.reduce_scatter (ZeRO gradients)", rs_per, grads * rs_per, rs * rs_per, "network"),
                     _row("nccl.all_gather (ZeRO parameters)", 1, params, ag, "network")]
        return out
    def size(g: int, st: int) -> int:
        return hybrid_shard_size(sc, plan, g, st)

    ag = coll("all_gather", compute_b, size)
    rs = coll("reduce_scatter", grad_reduce_b, size)
    # HYBRID_SHARD: each unit's reduced shard all-reduced across the replicas (one per node) right after its
    # reduce-scatter, on FSDP2's all-reduce stream, every micro-batch (torch/distributed/fsdp/_fully_shard/
    # _fsdp_collectives.py, foreach_reduce): it overlaps the backward as the reduce-scatters do
    replicas = [(n, g, st, size(g, st)) for n, g, st in parts if size(g, st) < g]
    ar = sum(_coll(sc, "all_reduce", n * grad_reduce_b / k, g // k, st * k) for n, g, st, k in replicas)
    exposed = ag / units + max(0.0, ag - fwd_s) + max(0.0, ag + rs + ar - bwd_s) + (rs + ar) / units
    # FSDP2 kernels around the collectives: all-gather copy-in (cast of the shard) and copy-out into the unsharded
    # params, twice per micro-batch; the gradients cast to the reduce dtype and copied into the reduce-scatter input
    shard = sum(n / size(g, st) for n, g, st in parts)
    moved = [shard * (weight_b + compute_b), 2 * params, 2 * params + shard * (weight_b + compute_b),
             p * (compute_b + grad_reduce_b), 2 * grads]
    kernels = 2 * (_memory_op_s(sc, moved[0]) + _memory_op_s(sc, moved[1]))
    kernels += _memory_op_s(sc, moved[3]) + _memory_op_s(sc, moved[4])
    kernel_bytes = 2 * (moved[0] + moved[1]) + moved[3] + moved[4]
    out.total_s = m * (2 * ag + rs + ar)
    out.exposed_s = m * (exposed + kernels)
    out.rows += [_row("nccl.all_gather (FSDP parameters, fwd + bwd)", 2 * m * units, 2 * m * params, 2 * m * ag,
                      "network"),
                 _row("nccl.reduce_scatter (FSDP gradients)", m * units, m * grads, m * rs, "network"),
                 _row("fsdp.copy_in_out_cast", 4 * m * units, m * kernel_bytes, m * kernels, "memory")]
    if replicas:
        shards = sum(n * grad_reduce_b / k for n, _, _, k in replicas)
        out.rows.append(_row("nccl.all_reduce (HSDP replicas)", m * units, m * shards, m * ar, "network"))
    return out


def hybrid_shard_size(sc: Scenario, plan: TrainPlan, group: int, stride: int) -> int:
    """The ranks a part of ``group`` data-parallel ranks ``stride`` apart is sharded over: all of them, or under
    HYBRID_SHARD those inside one node (the rest are replicas)."""
    system = sc.device.system
    node = getattr(system, "gpus_per_node", None) if system is not None else None
    if plan.fsdp == "hybrid" and node:
        return max(1, min(group, node // stride))
    return group


def shard_groups(sc: Scenario, plan: TrainPlan, groups: tuple) -> tuple:
    """``groups`` (aisim.step.state_groups) with each part's group the ranks its states are sharded over
    (hybrid_shard_size): what train_breakdown and optimizer_cost divide by."""
    return tuple((n, hybrid_shard_size(sc, plan, g, st), st) for n, g, st in groups)


def optimizer_cost(sc: Scenario, graph, plan: TrainPlan, dp: int, groups: tuple | None = None) -> Added:
    """The optimizer (AdamW, or SGD with --optimizer sgd) over the parameters this GPU updates (all; from ZeRO-1
    1/dp, or per part of ``groups`` 1/its group: aisim.step.state_groups), in the weights' dtype."""
    from ..cost.memory import TRAIN_STATE_BYTES, kept_params
    from ..cost.ops_time import op_time
    from ..formulas import op_cost
    from ..graph.ops import optimizer_op

    weight_b = TRAIN_STATE_BYTES[plan.precision][0]
    shard = dp if plan.stage >= 1 else 1
    parts = groups or ((graph.param_count, dp, 1),)
    n = max(1, round(kept_params(parts, plan.stage, 1)))
    tensors = max(1, round(graph.meta.get("n_param_tensors", 1) / (shard if plan.stage >= 3 else 1)))
    op = optimizer_op(sc.optimizer, n, "fp32" if weight_b == 4 else "bf16", tensors, plan.optimizer_impl)
    cost = op_cost(op)
    t = op_time(op, cost, sc.device, sc.calibration, "fp32").gpu_s
    return Added(time_s=t, rows=[_row(f"optimizer.{sc.optimizer} ({plan.optimizer_impl})", 1, cost.bytes, t,
                                      "memory", cost.flops)])


def pipeline_p2p(sc: Scenario, micro_batch: int, seq: int, compute_b: int, plan: TrainPlan) -> float:
    """Activation sends between stages exposed in the fill and drain: 2 (pp - 1) sends of b x s x h (per chunk
    boundary for interleaved: x v)."""
    from ..graph.build import make_config

    h = make_config(sc.config).hidden_size
    nbytes = micro_batch * seq * h * compute_b / sc.plan.tp
    ic = sc.device.interconnect
    system = sc.device.system
    net = getattr(system, "network", None) if system is not None else None
    bw = (net.nic_bw_bytes_per_s * net.bus_bw_fraction if net is not None else ic.link_bw_bytes_per_s) or 1.0
    latency = net.latency_s if net is not None else ic.latency_s
    v = plan.virtual_stages if plan.pp_schedule == "interleaved" else 1
    return 2 * (sc.plan.pp - 1) * v * (latency + nbytes / bw)
