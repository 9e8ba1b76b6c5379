"""Plots of aisim results as PNG files (matplotlib, the optional extra ``aisim[plot]``, imported where used).

Each function takes a result object (or rows) and a path, writes one PNG and returns the path; the CLI's ``--plot``
and the notebooks call them. Rendering only: no modelling here.
"""
from __future__ import annotations

from pathlib import Path


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        from .errors import AisimError

        raise AisimError("plots need matplotlib: install aisim[plot] (pip install 'aisim[plot]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    fig.clf()
    return path


def pareto_png(result, path) -> Path:
    """Output tokens/s per GPU vs tokens/s per user of every configuration meeting the SLOs (aisim plan serve), one
    colour per device, the Pareto front joined and ringed."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    devices = sorted({c.device for c in result.ranked})
    for i, device in enumerate(devices):
        cs = [c for c in result.ranked if c.device == device]
        ax.scatter([c.output_tokens_per_s_per_user for c in cs], [c.output_tokens_per_s_per_gpu for c in cs],
                   color=f"C{i}", label=device, alpha=0.7)
    front = result.pareto
    ax.plot([c.output_tokens_per_s_per_user for c in front], [c.output_tokens_per_s_per_gpu for c in front],
            "k--", lw=1, label="Pareto front")
    ax.scatter([c.output_tokens_per_s_per_user for c in front], [c.output_tokens_per_s_per_gpu for c in front],
               s=120, facecolors="none", edgecolors="k")
    ax.set_xlabel("output tokens/s per user (1000 / median TPOT)")
    ax.set_ylabel("output tokens/s per GPU at the load (rate x output / GPUs)")
    ax.set_title(f"{result.model} at {result.rate_per_s:g} req/s")
    ax.legend(fontsize=8)
    return _save(fig, path)


def roofline_png(estimate, gpu, path, dtype: str = "fp16") -> Path:
    """Per-op arithmetic intensity (FLOPs / bytes) vs achieved FLOP/s (FLOPs / time) of an Estimate's top ops, under
    the roofline min(peak FLOP/s, intensity x HBM bandwidth) of ``gpu`` (an aisim HardwareSpec)."""
    plt = _pyplot()
    peak, bw = gpu.peak_for(dtype), gpu.memory_bw_bytes_per_s
    ops = [o for o in estimate.top_ops if o.flops > 0 and o.bytes > 0 and o.time_ms > 0]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if ops:
        xs = [o.flops / o.bytes for o in ops]
        ys = [o.flops / (o.time_ms / 1e3) for o in ops]
        ax.scatter(xs, ys, s=[20 + 400 * o.share for o in ops], alpha=0.7)
        for o, x, y in list(zip(ops, xs, ys))[:8]:
            ax.annotate(o.name.replace("aten.", ""), (x, y), fontsize=7)
        lo, hi = min(xs + [1.0]) / 2, max(xs + [peak / bw]) * 4
    else:
        lo, hi = 0.1, 1e4
    grid = [lo * (hi / lo) ** (i / 100) for i in range(101)]
    ax.plot(grid, [min(peak, x * bw) for x in grid], "k-", lw=1, label=f"{gpu.name} roofline ({dtype})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"{estimate.model}: ops by time share (marker size)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def latency_throughput_png(points, path, title: str = "") -> Path:
    """Latency vs throughput over batch sizes. ``points``: {series label: [(batch, latency_ms, tokens_per_s)]};
    each point is labelled with its batch."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, rows) in enumerate(points.items()):
        rows = sorted(rows)
        ax.plot([r[2] for r in rows], [r[1] for r in rows], "o-", color=f"C{i}", label=label)
        for batch, lat, tput in rows:
            ax.annotate(str(batch), (tput, lat), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("throughput (tokens/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title or "latency vs throughput over batch size")
    ax.legend(fontsize=8)
    return _save(fig, path)


def estimated_vs_measured_png(rows, path, metric: str = "runtime_ms", title: str = "") -> Path:
    """Estimate vs measurement per category, log axes, the y = x line and a +-20 % band. ``rows``: triples
    (category, measured, estimated), or aisim.validation.report ComparisonRows (category: the workload; values:
    ``.metrics[metric]``)."""
    plt = _pyplot()
    groups: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if hasattr(r, "metrics"):
            pair = r.metrics.get(metric)
            r = (r.workload, pair.measured, pair.estimated) if pair is not None else (None, None, None)
        cat, measured, estimated = r
        if measured and estimated and measured > 0 and estimated > 0:
            groups.setdefault(str(cat), []).append((measured, estimated))
    fig, ax = plt.subplots(figsize=(6, 6))
    values = [v for pts in groups.values() for p in pts for v in p] or [1.0, 10.0]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="y = x")
    ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2], color="0.85", label="+-20 %")
    for i, (cat, pts) in enumerate(sorted(groups.items())):
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, color=f"C{i % 10}", label=f"{cat} ({len(pts)})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"measured {metric}")
    ax.set_ylabel(f"estimated {metric}")
    ax.set_title(title or f"estimated vs measured {metric}")
    ax.legend(fontsize=7)
    return _save(fig, path)


def train_plan_png(result, path) -> Path:
    """Time to train vs $ of every plan that fits (aisim plan train), one colour per device, marker size by GPU
    count, the Pareto front joined."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    cost = lambda c: c.usd if c.usd is not None else c.gpu_hours  # noqa: E731
    for i, device in enumerate(sorted({c.device for c in result.ranked})):
        cs = [c for c in result.ranked if c.device == device]
        ax.scatter([c.time_to_train_days for c in cs], [cost(c) for c in cs], s=[8 + c.gpus / 16 for c in cs],
                   color=f"C{i}", alpha=0.5, label=device)
    front = result.pareto
    ax.plot([c.time_to_train_days for c in front], [cost(c) for c in front], "k--o", lw=1, ms=3,
            label="Pareto front")
    ax.set_xscale("log")
    ax.set_xlabel("time to train (days)")
    ax.set_ylabel("cost ($, GPU-hours x price)")
    ax.set_title(f"{result.model}: {result.tokens:.3g} tokens, seq {result.seq}, batch {result.global_batch}\n"
                 f"marker area by GPU count ({', '.join(str(g) for g in sorted({c.gpus for c in result.ranked}))})",
                 fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)
