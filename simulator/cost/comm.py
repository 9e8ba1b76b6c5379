"""Collective time over the host's links: an alpha-beta model with the ring algorithm's byte factors.

all-reduce:  t = latency + 2(n-1)/n * bytes / bus_bw
all-gather:  t = latency + (n-1)/n * bytes / bus_bw      (bytes = the gathered tensor)
``latency`` is the whole collective's fixed cost and ``bus_bw`` the NCCL bus bandwidth (nccl-tests
PERFORMANCE.md convention), so a measured fit (``aisim calibrate`` on 2+ GPUs, or a system spec's) plugs in
directly. A group of fewer GPUs than the box's, or a box with no system file, reads the file of that GPU and
fabric nearest in size (_intra_link); the device's calibration fit, where it has one, only where no file does.
"""
from __future__ import annotations

import math

from ..specs import Device
from ..formulas import Cost
from ..graph.ops import Op
from ..specs import CalibrationSpec

# NCCL's tuning model (src/graph/tuning.cc, ncclTopoTuneModel): a ring all-reduce's latency is a base plus
# nsteps = 2(n - 1) steps of the link's latency (NVLink, LL protocol: baseLat 6.6 us, hwLat 0.6 us per step). Used
# only as a ratio, to carry a system file's n-GPU latency to a group of fewer of its GPUs.
NCCL_NVLINK_BASE_S, NCCL_NVLINK_STEP_S = 6.6e-6, 0.6e-6
RING_FACTORS = {"nccl.all_reduce": 2.0, "nccl.all_gather": 1.0, "nccl.reduce_scatter": 1.0,
                "nccl.all_to_all": 1.0, "nccl.send_recv": None}
# all-to-all (MoE dispatch/combine): each rank sends (n-1)/n of its routed rows (bytes = its routed tensor)


def collective_time_s(op: Op, cost: Cost, device: Device, cal: CalibrationSpec) -> float:
    group = int(op.attrs.get("group", device.count))
    if group <= 1:
        return 0.0
    bw, latency = _intra_link(device, cal, group)
    if bw <= 0:
        return 0.0
    factor = RING_FACTORS.get(op.name)
    if factor is None:  # point-to-point: the whole tensor over one link
        return latency + cost.bytes_written / bw
    stride = max(int(op.attrs.get("stride", 1)), 1)
    if op.name == "nccl.all_to_all":
        spread = _all_to_all_across_nodes_s(cost.bytes_written, group, stride, device, cal)
        if spread is not None:
            return spread
        return latency + factor * (group - 1) / group * cost.bytes_written / bw
    # a tensor-parallel group wider than a node (tp 16 on two 8-GPU nodes), or one that straddles a node boundary
    # (tp 6 on 8-GPU nodes), runs hierarchically across the network
    return collective_s(op.name.removeprefix("nccl."), cost.bytes_written, group, device, cal,
                        ranks_per_node(device, group, stride))


def ranks_per_node(device: Device, group: int, stride: int = 1) -> int | None:
    """Members of a ``group`` of ranks ``stride`` apart that share a node of a multi-node system (None without
    one): the node's share of them, or, for a group that does not tile the node, the largest count that divides
    both (the straddling groups' worst split, an approximation)."""
    per_node = getattr(device.system, "gpus_per_node", None) if device.system is not None else None
    if not per_node:
        return None
    g = max(per_node // max(stride, 1), 1)
    return g if group % g == 0 or g % group == 0 else math.gcd(group, g)


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
    g = max(1, min(group, ranks_per_node(device, group, stride) or group))
    if g >= group:
        return None
    intra_bw, intra_latency = _intra_link(device, cal, g)
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
    (all-reduce = reduce-scatter + all-reduce across nodes + all-gather, whose two intra phases pay the ring's base
    latency once: NCCL's ring latency is baseLat + nsteps x hwLat, src/graph/tuning.cc ncclTopoTuneModel, and the
    node's fitted latency is split by NCCL's NVLink constants; all-gather and reduce-scatter: one intra and one
    inter phase). The network's ``latency_s`` (a 2-node figure) grows as log2(nodes), NCCL's tree latency for
    small messages. Tensor-parallel groups wider than a node run the same way (collective_time_s). Known
    inaccuracies: NCCL's algorithm choice (tree at small sizes, NVLS) and congestion between rails are not
    modelled; for a small all-reduce NCCL's own model of two 8-GPU nodes gives about 27 us (tree, LL) where this
    gives about 56 us on h100x8-ndr (16.8 x 2 - 7.4 us of the node's ring + the network's 30 us)."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    system = device.system
    per_node = getattr(system, "gpus_per_node", None) if system is not None else None
    net = getattr(system, "network", None) if system is not None else None
    g = min(ranks_per_node or per_node or group, group)
    if per_node is None or net is None or g >= group:
        return _ring_s(kind, nbytes, group, *_intra_link(device, cal, group))
    nodes = math.ceil(group / g)
    inter_bw = net.nic_bw_bytes_per_s * net.nics_per_node / per_node * net.bus_bw_fraction
    if not net.rail_optimized:
        inter_bw /= net.non_rail_penalty
    intra = _intra_link(device, cal, g)
    # the network's latency grows with the nodes as NCCL's tree does for the small messages where it matters
    # (src/graph/tuning.cc ncclTopoTuneModel: 2 x log2(nNodes) x interLat); a file's latency_s is that of 2 nodes
    net_latency = net.latency_s * max(math.log2(nodes), 1.0)
    if kind == "all_reduce":
        # the intra reduce-scatter and all-gather are one ring's two halves: its base latency once (NCCL's ring:
        # baseLat + nsteps x hwLat), each half its share of the steps
        shared = intra[1] * NCCL_NVLINK_BASE_S / _nccl_ring_latency(g) if g > 1 and intra[0] > 0 else 0.0
        return (_ring_s("reduce_scatter", nbytes, g, *intra) + _ring_s("all_reduce", nbytes / g, nodes, inter_bw,
                net_latency) + _ring_s("all_gather", nbytes, g, *intra) - shared)
    return _ring_s(kind, nbytes, g, *intra) + _ring_s(kind, nbytes / g, nodes, inter_bw, net_latency)


def _intra_link(device: Device, cal: CalibrationSpec, group: int) -> tuple[float, float]:
    """(bus bandwidth, latency) of a collective over ``group`` GPUs of one host. A system file's figures are its
    ``gpu_count`` (or ``gpus_per_node``) GPUs' ring; a smaller group (tp 2 on an 8-GPU box) takes the system file
    of that many GPUs of the same kind on the same fabric where there is one (h100x2, h200x4), else, on NVLink, the
    box's latency scaled by NCCL's ring latency model (the bandwidth, nearly flat in n on NVSwitch, kept). NAMExN
    with no system file (h100x6, a100x2): on NVLink the file of exactly the group's GPUs, else the smallest larger
    file of that GPU scaled the same way, else the calibration's NCCL fit, else the device's default links."""
    ic = device.interconnect
    bw, latency = ic.link_bw_bytes_per_s, ic.latency_s
    system = device.system
    nvlink = ic.kind in ("nvswitch", "nvlink-bridge")
    ranks = (system.gpus_per_node or system.gpu_count) if system is not None else device.count
    if system is not None and group >= ranks:
        return bw, latency
    same = [s for s in systems_of(device.gpu, ic.kind) if s.gpu_count >= group] if nvlink else []
    exact = next((s for s in same if s.gpu_count == group), None)
    if exact is not None:
        return exact.interconnect.link_bw_bytes_per_s, exact.interconnect.latency_s
    if system is not None:
        return bw, latency * (_nccl_ring_latency(group) / _nccl_ring_latency(ranks) if nvlink else 1.0)
    if same:
        larger = min(same, key=lambda s: s.gpu_count)
        return (larger.interconnect.link_bw_bytes_per_s,
                larger.interconnect.latency_s * _nccl_ring_latency(group) / _nccl_ring_latency(larger.gpu_count))
    if cal.allreduce_bus_bw_bytes_per_s and nvlink:
        bw, latency = cal.allreduce_bus_bw_bytes_per_s, cal.allreduce_latency_s or latency
    return bw, latency


def _nccl_ring_latency(n: int) -> float:
    return NCCL_NVLINK_BASE_S + 2 * (n - 1) * NCCL_NVLINK_STEP_S


def systems_of(gpu, kind: str) -> list:
    """The single-node system files (shipped or the user's) of ``gpu`` (a HardwareSpec) GPUs on a ``kind`` fabric,
    their GPU named by its name or any alias."""
    from ..specs import all_systems

    names = {gpu.name.lower(), *(a.lower() for a in getattr(gpu, "aliases", ()))}
    return [s for s in all_systems().values()
            if s.gpus_per_node is None and s.interconnect.kind == kind and s.gpu.strip().lower() in names]


def _ring_s(kind: str, nbytes: float, n: int, bw: float, latency: float) -> float:
    if n <= 1 or bw <= 0:
        return 0.0
    return latency + RING_FACTORS[f"nccl.{kind}"] * (n - 1) / n * nbytes / bw
