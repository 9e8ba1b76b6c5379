"""The host half of a calibration: eager PyTorch's CPU costs on this machine (``aisim calibrate --host-only``).

A calibration file carries both the GPU's curves and the CPU costs of the host it was measured on (per-op dispatch,
nn.Module calls, the HF Python between ops). Two VMs of the same GPU kind differ in the second by up to 1.5x
(docs/accuracy.md), so the measurement harnesses record this host's constants at the start and end of each run
(a ``type: host`` line), and the reports can estimate a run with the host it ran on (``HostSpec``, ``--host``).

The benchmarks are calibrate_bench.bench_overheads (tight loops of a tiny add, nn.Linear, F.linear, a view) and
framework_overhead.bench_framework_overhead (4-layer width-64 HF models that no accuracy table uses), fitted by
calibrate_fit.fit_overheads: nothing here sees a validation case.
"""
from __future__ import annotations

import datetime
import os
import platform
import socket
from pathlib import Path


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def measure_host(repeats: int = 7, count: int = 2000, calls: int = 50) -> dict:
    """Run the host microbenchmarks on CUDA device 0 (about 10-20 s): a ``type: host`` record with the fitted
    constants (HOST_FIELDS), the raw samples and where they were measured."""
    import torch

    from aisim.specs import HOST_FIELDS, default_calibration

    from .calibrate_bench import bench_overheads
    from .calibrate_fit import fit_overheads
    from .framework_overhead import bench_framework_overhead

    raw = bench_overheads(repeats=repeats, count=count) + bench_framework_overhead(repeats=5, calls=calls)
    fitted = fit_overheads(raw, default_calibration())
    constants = {f: fitted[f] for f in HOST_FIELDS if fitted.get(f) is not None}
    provenance = {"hostname": socket.gethostname(), "cpu": cpu_name(), "cpu_count": str(os.cpu_count()),
                  "gpu_name": torch.cuda.get_device_name(0), "torch": torch.__version__,
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "method": "validation/host.py: calibrate_bench.bench_overheads + "
                            "framework_overhead.bench_framework_overhead, fitted by calibrate_fit.fit_overheads"}
    return {"type": "host", "constants": constants, "provenance": provenance,
            "raw": [{k: v for k, v in r.items() if k != "config"} for r in raw]}


def host_spec(record: dict):
    """A ``type: host`` record (or a list of them: the median of each constant) -> HostSpec."""
    import statistics

    from aisim.specs import HostSpec

    records = [r for r in (record if isinstance(record, list) else [record]) if r.get("constants")]
    if not records:
        raise ValueError("no successful host measurement among the given type: host records")
    keys = set().union(*(r["constants"] for r in records))
    constants = {k: statistics.median(r["constants"][k] for r in records if k in r["constants"]) for k in keys}
    provenance = {k: str(v) for k, v in records[0].get("provenance", {}).items()}
    if len(records) > 1:
        provenance["records"] = f"median of {len(records)} host measurements of the run"
    return HostSpec(**constants, provenance=provenance)


def write_host_file(path: Path) -> Path:
    """Measure this host and write a host YAML for ``--host``."""
    import yaml

    from .calibrate import _require_cuda

    _require_cuda()
    spec = host_spec(measure_host())
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# written by `aisim calibrate --host-only` (validation/host.py); use with --host\n"
                    + yaml.safe_dump(spec.model_dump(), sort_keys=False))
    return path
