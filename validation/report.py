"""Measured vs estimated: join measured JSONL datasets with ``aisim.estimate`` and render the comparison.

``python -m aisim.validation.report validation/data/h100.jsonl --fmt rst``

For each measured case the estimator is called with the same model, workload, batch, seq, dtype and TP degree
on the aisim device named after the measured GPU (``NVIDIA H100 80GB HBM3`` -> ``h100-sxm``; ``x2`` appended
for tp=2). Error = (estimated - measured) / measured (TorchCAP's page divides |m - e| by the estimate
instead). Missing values (energy not metered, a failed case, a failed estimate) are ``n/a``, never 0.
Energy per token is the energy of all GPUs of the case; memory is the peak of one GPU.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence
from typing import Optional

import typer

from ..errors import AisimError
from .cli import emit, new_app, run

from .runner import read_jsonl
from .suite import TRAINING_WORKLOADS
from .tables import Column, render_csv, render_markdown, render_rst_grid, rst_heading

# (key, column title, measured field, Estimate attribute)
METRICS = (
    ("runtime_ms", "Runtime (ms)", "runtime_ms_median", "runtime_ms"),
    ("memory_gb", "Memory (GB)", "peak_memory_gb", "memory_gb"),
    ("energy_j_per_token", "Energy (J/token)", "energy_j_per_token", "energy_j_per_token"),
    ("throughput_tokens_per_s", "Throughput (token/s)", "throughput_tokens_per_s", "throughput_tokens_per_s"),
)
ORDERS = {"measured-first": ("Measured", "Estimated", "Error"), "estimated-first": ("Estimated", "Measured", "Error")}
FORMATS = ("rst", "markdown", "csv", "json")
NA = "n/a"

# Measured GPU name (torch.cuda.get_device_name) -> aisim device, where the GPU specs' aliases do not say.
GPU_TO_DEVICE = {"NVIDIA H100 80GB HBM3": "h100-sxm", "NVIDIA H200": "h200", "NVIDIA H100 PCIe": "h100-pcie",
                 "NVIDIA RTX A6000": "rtx-a6000", "NVIDIA RTX A5000": "rtx-a5000"}

Estimator = Callable[..., object]


@dataclass
class Pair:
    estimated: float | None
    measured: float | None

    @property
    def error(self) -> float | None:
        """(estimated - measured) / measured, or None where either is missing."""
        if self.estimated is None or self.measured is None or self.measured == 0:
            return None
        return (self.estimated - self.measured) / self.measured


@dataclass
class ComparisonRow:
    key: str
    model: str
    gpu_name: str
    device: str
    workload: str
    batch: int
    seq: int
    dtype: str
    tp: int
    status: str
    metrics: dict[str, Pair] = field(default_factory=dict)
    fits: bool | None = None
    estimate_error: str | None = None
    measure_error: str | None = None
    step_tokens: int = 1

    def as_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "metrics"}
        for name, pair in self.metrics.items():
            out[f"{name}_measured"], out[f"{name}_estimated"], out[f"{name}_error"] = (
                pair.measured, pair.estimated, pair.error)
        return out


@dataclass
class SummaryRow:
    category: str
    metric: str
    n: int
    mape_pct: float | None
    max_abs_error_pct: float | None
    missing: int


def paired_mape_pct(estimated: Sequence[float], measured: Sequence[float]) -> float:
    """Mean absolute percentage error (%) of paired estimated and measured values."""
    return 100 * sum(abs(e - m) / m for e, m in zip(estimated, measured)) / len(measured)


def load_measurements(paths: Sequence[str | Path]) -> list[dict]:
    """Case lines of the datasets, each with its section header's gpu_name/driver/torch; for a key measured
    more than once on one GPU, the last ok (else the last) line."""
    chosen: dict[tuple[str, str], dict] = {}
    for path in paths:
        if not Path(path).is_file():
            raise AisimError(f"measured dataset {str(path)!r} is not a file; give JSONL file(s) written by a suite run")
        header: dict = {}
        for line in read_jsonl(path):
            if line.get("type") == "header":
                header = line
                continue
            if line.get("type") != "case" or not _case_line_ok(line, path):
                continue
            record = {**line, "gpu_name": str(header.get("gpu_name", "unknown")), "source": str(path),
                      "header": {k: header.get(k) for k in ("driver", "cuda", "torch", "transformers", "date")}}
            ident = (record["gpu_name"], record["key"])
            if ident not in chosen or record["status"] == "ok" or chosen[ident]["status"] != "ok":
                chosen[ident] = record
    return list(chosen.values())


CASE_FIELDS = {"key": str, "model": str, "workload": str, "dtype": str, "batch": int, "seq": int}


def _case_line_ok(line: dict, path) -> bool:
    """A case line has its identifying fields with their types, and every measured number it gives is finite and
    positive (a negative runtime is a broken record, not a measurement); otherwise it is skipped with a warning."""
    bad = [k for k, kind in CASE_FIELDS.items() if not isinstance(line.get(k), kind) or isinstance(line.get(k), bool)]
    if not bad and line.get("status") == "ok":
        bad = [f for _, _, f, _ in METRICS if line.get(f) is not None and not _positive_number(line[f])]
    if bad:
        print(f"warning: {path}: case {str(line.get('key'))[:80]!r} skipped: {', '.join(bad)} missing or not a "
              "finite positive value of the right type", file=sys.stderr)
    return not bad


def _positive_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def aisim_device_name(gpu_name: str, count: int = 1) -> str:
    """The aisim device for ``count`` GPUs named ``gpu_name``: a GPU spec alias, else GPU_TO_DEVICE."""
    base = GPU_TO_DEVICE.get(gpu_name)
    if base is None:
        try:
            from aisim.catalog import resolve_gpu

            base = resolve_gpu(gpu_name).name
        except Exception:  # noqa: BLE001 - no spec: the estimator reports the unknown name
            base = gpu_name.lower().replace("nvidia ", "").replace(" ", "-")
    return base if count == 1 else f"{base}x{count}"


def _value(obj, name: str) -> float | None:
    value = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _default_estimator() -> Estimator:
    import aisim

    return aisim.estimate


# A decode energy window also holds the untimed cache copies between trials; their energy, measured alone, is
# subtracted, but in the window they cost more (gaps, syncs): above this share of the window the per-step
# energy is not a measurement of the step and is reported as n/a (e.g. 26% for opt-6.7b decode 64 x 1024 on
# H200, whose subtracted figure implied 980 W on a 700 W card).
AFTER_WORK_MAX_SHARE = 0.10


def measured_energy_valid(m: dict) -> bool:
    after, per_step, trials = m.get("energy_after_work_j"), m.get("energy_j_per_step"), m.get("trials")
    if not after or per_step is None or not trials:
        return True
    return after / (per_step * trials + after) <= AFTER_WORK_MAX_SHARE


def compare_one(m: dict, estimator: Estimator) -> ComparisonRow:
    """Estimate one measured case and pair the metrics."""
    tp = int(m.get("tp") or 1)
    device = aisim_device_name(m["gpu_name"], tp)
    est, est_error = None, None
    try:
        est = estimator(model=m["model"], device=device, workload=m["workload"], batch=m["batch"], seq=m["seq"],
                        dtype=m["dtype"], tp=tp, tp_scope=m.get("tp_scope") or "all",
                        **({"ep": int(m["ep"])} if int(m.get("ep") or 1) > 1 else {}),
                        with_loss=m["workload"] in TRAINING_WORKLOADS,
                        **({"step_tokens": m["step_tokens"]} if m.get("step_tokens", 1) != 1 else {}),
                        **_train_plan(m))
    except Exception as exc:  # noqa: BLE001 - shown as n/a with the reason
        est_error = f"{type(exc).__name__}: {exc}"
    ok = m.get("status") == "ok"
    metrics = {key: Pair(_value(est, attr) if est is not None else None, _value(m, field_) if ok else None)
               for key, _, field_, attr in METRICS}
    timed = _as_timed(m, est, device)
    if timed is not None:
        metrics["runtime_ms"] = Pair(timed, metrics["runtime_ms"].measured)
        tokens = _value(est, "tokens")
        if tokens:
            metrics["throughput_tokens_per_s"] = Pair(tokens / (timed / 1e3),
                                                      metrics["throughput_tokens_per_s"].measured)
    if not measured_energy_valid(m):
        metrics["energy_j_per_token"] = Pair(metrics["energy_j_per_token"].estimated, None)
    fits = None if est is None else (est.get("fits") if isinstance(est, dict) else getattr(est, "fits", None))
    return ComparisonRow(m["key"], m["model"], m["gpu_name"], device, m["workload"], m["batch"], m["seq"],
                         m["dtype"], tp, m.get("status", "unknown"), metrics, fits, est_error, m.get("error"),
                         int(m.get("step_tokens") or 1))


def _train_plan(m: dict) -> dict:
    """A train row's optimizer as its harness ran it: measure.py steps torch.optim.AdamW with its defaults
    (foreach on CUDA; recorded as "adamw (foreach default)"), which makes 8 passes over the states where the fused
    kernel makes one (formulas.ADAMW_STREAMS). Other rows: nothing."""
    if m.get("workload") != "train" or m.get("optimizer") != "adamw (foreach default)":
        return {}
    from aisim.studies.train import DTYPE_PRECISION
    from aisim.workload import TrainPlan

    return {"train": TrainPlan(precision=DTYPE_PRECISION[m["dtype"]], optimizer_impl="foreach")}


def _as_timed(m: dict, est, device: str) -> float | None:
    """A decode row of validation/measure.py (it has ``kv_fill``) on one GPU is timed after the harness's
    unsynchronized cache rewind, which gives the host a head start (validation/rewind.py): the estimate as that
    harness times it, in ms; None where nothing changes. A distributed run synchronizes before every trial
    (measure.py _barrier), so its rows have no head start."""
    if m.get("workload") != "decode" or not m.get("kv_fill") or est is None or int(m.get("tp") or 1) != 1:
        return None
    runtime, gpu_busy, kv_gb = (_value(est, "runtime_ms"), _value(est, "gpu_busy_ms"),
                                _value(getattr(est, "memory", None), "kv_cache_gb"))
    if runtime is None or gpu_busy is None or not kv_gb:
        return None
    from aisim.catalog import resolve_device, resolve_model
    from aisim.errors import AisimError

    from .rewind import head_start_s, measured_runtime_s

    try:
        _, config = resolve_model(m["model"])
        gpu = resolve_device(device).gpu.name
    except AisimError:       # a CPU run, a model or device aisim does not know: the estimate as it is
        return None
    head = head_start_s(config, kv_gb * 1e9, gpu)
    return measured_runtime_s(runtime / 1e3, gpu_busy / 1e3, head) * 1e3 if head else None


def compare(measured: list[dict], estimator: Estimator | None = None) -> list[ComparisonRow]:
    """One ComparisonRow per measured case (estimator default: aisim.estimate)."""
    estimator = estimator or _default_estimator()
    return [compare_one(m, estimator) for m in measured]


CATEGORIES = (
    ("forward/prefill runtime", "runtime_ms", lambda r: r.workload in ("forward", "prefill") and r.tp == 1),
    ("encode runtime", "runtime_ms", lambda r: r.workload == "encode" and r.tp == 1),
    ("decode runtime", "runtime_ms", lambda r: r.workload == "decode" and r.tp == 1),
    ("forward-backward/train runtime", "runtime_ms", lambda r: r.workload in TRAINING_WORKLOADS and r.tp == 1),
    ("tp runtime", "runtime_ms", lambda r: r.tp > 1),
    ("peak memory", "memory_gb", lambda r: True),
    ("energy per token", "energy_j_per_token", lambda r: True),
    ("throughput", "throughput_tokens_per_s", lambda r: True),
)


def summarize(rows: Sequence[ComparisonRow]) -> list[SummaryRow]:
    """Per category: n (rows with both values), MAPE = mean |error| and max |error|, in percent."""
    out = []
    for category, metric, selected in CATEGORIES:
        errors = [r.metrics[metric].error for r in rows if selected(r)]
        present = [abs(e) for e in errors if e is not None]
        out.append(SummaryRow(category, metric, len(present),
                              100 * sum(present) / len(present) if present else None,
                              100 * max(present) if present else None, len(errors) - len(present)))
    return out


# ------------------------------------------------------------------ rendering

def fmt_value(x: float | None) -> str:
    if x is None:
        return NA
    return f"{x:.2f}" if abs(x) >= 1 else f"{x:#.3g}"


def fmt_error(e: float | None) -> str:
    return NA if e is None else f"{100 * e:+.2f}%"


def _csv_number(x: float | None, scale: float = 1.0) -> str:
    return NA if x is None else f"{x * scale:.6g}"


def metric_columns(order: str = "measured-first", csv: bool = False) -> list[Column]:
    subs = tuple("Error (%)" if csv and s == "Error" else s for s in ORDERS[order])
    return [Column(title, subs) for _, title, _, _ in METRICS]


def _metric_cells(row: ComparisonRow, order: str, csv: bool) -> list[str]:
    cells = []
    for key, _, _, _ in METRICS:
        pair = row.metrics[key]
        values = {"Measured": pair.measured, "Estimated": pair.estimated}
        for sub in ORDERS[order]:
            if sub == "Error":
                cells.append(_csv_number(pair.error, 100) if csv else fmt_error(pair.error))
            else:
                cells.append(_csv_number(values[sub]) if csv else fmt_value(values[sub]))
    return cells


def _device_label(row: ComparisonRow) -> str:
    return row.gpu_name if row.tp == 1 else f"{row.gpu_name} x {row.tp}"


def _model_label(row: ComparisonRow) -> str:
    return row.model if row.status == "ok" else f"{row.model} ({row.status})"


def flat_table(rows: Sequence[ComparisonRow], order: str = "measured-first", csv: bool = False):
    """(columns, cells) with one line per case: Model | Device | Workload | Batch | Seq | DType | metrics."""
    columns = [Column("Model", align="left"), Column("Device", align="left"), Column("Workload", align="left"),
               Column("Batch"), Column("Seq"), Column("Step tokens"), Column("DType", align="left"),
               *metric_columns(order, csv)]
    cells = [[_model_label(r), _device_label(r), r.workload, str(r.batch), str(r.seq), str(r.step_tokens), r.dtype,
              *_metric_cells(r, order, csv)] for r in rows]
    return columns, cells


def seed_table(rows: Sequence[ComparisonRow], order: str = "measured-first"):
    """(columns, cells) in TorchCAP's layout: Model | Device | the four metric groups."""
    columns = [Column("Model", align="left"), Column("Device", align="left"), *metric_columns(order)]
    return columns, [[_model_label(r), _device_label(r), *_metric_cells(r, order, False)] for r in rows]


def _shape_title(workload: str, batch: int, seq: int, dtype: str, rst: bool, step_tokens: int = 1) -> str:
    size = f":math:`{batch} \\times {seq}`" if rst else f"{batch} x {seq}"
    if workload == "decode" and step_tokens > 1:
        return f"Decoder call of {step_tokens} tokens per row, batch {batch}, context {seq} ({dtype})"
    if workload == "decode":
        return f"Decode step, batch {batch}, context {seq} ({dtype})"
    if workload == "encode":
        return f"Encode, batch {batch}, one 30 s window ({dtype})"
    return f"{workload.capitalize()}, Input Sequence Size = {size} ({dtype})"


def summary_table(summary: Sequence[SummaryRow]):
    columns = [Column("Category", align="left"), Column("n"), Column("MAPE"), Column("Max abs error")]
    pct = lambda v: NA if v is None else f"{v:.2f}%"  # noqa: E731
    return columns, [[s.category, str(s.n), pct(s.mape_pct), pct(s.max_abs_error_pct)] for s in summary]


def _sections(rows: Sequence[ComparisonRow], order: str, rst: bool) -> list[str]:
    render = render_rst_grid if rst else render_markdown
    parts, shapes = [], {}
    for r in rows:
        shapes.setdefault((r.workload, r.batch, r.seq, r.dtype, r.step_tokens), []).append(r)
    for (workload, batch, seq, dtype, step_tokens), group in shapes.items():
        title = _shape_title(workload, batch, seq, dtype, rst, step_tokens)
        parts.append(rst_heading(title, "-") if rst else f"## {title}")
        for label, members in (("Single GPU", [r for r in group if r.tp == 1]),
                               ("Multi GPU", [r for r in group if r.tp > 1])):
            if members:
                parts += [rst_heading(label, "~") if rst else f"### {label}", render(*seed_table(members, order))]
    return parts


def sources_of(measured: Sequence[dict]) -> list[str]:
    """One provenance line per measured file and GPU: driver, torch, transformers, date of its header."""
    seen: dict[tuple, str] = {}
    for m in measured:
        h = m.get("header", {})
        key = (m.get("source"), m["gpu_name"], h.get("driver"), h.get("torch"), h.get("transformers"))
        seen.setdefault(key, f"{Path(str(m.get('source'))).name}: {m['gpu_name']}, driver {h.get('driver')}, "
                             f"CUDA {h.get('cuda')}, torch {h.get('torch')}, transformers "
                             f"{h.get('transformers')}, {str(h.get('date'))[:10]}")
    return list(seen.values())


def render_report(rows: Sequence[ComparisonRow], fmt: str = "rst", *, order: str = "measured-first",
                  layout: str = "sections", title: str = "Benchmark", sources: Sequence[str] = ()) -> str:
    """The comparison as rst / markdown (tables per shape, or one flat table, then the summary), csv or json."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: use one of {', '.join(FORMATS)}")
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: use one of {', '.join(ORDERS)}")
    summary = summarize(rows)
    if fmt == "json":
        return json.dumps({"sources": list(sources), "rows": [r.as_dict() for r in rows],
                           "summary": [asdict(s) for s in summary]}, indent=1, allow_nan=False)
    if fmt == "csv":
        return render_csv(*flat_table(rows, order, csv=True))
    rst = fmt == "rst"
    render = render_rst_grid if rst else render_markdown
    note = ("Error = (Estimated - Measured) / Measured; n/a = not measured (failed case, energy not metered) "
            "or not estimated.")
    parts = [rst_heading(title, "=") if rst else f"# {title}", note]
    parts += ["Measured: " + "; ".join(sources)] if sources else []
    parts += _sections(rows, order, rst) if layout == "sections" else [render(*flat_table(rows, order))]
    parts += [rst_heading("Summary", "-") if rst else "## Summary", render(*summary_table(summary))]
    return "\n\n".join(parts) + "\n"


def build_report(jsonl_paths: Sequence[str | Path] | str | Path, fmt: str = "rst", *,
                 estimator: Estimator | None = None, order: str = "measured-first", layout: str = "sections") -> str:
    """Load measured datasets, estimate every case, and render the comparison (rst, markdown, csv or json)."""
    paths = [jsonl_paths] if isinstance(jsonl_paths, (str, Path)) else list(jsonl_paths)
    measured = load_measurements(paths)
    return render_report(compare(measured, estimator), fmt, order=order, layout=layout,
                         sources=sources_of(measured))


app = new_app(__doc__.split("\n")[0])


@app.command()
def _report(jsonl: list[Path] = typer.Argument(..., help="measured datasets (validation/data/*.jsonl)"),
            fmt: str = typer.Option("rst", help="|".join(FORMATS)),
            order: str = typer.Option("measured-first", help="|".join(ORDERS)),
            layout: str = typer.Option("sections", help="sections|flat"),
            out: Optional[Path] = typer.Option(None, help="write here instead of stdout")) -> int:
    if fmt not in FORMATS or order not in ORDERS or layout not in ("sections", "flat"):
        raise AisimError(f"--fmt is one of {FORMATS}, --order one of {list(ORDERS)}, --layout sections or flat")
    text = build_report([str(p) for p in jsonl], fmt, order=order, layout=layout)
    return emit(text, out)


def main(argv: list[str] | None = None) -> int:
    return run(app, argv, "python -m aisim.validation.report")


if __name__ == "__main__":
    raise SystemExit(main())
