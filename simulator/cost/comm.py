"""Collective time over the host's links: an alpha-beta model with the ring algorithm's byte factors.

all-reduce:  t = latency + 2(n-1)/n * bytes / bus_bw
all-gather:  t = latency + (n-1)/n * bytes / bus_bw      (bytes = the gathered tensor)
``latency`` is the whole collective's fixed cost and ``bus_bw`` the NCCL bus bandwidth (nccl-tests
PERFORMANCE.md convention), so a measured fit (``aisim calibrate`` on 2+ GPUs, or a system spec's) plugs in
directly. Where the device's calibration has a measured fit and no system spec file names the links, the fit is
used for any GPU count on that fabric (a rule: NCCL's ring bus bandwidth is nearly flat in n on NVSwitch).
"""
from __future__ import annotations

import math

from ..specs import Device
from ..formulas import Cost
from ..graph.ops import Op
from ..specs import CalibrationSpec

RING_FACTORS = {"nccl.all_reduce": 2.0, "nccl.all_gather": 1.0, "nccl.reduce_scatter": 1.0,
                "nccl.all_to_all": 1.0, "nccl.send_recv": None}
# all-to-all (MoE dispatch/combine): each rank sends (n-1)/n of its routed rows (bytes = its routed tensor)


def collective_time_s(op: Op, cost: Cost, device: Device, cal: CalibrationSpec) -> float:
    group = int(op.attrs.get("group", device.count))
    if group <= 1:
        return 0.0
    ic = device.interconnect
    bw, latency = ic.link_bw_bytes_per_s, ic.latency_s
    if device.system is None and cal.allreduce_bus_bw_bytes_per_s and ic.kind in ("nvswitch", "nvlink-bridge"):
        bw, latency = cal.allreduce_bus_bw_bytes_per_s, cal.allreduce_latency_s or latency
    if bw <= 0:
        return 0.0
    factor = RING_FACTORS.get(op.name)
    if factor is None:  # point-to-point: the whole tensor over one link
        return latency + cost.bytes_written / bw
    if op.name == "nccl.all_to_all":
        spread = _all_to_all_across_nodes_s(cost.bytes_written, group, int(op.attrs.get("stride", 1)), device, cal)
        if spread is not None:
            return spread
    return latency + factor * (group - 1) / group * cost.bytes_written / bw


def _all_to_all_across_nodes_s(nbytes: float, group: int, stride: int, device: Device,
                               cal: CalibrationSpec) -> float | None:
    """An all-to-all whose ``group`` ranks, ``stride`` apart, span nodes of a multi-node system:
    each rank sends 1/n of its ``nbytes`` to every other rank, (g - 1)/n of it inside its node (g group members
    per node) over NVLink and (n - g)/n through its share of the node's NICs, both at once:
        t = max(latency + (g - 1)/n x bytes / intra bus bw, net latency + (n - g)/n x bytes / NIC bw per GPU)
    (each GPU's share of its node's NICs; PyTorch's all_to_all_single is an ncclSend and ncclRecv to every peer in
    one NCCL group, torch/csrc/cuda/nccl.cpp all2all_single_equal_split). None where the group fits in one node or
    the system has no network."""
    system = device.system
    per_node = getattr(system, "gpus_per_node", None) if system is not None else None
    net = getattr(system, "network", None) if system is not None else None
    if per_node is None or net is None:
        return None
    g = max(1, min(group, per_node // max(stride, 1)))
    if g >= group:
        return None
    intra_bw, intra_latency = _intra_link(device, cal)
    inter_bw = net.nic_bw_bytes_per_s * net.nics_per_node / per_node * net.bus_bw_fraction
    if not net.rail_optimized:
        inter_bw /= net.non_rail_penalty
    intra = intra_latency + (g - 1) / group * nbytes / intra_bw if g > 1 and intra_bw > 0 else 0.0
    inter = net.latency_s + (group - g) / group * nbytes / inter_bw if inter_bw > 0 else 0.0
    return max(intra, inter)


def collective_s(kind: str, nbytes: float, group: int, device: Device, cal: CalibrationSpec,
                 ranks_per_node: int | None = None) -> float:
    """One collective of ``nbytes`` (the full tensor) over ``group`` ranks, by name: all_reduce, all_gather,
    reduce_scatter. Within one node: the ring model above. A group spanning nodes (the system has
    ``gpus_per_node`` and a ``network``) runs hierarchically, as NCCL's tree/ring-of-rings do: a collective inside
    each node over its ``ranks_per_node`` members (NVLink/NVSwitch), then one between the nodes on 1/g of the data
    over each GPU's share of the node's NICs, then (all-reduce) the intra-node all-gather:
        t = t_intra(bytes) + t_inter(bytes / g over n nodes) [+ t_intra_allgather(bytes)]
    (all-reduce = reduce-scatter + all-reduce across nodes + all-gather; all-gather and reduce-scatter: one
    intra and one inter phase). Known inaccuracies: NCCL's algorithm choice (tree at small sizes, NVLS) and
    congestion between rails are not modelled."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    system = device.system
    per_node = getattr(system, "gpus_per_node", None) if system is not None else None
    net = getattr(system, "network", None) if system is not None else None
    g = min(ranks_per_node or per_node or group, group)
    if per_node is None or net is None or g >= group:
        return _ring_s(kind, nbytes, group, *_intra_link(device, cal))
    nodes = math.ceil(group / g)
    inter_bw = net.nic_bw_bytes_per_s * net.nics_per_node / per_node * net.bus_bw_fraction
    if not net.rail_optimized:
        inter_bw /= net.non_rail_penalty
    intra = _intra_link(device, cal)
    if kind == "all_reduce":
        return (_ring_s("reduce_scatter", nbytes, g, *intra) + _ring_s("all_reduce", nbytes / g, nodes, inter_bw,
                net.latency_s) + _ring_s("all_gather", nbytes, g, *intra))
    return _ring_s(kind, nbytes, g, *intra) + _ring_s(kind, nbytes / g, nodes, inter_bw, net.latency_s)


def _intra_link(device: Device, cal: CalibrationSpec) -> tuple[float, float]:
    ic = device.interconnect
    bw, latency = ic.link_bw_bytes_per_s, ic.latency_s
    if device.system is None and cal.allreduce_bus_bw_bytes_per_s and ic.kind in ("nvswitch", "nvlink-bridge"):
        bw, latency = cal.allreduce_bus_bw_bytes_per_s, cal.allreduce_latency_s or latency
    return bw, latency


def _ring_s(kind: str, nbytes: float, n: int, bw: float, latency: float) -> float:
    if n <= 1 or bw <= 0:
        return 0.0
    return latency + RING_FACTORS[f"nccl.{kind}"] * (n - 1) / n * nbytes / bw
