"""aisim: analytical performance, memory and energy simulator for transformer models on GPUs.

``aisim.estimate(model="opt-6.7b", device="a6000x8")`` returns an ``aisim.results.Estimate``. Imports are lazy:
``aisim.estimate`` is ``aisim.api.estimate`` (its real signature), loaded on first use, so the measurement code
under aisim.validation runs where pydantic is not installed; torch and transformers load only to trace a graph.
"""
from __future__ import annotations

__version__ = "0.2.0"
__all__ = ["estimate", "__version__"]


def __getattr__(name: str):
    if name == "estimate":
        from .api import estimate

        return estimate
    raise AttributeError(f"module 'aisim' has no attribute {name!r}")
