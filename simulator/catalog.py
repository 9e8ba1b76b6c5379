"""Name resolution: what users type (``a6000x8``, ``opt-6.7b``, ``facebook/opt-6.7b``, a config path) to specs."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .errors import AisimError, UnknownNameError
from .specs import HardwareSpec, InterconnectSpec, SystemSpec, all_hardware, all_systems

_MULTI = re.compile(r"^(?P<gpu>.+?)\s*[x×]\s*(?P<n>\d+)$")

# Architecture rules for a host with no system spec file (docs/specs.md says where each comes from).
PCIE_BW_PER_LANE_BYTES_PER_S = {3: 0.985e9, 4: 1.969e9, 5: 3.938e9}  # PCIe base spec, per direction
PCIE_ACHIEVED_FRACTION = 0.80      # TLP/DLLP protocol overhead, typical achieved DMA fraction
NVLINK_ACHIEVED_FRACTION = 0.80    # NCCL bus bandwidth / NVLink unidirectional peak on NVSwitch systems
COLLECTIVE_LATENCY_PCIE_S = 50e-6  # NCCL small-message all-reduce latency over PCIe (nccl-tests order of magnitude)
COLLECTIVE_LATENCY_NVLINK_S = 15e-6


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


def _gpu_index() -> dict[str, str]:
    index = {}
    for key, spec in all_hardware().items():
        for alias in [key, spec.name, *spec.aliases]:
            index[alias.lower()] = key
    return index


def resolve_gpu(name: str) -> HardwareSpec:
    index = _gpu_index()
    key = index.get(name.strip().lower())
    if key is None:
        raise UnknownNameError("device", name, sorted(all_hardware()) + sorted(all_systems()),
                               "Run `aisim list devices` for all names; append xN for N GPUs (a6000x8).")
    return all_hardware()[key]


def _default_interconnect(gpu: HardwareSpec, count: int) -> tuple[InterconnectSpec, str]:
    pcie_bw = PCIE_BW_PER_LANE_BYTES_PER_S.get(gpu.pcie_gen, 1.969e9) * gpu.pcie_lanes * PCIE_ACHIEVED_FRACTION
    if gpu.nvlink_kind == "switch" and gpu.nvlink_bw_bytes_per_s:
        bw = gpu.nvlink_bw_bytes_per_s / 2 * NVLINK_ACHIEVED_FRACTION
        ic = InterconnectSpec(kind="nvswitch", algorithm="ring", link_bw_bytes_per_s=bw,
                              latency_s=COLLECTIVE_LATENCY_NVLINK_S, source="architecture rule (catalog.py)")
        return ic, f"no system spec file for {gpu.name}x{count}: assumed an NVSwitch fabric at {bw / 1e9:.0f} GB/s per GPU per direction"
    if gpu.nvlink_kind == "bridge" and gpu.nvlink_bw_bytes_per_s and count == 2:
        bw = gpu.nvlink_bw_bytes_per_s / 2 * NVLINK_ACHIEVED_FRACTION
        ic = InterconnectSpec(kind="nvlink-bridge", algorithm="ring", link_bw_bytes_per_s=bw,
                              latency_s=COLLECTIVE_LATENCY_NVLINK_S, source="architecture rule (catalog.py)")
        return ic, f"no system spec file for {gpu.name}x{count}: assumed the 2 GPUs joined by an NVLink bridge at {bw / 1e9:.0f} GB/s per direction"
    ic = InterconnectSpec(kind="pcie", algorithm="ring", link_bw_bytes_per_s=pcie_bw,
                          latency_s=COLLECTIVE_LATENCY_PCIE_S, source="architecture rule (catalog.py)")
    return ic, (f"no system spec file for {gpu.name}x{count}: assumed PCIe gen{gpu.pcie_gen} x{gpu.pcie_lanes} "
                f"through the host, {pcie_bw / 1e9:.1f} GB/s per GPU per direction")


def resolve_device(name: str) -> Device:
    """``h100`` -> one GPU; ``a6000x8`` -> a system spec file if one exists, else 8 GPUs on default links."""
    text = name.strip().lower()
    for spec in all_systems().values():
        if text in {spec.name.lower(), *(a.lower() for a in spec.aliases)}:
            gpu = resolve_gpu(spec.gpu)
            return Device(gpu=gpu, count=spec.gpu_count, system=spec, interconnect=spec.interconnect)
    match = _MULTI.match(text)
    if match and text.lower() not in _gpu_index():
        gpu, count = resolve_gpu(match["gpu"]), int(match["n"])
        if count < 1:
            raise AisimError(f"device {name!r}: the GPU count must be at least 1")
    else:
        gpu, count = resolve_gpu(text), 1
    if count == 1:
        ic = InterconnectSpec(kind="none", algorithm="ring", link_bw_bytes_per_s=0.0, latency_s=0.0,
                              source="single GPU")
        return Device(gpu=gpu, count=1, system=None, interconnect=ic)
    ic, assumed = _default_interconnect(gpu, count)
    return Device(gpu=gpu, count=count, system=None, interconnect=ic, assumptions=(assumed,))


# ---------------------------------------------------------------- models

def _model_dir() -> Path:
    return Path(str(resources.files("aisim.model_specs")))


@lru_cache(maxsize=None)
def model_index() -> dict[str, Path]:
    """Every shipped config by file stem, by its ``_name_or_path`` and by the name after the organisation."""
    index: dict[str, Path] = {}
    for path in sorted(_model_dir().glob("*.json")):
        with open(path) as f:
            full = json.load(f).get("_name_or_path", path.stem)
        for alias in {path.stem, full, full.split("/")[-1]}:
            index[alias.lower()] = path
    return index


def model_names() -> list[str]:
    names = []
    for path in sorted(set(model_index().values())):
        with open(path) as f:
            names.append(json.load(f).get("_name_or_path", path.stem))
    return sorted(names)


def resolve_model(name: str) -> tuple[str, dict]:
    """A shipped name (with or without organisation) or a path to a local HF config.json -> (name, config)."""
    path = Path(name).expanduser()
    if name.endswith(".json") or path.is_dir():
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise AisimError(f"model config {str(path)!r} does not exist; give a path to an HF config.json "
                             "or a shipped name (`aisim list models`).")
        try:
            with open(path) as f:
                config = json.load(f)
        except json.JSONDecodeError as exc:
            raise AisimError(f"{path}: not valid JSON ({exc})") from None
        return config.get("_name_or_path") or path.parent.name or path.stem, config
    found = model_index().get(name.strip().lower())
    if found is None:
        raise UnknownNameError("model", name, model_names() + [n.split("/")[-1] for n in model_names()],
                               "Run `aisim list models`, or pass a path to a local HF config.json.")
    with open(found) as f:
        config = json.load(f)
    return config.get("_name_or_path", found.stem), config
