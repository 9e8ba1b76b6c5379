"""Measurement side of aisim: run real HF models on the local GPU(s) and compare with ``aisim.estimate``.

Data flows one way: the simulator never imports this package. Heavy dependencies (torch, transformers,
pynvml) are imported inside the functions that use them, so importing this package is cheap.

Public entry points (imported lazily):

- ``run_suite(suite_path, out_jsonl, *, gpus=None, device_name=None, max_minutes=None, ...)``  (runner)
- ``build_report(jsonl_paths, fmt='rst', *, estimator=None, ...) -> str``                  (report)
- ``summarize(rows) -> list[SummaryRow]``                                                     (report)
- ``load_suite(path) -> Suite``                                                               (suite)
"""
from __future__ import annotations

_EXPORTS = {
    "run_suite": "runner", "RunError": "runner",
    "build_report": "report", "summarize": "report", "compare": "report", "load_measurements": "report",
    "load_suite": "suite", "Suite": "suite", "Case": "suite", "MeasureSettings": "suite",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
