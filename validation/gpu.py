"""The local machine: provenance header, NVML energy / memory / power readings, torch device handling.

NVML readings (pynvml, package ``nvidia-ml-py``) are optional: where NVML or a counter is missing the reading
is ``None`` (never zero) and the result says ``energy_available: false``. GB means 1e9 bytes.
"""
from __future__ import annotations

import datetime as _dt
import platform
import socket
from functools import lru_cache

GB = 1e9
MJ_PER_J = 1e3
MW_PER_W = 1e3

# Kept set in every process this package starts: NVLink multicast (NVLS) can take a shared host's GPUs out
# of service, so NCCL, PyTorch symmetric memory and NVSHMEM must not use it.
NCCL_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def set_safe_env() -> None:
    import os

    os.environ.update(NCCL_SAFE_ENV)


@lru_cache(maxsize=1)
def _nvml():
    """The initialised pynvml module, or None where NVML cannot be used (no package, no driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - any failure means "no NVML", reported as unavailable
        return None


def nvml_handle(torch_index: int):
    """NVML handle of torch's CUDA device ``torch_index`` (matched by UUID, so CUDA_VISIBLE_DEVICES is honoured)."""
    nv = _nvml()
    if nv is None:
        return None
    import torch

    try:
        uuid = str(torch.cuda.get_device_properties(torch_index).uuid)
        for candidate in (uuid if uuid.startswith("GPU-") else f"GPU-{uuid}", uuid):
            try:
                return nv.nvmlDeviceGetHandleByUUID(candidate)
            except nv.NVMLError:
                continue
    except Exception:  # noqa: BLE001 - older torch without .uuid: fall back to the index
        pass
    try:
        return nv.nvmlDeviceGetHandleByIndex(torch_index)
    except Exception:  # noqa: BLE001
        return None


def energy_mj(handle) -> int | None:
    """Total energy since the driver loaded, in millijoules (nvmlDeviceGetTotalEnergyConsumption), or None."""
    nv = _nvml()
    if nv is None or handle is None:
        return None
    try:
        return int(nv.nvmlDeviceGetTotalEnergyConsumption(handle))
    except Exception:  # noqa: BLE001 - NotSupported on GPUs before Volta and some virtual GPUs
        return None


def wait_energy_tick(handle, timeout_s: float = 0.5) -> tuple[float, int] | None:
    """(perf_counter time, mJ) just after NVML's energy counter next changes, or None without NVML energy.

    The counter advances in steps (every ~100 ms on H100, driver 580), so a window read at arbitrary times is
    off by up to a step at each end (~10% of a 1 s window). Opening and closing the window on a step bounds
    that error to the idle tail between the last kernel and the next step (<= one period at idle power).
    """
    import time

    first = energy_mj(handle)
    if first is None:
        return None
    start = time.perf_counter()
    while True:
        now, value = time.perf_counter(), energy_mj(handle)
        if value != first or now - start > timeout_s:
            return now, value


def used_memory_gb(handle) -> float | None:
    """Device memory in use by all processes (NVML), GB; includes the CUDA context and allocator cache."""
    nv = _nvml()
    if nv is None or handle is None:
        return None
    try:
        return nv.nvmlDeviceGetMemoryInfo(handle).used / GB
    except Exception:  # noqa: BLE001
        return None


def sm_clock_mhz(handle) -> float | None:
    nv = _nvml()
    if nv is None or handle is None:
        return None
    try:
        return float(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001
        return None


# nvmlClocksEventReasons bits (nvml.h): why the clocks are below their maximum
CLOCK_EVENT_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                       0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake"}


def clock_event_reasons(handle) -> int | None:
    """The bitmask of why the SM clock is below its maximum now (CLOCK_EVENT_REASONS), or None."""
    nv = _nvml()
    if nv is None or handle is None:
        return None
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        try:
            return int(getattr(nv, name)(handle))
        except Exception:  # noqa: BLE001
            continue
    return None


def power_limit_w(handle) -> float | None:
    nv = _nvml()
    if nv is None or handle is None:
        return None
    try:
        return nv.nvmlDeviceGetPowerManagementLimit(handle) / MW_PER_W
    except Exception:  # noqa: BLE001
        return None


def power_limits(handle) -> dict | None:
    """What the board allows, read (nothing is set): the power limit's range and default (W) and the SM clock's
    range (MHz, the lowest and highest supported graphics clock)."""
    nv = _nvml()
    if nv is None or handle is None:
        return None
    out = {}
    try:
        low, high = nv.nvmlDeviceGetPowerManagementLimitConstraints(handle)
        out.update(min_power_limit_w=low / MW_PER_W, max_power_limit_w=high / MW_PER_W,
                   default_power_limit_w=nv.nvmlDeviceGetPowerManagementDefaultLimit(handle) / MW_PER_W)
    except Exception:  # noqa: BLE001
        pass
    try:
        out["max_sm_clock_mhz"] = float(nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM))
        memory_mhz = nv.nvmlDeviceGetSupportedMemoryClocks(handle)[0]
        clocks = nv.nvmlDeviceGetSupportedGraphicsClocks(handle, memory_mhz)
        out.update(min_sm_clock_mhz=float(min(clocks)), max_memory_clock_mhz=float(memory_mhz))
    except Exception:  # noqa: BLE001
        pass
    return out or None


def driver_version() -> str | None:
    nv = _nvml()
    if nv is None:
        return None
    try:
        version = nv.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001
        return None


def torch_device(gpus: list[int] | None, rank: int = 0):
    """The torch device for ``rank``: ``cuda:gpus[rank]`` (or ``cuda:rank``) where CUDA exists, else CPU."""
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu")
    index = gpus[rank] if gpus else rank
    return torch.device("cuda", index)


def aisim_version() -> str:
    try:
        from importlib.metadata import version

        return version("aisim")
    except Exception:  # noqa: BLE001 - running from a source tree that is not installed
        return "unknown"


def environment_header(gpus: list[int] | None = None, device_name: str | None = None) -> dict:
    """Provenance of a measured dataset: the first line of every JSONL section."""
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    index = (gpus[0] if gpus else 0) if cuda else None
    handle = nvml_handle(index) if cuda else None
    gpu_name = device_name or (torch.cuda.get_device_name(index) if cuda else "cpu")
    count = (len(gpus) if gpus else torch.cuda.device_count()) if cuda else 0
    return {
        "type": "header",
        "gpu_name": gpu_name,
        "gpu_count": count,
        "gpus": list(gpus) if gpus else (list(range(count)) if cuda else []),
        "driver": driver_version(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "power_limit_w": power_limit_w(handle),
        "power_limits": power_limits(handle),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "aisim_version": aisim_version(),
    }


def energy_counter_period_s(torch_index: int = 0, seconds: float = 2.0) -> dict:
    """How often NVML's total-energy counter changes under load (bounds the error of a short energy window).

    Runs bf16 matrix products for ``seconds`` while polling the counter; returns the median interval between
    changes and the average power over the probe. None values where NVML energy is unavailable.
    """
    import statistics
    import time

    import torch

    handle = nvml_handle(torch_index)
    if energy_mj(handle) is None:
        return {"energy_available": False, "update_period_s": None, "avg_power_w": None}
    a = torch.randn(4096, 4096, device=f"cuda:{torch_index}", dtype=torch.bfloat16)
    samples, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ a
        torch.cuda.synchronize(torch_index)
        samples.append((time.perf_counter(), energy_mj(handle)))
    changes = [t for (t, e), (_, e_prev) in zip(samples[1:], samples) if e != e_prev]
    gaps = [b - a_ for a_, b in zip(changes, changes[1:])]
    joules = (samples[-1][1] - samples[0][1]) / MJ_PER_J
    return {"energy_available": True, "update_period_s": statistics.median(gaps) if gaps else None,
            "changes": len(changes), "polls": len(samples),
            "avg_power_w": joules / (samples[-1][0] - samples[0][0])}
