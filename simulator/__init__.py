"""aisim: analytical performance, memory and energy simulator for transformer models on GPUs.

``aisim.estimate(model="opt-6.7b", device="a6000x8")`` returns an ``aisim.results.Estimate``. Heavy modules
(torch, transformers) are imported only when a graph must be traced.
"""
from __future__ import annotations

__version__ = "0.2.0"

from .api import estimate  # noqa: E402  (typed front: pydantic and the spec loaders only, no torch)

__all__ = ["estimate", "__version__"]
