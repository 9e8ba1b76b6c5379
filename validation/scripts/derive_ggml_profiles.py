"""Derive the ggml-vulkan GEMM fraction of hardware_specs/runtimes/ggml-vulkan.yaml from a published bench.

Source (calibration data, not evaluation data): whisper.cpp issue #89 "Benchmark results", kmzs123, 2025-03-22,
AMD Radeon RX 6750 GRE, Windows 10, Vulkan backend, whisper.cpp commit 3fc6ad9 (the 1.7.5 era): `bench` encode time
of ggml medium (multilingual) = 282.16 ms. The bench's encode is one 30 s window through conv, encoder and the
cross-attention K/V, which is aisim's encode with encode_cross_kv, at the profile's other settings.

The fraction is found by bisection: the value at which aisim's estimate of that encode on rx-6750-gre equals the
bench. Run: python -m aisim.validation.scripts.derive_ggml_profiles  (prints the fraction and the check).
"""
from __future__ import annotations

SOURCE_MS = 282.16
MODEL, DEVICE = "whisper-medium", "rx-6750-gre"


def encode_ms(fraction: float) -> float:
    from aisim.api import estimate
    from aisim.specs import all_runtimes

    rt = all_runtimes()["ggml-vulkan"]
    entry = rt.efficiency[0].model_copy(update={"gemm_fraction_of_peak": fraction})
    variant = rt.model_copy(update={"efficiency": [entry]})
    return estimate(model=MODEL, device=DEVICE, workload="encode", runtime=variant, top_ops=0).runtime_ms


def derive(target_ms: float = SOURCE_MS) -> float:
    lo, hi = 1e-3, 1.0
    if encode_ms(hi) > target_ms:
        raise SystemExit(f"even a fraction of 1.0 is slower than {target_ms} ms: check the profile")
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if encode_ms(mid) > target_ms else (lo, mid)
    return round((lo + hi) / 2, 3)


def main() -> None:
    from aisim.specs import all_runtimes

    fraction = derive()
    shipped = all_runtimes()["ggml-vulkan"].efficiency[0].gemm_fraction_of_peak
    print(f"ggml-vulkan gemm_fraction_of_peak derived from {MODEL} encode {SOURCE_MS} ms on {DEVICE}: {fraction}")
    print(f"shipped in hardware_specs/runtimes/ggml-vulkan.yaml: {shipped}; estimate at the shipped value: "
          f"{encode_ms(shipped):.1f} ms")


if __name__ == "__main__":
    main()
