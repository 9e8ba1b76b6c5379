"""GPU and system spec files: they load, their names resolve, and their numbers are self-consistent."""
from __future__ import annotations

import warnings

import pytest

from aisim.catalog import resolve_device
from aisim.errors import UnknownNameError
from aisim.specs import all_hardware, all_systems

# What users type -> the GPU spec file it must reach.
GPU_ALIASES = {
    "a5000": "rtx-a5000", "rtx-a5000": "rtx-a5000", "NVIDIA RTX A5000": "rtx-a5000",
    "a6000": "rtx-a6000", "rtx-a6000": "rtx-a6000", "NVIDIA RTX A6000": "rtx-a6000",
    "a10g": "a10g", "NVIDIA A10G": "a10g",
    "l4": "l4", "NVIDIA L4": "l4",
    "l40s": "l40s", "NVIDIA L40S": "l40s",
    "a100-40gb": "a100-sxm4-40gb", "a100-sxm4-40gb": "a100-sxm4-40gb", "NVIDIA A100-SXM4-40GB": "a100-sxm4-40gb",
    "a100": "a100-sxm4-80gb", "a100-80gb": "a100-sxm4-80gb", "a100-sxm4-80gb": "a100-sxm4-80gb",
    "NVIDIA A100-SXM4-80GB": "a100-sxm4-80gb",
    "a100-pcie": "a100-pcie-80gb", "a100-pcie-80gb": "a100-pcie-80gb", "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "h100": "h100-sxm", "h100-sxm": "h100-sxm", "NVIDIA H100 80GB HBM3": "h100-sxm",
    "h100-pcie": "h100-pcie", "NVIDIA H100 PCIe": "h100-pcie",
    "h200": "h200", "NVIDIA H200": "h200",
    "3090": "rtx-3090", "rtx-3090": "rtx-3090", "rtx3090": "rtx-3090", "NVIDIA GeForce RTX 3090": "rtx-3090",
    "4090": "rtx-4090", "rtx-4090": "rtx-4090", "rtx4090": "rtx-4090", "NVIDIA GeForce RTX 4090": "rtx-4090",
    "gtx-1650": "gtx-1650-mobile", "gtx1650": "gtx-1650-mobile", "gtx1650-mobile": "gtx-1650-mobile",
    "gtx-1650-mobile": "gtx-1650-mobile", "GTX-1650": "gtx-1650-mobile",
}

# System names -> (system file, GPU file, GPU count).
SYSTEM_ALIASES = {
    "a6000x8": ("a6000x8-pcie", "rtx-a6000", 8), "rtx-a6000x8": ("a6000x8-pcie", "rtx-a6000", 8),
    "a6000x8-pcie": ("a6000x8-pcie", "rtx-a6000", 8),
    "a5000x8": ("a5000x8-pcie", "rtx-a5000", 8), "rtx-a5000x8": ("a5000x8-pcie", "rtx-a5000", 8),
    "a5000x8-pcie": ("a5000x8-pcie", "rtx-a5000", 8),
    "h100x8": ("h100x8", "h100-sxm", 8), "h100x4": ("h100x4", "h100-sxm", 4), "h100x2": ("h100x2", "h100-sxm", 2),
    "h200x8": ("h200x8", "h200", 8), "h200x4": ("h200x4", "h200", 4), "h200x2": ("h200x2", "h200", 2),
    "a100x8": ("a100x8", "a100-sxm4-80gb", 8),
}

EXPECTED_GPUS = {"rtx-a5000", "rtx-a6000", "a10g", "l4", "l40s", "a100-sxm4-40gb", "a100-sxm4-80gb",
                 "a100-pcie-80gb", "h100-sxm", "h100-pcie", "h200", "rtx-3090", "rtx-4090", "gtx-1650-mobile"}


def test_all_specs_load_and_stems_match_names():
    gpus, systems = all_hardware(), all_systems()
    assert EXPECTED_GPUS <= set(gpus)
    assert set(SYSTEM_ALIASES[k][0] for k in SYSTEM_ALIASES) <= set(systems)
    for stem, spec in {**gpus, **systems}.items():
        assert spec.name == stem


def test_aliases_unique():
    owner: dict[str, str] = {}
    for kind, specs in (("gpu", all_hardware()), ("system", all_systems())):
        for stem, spec in specs.items():
            for alias in {stem, spec.name, *spec.aliases}:
                key = alias.strip().lower()
                assert owner.get(key, f"{kind}:{stem}") == f"{kind}:{stem}", (
                    f"alias {alias!r} of {kind} {stem} is also used by {owner[key]}")
                owner[key] = f"{kind}:{stem}"


@pytest.mark.parametrize("alias,expected", sorted(GPU_ALIASES.items()))
def test_gpu_alias_resolves(alias, expected):
    device = resolve_device(alias)
    assert device.gpu.name == expected
    assert device.count == 1 and device.system is None


@pytest.mark.parametrize("alias,expected", sorted(SYSTEM_ALIASES.items()))
def test_system_alias_resolves(alias, expected):
    system, gpu, count = expected
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a system file must be found: no 'no system spec file' warning
        device = resolve_device(alias)
    assert device.system is not None and device.system.name == system
    assert device.gpu.name == gpu and device.count == count


def test_a6000x8_is_the_pcie_system_file():
    device = resolve_device("a6000x8")
    assert device.system.name == "a6000x8-pcie"
    assert device.count == 8 and device.gpu.name == "rtx-a6000"
    assert device.interconnect.kind == "pcie"
    assert 10e9 <= device.interconnect.link_bw_bytes_per_s <= 20e9
    assert 40e-6 <= device.interconnect.latency_s <= 70e-6


def test_unknown_name_lists_close_matches():
    with pytest.raises(UnknownNameError) as info:
        resolve_device("rtx-a600")
    assert "rtx-a6000" in info.value.close_matches
    assert "rtx-a6000" in str(info.value)
    with pytest.raises(UnknownNameError):
        resolve_device("tpu-v5e")


@pytest.mark.parametrize("stem", sorted(EXPECTED_GPUS))
def test_gpu_numbers_are_consistent(stem):
    spec = all_hardware()[stem]
    p = spec.peak_flops_per_s
    assert 1e12 < p.fp32 < 1e14
    assert p.fp16 >= p.fp32
    if spec.has_tensor_cores:
        assert p.fp16 > p.fp32 and p.bf16 is not None and p.tf32 is not None
        assert p.bf16 == p.fp16  # dense BF16 and FP16 (same accumulate) run at the same rate on these parts
    else:
        assert p.tf32 is None and p.bf16 is None and p.fp8 is None
    if p.fp8 is not None:
        assert spec.architecture in {"ada", "hopper"} and p.fp8 >= p.fp16
    # peak FP32 = SMs x FP32 lanes x 2 x clock, within 3% (64 lanes per SM on Turing and GA100, else 128)
    lanes = 64 if spec.architecture == "turing" or spec.compute_capability == "8.0" else 128
    assert p.fp32 == pytest.approx(spec.sm_count * lanes * 2 * spec.boost_clock_mhz * 1e6, rel=0.03)
    assert 2**30 < spec.memory_bytes < 160 * 2**30
    assert 100e9 <= spec.memory_bw_bytes_per_s <= 5e12
    assert 0 < spec.idle_power_w < spec.board_power_w
    assert spec.pcie_gen in (3, 4, 5) and spec.pcie_lanes == 16
    assert (spec.nvlink_kind == "none") == (spec.nvlink_bw_bytes_per_s == 0)
    assert spec.architecture in {"turing", "ampere", "ada", "hopper"}
    major = int(spec.compute_capability.split(".")[0])
    assert major == {"turing": 7, "ampere": 8, "ada": 8, "hopper": 9}[spec.architecture]


@pytest.mark.parametrize("stem", sorted(all_systems()))
def test_system_numbers_are_consistent(stem):
    system = all_systems()[stem]
    gpu = resolve_device(system.gpu).gpu
    ic = system.interconnect
    assert system.gpu_count >= 2 and ic.source
    assert 0 < ic.latency_s < 1e-3
    if ic.kind == "nvswitch":
        assert gpu.nvlink_kind == "switch"
        assert ic.link_bw_bytes_per_s < gpu.nvlink_bw_bytes_per_s / 2  # achievable busbw < nominal one-way
    if ic.kind == "pcie":
        x16_one_way = {3: 15.75e9, 4: 31.5e9, 5: 63.0e9}[gpu.pcie_gen]  # PCIe base spec, per direction
        assert ic.link_bw_bytes_per_s < x16_one_way


def test_multi_node_names_resolve_for_every_workload():
    """SYSTEMxN is N nodes of a multi-node system; a one-host system's name with xN means the shipped fabric of
    that GPU and node size (said in a note); a one-host system with no such fabric is a one-line error."""
    from aisim.catalog import resolve_device
    from aisim.errors import AisimError

    fabric = resolve_device("h100x8-ndrx2")
    assert fabric.count == 16 and fabric.system.network is not None
    shorthand = resolve_device("h100x8x2")
    assert shorthand.count == 16 and shorthand.system.name == "h100x8-ndrx2"
    assert any("2 nodes of h100x8-ndr" in a for a in shorthand.assumptions)
    with pytest.raises(AisimError, match="one host with no inter-node network"):
        resolve_device("a6000x8x2")


def test_a_tp_group_costs_the_same_on_a_bigger_box():
    """A tensor-parallel group's collectives are its own ranks' ring: tp 2 on an 8-GPU box takes the 2-GPU system
    file's link (or, with none shipped, NCCL's ring latency for 2 ranks), not the 8-GPU ring's latency."""
    from aisim import estimate

    def step(device, batch):
        return estimate(model="Meta-Llama-3-8B", device=device, tp=2, batch=batch, workload="decode", seq=2048,
                        runtime="vllm", top_ops=None).runtime_ms

    alone = step("h100x2", 1)
    assert step("h100x4", 2) == pytest.approx(alone, rel=1e-9)
    assert step("h100x8", 4) == pytest.approx(alone, rel=1e-9)
    assert step("h100x6", 3) == pytest.approx(alone, rel=1e-9)    # no 6-GPU file: the 2-GPU one still prices tp 2
    # no 2-GPU A100 system is shipped: the 8-GPU latency scaled down by NCCL's ring model, so tp 2 is cheaper there
    # than the same group priced with the whole box's ring latency
    from aisim.cost.comm import _intra_link
    from aisim.specs import load_calibration

    dev = resolve_device("a100x8")
    cal = load_calibration("default")
    bw2, lat2 = _intra_link(dev, cal, 2)
    bw8, lat8 = _intra_link(dev, cal, 8)
    assert bw2 == bw8 and lat2 == pytest.approx(lat8 * (6.6 + 2 * 0.6) / (6.6 + 14 * 0.6))
