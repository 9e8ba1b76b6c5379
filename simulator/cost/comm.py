"""Collective time over the host's links: an alpha-beta model with the ring algorithm's byte factors.

all-reduce:  t = latency + 2(n-1)/n * bytes / bus_bw
all-gather:  t = latency + (n-1)/n * bytes / bus_bw      (bytes = the gathered tensor)
``latency`` is the whole collective's fixed cost and ``bus_bw`` the NCCL bus bandwidth (nccl-tests
PERFORMANCE.md convention), so a measured fit (``aisim calibrate`` on 2+ GPUs, or a system spec's) plugs in
directly. Where the device's calibration has a measured fit and no system spec file names the links, the fit is
used for any GPU count on that fabric (a rule: NCCL's ring bus bandwidth is nearly flat in n on NVSwitch).
"""
from __future__ import annotations

from ..specs import Device
from ..formulas import Cost
from ..graph.ops import Op
from ..specs import CalibrationSpec

RING_FACTORS = {"nccl.all_reduce": 2.0, "nccl.all_gather": 1.0, "nccl.reduce_scatter": 1.0,
                "nccl.send_recv": None}


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
    return latency + factor * (group - 1) / group * cost.bytes_written / bw
