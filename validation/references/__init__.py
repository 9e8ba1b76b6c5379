"""Published benchmark tables as machine-readable reference datasets.

These are EVALUATION data for aisim: measured numbers transcribed exactly from published sources, each
file with a ``source`` and a ``provenance`` block (hardware, software, workload, metric definitions) and
``notes`` on anything odd in the source. No cost-model parameter may be fitted to them.

    >>> from aisim.validation.references import load_reference
    >>> ref = load_reference("torchcap")
    >>> ref["rows"][0]["measured"]["runtime_ms"]
    693.77

Datasets (name -> file):

* ``torchcap``    -> torchcap.yaml     TorchCAP benchmark page (RTX A5000/A6000, 1 and 8 GPUs); ``rows`` (001) and
  ``rows_004`` (older page, labels un-swapped)
* ``cs336``       -> cs336.yaml        Stanford CS336 A2 forward / forward+backward timings; ``rows``
* ``tgi-bloomz``  -> tgi_bloomz.yaml   TGI text-generation-benchmark, bloomz-7b1-mt, 1-8 shards; ``runs``
* ``whisper-cpp`` -> whisper_cpp.yaml  whisper.cpp medium.en on a GTX 1650 laptop GPU; ``rows``
* ``trtllm-perf`` -> trtllm_perf.yaml  TensorRT-LLM's published Llama-2 tables (H100 FP8, A100 FP16, L40S FP8);
  ``throughput_rows`` and ``latency_rows``
* ``vllm-serve``  -> vllm_serve_gpustack.yaml  GPUStack's vLLM v0.11.0 bench-serve runs of gpt-oss-20b (A100, H100);
  ``rows``

``_transcribe_seeds.py`` in this folder regenerates (or ``--check``s) the data part of each file from the
seed text files.
"""
from __future__ import annotations

import copy
import functools
from pathlib import Path

import yaml

__all__ = ["REFERENCE_FILES", "load_reference", "reference_names"]

REFERENCE_FILES: dict[str, str] = {
    "torchcap": "torchcap.yaml",
    "cs336": "cs336.yaml",
    "tgi-bloomz": "tgi_bloomz.yaml",
    "whisper-cpp": "whisper_cpp.yaml",
    "trtllm-perf": "trtllm_perf.yaml",
    "vllm-serve": "vllm_serve_gpustack.yaml",
}


def reference_names() -> list[str]:
    """The valid names for :func:`load_reference`."""
    return list(REFERENCE_FILES)


def _read_text(filename: str) -> str:
    # Installed package: the YAML files are package data of aisim.validation (references/*.yaml).
    try:
        from importlib.resources import files

        resource = files("aisim.validation") / "references" / filename
        if resource.is_file():
            return resource.read_text(encoding="utf-8")
    except Exception:  # aisim not installed / not importable here: use the source tree
        pass
    return (Path(__file__).resolve().parent / filename).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=None)
def _load_cached(filename: str) -> dict:
    data = yaml.safe_load(_read_text(filename))
    if not isinstance(data, dict):
        raise ValueError(f"reference file {filename} does not hold a mapping")
    return data


def load_reference(name: str) -> dict:
    """Load one reference dataset by name (``torchcap``, ``cs336``, ``tgi-bloomz``, ``whisper-cpp``).

    Underscores are accepted for hyphens (``tgi_bloomz``). Returns a fresh dict each call (safe to mutate).
    Raises ValueError for an unknown name.
    """
    key = str(name).strip().lower().replace("_", "-")
    if key not in REFERENCE_FILES:
        raise ValueError(
            f"unknown reference dataset {name!r}; valid names: {', '.join(REFERENCE_FILES)}"
        )
    return copy.deepcopy(_load_cached(REFERENCE_FILES[key]))
