"""Mixture-of-experts accuracy: the committed MoE measurements (validation/data/moe/moe-h100.jsonl) against aisim.

``moe_section()`` returns the markdown lines of docs/accuracy.md's MoE section (validation/accuracy.py calls it);
``compare_moe()`` the per-case rows; ``moe_mape()`` MAPE per category, which tests/test_moe.py holds under ceilings.

Cases: HF transformers 5.17 eager with its default experts path (``experts_implementation="grouped_mm"``), bf16,
one H100 SXM, random weights (near-uniform routing). The per-expert Python loop (``impl=eager``) rows are listed
but not scored: its data-dependent loop over the hit experts cannot be traced on the meta device (aisim traces the
default grouped-GEMM path). Nothing here is fitted to these rows.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from .report import paired_mape_pct
from .rewind import head_start_s, measured_runtime_s, rewind_note

DATA = Path(__file__).parent / "data" / "moe" / "moe-h100.jsonl"
# the same harness after its fix (--profile after every timed case), on another H100 host, 2026-11-26 09:48
RERUN = Path(__file__).parent / "data" / "moe" / "moe-h100-rerun.jsonl"
# The first (scored) run, the rerun, and five more runs of the fixed harness (profile off), default experts path
# only, each on the H100 machine the device lent at the time, 2026-11-26: run3 (its host lines failed: the machine
# lacked pydantic), run4, run5 (OLMoE and Qwen1.5-MoE only), run6 and run7 (after the per-op host table was
# committed: its estimates are predictions) with host lines (validation/host.py); run9 on 2026-11-27 13:24 (aisim's
# MoE estimates unchanged since run8's session; right after the framework_arch harness in the same call).
RUNS = (DATA, RERUN, *(Path(__file__).parent / "data" / "moe" / f"moe-h100-run{i}.jsonl"
                       for i in (3, 4, 5, 6, 7, 8, 9)))
# harness/host_scopes.py right after run6 and run7, on their hosts (a diagnostic: per-scope and per-op host time)
HOST_SCOPES = Path(__file__).parent / "data" / "kernels" / "host-scopes-h100.jsonl"
HOST_SCOPES_RUNS = (HOST_SCOPES, *(HOST_SCOPES.with_name(f"host-scopes-h100-run{i}.jsonl") for i in (2, 3)))
GROUPED_GEMM = Path(__file__).parent / "data" / "kernels" / "grouped-gemm-h100.jsonl"
# Mixtral-8x7B with 16 of its 32 layers (harness/configs/mixtral-8x7b-16l.json; the 32-layer model needs 93 GB, and no
# H200 was lent on 2026-11-27), one run on an H100, predicted: the config was committed before it ran (9255cb3)
MIXTRAL = Path(__file__).parent / "data" / "moe" / "moe-mixtral16l-h100.jsonl"
CONFIGS = Path(__file__).parent / "harness" / "configs"
DEVICE = "h100"
RUNTIME = "eager"
SCORED_IMPL = "grouped_mm"
CATEGORIES = ("prefill runtime", "decode runtime", "prefill memory", "decode memory")
# Goals of the engines + MoE issue (MAPE %), and regression ceilings (the value of the commit that set it plus half a
# point; tests/test_moe.py fails above them). Lower a ceiling when accuracy improves. Scored: the first run, as the goal
# was set on it; the per-case median over the runs is shown beside it, not scored (a median over hosts averages the
# host noise out, so holding it to a goal set for one run would loosen the goal).
GOALS = {"prefill runtime": 15.0, "decode runtime": 15.0, "prefill memory": 3.0, "decode memory": 3.0}
CEILINGS = {"prefill runtime": 9.3, "decode runtime": 16.2, "prefill memory": 0.5, "decode memory": 0.6}
GB = 1e9


_mape = paired_mape_pct


def _records(path: Path) -> list[dict]:
    """A harness JSONL file's records."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _header(path: Path) -> dict:
    """The header line of a harness JSONL file ({} if it has none)."""
    return next((r for r in _records(path) if r.get("type") == "header"), {})


def _host_records(records: list[dict]) -> list[dict]:
    """The file's successful host lines (validation/host.py)."""
    return [r for r in records if r.get("type") == "host" and r.get("constants")]


def _file_device(path: Path) -> str:
    """The GPU a harness file ran on (its header's gpu_name, which aisim resolves), or the H100 default."""
    return (_header(path).get("gpu_name") if path.exists() else None) or DEVICE


@dataclass(frozen=True)
class MoeRow:
    model: str
    impl: str
    workload: str
    batch: int
    context: int
    measured_ms: float
    estimated_ms: float
    measured_gb: float
    estimated_gb: float
    measured_distinct: float
    estimated_distinct: float

    @property
    def case(self) -> tuple[str, str, int, int]:
        """What identifies the case across runs: model, phase, batch, context."""
        return self.model, self.workload, self.batch, self.context

    @property
    def time_err_pct(self) -> float:
        return 100.0 * (self.estimated_ms - self.measured_ms) / self.measured_ms

    @property
    def mem_err_pct(self) -> float:
        return 100.0 * (self.estimated_gb - self.measured_gb) / self.measured_gb


def load_cases(path: Path = DATA) -> list[dict]:
    with open(path) as f:
        return [r for r in map(json.loads, f) if r.get("type") == "case" and r.get("status") == "ok"]


def estimate_case(case: dict, calibration="auto", device: str = DEVICE) -> tuple[float, float, float]:
    """(runtime ms, peak memory GB, expected distinct experts per layer) of one measured case on ``device``."""
    from aisim.formulas import expected_distinct_experts
    from aisim.graph.engine import moe_routing
    from aisim.scenario import scenario
    from aisim.step import step_cost
    from aisim.workload import StepShape

    sc = scenario(str(CONFIGS / f"{case['model']}.json"), device, dtype="bf16", runtime=RUNTIME,
                  calibration=calibration)
    cost = step_cost(sc, StepShape(phase=case["workload"], batch=case["batch"], seq=case["context"]))
    moe = moe_routing(sc.config)
    tokens = case["batch"] * (case["context"] if case["workload"] == "prefill" else 1)
    distinct = expected_distinct_experts(tokens, moe["top_k"], moe["experts"])
    runtime_s = cost.runtime_s
    if case["workload"] == "decode":   # timed after moe_bench's unsynchronized cache rewind (validation/rewind.py)
        head = head_start_s(sc.config, cost.memory.kv_cache_gb * GB, sc.device.gpu.name)
        runtime_s = measured_runtime_s(cost.runtime_s, cost.gpu_busy_s, head)
    return runtime_s * 1e3, cost.memory.total_gb, distinct


def compare_moe(path: Path = DATA, calibration="auto") -> list[MoeRow]:
    """The file's cases against aisim on the GPU its header names."""
    rows = []
    device = _file_device(path)
    for case in load_cases(path):
        if case["impl"] != SCORED_IMPL:
            continue
        ms, gb, distinct = estimate_case(case, calibration, device)
        rows.append(MoeRow(case["model"], case["impl"], case["workload"], case["batch"], case["context"],
                           case["median_ms"], ms, case["peak_allocated_gb"], gb,
                           case["routing"]["mean_distinct"], distinct))
    return rows


def moe_mape(rows: list[MoeRow]) -> dict[str, float]:
    out = {}
    for phase in ("prefill", "decode"):
        sel = [r for r in rows if r.workload == phase]
        if sel:
            out[f"{phase} runtime"] = sum(abs(r.time_err_pct) for r in sel) / len(sel)
            out[f"{phase} memory"] = sum(abs(r.mem_err_pct) for r in sel) / len(sel)
    return out


def median_of_runs(per_run: list[list[MoeRow]]) -> list[MoeRow]:
    """One row per case measured in any run (``per_run``: compare_moe of each run): the estimate against the
    median of the runs' measured times."""
    by_case: dict[tuple, list[MoeRow]] = {}
    for rows in per_run:
        for r in rows:
            by_case.setdefault(r.case, []).append(r)
    return [replace(rs[0], measured_ms=statistics.median(r.measured_ms for r in rs),
                    measured_gb=statistics.median(r.measured_gb for r in rs)) for rs in by_case.values()]


def runs_rows(runs: tuple[Path, ...] = RUNS) -> dict[Path, list[MoeRow]]:
    """compare_moe of each run, once for every table that reads them."""
    return {path: compare_moe(path) for path in runs}


def mixtral_lines(path: Path = MIXTRAL, per_run: dict[Path, list[MoeRow]] | None = None) -> list[str]:
    """The Mixtral-shaped run: per-case errors, MAPE, and the same estimated with the run's own host lines
    (``per_run``: compare_moe of the scored runs, as moe_section has them)."""
    from aisim.specs import load_calibration

    from .host import host_spec

    if not path.exists():
        return []
    records = _records(path)
    header, hosts = _header(path), _host_records(records)
    rows = compare_moe(path)
    mape = moe_mape(rows)
    out = [f"Mixtral-8x7B with 16 of its 32 layers (validation/harness/configs/mixtral-8x7b-16l.json: 8 experts of "
           "14336 wide, top-2; the whole model needs 93 GB of bf16 weights, and no H200 was lent when asked earlier "
           f"on 2026-11-27: one was later, below), one run ({path.relative_to(path.parents[3])}: "
           f"{header.get('gpu_name')}, driver "
           f"{header.get('driver')}, torch {header.get('torch')}, transformers {header.get('transformers')}, "
           f"{header.get('date', '?')[:16]}), predicted: the config was committed before it ran and nothing changed "
           "since. Not in the scored table (one run, another model):", "",
           *_mixtral_table(rows)]
    line = (f"Runtime MAPE prefill {mape['prefill runtime']:.1f}%, decode {mape['decode runtime']:.1f}%; memory "
            f"{mape['prefill memory']:.2f}% / {mape['decode memory']:.2f}%.")
    if hosts:
        per_run = per_run or runs_rows()
        calibration = load_calibration("h100-sxm")
        spec = host_spec(hosts)
        own = moe_mape(compare_moe(path, calibration=spec.apply(calibration)))
        helped = []
        for run, run_rows in per_run.items():
            run_hosts = _host_records(_records(run))
            if run_hosts:
                cal = host_spec(run_hosts).apply(calibration)
                helped.append(moe_mape(compare_moe(run, calibration=cal))["decode runtime"]
                              < moe_mape(run_rows)["decode runtime"])
        line += (f" The run's host was among the slowest measured: its host lines (validation/host.py, start and "
                 f"end) give a tiny-model framework scale of {spec.eager_framework_scale:.2f}, where the "
                 f"calibration's host has {calibration.eager_framework_scale:.2f}; estimated with "
                 f"them (`--host`), decode {own['decode runtime']:.1f}%, prefill {own['prefill runtime']:.1f}% (not "
                 f"the scored method: on the {len(helped)} scored runs with host lines they improved decode on "
                 f"{sum(helped)}).")
    return out + ["", line]


def _mixtral_table(rows: list[MoeRow], predicted: dict | None = None) -> list[str]:
    head = ("| phase | batch | context | measured ms | estimated ms | error % | measured GB | estimated GB | "
            "experts touched (measured / expected) |")
    out = [head + (" predicted ms | predicted GB |" if predicted else ""),
           "|---|---:|---:|---:|---:|---:|---:|---:|---|" + ("---:|---:|" if predicted else "")]
    for r in rows:
        line = (f"| {r.workload} | {r.batch} | {r.context} | {r.measured_ms:.2f} | {r.estimated_ms:.2f} | "
                f"{r.time_err_pct:+.1f} | {r.measured_gb:.2f} | {r.estimated_gb:.2f} | {r.measured_distinct:.1f} / "
                f"{r.estimated_distinct:.1f} |")
        if predicted:
            ms, gb = predicted[(r.workload, r.batch, r.context)]
            line += f" {ms:.2f} | {gb:.2f} |"
        out.append(line)
    return out


# The whole Mixtral-8x7B (harness/configs/mixtral-8x7b.json, 32 layers) on an H200, HF eager: aisim as committed in
# 1c67111 (2026-11-27 05:37 UTC, before the run at 05:41; its message gives the ranges, these per-case values were
# recomputed from that tree and recorded after the run). h200.yaml then had no grouped-GEMM table and no broadcast
# curve, so the experts ran at the dense table's efficiency and the masked fills at the contiguous copy rate:
# (phase, batch, context) -> (ms, peak GB)
MIXTRAL_H200 = Path(__file__).parent / "data" / "moe" / "moe-mixtral-h200.jsonl"
MIXTRAL_H200_PREDICTED = {
    ("decode", 1, 128): (33.44, 93.46), ("decode", 1, 1024): (33.44, 93.58), ("decode", 8, 128): (40.49, 93.58),
    ("decode", 8, 1024): (39.93, 94.53), ("decode", 32, 128): (42.09, 93.99), ("decode", 32, 1024): (39.08, 97.81),
    ("prefill", 1, 128): (44.06, 93.49), ("prefill", 1, 1024): (65.02, 93.86), ("prefill", 8, 128): (65.01, 93.86),
    ("prefill", 8, 1024): (421.26, 96.80), ("prefill", 32, 128): (213.55, 95.12),
    ("prefill", 32, 1024): (1652.02, 106.86)}


def mixtral_h200_lines(path: Path = MIXTRAL_H200) -> list[str]:
    """The whole Mixtral-8x7B on an H200: the predictions made before the run, the model as it stands (with the
    H200's own grouped-GEMM table and broadcast curve, microbenchmarked after the run), and with the run's host
    lines."""
    from aisim.specs import load_calibration

    from .host import host_spec

    if not path.exists():
        return []
    header, hosts = _header(path), _host_records(_records(path))
    rows = compare_moe(path)
    mape = moe_mape(rows)
    h200 = load_calibration("h200")
    broadcast = h200.broadcast_memory_efficiency.efficiency

    def predicted_mape(workload: str, column: int) -> float:
        picked = [r for r in rows if r.workload == workload]
        return _mape([MIXTRAL_H200_PREDICTED[r.workload, r.batch, r.context][column] for r in picked],
                     [(r.measured_ms, r.measured_gb)[column] for r in picked])

    out = [f"The whole Mixtral-8x7B (validation/harness/configs/mixtral-8x7b.json, 32 layers, 93 GB of bf16 weights) "
           f"on an H200, HF eager, one run ({path.relative_to(path.parents[3])}: {header.get('gpu_name')}, driver "
           f"{header.get('driver')}, torch {header.get('torch')}, transformers {header.get('transformers')}, "
           f"{header.get('date', '?')[:16]}), with the predictions (the last two columns: aisim as committed in "
           "1c67111 before the run, whose message gives their ranges; the per-case values are recorded in "
           "moe_report.MIXTRAL_H200_PREDICTED):", "",
           *_mixtral_table(rows, MIXTRAL_H200_PREDICTED), "",
           f"The predictions: runtime MAPE prefill {predicted_mape('prefill', 0):.1f}%, decode "
           f"{predicted_mape('decode', 0):.1f}%; memory {predicted_mape('prefill', 1):.2f}% / "
           f"{predicted_mape('decode', 1):.2f}%. They were made when h200.yaml had no grouped-GEMM table and no "
           "broadcast curve: the experts' GEMMs ran at the dense table's efficiency and the router's masked fills at "
           f"the contiguous copy rate (h200.yaml's memory curve, up to {max(h200.memory_efficiency.efficiency):.2f} of "
           f"bandwidth, where the broadcast curve measured after gives {min(broadcast):.2f}-{max(broadcast):.2f}). "
           "Right after the run the "
           "grouped_gemm harness ran on the H200 (validation/data/kernels/grouped-gemm-h200.jsonl, model and grid "
           "sections, no Mixtral shape; `python -m aisim.validation.scripts.derive_grouped_gemm "
           "validation/data/kernels/grouped-gemm-h200.jsonl --gpu h200 --write hardware_specs/calibration/h200.yaml`) "
           f"and the model as it stands, with those blocks, gives prefill {mape['prefill runtime']:.1f}%, decode "
           f"{mape['decode runtime']:.1f}%, memory {mape['prefill memory']:.2f}% / {mape['decode memory']:.2f}%."]
    if hosts:
        spec = host_spec(hosts)
        own = moe_mape(compare_moe(path, calibration=spec.apply(h200)))
        out[-1] += (f" The run's host was a slow one: its host lines (validation/host.py) give a tiny-model framework "
                    f"scale of {spec.eager_framework_scale:.2f}, where h200.yaml's host has "
                    f"{h200.eager_framework_scale:.2f}; with them (`--host`), decode "
                    f"{own['decode runtime']:.1f}%, prefill {own['prefill runtime']:.1f}% (not the scored method).")
    return out


# The three MoE models on an H200 (the first run's harness, default experts path), one run, 2026-11-27 06:40 UTC:
# predicted by the model as committed in 3fdba2d (06:39 UTC), nothing that prices these rows changed since
MOE_H200 = Path(__file__).parent / "data" / "moe" / "moe-h200.jsonl"


def moe_h200_lines(path: Path = MOE_H200) -> list[str]:
    """The OLMoE / Qwen-MoE run on an H200: per-category MAPE (predicted), per-model decode bias, and the same with
    the run's host lines."""
    from aisim.specs import load_calibration

    from .host import host_spec

    if not path.exists():
        return []
    header, hosts = _header(path), _host_records(_records(path))
    rows = compare_moe(path)
    mape = moe_mape(rows)
    bias = {model: _mean_signed([r for r in rows if r.workload == "decode"], model)
            for model in dict.fromkeys(r.model for r in rows)}
    line = (f"The same harness on an H200 ({path.relative_to(path.parents[3])}: {header.get('gpu_name')}, driver "
            f"{header.get('driver')}, torch {header.get('torch')}, transformers {header.get('transformers')}, "
            f"{header.get('date', '?')[:16]}; {len(rows)} cases), predicted (aisim as committed in 3fdba2d, a minute "
            f"before the run; h200.yaml's grouped-GEMM table and broadcast curve come from the grouped_gemm harness "
            f"on another H200 machine, at these models' shapes): runtime MAPE prefill {mape['prefill runtime']:.1f}%, "
            f"decode {mape['decode runtime']:.1f}%; memory {mape['prefill memory']:.2f}% / "
            f"{mape['decode memory']:.2f}%. Decode mean signed error: "
            + ", ".join(f"{m} {v:+.1f}%" for m, v in bias.items()) + ".")
    if hosts:
        spec = host_spec(hosts)
        own = moe_mape(compare_moe(path, calibration=spec.apply(load_calibration("h200"))))
        case = ("olmoe-1b-7b", "decode", 1, 128)
        here = next(r.measured_ms for r in rows if r.case == case)
        h100 = [c["median_ms"] for run in RUNS for c in load_cases(run)
                if (c["model"], c["workload"], c["batch"], c["context"]) == case and c["impl"] == SCORED_IMPL]
        line += (f" Its host was slow (framework scale {spec.eager_framework_scale:.2f} from its host lines, "
                 f"h200.yaml's host {load_calibration('h200').eager_framework_scale:.2f}): OLMoE's decode step at "
                 f"batch 1, context 128 took {here:.1f} ms where the {len(h100)} H100 runs' took "
                 f"{min(h100):.1f}-{max(h100):.1f}; with the host lines (`--host`) decode "
                 f"{own['decode runtime']:.1f}%, prefill {own['prefill runtime']:.1f}% (not the scored method).")
    return [line]


# DeepSeek-V2-Lite (MLA attention, 64 routed experts top-6 + 2 shared, first layer dense) and gpt-oss-20b
# (sliding-window and full attention layers with sinks, eager attention, 32 experts top-4 with biases, bf16 experts) in
# HF eager on one H100 (harness/configs/deepseek-v2-lite.json, gpt-oss-20b.json): aisim as it stood before the run,
# recorded here and committed before it ran (estimate_case, h100-sxm.yaml): (model, phase, batch, context) ->
# (ms, peak GB)
NEW_ARCH_PREDICTED = {
    ("deepseek-v2-lite", "decode", 1, 128): (37.33, 31.45), ("deepseek-v2-lite", "decode", 1, 1024): (37.33, 31.49),
    ("deepseek-v2-lite", "decode", 8, 128): (37.33, 31.49), ("deepseek-v2-lite", "decode", 8, 1024): (37.33, 31.82),
    ("deepseek-v2-lite", "decode", 32, 128): (38.28, 31.63), ("deepseek-v2-lite", "decode", 32, 1024): (37.84, 32.94),
    ("deepseek-v2-lite", "prefill", 1, 128): (39.29, 31.47), ("deepseek-v2-lite", "prefill", 1, 1024): (44.35, 31.65),
    ("deepseek-v2-lite", "prefill", 8, 128): (44.49, 31.65), ("deepseek-v2-lite", "prefill", 8, 1024): (160.13, 33.05),
    ("deepseek-v2-lite", "prefill", 32, 128): (85.20, 32.25),
    ("deepseek-v2-lite", "prefill", 32, 1024): (620.65, 37.85),
    ("gpt-oss-20b", "decode", 1, 128): (34.50, 41.87), ("gpt-oss-20b", "decode", 1, 1024): (34.50, 41.91),
    ("gpt-oss-20b", "decode", 8, 128): (35.00, 41.93), ("gpt-oss-20b", "decode", 8, 1024): (35.00, 42.23),
    ("gpt-oss-20b", "decode", 32, 128): (37.57, 42.13), ("gpt-oss-20b", "decode", 32, 1024): (39.11, 43.32),
    ("gpt-oss-20b", "prefill", 1, 128): (38.82, 41.90), ("gpt-oss-20b", "prefill", 1, 1024): (76.32, 42.36),
    ("gpt-oss-20b", "prefill", 8, 128): (53.24, 42.19), ("gpt-oss-20b", "prefill", 8, 1024): (467.65, 45.87),
    ("gpt-oss-20b", "prefill", 32, 128): (138.05, 43.17), ("gpt-oss-20b", "prefill", 32, 1024): (1627.91, 57.88)}


NEW_ARCH = Path(__file__).parent / "data" / "moe" / "moe-newarch-h100.jsonl"
NEW_ARCH_H200 = Path(__file__).parent / "data" / "moe" / "moe-newarch-h200.jsonl"
# The same two models on an H200: aisim as it stood before that run (h200.yaml), committed before it
NEW_ARCH_H200_PREDICTED = {
    ("deepseek-v2-lite", "decode", 1, 128): (37.60, 31.45), ("deepseek-v2-lite", "decode", 1, 1024): (37.60, 31.49),
    ("deepseek-v2-lite", "decode", 8, 128): (37.60, 31.49), ("deepseek-v2-lite", "decode", 8, 1024): (37.60, 31.82),
    ("deepseek-v2-lite", "decode", 32, 128): (37.79, 31.63), ("deepseek-v2-lite", "decode", 32, 1024): (37.17, 32.94),
    ("deepseek-v2-lite", "prefill", 1, 128): (38.77, 31.47), ("deepseek-v2-lite", "prefill", 1, 1024): (42.81, 31.65),
    ("deepseek-v2-lite", "prefill", 8, 128): (42.81, 31.65), ("deepseek-v2-lite", "prefill", 8, 1024): (148.89, 33.05),
    ("deepseek-v2-lite", "prefill", 32, 128): (81.66, 32.25),
    ("deepseek-v2-lite", "prefill", 32, 1024): (568.75, 37.85),
    ("gpt-oss-20b", "decode", 1, 128): (35.30, 41.87), ("gpt-oss-20b", "decode", 1, 1024): (35.30, 41.91),
    ("gpt-oss-20b", "decode", 8, 128): (35.30, 41.93), ("gpt-oss-20b", "decode", 8, 1024): (35.30, 42.23),
    ("gpt-oss-20b", "decode", 32, 128): (37.41, 42.13), ("gpt-oss-20b", "decode", 32, 1024): (36.83, 43.32),
    ("gpt-oss-20b", "prefill", 1, 128): (38.59, 41.90), ("gpt-oss-20b", "prefill", 1, 1024): (69.75, 42.36),
    ("gpt-oss-20b", "prefill", 8, 128): (49.29, 42.19), ("gpt-oss-20b", "prefill", 8, 1024): (424.42, 45.87),
    ("gpt-oss-20b", "prefill", 32, 128): (128.06, 43.17), ("gpt-oss-20b", "prefill", 32, 1024): (1433.33, 57.88)}


# Regression ceilings of the model as it stands on these runs (MAPE %, the value when set plus half a point; not goals:
# one run each, on hosts slower than the calibrations')
NEW_ARCH_CEILINGS = {"moe-newarch-h100.jsonl": {"prefill runtime": 11.1, "decode runtime": 18.1},
                     "moe-newarch-h200.jsonl": {"prefill runtime": 19.2, "decode runtime": 29.9}}
# (file, predictions, calibration, the commit that recorded them, their name here)
NEW_ARCH_RUNS = ((NEW_ARCH, NEW_ARCH_PREDICTED, "h100-sxm", "1c2113c", "NEW_ARCH_PREDICTED"),
                 (NEW_ARCH_H200, NEW_ARCH_H200_PREDICTED, "h200", "d37788e", "NEW_ARCH_H200_PREDICTED"))


def new_arch_table(rows: list[MoeRow], predicted: dict) -> list[str]:
    """Markdown rows: each case measured, estimated now and as predicted before the run."""
    head = ("| model | phase | batch | context | measured ms | estimated ms | error % | measured GB | estimated GB | "
            "error % | experts touched (measured / expected) | predicted ms |")
    table = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        table.append(f"| {r.model} | {r.workload} | {r.batch} | {r.context} | {r.measured_ms:.2f} | "
                     f"{r.estimated_ms:.2f} | {r.time_err_pct:+.1f} | {r.measured_gb:.2f} | {r.estimated_gb:.2f} | "
                     f"{r.mem_err_pct:+.2f} | {r.measured_distinct:.1f} / {r.estimated_distinct:.1f} | "
                     f"{predicted[r.model, r.workload, r.batch, r.context][0]:.2f} |")
    return table


def new_arch_predicted_mape(rows: list[MoeRow], predicted: dict) -> dict[tuple[str, str], float]:
    """(phase, "runtime" | "memory") -> MAPE of the predictions committed before the run."""
    return {(phase, what): _mape([predicted[r.model, r.workload, r.batch, r.context][column]
                                  for r in rows if r.workload == phase],
                                 [(r.measured_ms, r.measured_gb)[column] for r in rows if r.workload == phase])
            for phase in ("prefill", "decode") for column, what in enumerate(("runtime", "memory"))}


def new_arch_lines(runs: tuple = NEW_ARCH_RUNS) -> list[str]:
    """DeepSeek-V2-Lite and gpt-oss-20b on an H100 and an H200: per case against the predictions committed before
    each run, per model MAPE, and with the run's host lines."""
    from aisim.specs import load_calibration

    from .host import host_spec

    def decode_ms(rows: list[MoeRow], model: str) -> list[float]:
        return [r.measured_ms for r in rows if r.model == model and r.workload == "decode"]

    out, first_rows = [], []
    for path, predicted, calibration_name, commit, name in runs:
        if not path.exists():
            continue
        header, hosts = _header(path), _host_records(_records(path))
        rows = compare_moe(path)
        mape = new_arch_predicted_mape(rows, predicted)
        per_model = {model: moe_mape([r for r in rows if r.model == model])
                     for model in dict.fromkeys(r.model for r in rows)}
        run = (f"one run ({path.relative_to(path.parents[3])}: {header.get('gpu_name')}, driver "
               f"{header.get('driver')}, torch {header.get('torch')}, transformers {header.get('transformers')}, "
               f"{header.get('date', '?')[:16]})")
        if not out:
            intro = (f"Two architectures no earlier run measured, {run}; random bf16 weights, grouped-GEMM experts: "
                     "DeepSeek-V2-Lite (validation/harness/configs/deepseek-v2-lite.json: MLA attention whose "
                     "compressed latents transformers caches, 64 routed experts top-6 plus 2 shared, first layer "
                     "dense) and gpt-oss-20b (validation/harness/configs/gpt-oss-20b.json: sliding-window (128) and "
                     "full attention layers with sinks, eager attention, 32 experts top-4 with biases; bf16 experts, "
                     "its MXFP4 quantization_config left out). The harness rolls a sliding-window layer back with "
                     "transformers' own past recording (DynamicSlidingWindowLayer.activate_past_recording, then "
                     "crop(-1)). Not in the scored table (other models, one run per GPU).")
        else:
            spans = [f"{model} {_span(decode_ms(rows, model))} ms here, {_span(decode_ms(first_rows, model))} ms on "
                     "the first run" for model in dict.fromkeys(r.model for r in rows)]
            intro = (f"The same two models on the {header.get('gpu_name')}, {run}; decode steps took "
                     + ", ".join(spans) + ".")
        first_rows = first_rows or rows
        out += [intro + f" The last column is aisim as committed in {commit} before the run (the per-case values "
                f"are in moe_report.{name}):",
                "", *new_arch_table(rows, predicted), "",
                f"The predictions: runtime MAPE prefill {mape['prefill', 'runtime']:.1f}%, decode "
                f"{mape['decode', 'runtime']:.1f}%; memory {mape['prefill', 'memory']:.2f}% / "
                f"{mape['decode', 'memory']:.2f}%. The model as it stands, per model: "
                + "; ".join(f"{model} prefill {v['prefill runtime']:.1f}%, decode {v['decode runtime']:.1f}%"
                            for model, v in per_model.items()) + "."]
        if hosts:
            spec = host_spec(hosts)
            calibration = load_calibration(calibration_name)
            own = moe_mape(compare_moe(path, calibration=spec.apply(calibration)))
            decode = [r.time_err_pct for r in rows if r.workload == "decode"]
            out[-1] += (f" Decode mean signed error {statistics.mean(decode):+.1f}%; the run's host lines "
                        f"(validation/host.py) give a tiny-model framework scale of {spec.eager_framework_scale:.2f}, "
                        f"where {calibration_name}.yaml's host has {calibration.eager_framework_scale:.2f}; with them "
                        f"(`--host`), decode {own['decode runtime']:.1f}%, prefill {own['prefill runtime']:.1f}% "
                        "(not the scored method).")
        out.append("")
    return out[:-1]


def median_rows(per_run: dict[Path, list[MoeRow]] | None = None) -> list[MoeRow]:
    """Every case against its median over the runs that measured it (not scored; shown beside the first run)."""
    return median_of_runs(list((per_run or runs_rows()).values()))


def runs_lines(per_run: dict[Path, list[MoeRow]]) -> list[str]:
    """Markdown: MAPE per run, pooled over every run's rows, and against the per-case median of the runs."""
    lines = ["| run | host | cases | prefill runtime MAPE (%) | decode runtime MAPE (%) |", "|---|---|---:|---:|---:|"]
    for path, rows in per_run.items():
        with open(path) as f:
            header = json.loads(f.readline())
        mape = moe_mape(rows)
        lines.append(f"| {path.name} | {header.get('date', '?')[:16]} | {len(rows)} | "
                     f"{mape.get('prefill runtime', float('nan')):.1f} | {mape.get('decode runtime', float('nan')):.1f} |")
    pooled = moe_mape([r for rows in per_run.values() for r in rows])
    median_rows = median_of_runs(list(per_run.values()))
    median = moe_mape(median_rows)
    lines += [f"| all runs pooled | | {sum(map(len, per_run.values()))} | {pooled['prefill runtime']:.1f} | "
              f"{pooled['decode runtime']:.1f} |",
              f"| per-case median of the runs | | {len(median_rows)} | {median['prefill runtime']:.1f} | "
              f"{median['decode runtime']:.1f} |"]
    return lines


def run_to_run(per_run: dict[Path, list[MoeRow]]) -> dict[str, dict[str, float]]:
    """Per phase: how well one run's measured times estimate another's (MAPE over the cases both measured, mean
    and range over the ordered pairs of runs), and the median of the other runs' times as the estimate of each run
    (MAPE per run): the floor that host variance puts under any estimate of one run."""
    import itertools

    runs = {p: {r.case: r.measured_ms for r in rows} for p, rows in per_run.items()}
    out = {}
    for phase in ("prefill", "decode"):
        pairs = []
        for a, b in itertools.permutations(runs, 2):
            both = [k for k in runs[a] if k in runs[b] and k[1] == phase]
            if both:
                pairs.append(statistics.mean(100 * abs(runs[b][k] / runs[a][k] - 1) for k in both))
        others = []
        for a in runs:
            errs = []
            for k in (k for k in runs[a] if k[1] == phase):
                vals = [runs[b][k] for b in runs if b != a and k in runs[b]]
                if vals:
                    errs.append(100 * abs(statistics.median(vals) / runs[a][k] - 1))
            if errs:
                others.append(statistics.mean(errs))
        if pairs:
            out[phase] = {"pairs": len(pairs), "mean": statistics.mean(pairs), "min": min(pairs), "max": max(pairs),
                          "others_min": min(others), "others_max": max(others),
                          "others_mean": statistics.mean(others)}
    return out


def run_to_run_lines(per_run: dict[Path, list[MoeRow]]) -> list[str]:
    floor = run_to_run(per_run)
    if not floor:
        return []
    mapes = [moe_mape(rows) for rows in per_run.values()]
    own = {phase: statistics.mean(m[f"{phase} runtime"] for m in mapes if f"{phase} runtime" in m)
           for phase in ("prefill", "decode")}
    return ["How far the runs are from each other (no model: one run's measured times as the estimate of another's, "
            "MAPE over the cases both measured, over every ordered pair of runs; and the per-case median of the other "
            "runs as the estimate of each run): "
            + "; ".join(f"{phase} {f['mean']:.1f}% ({f['pairs']} pairs, {f['min']:.1f}-{f['max']:.1f}), median of "
                        f"the others {f['others_mean']:.1f}% ({f['others_min']:.1f}-{f['others_max']:.1f})"
                        for phase, f in floor.items())
            + f". aisim's per-run MAPE averages {own['prefill']:.1f}% prefill and {own['decode']:.1f}% decode: closer "
            "to a run than another run's measurement of it, and near the median of the other runs; the host's "
            "variance between machines of the same kind sets what one run's decode MAPE can be."]


def spread_lines(per_run: dict[Path, list[MoeRow]]) -> list[str]:
    """The host spread of the same decode case across the runs, and the median-of-runs error range per model."""
    from aisim.specs import load_calibration

    from .transfer import H100_RUNS

    runs = tuple(per_run)
    median = median_of_runs(list(per_run.values()))

    def span(model: str) -> str:
        ms = [r.measured_ms for rows in per_run.values() for r in rows
              if r.case == (model, "decode", 1, 128)]
        return f"{min(ms):.0f}-{max(ms):.0f} ms"

    def errors(model: str) -> str:
        errs = sorted(r.time_err_pct for r in median if r.model == model and r.workload == "decode")
        return f"{errs[0]:+.0f}..{errs[-1]:+.0f}%"

    models = sorted({r.model for r in median})
    return ["The spread between runs is the host's: the same decode case (batch 1, context 128) takes "
            + ", ".join(f"{span(m)} ({m})" for m in models) + " on different hosts of the same kind, while the large "
            "prefills agree within a few percent. Decode errors against the median of the runs: "
            + ", ".join(f"{m} {errors(m)}" for m in models) + "; mean signed error "
            + ", ".join(f"{m} {_mean_signed(median, m):+.1f}%" for m in models) + ". Decode is estimated short on "
            "the median, and not because the calibration's host was a fast one: a plain eager add took "
            f"{load_calibration('h100-sxm').eager_add_dispatch_s * 1e6:.1f} us there (hardware_specs/calibration/"
            f"h100-sxm.yaml eager_add_dispatch_s) and {_host_lines_add_us(runs)} on the later runs' and the "
            "host-scopes run's hosts. "
            "And on hosts of the same pool the dense decode rows of the H100 suite ran faster than estimated (mean "
            f"signed error {_dense_decode_bias():+.1f}%, estimate - measured, against the per-case median of the "
            f"{len(H100_RUNS)} suite runs): no host speed fits both; the diagnostic below shows where the MoE steps "
            "differ."]


def _dense_decode_bias() -> float:
    """Mean signed runtime error (%) of the dense H100 suite's decode rows against the median of its runs
    (estimated - measured; negative: the estimate is faster)."""
    from aisim.api import estimate

    from .report import compare
    from .transfer import MEDIAN_RUNS, measured_cases

    errs = [100 * (p.estimated - p.measured) / p.measured for r in compare(measured_cases(MEDIAN_RUNS), estimate)
            if r.workload == "decode" and (p := r.metrics.get("runtime_ms")) and p.measured and p.estimated]
    return sum(errs) / len(errs)


def _mean_signed(rows: list[MoeRow], model: str) -> float:
    errs = [r.time_err_pct for r in rows if r.model == model and r.workload == "decode"]
    return sum(errs) / len(errs)


def _host_line_values(runs: tuple[Path, ...]) -> list[float]:
    """Microseconds of one plain eager add (calibrate_bench add_out_s, median) in every host line of the runs and
    of the host-scopes run."""
    out = []
    for path in (*runs, HOST_SCOPES):
        with open(path) as f:
            for r in map(json.loads, f):
                raw = r.get("raw") if r.get("type") == "host" else None
                add = [x for x in raw or [] if x.get("name") == "add_out_s"]
                if add:
                    out.append(statistics.median(add[0]["samples_s"]) * 1e6)
    return out


def _host_lines_add_us(runs: tuple[Path, ...]) -> str:
    vals = _host_line_values(runs)
    return (f"{min(vals):.1f}-{max(vals):.1f} us ({len(vals)} host lines, median {statistics.median(vals):.1f})"
            if vals else "no host lines")


LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cuLaunchKernel",
                          "cudaMemcpyAsync", "cudaMemsetAsync"})


def host_scopes_rows(path: Path = HOST_SCOPES) -> list[dict]:
    """Per host_scopes case: the measured kernel launches (CUDA launch and memcpy/memset calls per step, profiler)
    and launch time of the step against aisim's launches and host time for the same model and layer count."""
    import tempfile

    from aisim.cost.timeline import cpu_costs
    from aisim.scenario import scenario
    from aisim.step import op_arrays
    from aisim.validation.harness import common
    from aisim.workload import StepShape

    rows = []
    with open(path) as f:
        records = [json.loads(line) for line in f]
    header = next((r for r in records if r.get("type") == "header"), {})
    cases = [r for r in records if r.get("type") == "case" and r.get("status") == "ok"]
    # the clean step timed before any profiler session in the process, where the run has it (host_scopes.py's first
    # pass); otherwise the faster of the two clean timings around this model's own profile
    first = {(r["model"], r["batch"], r["context"]): r["clean"]["launch_median_ms"] for r in records
             if r.get("type") == "clean_first" and r.get("status") == "ok"}
    for c in cases:
        config = {k: v for k, v in json.loads(common.config_path(c["model"]).read_text()).items()
                  if not k.startswith("_")}
        config["num_hidden_layers"] = c["num_hidden_layers"]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as tmp:
            json.dump(config, tmp)
        try:
            sc = scenario(tmp.name, DEVICE, dtype="bf16", runtime=RUNTIME)
            a = op_arrays(sc, sc.workload(StepShape(phase="decode", batch=c["batch"], seq=c["context"])))
        finally:
            Path(tmp.name).unlink()
        cpu = cpu_costs(a.ops, list(a.kinds), a.launches, sc.calibration, sc.runtime, phase="decode",
                        model_type=config.get("model_type"))
        launch_ms = first.get((c["model"], c["batch"], c["context"]),
                              min(c["clean"]["launch_median_ms"], c["clean_after"]["launch_median_ms"]))
        # the committed run profiled the cache cleanup between steps too (harness fixed since): 2 copies per layer
        cleanup = 2 * c["num_hidden_layers"] if not header.get("profile_window_per_step") else 0
        rows.append({"model": c["model"], "layers": c["num_hidden_layers"], "batch": c["batch"],
                     "measured_launches": sum(o["calls_per_step"] for o in c["ops"] if o["name"] in LAUNCH_CALLS)
                     - cleanup,
                     "aisim_launches": float((a.launches * a.repeats).sum()), "launch_ms": launch_ms,
                     "aisim_host_ms": float((cpu * a.repeats).sum()) * 1e3})
    return rows


def _span(values: list[float]) -> str:
    lo, hi = round(min(values)), round(max(values))
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


QUERY_CALLS = frozenset({"cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", "cudaFuncGetAttributes",
                         "cudaFuncSetAttribute"})


def _cuda_queries(path: Path) -> dict[str, float]:
    """CUDA runtime occupancy / function-attribute calls per step of each model's batch-1 case."""
    with open(path) as f:
        cases = [r for r in map(json.loads, f) if r.get("type") == "case" and r.get("status") == "ok"
                 and r["batch"] == 1]
    return {c["model"]: sum(o["calls_per_step"] for o in c["ops"] if o["name"] in QUERY_CALLS) for c in cases}


OP_HOST = Path(__file__).parent / "data" / "kernels" / "op-host-h100.jsonl"


def op_host_ratios(path: Path = OP_HOST) -> dict[str, float]:
    """Median over the file's runs of each op's host cost relative to a plain add (harness/op_host.py)."""
    found: dict[str, list[float]] = {}
    with open(path) as f:
        for r in map(json.loads, f):
            if r.get("type") == "op" and r.get("ratio_to_add"):
                found.setdefault(r["name"], []).append(r["ratio_to_add"])
    return {k: statistics.median(v) for k, v in found.items()}


def op_host_lines(path: Path = OP_HOST) -> list[str]:
    """That microbenchmark (harness/op_host.py, tiny non-judged shapes): per-op host cost against aisim's split."""
    if not path.exists():
        return []
    from aisim.specs import load_calibration

    ratios = op_host_ratios(path)
    cal = load_calibration("h100-sxm")
    groups = {"GEMMs (mm, addmm, bmm)": ("mm", "addmm", "bmm"), "SDPA decode": ("sdpa_decode",),
              "topk / sort / cumsum": ("topk", "sort", "cumsum"), "masked_fill (out of place)": ("masked_fill",),
              "elementwise and reductions": ("mul", "neg", "rsqrt", "pow", "mean", "sum", "silu", "sigmoid",
                                             "softmax", "cat"),
              "views (view, transpose, unsqueeze, slice, expand)": ("view", "transpose", "unsqueeze", "slice",
                                                                     "expand")}

    def span(names):
        vals = [ratios[n] for n in names if n in ratios]
        return f"{min(vals):.2f}-{max(vals):.2f}" if len(vals) > 1 else f"{vals[0]:.2f}"

    return [f"A microbenchmark for it ({path.relative_to(path.parents[3])}, validation/harness/op_host.py: tiny "
            "non-judged bf16 shapes on an H100, two runs, each op interleaved with the others) gives each op's host "
            "cost relative to a plain add: " + "; ".join(f"{g} {span(n)}" for g, n in groups.items())
            + ". These ratios are the calibration's per-op host table (eager_op_host_ratio, times its own measured "
            f"add, eager_add_dispatch_s {cal.eager_add_dispatch_s * 1e6:.1f} us; python -m "
            "aisim.validation.scripts.derive_op_host), with eager_framework_scale refitted on the tiny models "
            f"({cal.eager_framework_scale:.3f}) and the train phase scale on the phase rounds "
            f"({cal.eager_phase_scale.get('train', 1.0):.3f}). Before it, every kernel op cost the same fitted K and "
            f"a view {cal.eager_view_dispatch_s / cal.eager_kernel_dispatch_s:.2f} of it (the split, which absorbed "
            "the GEMMs' extra cost into the views'): the MoE decode rows, kernel-heavy, came out 3-5% faster "
            "relative to the dense ones."] + _op_host_extra_lines()


def _op_host_extra_lines() -> list[str]:
    """The ops the H100 file lacked, timed on an H200 host, and the portability of the ratios between the hosts."""
    from aisim.validation.scripts import derive_op_host as d

    if not all(p.exists() for p in d.EXTRA):
        return []
    extra = d.extra_ratios()
    both = d.portable_check()
    kernel = [b / a - 1 for k, (a, b) in both.items() if a >= 0.5]
    groups = {"LayerNorm": ("layer_norm",), "relu / tanh / gelu": ("relu", "tanh", "gelu"),
              "the grouped_mm experts' routing (floor_divide, ge, clamp_, masked_fill_, index_put_, arange)":
                  ("floor_divide", "ge_scalar", "clamp_", "masked_fill_", "index_put_", "arange"),
              "where / max / zeros": ("where", "max_dim", "zeros"),
              "in-place add_ / div_ / copy_": ("add_", "div_", "copy_"), "split / empty_like / detach":
                  ("split", "empty_like", "detach")}

    def span(names):
        vals = [extra[n] for n in names if n in extra]
        return f"{min(vals):.2f}-{max(vals):.2f}" if len(vals) > 1 else f"{vals[0]:.2f}"

    return ["", "The ops that table lacks (LayerNorm, relu / tanh / gelu, the grouped_mm experts' routing, in-place "
            "ops), priced as one plain add each (a view-like op as the views' median), were timed too (2026-11-28: "
            "the same harness with them added, two runs on an H200 host, "
            + ", ".join(str(p.relative_to(p.parents[3])) for p in d.EXTRA) + "): "
            + "; ".join(f"{g} {span(n)}" for g, n in groups.items()) + ". The ops both files time agree between "
            f"the two hosts: kernel ops (ratio >= 0.5) {min(kernel):+.0%} to {max(kernel):+.0%} (median "
            f"{statistics.median(kernel):+.1%}), so the ratios read as PyTorch's dispatch, not one machine's. Not in "
            "the shipped table: with them the tiny models' framework scale, refitted, falls (the LayerNorm families' "
            "norms move into their ops), which brings the dense suites closer and every MoE set further "
            "(docs/calibration.md gives the figures; `python -m aisim.validation.scripts.derive_op_host --extra`)."]


def host_scopes_lines(paths: tuple[Path, ...] = HOST_SCOPES_RUNS) -> list[str]:
    paths = tuple(p for p in paths if p.exists())
    if not paths:
        return []
    lines = ["Where the host time goes (validation/harness/host_scopes.py, right after run6, run7 and run8 on their "
             "machines: " + ", ".join(str(p.relative_to(p.parents[3])) for p in paths) + "; Qwen3-MoE built with 12 "
             "of its 48 layers): the step's launch time (host, no sync; in the third run timed for every model before "
             "any profiler session in the process, in the first two the faster of the clean timings around the "
             "model's own profile, so every model after the first carries the earlier profiles' residue: a CPU-only "
             "profile slowed OLMoE's step 22.0 -> 25.2 ms in the second run), the "
             "kernel launches per step that torch.profiler counts (CUDA launch, memcpy and memset calls), aisim's "
             "for the same step, and the host time per launch.", "",
             "| run | model | layers | batch | launches measured / aisim | host ms measured / aisim | "
             "host us per launch measured / aisim |", "|---|---|---:|---:|---|---|---|"]
    rows = []
    for i, path in enumerate(paths, 1):
        for r in host_scopes_rows(path):
            rows.append(r)
            lines.append(f"| {i} | {r['model']} | {r['layers']} | {r['batch']} | {r['measured_launches']:.0f} / "
                         f"{r['aisim_launches']:.0f} | {r['launch_ms']:.1f} / {r['aisim_host_ms']:.1f} | "
                         f"{1e3 * r['launch_ms'] / r['measured_launches']:.1f} / "
                         f"{1e3 * r['aisim_host_ms'] / r['aisim_launches']:.1f} |")
    excess = [100 * (r["measured_launches"] / r["aisim_launches"] - 1) for r in rows]
    per_launch = {}
    for r in rows:
        per_launch.setdefault(r["model"], []).append(1e3 * r["launch_ms"] / r["measured_launches"])
    path = paths[0]
    queries = _cuda_queries(path)
    lines += ["", f"Every model launches {min(excess):.0f}-{max(excess):.0f}% more kernels per step than aisim's "
              "trace counts (the profile's CUDA launch, memcpy and memset calls; the first run's profile window "
              "also held the harness's cache cleanup, 2 copies per layer, subtracted). The calls the meta-device "
              "trace does not show are launches nested inside ops whose host cost is measured whole: sort's "
              "aranges, the clone of an out-of-place masked_fill (a device-to-device cudaMemcpyAsync), cuBLAS's "
              "split-K second kernel, the index_put_ of the inverse permutation. The third run's hosts were erratic "
              "even without a profiler (Llama-3-8B 20.7 ms at batch 1 and 33.6 ms at batch 8, same process). On "
              "these hosts a launch cost " + ", ".join(f"{m} {_span(v)} us" for m, v in per_launch.items())
              + "; the MoE steps also make CUDA runtime queries per step that Llama's does not (occupancy and "
              "function-attribute queries of the grouped GEMM, sort and scan kernels: "
              + ", ".join(f"{m} {n:.0f}" for m, n in queries.items() if n) + "; Llama-3-8B none). The missing "
              "launches are not "
              "modelled (this profile is of the judged models); the per-op host costs are, from a microbenchmark "
              "of their own:", "", *op_host_lines()]
    return lines


def moe_section(path: Path = DATA) -> list[str]:
    """Markdown lines: the MoE dataset against estimates, per case and MAPE per category."""
    per_run = runs_rows()
    rows = per_run[path] if path in per_run else compare_moe(path)
    mape = moe_mape(rows)
    median = median_rows(per_run)
    median_mape = moe_mape(median)
    skipped = [c for c in load_cases(path) if c["impl"] != SCORED_IMPL]
    lines = [
        "## Mixture-of-experts models (one H100 SXM, HF eager, grouped-GEMM experts)",
        "",
        "Measured by validation/harness/moe_bench.py (H100 80GB HBM3, driver 580.159.04, torch 2.11.0+cu130, "
        "transformers 5.17.0, 2026-11-26; configs in validation/harness/configs/; random bf16 weights, so routing is "
        "near uniform). aisim reads, per grouped expert GEMM, the weights of the E * (1 - (1 - k/E)^T) experts that T "
        "tokens with top-k of E are expected to touch. Median step time; peak = torch.cuda.max_memory_allocated. "
        "Nothing is fitted to these rows. Scored: the first run (its Qwen rows were timed after profiler sessions "
        "in the same process, which double the MoE block's host time, below).",
        "",
        "| category | cases | MAPE (%) | goal (%) | met | ceiling (%) |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for cat in CATEGORIES:
        n = sum(1 for r in rows if r.workload == cat.split()[0])
        if cat in mape:
            met = "yes" if mape[cat] <= GOALS[cat] else "no"
            lines.append(f"| {cat} | {n} | {mape[cat]:.1f} | {GOALS[cat]:.0f} | {met} | {CEILINGS[cat]:.1f} |")
    lines += ["", f"Not scored: each case against its median over the {len(per_run)} runs of the harness (the runs "
              "that measured it: run5 lacks qwen3-30b-a3b), each on the H100 machine the device lent at the time: "
              f"prefill {median_mape['prefill runtime']:.1f}%, decode {median_mape['decode runtime']:.1f}%. A median "
              "over hosts averages the host noise out (one run's decode times are 9-45% (MAPE) from another run's, "
              "below), so it is shown, not held to the goal set for one run.",
              "", f"The harness was run {len(RUNS)} times (validation/data/moe/). Runtime MAPE per run, over all "
              "runs' rows pooled, and against each case's median over the runs:", "",
              *runs_lines(per_run), "", *run_to_run_lines(per_run), "",
              *spread_lines(per_run), "", *mixtral_lines(per_run=per_run), "", *mixtral_h200_lines(), "",
              *moe_h200_lines(), "", *new_arch_lines(), "", *tp_lines(), "",
              *host_scopes_lines(), "",
              "", "Each case of the first run (scored), with its median over the runs beside it:", "",
              "| model | phase | batch | context | measured ms | estimated ms | error % | median of runs ms | "
              "error % | measured GB | estimated GB | error % | experts touched (measured / expected) |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    median_by_case = {r.case: r for r in median}
    for r in rows:
        m = median_by_case.get(r.case)
        med = f"{m.measured_ms:.2f} | {m.time_err_pct:+.1f}" if m else "- | -"
        lines.append(f"| {r.model} | {r.workload} | {r.batch} | {r.context} | {r.measured_ms:.2f} | "
                     f"{r.estimated_ms:.2f} | {r.time_err_pct:+.1f} | {med} | {r.measured_gb:.2f} | "
                     f"{r.estimated_gb:.2f} | {r.mem_err_pct:+.1f} | {r.measured_distinct:.1f} / "
                     f"{r.estimated_distinct:.1f} |")
    lines += ["", f"Not scored: {len(skipped)} rows of the per-expert Python loop (`experts_implementation="
              "\"eager\"`), whose loop over the hit experts is data-dependent and is not traced on the meta device. "
              "Prefill of one sequence with random weights touches fewer experts than uniform routing predicts "
              "(26-40 of 60-128 measured at batch 1): the tokens' hidden states are alike; at prefill the experts' "
              "weights are a small part of the bytes moved, so the runtime is barely affected.", "",
              "How the grouped-GEMM path is priced: each routed `torch._grouped_mm` reads the H100 grouped-GEMM "
              "table (hardware_specs/calibration/h100-sxm.yaml `grouped_gemm_tables`) at its rows per touched expert, "
              "and the router's masked fills and routing-weight multiply, which broadcast an (S, 1) column and run "
              "PyTorch's non-vectorized elementwise kernel, the measured broadcast curve "
              "(`broadcast_memory_efficiency`, "
              "27-35% of bandwidth where a copy reaches 80-89%). Both come from validation/harness/grouped_gemm.py "
              "(torch._grouped_mm called as transformers calls it, on a balanced 64-expert grid of rows per expert x "
              "N x K; derivation: python -m aisim.validation.scripts.derive_grouped_gemm), not from these rows; the "
              "same run's model-shape grouped GEMMs, not used for the table, check it (MAPE 20.3% with the dense "
              "table, 7.7% with the grouped one, 36 device-bound calls of 8-32768 tokens). Not out of sample in the "
              "strict sense: the microbenchmark runs these three models' MoE ops at their own shapes (the broadcast "
              "curve and the per-op host costs, eager_op_dispatch_s, come from them), though in isolation, on no "
              "judged step.", "",
              *host_lines(rows)]
    return lines


TP_RUNS = tuple(Path(__file__).parent / "data" / f for f in (
    "tp2-moe-h100.jsonl", "tp2-moe-h100-run2.jsonl", "tp2-mixtral-h200.jsonl", "tp2-moe-ep-h100.jsonl",
    "tp2-moe-ep-h100-run2.jsonl", "tp2-moe-h100-run3.jsonl"))
EP_PROFILE = Path(__file__).parent / "data" / "kernels" / "ep-profile-h100.jsonl"


def tp_lines(paths: tuple[Path, ...] = TP_RUNS) -> list[str]:
    """Markdown lines: the MoE tensor-parallel suites (validation/suites/tp2-moe.yaml, tp2-mixtral.yaml), each TP=2
    case beside its TP=1 twin, runtime and peak memory per GPU against the estimates."""
    from .report import compare, load_measurements

    existing = [p for p in paths if p.exists()]
    if not existing:
        return []
    lines = ["### Tensor and expert parallel 2 (measured)", "",
             "Every expert's intermediate features split over the two GPUs and the experts' output all-reduced, as "
             "transformers' TP plan for Mixtral and vLLM's FusedMoE without expert parallelism shard them "
             "(validation/tp.py; validation/suites/tp2-moe.yaml and tp2-mixtral.yaml, each TP=2 case with its TP=1 "
             "twin; HF eager, grouped-GEMM experts, random bf16 weights); and, the rows of tp2-moe-ep-h100.jsonl "
             "(key /ep2), the experts split by index instead (each GPU holds half of them whole; transformers' EP "
             "sentinel path skips the others; aisim --tp 2 --ep 2). The suites were committed before they ran "
             "(their commit messages record the predictions for decode 16 x 1024); the table is the code as of this "
             "document. Memory is the peak per GPU (torch.cuda.max_memory_allocated of the busiest rank).", "",
             "| run | model | step | tp | measured ms | estimated ms | error % | measured GB/GPU | estimated GB/GPU | "
             "error % |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    errors: dict[str, list[float]] = {"time": [], "memory": []}
    measured: dict[tuple[str, str, str, int], tuple] = {}   # (file, model, step, tp) -> (measured, estimated) ms
    for path in existing:
        header = _header(path)
        for r in compare(load_measurements([path])):
            t, m = r.metrics["runtime_ms"], r.metrics["memory_gb"]
            if t.error is None or m.error is None:
                continue
            errors["time"].append(abs(t.error))
            errors["memory"].append(abs(m.error))
            step = f"{r.workload} {r.batch} x {r.seq}"
            measured[(path.name, Path(r.model).stem, step, r.tp)] = (t.measured, t.estimated)
            lines.append(f"| {path.name} ({header.get('gpu_name', '?')}) | {Path(r.model).stem} | {step} | {r.tp} | "
                         f"{t.measured:.2f} | {t.estimated:.2f} | {100 * t.error:+.1f} | {m.measured:.2f} | "
                         f"{m.estimated:.2f} | {100 * m.error:+.2f} |")
    full = [r for path in existing if "mixtral-h200" in path.name
            for r in compare(load_measurements([path])) if r.tp == 2 and r.metrics["memory_gb"].measured]
    peak = max((r.metrics["memory_gb"].measured for r in full), default=None)
    lines += ["", f"Runtime MAPE {100 * statistics.mean(errors['time']):.1f}% over {len(errors['time'])} steps, "
              f"peak memory per GPU {100 * statistics.mean(errors['memory']):.2f}%."
              + (f" The whole Mixtral-8x7B at tensor parallel 2 peaked at {peak:.2f} GB per GPU over its steps "
                 "(measured on two H200s, whose 141 GB let each rank build the whole model before keeping its "
                 "shard): it fits two 80 GB H100s, as `aisim estimate --model Mixtral-8x7B-v0.1 --device h100x2 "
                 "--tp 2` says." if peak else "")
              + _tp_host_sentence(measured) + _ep_sentence(measured)]
    return lines


def _ep_sentence(ms: dict) -> str:
    """The expert-parallel run against its width-split twin, in their own figures."""
    ep_files = ("tp2-moe-ep-h100.jsonl", "tp2-moe-ep-h100-run2.jsonl")
    big = [100 * (e - m) / m for (f, _, step, _), (m, e) in ms.items() if f in ep_files and step == "forward 8 x 1024"]
    # the same machine, minutes apart: the second EP run and the width split's third run (its TP=2 cases)
    pairs = [(ms[(ep_files[1], model, step, 2)][0], ms[("tp2-moe-h100-run3.jsonl", model, step, 2)][0])
             for (f, model, step, _) in ms if f == ep_files[1] and ("tp2-moe-h100-run3.jsonl", model, step, 2) in ms]
    profile = {r["ep"]: r["step_ms"] for r in _records(EP_PROFILE) if r.get("type") == "profile"} \
        if EP_PROFILE.exists() else {}
    if not big or not pairs or len(profile) < 2:
        return ""
    ratios = [e / t for e, t in pairs]
    return (f" With the experts split by index the memory per GPU is as estimated and the 8 x 1024 forwards within "
            f"{max(map(abs, big)):.0f}%; its small steps miss by the host again: the first EP run's machine was "
            f"slower than the width split's (the first two), and on one machine, minutes apart, the EP steps took "
            f"{min(ratios):.2f}-{max(ratios):.2f}x the width split's (median {statistics.median(ratios):.2f}; "
            f"that machine's host was the slowest of all: Qwen1.5-MoE's EP decode at batch 1 took "
            f"{ms[(ep_files[1], 'qwen1.5-moe-a2.7b', 'decode 1 x 1024', 2)][0]:.1f} ms). A profile of Mixtral's "
            f"decode at batch 1 on that machine just before (validation/harness/ep_profile.py, "
            f"validation/data/kernels/ep-profile-h100.jsonl) had both splits at the same step time "
            f"({profile[1]:.1f} and {profile[max(profile)]:.1f} ms): --ep under eager HF is priced like the width "
            "split, which these runs do not contradict beyond the host's spread.")


def _tp_host_sentence(ms: dict) -> str:
    """Where the TP runs' misses come from, in their own figures: the host-bound steps (decode at batch 1 on the
    H200 host against the H100 host's 16-layer model; one H100 run's TP=2 decode against the other's)."""
    def get(*key):
        return ms[key][0] if key in ms else None

    h200 = get("tp2-mixtral-h200.jsonl", "mixtral-8x7b", "decode 1 x 1024", 1)
    h100 = get("tp2-moe-h100-run2.jsonl", "mixtral-8x7b-16l", "decode 1 x 1024", 1)
    first = get("tp2-moe-h100.jsonl", "mixtral-8x7b-16l", "decode 16 x 1024", 2)
    second = get("tp2-moe-h100-run2.jsonl", "mixtral-8x7b-16l", "decode 16 x 1024", 2)
    if None in (h200, h100, first, second):
        return ""
    return (f" The misses are host-bound steps: the H200 machine's host was slow (the whole Mixtral's TP=1 decode at "
            f"batch 1 took {h200:.1f} ms, {h200 / 32:.2f} ms per layer, where the H100 machine's 16-layer model took "
            f"{h100:.1f}, {h100 / 16:.2f} ms per layer: at batch 1 a layer's time is the host's dispatch of its ops), "
            f"and the first H100 run's Mixtral TP=2 "
            f"decode at batch 16 took {first:.1f} ms where the second, minutes later on the same machine, took "
            f"{second:.1f}.")


def block_host_ms(model: str) -> float:
    """aisim's host (dispatch) time of one MoE block at decode batch 1: the ops under a layer's ``.mlp`` scope (router,
    experts, shared expert), the deepest traced layer's."""
    from aisim.cost.timeline import cpu_costs
    from aisim.scenario import scenario
    from aisim.step import op_arrays
    from aisim.workload import StepShape

    sc = scenario(str(CONFIGS / f"{model}.json"), DEVICE, dtype="bf16", runtime=RUNTIME)
    arrays = op_arrays(sc, sc.workload(StepShape(phase="decode", batch=1, seq=128)))
    cpu = cpu_costs(arrays.ops, list(arrays.kinds), arrays.launches, sc.calibration, sc.runtime,
                    phase="decode", model_type=sc.config.get("model_type"))
    scopes = [op.scope.split(".mlp")[0] for op in arrays.ops if ".mlp" in (op.scope or "")]
    last = scopes[-1]
    return 1e3 * sum(c for op, c in zip(arrays.ops, cpu) if (op.scope or "").startswith(last + ".mlp"))


def measured_block_host_ms(path: Path = GROUPED_GEMM) -> dict[str, float]:
    """The grouped_gemm harness's host time per MoE block call (its ``host`` section: a fresh process, decode
    input of 1 and 8 tokens), median per model."""
    if not path.exists():
        return {}
    found: dict[str, list[float]] = {}
    for r in map(json.loads, open(path)):
        if r.get("section") == "host" and r.get("status") == "ok":
            found.setdefault(r["model"], []).append(r["host_ms"])
    return {m: sorted(v)[len(v) // 2] for m, v in found.items()}


def host_lines(rows: list[MoeRow], rerun: Path = RERUN) -> list[str]:
    """The host-bound rows: what aisim charges beyond the per-kernel dispatch, why the Qwen rows of this run miss,
    and the rerun (after the harness fix) on another host."""
    from aisim.specs import load_calibration

    own = load_calibration("h100-sxm").eager_op_dispatch_s
    kernel = load_calibration("h100-sxm").eager_kernel_dispatch_s

    def errors(sel: list[MoeRow], model: str) -> str:
        errs = sorted(r.time_err_pct for r in sel if r.model == model and r.workload == "decode")
        return f"{errs[0]:+.0f}..{errs[-1]:+.0f}%" if errs else "-"

    models = sorted({r.model for r in rows})
    lines = ["Small steps are host-bound: eager dispatch of some 110 aten ops per layer. Beyond one kernel op's "
             f"dispatch ({kernel * 1e6:.0f} us), aisim charges the MoE path's ops that do more host work their own "
             "cost, measured by the grouped_gemm harness relative to a masked_fill_ in the same loop "
             "(`eager_op_dispatch_s`: " + ", ".join(f"{k.split('.')[-1]} {v * 1e6:.0f} us" for k, v in own.items())
             + "); the two out-of-place masked fills per layer are ATen's clone + masked_fill_ and the router's "
             "topk a selection + sort, two kernel ops each (ATen's masked_fill; the profile's kernel counts); "
             "topk's own host cost was not measured. Host time per MoE block call (router, experts, Qwen1.5's "
             "shared expert), aisim against the harness in a fresh process: "
             + ", ".join(f"{m} {block_host_ms(m):.2f} / {v:.2f} ms"
                         for m, v in sorted(measured_block_host_ms().items()))
             + ". Decode errors of this run: "
             + ", ".join(f"{m} {errors(rows, m)}" for m in models) + ". OLMoE's batch 32 context 1024 step ran "
             "20-25% faster than its other decode steps on both hosts: moe_bench rewinds the cache between steps "
             "(crop, then every layer's K and V made contiguous) without synchronizing, so the host issues the next "
             "step while the GPU still copies and the step's start event sits behind the copies; a host-bound decode "
             "row is timed short by that head start. aisim's decode estimates here are as the harness times them "
             "(validation/rewind.py: " + rewind_note() + "; max(GPU busy, runtime - head start)). The Qwen "
             "rows were timed after moe_bench had profiled OLMoE in the same process (torch.profiler with CUDA "
             "activities, "
             "four sessions); the grouped_gemm harness measured what a profiler session leaves behind: the host time "
             "of one MoE block call doubles afterwards (OLMoE 0.51 -> 1.00 ms, Qwen1.5-MoE 0.66 -> 1.31 ms, Qwen3-MoE "
             "0.51 -> 1.07 ms, decode input). moe_bench now profiles after every timed case."]
    if rerun.exists():
        again = compare_moe(rerun)
        mape = moe_mape(again)
        olmoe = [r.measured_ms for r in (rows + again) if r.model == "olmoe-1b-7b" and r.workload == "decode"
                 and r.batch == 1 and r.context == 128]
        lines += ["", f"The rerun with the profile last ({rerun.relative_to(rerun.parents[3])}, another H100 host, "
                  f"not scored): runtime MAPE {mape['prefill runtime']:.1f}% prefill, {mape['decode runtime']:.1f}% "
                  "decode; decode errors " + ", ".join(f"{m} {errors(again, m)}" for m in models) + ". On that "
                  "host (the grouped_gemm harness ran there) the MoE block's host time matches aisim's, while whole "
                  "decode steps take longer than estimated for all three models, OLMoE's too (timed first and clean "
                  "in both runs: " + " and ".join(f"{v:.1f}" for v in olmoe) + " ms at decode batch 1 context 128); "
                  "its Qwen1.5-MoE batch-1 steps are bimodal (36 and 56 ms). The large prefills agree within 1% "
                  "between the runs. What remains of the decode miss is outside the MoE block: the rest of the "
                  "layer's eager dispatch, whose calibration carries one machine's host speed, and the profiler's "
                  "residue in this run's Qwen rows."]
    return lines


ENGINE_CASE = {"model": "Meta-Llama-3-8B", "device": "h100", "workload": "decode", "batch": 32, "seq": 7512,
               "dtype": "bf16"}


GRAPHS_DIR = Path(__file__).parent / "data" / "kernels"
GRAPHS_DATA = GRAPHS_DIR / "graphs-decode-h100.jsonl"                    # in sample: max_cache_len 1039
GRAPHS_CACHELEN_DATA = GRAPHS_DIR / "graphs-decode-cachelen-h100.jsonl"  # out of sample: max_cache_len 4096 (+ 1039)
GRAPHS_CONFIGS = {"qwen2.5-1.5b": str(CONFIGS / "qwen2.5-1.5b.json"), "Meta-Llama-3-8B": "Meta-Llama-3-8B"}
GRAPHS_GOAL = 10.0
# in-sample MAPE plus half a point: 6.9% with the tiny-Llama replay constants, 7.2% with the wide models' of one host,
# 8.1% with both hosts' (2026-11-27, stated regressions of these 4 rows; every measured row 11.8% -> 7.6%); 14.3% with
# the consistent replay accounting (2026-11-27 session 12: qwen2.5-1.5b's batch-1 steps replay with shorter gaps than
# any non-judged model's, +38/+40%; a stated regression; every measured row 8.7% -> 8.9%)
GRAPHS_CEILING = 14.8
GRAPHS_ALL_CEILING = 7.8    # every measured row (32 with the H100 and H200 out-of-sample runs of session 12: 7.3%)
# Predicted before the measurement (2026-11-26 ~10:10 UTC, commit "graphs: HF StaticCache decode ..."): ms per
# timed forward (no rewind), context 1024, --runtime graphs, static_cache_len 4096, one H100 SXM.
GRAPHS_PREDICTED_MS = {("qwen2.5-1.5b", 1, 4096): 3.146, ("qwen2.5-1.5b", 32, 4096): 18.359,
                       ("Meta-Llama-3-8B", 1, 4096): 8.358, ("Meta-Llama-3-8B", 32, 4096): 59.008}
# Batch 8 (the first run's batch-8 cases were skipped by its time budget), predicted before the measurement
# (2026-11-27 ~03:10 UTC, commit "graphs: batch-8 predictions"), ms per timed forward, context 1024, per GPU.
GRAPHS_B8_DATA = GRAPHS_DIR / "graphs-decode-b8.jsonl"
# With the replay constants frozen after the batch-8 run (two wide non-judged models' hosts, 9dad04d), new cases
# predicted before they were measured (2026-11-27 ~04:00 UTC, commit "graphs: frozen-constant predictions"): ms per
# timed forward, context 1024, max_cache_len 2048, batch 4 and 16, one H100 SXM.
GRAPHS_FRESH_DATA = GRAPHS_DIR / "graphs-decode-fresh.jsonl"
GRAPHS_FRESH_PREDICTED_MS = {("qwen2.5-1.5b", 4, 2048): 4.071, ("qwen2.5-1.5b", 16, 2048): 6.824,
                             ("Meta-Llama-3-8B", 4, 2048): 10.493, ("Meta-Llama-3-8B", 16, 2048): 20.548}
# With the consistent replay accounting (each kernel its eager time less the eager launch gap, plus the replay gap per
# kernel aisim counts, constants from every non-judged replay run incl. batch 1/8/32), new cases predicted before they
# were measured (commit 1c67111, 2026-11-27 05:37 UTC; the runs 05:38-05:48): ms per timed
# forward, context 1024, on one H100 SXM and one H200 (the H200 rows with the H100 host's replay constants).
GRAPHS_OOS_DATA = {
    "h100": (GRAPHS_DIR / "graphs-decode-oos-h100.jsonl", GRAPHS_DIR / "graphs-decode-oos-h100-b12.jsonl"),
    "h200": tuple(GRAPHS_DIR / f"graphs-decode-oos-h200{tail}.jsonl" for tail in ("", "-b12", "-llama", "-llama-b12"))}
GRAPHS_OOS_PREDICTED_MS = {
    "h100": {("qwen2.5-1.5b", 2, 3072): 4.82, ("qwen2.5-1.5b", 24, 3072): 12.801, ("qwen2.5-1.5b", 12, 1536): 5.639,
             ("Meta-Llama-3-8B", 2, 3072): 10.584, ("Meta-Llama-3-8B", 24, 3072): 37.832,
             ("Meta-Llama-3-8B", 12, 1536): 15.475},
    "h200": {("qwen2.5-1.5b", 2, 3072): 3.886, ("qwen2.5-1.5b", 24, 3072): 10.111, ("qwen2.5-1.5b", 12, 1536): 4.999,
             ("Meta-Llama-3-8B", 2, 3072): 8.55, ("Meta-Llama-3-8B", 24, 3072): 28.031,
             ("Meta-Llama-3-8B", 12, 1536): 12.152}}
GRAPHS_B8_PREDICTED_MS = {
    "h100": {("qwen2.5-1.5b", 8, 1039): 3.351, ("qwen2.5-1.5b", 8, 4096): 6.149,
             ("Meta-Llama-3-8B", 8, 1039): 10.257, ("Meta-Llama-3-8B", 8, 4096): 19.739},
    "h200": {("qwen2.5-1.5b", 8, 1039): 2.769, ("qwen2.5-1.5b", 8, 4096): 4.995,
             ("Meta-Llama-3-8B", 8, 1039): 7.609, ("Meta-Llama-3-8B", 8, 4096): 14.721}}


@dataclass(frozen=True)
class GraphsRow:
    model: str
    batch: int
    cache_len: int
    measured_ms: float
    estimated_ms: float       # aisim's step, plus the harness's timed rewind where the row timed it
    rewind_ms: float          # that rewind: one eager fill_ per layer (rows before the harness moved it out)
    gpu_kernel_ms: float | None   # the profiled GPU kernel time per forward (harness --profile), if recorded
    estimated_gpu_ms: float       # aisim's GPU busy time: its kernels with the replay gap after each
    estimated_kernel_ms: float = 0.0   # the same with a zero replay gap: aisim's kernels alone, as the profile sums

    @property
    def err_pct(self) -> float:
        return 100.0 * (self.estimated_ms - self.measured_ms) / self.measured_ms


def _graphs_cases(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path) as f:
        return [r for r in map(json.loads, f) if r.get("type") == "case" and r.get("mode") == "compile"
                and r.get("status") == "ok" and r["model"] in GRAPHS_CONFIGS]


def compare_graphs(path: Path = GRAPHS_DATA) -> list[GraphsRow]:
    """The measured static-cache + torch.compile decode steps (harness graphs_decode, on the GPU its header names)
    against ``--runtime graphs`` at the row's max_cache_len. Rows that timed the harness's per-layer rewind with the
    step (before it ran untimed) get its host time added: one eager fill_ launch per layer at the calibration's
    eager kernel dispatch cost (eager_kernel_dispatch_s x eager_framework_scale)."""
    from aisim.scenario import scenario
    from aisim.step import step_cost
    from aisim.workload import StepShape

    rows = []
    device = _file_device(path)
    for case in _graphs_cases(path):
        sc = scenario(GRAPHS_CONFIGS[case["model"]], device, dtype="bf16", runtime="graphs")
        shape = StepShape(phase="decode", batch=case["batch"], seq=case["context"],
                          static_cache_len=case["max_cache_len"])
        cost = step_cost(sc, shape)
        no_gap = scenario(GRAPHS_CONFIGS[case["model"]], device, dtype="bf16",
                          runtime=sc.runtime.model_copy(update={"replay_kernel_gap_s": 0.0}))
        cal = sc.calibration
        per_fill_s = (cal.eager_kernel_dispatch_s or cal.eager_dispatch_s) * cal.eager_framework_scale
        rewind_s = 0.0 if case.get("timed") == "forward" else sc.config["num_hidden_layers"] * per_fill_s
        profile = case.get("profile") or {}
        rows.append(GraphsRow(case["model"], case["batch"], case["max_cache_len"], case["median_ms"],
                              (cost.runtime_s + rewind_s) * 1e3, rewind_s * 1e3, profile.get("gpu_kernel_ms"),
                              cost.gpu_busy_s * 1e3, step_cost(no_gap, shape).gpu_busy_s * 1e3))
    return rows


def graphs_mape(rows: list[GraphsRow]) -> float | None:
    return sum(abs(r.err_pct) for r in rows) / len(rows) if rows else None


def _graphs_table(rows: list[GraphsRow], predicted: dict | None = None) -> list[str]:
    """``predicted``: (model, batch, max_cache_len) -> ms predicted before the measurement, shown as a column."""
    head = "| model | batch | max_cache_len | measured ms | estimated ms | error % | harness rewind ms | " \
           "GPU kernels ms (profiled / aisim) |"
    lines = [head + (" predicted ms |" if predicted else ""),
             "|---|---:|---:|---:|---:|---:|---:|---|" + ("---:|" if predicted else "")]
    for r in rows:
        gpu = f"{r.gpu_kernel_ms:.2f} / {r.estimated_kernel_ms:.2f}" if r.gpu_kernel_ms else "-"
        line = (f"| {r.model} | {r.batch} | {r.cache_len} | {r.measured_ms:.2f} | {r.estimated_ms:.2f} | "
                f"{r.err_pct:+.1f} | {r.rewind_ms:.2f} | {gpu} |")
        if predicted:
            before = predicted.get((r.model, r.batch, r.cache_len))
            line += f" {before:.2f} |" if before is not None else " - |"
        lines.append(line)
    return lines


def graphs_lines(path: Path = GRAPHS_DATA, cachelen_path: Path = GRAPHS_CACHELEN_DATA) -> list[str]:
    """Markdown lines of the graphs section: in-sample rows (max_cache_len 1039) and, once measured, the
    out-of-sample max_cache_len run with the predictions made before it."""
    from aisim.specs import all_runtimes

    rows = compare_graphs(path)
    if not rows:
        return ["No measured static-cache + torch.compile data."]
    mape = graphs_mape(rows)
    graphs = all_runtimes()["graphs"]
    gap_us, step_ms = graphs.replay_kernel_gap_s * 1e6, graphs.per_step_overhead_s * 1e3
    out = ["HF StaticCache + torch.compile(mode='reduce-overhead') decode on one H100 "
           "(validation/data/kernels/graphs-decode-h100.jsonl, context 1024, max_cache_len 1039) against "
           "`--runtime graphs --static-cache-len <max_cache_len>`:", "", *_graphs_table(rows), "",
           f"MAPE {mape:.1f}% over these {len(rows)} cases (ceiling {GRAPHS_CEILING:.1f}%; the goal, "
           f"{GRAPHS_GOAL:.0f}%, is judged over every measured row, below). A stated regression: with the replay "
           "accounting before commit 1c67111 (docs/accuracy.md at e3adbbb) these 4 rows gave 8.1%, "
           "the max_cache_len run's 8 rows 5.5% and the 20 rows then measured 8.7%; qwen2.5-1.5b's batch-1 steps now "
           "come out 19-40% long (its replays leave shorter gaps per kernel than any non-judged model's), and the "
           "accounting that replaced it predicted the two runs made after it (below). "
           "What runs (transformers 5.17, graph.engine.static_cache_decode): "
           "each step attends over the whole max_cache_len with a (B, 1, 1, L) mask, so transformers' SDPA path "
           "repeats the KV heads (`repeat_kv.copy`: B x H x L x D written per K and V) and PyTorch runs its masked "
           "kernel (the calibration's sdpa_mask table), the cache written in place (index_copy_, no whole-cache "
           f"copy). Under the replay each kernel takes its eager back-to-back time less the eager stream's launch gap "
           "(efficiency.graph_replay_credit_s: a tiny copy back to back less its time in a 1000-kernel replay), "
           f"plus a replay gap of {gap_us:.2f} us after each kernel aisim counts, plus {step_ms:.2f} ms per step "
           "(the compiled call's host work: dynamo guards, the cudagraph-tree replay's input checks). Both constants "
           "are the least-squares fit, in aisim's accounting, over every replay run of models no table judges: "
           "Llama-3.2-1B- and 3B-wide models at 2-16 layers and batch 1, 8 and 32 and a 256-wide tiny Llama, on "
           "three H100 hosts (validation/data/kernels/graphs-replay-wide-h100.jsonl, -run2, "
           "graphs-replay-batches-h100.jsonl, graphs-replay-tiny-h100.jsonl; "
           "`python -m aisim.validation.scripts.derive_graphs_replay`; graphs.yaml replay_kernel_gap_s and "
           "per_step_overhead_s). The old rows timed the harness's per-layer "
           "fill-level rewind (an eager fill_ per layer) with each step: its host time is added from the "
           "calibration."]
    later = compare_graphs(cachelen_path)
    if later:
        fresh = [r for r in later if (r.model, r.batch, r.cache_len) in GRAPHS_PREDICTED_MS]
        out += ["", "Out of sample (validation/data/kernels/graphs-decode-cachelen-h100.jsonl: the same harness with "
                "--cache-lens, the rewind untimed; predicted before the measurement):", "",
                *_graphs_table(later, predicted=GRAPHS_PREDICTED_MS), ""]
        if fresh:
            out.append(f"The predictions made before the measurement: MAPE "
                       f"{_predicted_mape(fresh, GRAPHS_PREDICTED_MS):.1f}% "
                       f"over the {len(fresh)} max_cache_len 4096 cases. The model as it stands: "
                       f"{graphs_mape(fresh):.1f}% over them"
                       + (f", {graphs_mape(later):.1f}% over all {len(later)} rows." if len(later) > len(fresh)
                          else "."))
        out += ["", *_profile_lines(later)]
    out += ["", *graphs_b8_lines(rows + later)]
    return out


def graphs_b8_lines(earlier: list[GraphsRow], path: Path = GRAPHS_B8_DATA) -> list[str]:
    """The batch-8 run (the batch the first run's time budget skipped) against the predictions committed before
    it, and the goal over every measured graphs row."""
    from aisim.specs import all_runtimes

    rows = compare_graphs(path)
    if not rows:
        return []
    graphs = all_runtimes()["graphs"]
    gap_us, step_ms = graphs.replay_kernel_gap_s * 1e6, graphs.per_step_overhead_s * 1e3
    header = _header(path)
    predicted = GRAPHS_B8_PREDICTED_MS["h100"]
    everything = earlier + rows
    gaps = [(r.measured_ms - r.gpu_kernel_ms) for r in rows if r.gpu_kernel_ms]
    kernels = {(c["model"], c["batch"], c["max_cache_len"]): (c.get("profile") or {}).get("kernels_per_step")
               for c in _graphs_cases(path)}
    per_kernel = [1e3 * (r.measured_ms - r.gpu_kernel_ms) / kernels[(r.model, r.batch, r.cache_len)] for r in rows
                  if r.gpu_kernel_ms and kernels.get((r.model, r.batch, r.cache_len))]
    return [f"Batch 8 (validation/data/kernels/graphs-decode-b8.jsonl: {header.get('gpu_name', '?')}, driver "
            f"{header.get('driver', '?')}, torch {header.get('torch', '?')}, transformers "
            f"{header.get('transformers', '?')}, {header.get('date', '?')[:16]}; the first run's batch-8 cases were "
            "skipped by its time budget), with the predictions committed before it (the last column); the "
            "estimates are the model as it stands, whose replay constants were re-derived after this run, from "
            "models no table judges (above):", "",
            *_graphs_table(rows, predicted=predicted), "",
            f"The predictions: MAPE {_predicted_mape(rows, predicted):.1f}% over {len(rows)} rows. "
            "Profiled, the kernels sum to " + " / ".join(f"{r.gpu_kernel_ms:.2f}" for r in rows if r.gpu_kernel_ms)
            + " ms, aisim's " + " / ".join(f"{r.estimated_kernel_ms:.2f}" for r in rows if r.gpu_kernel_ms)
            + " ms (its GPU time with a zero replay gap); the measured steps are "
            f"{min(gaps):.1f}-{max(gaps):.1f} ms longer than their kernels alone ("
            f"{min(per_kernel):.1f}-{max(per_kernel):.1f} us per replayed kernel), and at 8 rows qwen2.5-1.5b's "
            "small GEMMs take longer than the table less the replay credit. The predictions used the tiny Llama's "
            "replay constants (1.45 us per kernel, 0.17 ms per step) in the earlier accounting, since replaced "
            f"(above: {gap_us:.2f} us per aisim kernel, {step_ms:.2f} ms per step; none fitted to these rows).",
            "", *graphs_fresh_lines(everything)]


def graphs_fresh_lines(earlier: list[GraphsRow], path: Path = GRAPHS_FRESH_DATA) -> list[str]:
    """New cases measured with the replay constants frozen, against the predictions committed before them, then
    the consistent-accounting out-of-sample runs (graphs_oos_lines) and every measured row."""
    rows = compare_graphs(path)
    lines = []
    if rows:
        header = _header(path)
        lines += [f"Out of sample with the constants frozen (validation/data/kernels/graphs-decode-fresh.jsonl: "
                  f"{header.get('gpu_name', '?')}, driver {header.get('driver', '?')}, torch "
                  f"{header.get('torch', '?')}, "
                  f"{header.get('date', '?')[:16]}; batch 4 and 16 at max_cache_len 2048, predicted and committed "
                  "before the run):", "", *_graphs_table(rows, predicted=GRAPHS_FRESH_PREDICTED_MS), "",
                  f"MAPE {graphs_mape(rows):.1f}% over these {len(rows)} rows with the model as it stands. The "
                  "predictions (the last column) were made with the earlier accounting, in which the runtime's "
                  "replay gap replaced the calibration's tiny-kernel replay inside the credit, so the credit took a "
                  "tiny copy's whole eager time off every kernel and aisim's kernels came out short of the profiled "
                  "ones on every row; corrected since (the accounting above).", ""]
    return lines + graphs_oos_lines(earlier + rows)


def _predicted_mape(rows: list[GraphsRow], predicted: dict) -> float | None:
    """MAPE (%) of the predictions made before a run, over the rows that have one (None: no such row)."""
    picked = [r for r in rows if (r.model, r.batch, r.cache_len) in predicted]
    return _mape([predicted[r.model, r.batch, r.cache_len] for r in picked], [r.measured_ms for r in picked]) \
        if picked else None


def prediction_history() -> list[tuple[str, float | None]]:
    """(run, MAPE % of the predictions committed before it) of every earlier out-of-sample graphs run on an H100."""
    return [("max_cache_len 4096", _predicted_mape(compare_graphs(GRAPHS_CACHELEN_DATA), GRAPHS_PREDICTED_MS)),
            ("batch 8", _predicted_mape(compare_graphs(GRAPHS_B8_DATA), GRAPHS_B8_PREDICTED_MS["h100"])),
            ("frozen constants, batch 4 and 16",
             _predicted_mape(compare_graphs(GRAPHS_FRESH_DATA), GRAPHS_FRESH_PREDICTED_MS))]


def graphs_oos_lines(earlier: list[GraphsRow], paths: dict[str, tuple[Path, ...]] = GRAPHS_OOS_DATA) -> list[str]:
    """The runs predicted with the consistent replay accounting (H100 and H200), against the predictions committed
    before them, and the goal over every measured row of both GPUs."""
    lines, oos, before = [], [], {}
    for gpu, files in paths.items():
        rows = [r for path in files for r in compare_graphs(path)]
        if not rows:
            continue
        header = _header(files[0])
        predicted = GRAPHS_OOS_PREDICTED_MS[gpu]
        before[gpu] = _predicted_mape(rows, predicted)
        oos += rows
        lines += [f"Out of sample on an {gpu.upper()} ("
                  + ", ".join(f"validation/data/kernels/{p.name}" for p in files)
                  + f": {header.get('gpu_name', '?')}, driver {header.get('driver', '?')}, torch "
                  f"{header.get('torch', '?')}, transformers {header.get('transformers', '?')}, "
                  f"{header.get('date', '?')[:16]}; batch 2 and 24 at max_cache_len 3072, batch 12 at 1536), predicted "
                  "with the accounting above and committed before the run"
                  + (" (the H200 rows with the H100 hosts' replay constants and the H200 calibration)" if gpu == "h200"
                     else "") + ":", "", *_graphs_table(rows, predicted=predicted), "",
                  f"The predictions: MAPE {before[gpu]:.1f}% over {len(rows)} rows.", ""]
    every = earlier + oos
    mape = graphs_mape(every)
    made = [f"{v:.1f}% ({label})" for label, v in prediction_history() if v is not None]
    made += [f"{v:.1f}% ({gpu.upper()}, consistent accounting)" for gpu, v in before.items() if v is not None]
    lines.append(f"All {len(every)} measured graphs rows: MAPE {mape:.1f}% with the model as it stands (goal "
                 f"{GRAPHS_GOAL:.0f}%: {'met' if mape <= GRAPHS_GOAL else 'not met'} on them); the predictions made "
                 "before each out-of-sample run: " + ", ".join(made) + ".")
    return lines


def _profile_lines(rows: list[GraphsRow]) -> list[str]:
    """What the harness's torch.profiler says about the rows (--profile): aisim's GPU time against the kernels'."""
    prof = [r for r in rows if r.gpu_kernel_ms]
    if not prof:
        return []
    gpu_mape = sum(abs(r.estimated_kernel_ms - r.gpu_kernel_ms) / r.gpu_kernel_ms for r in prof) / len(prof) * 100
    gaps = sorted(r.measured_ms - r.gpu_kernel_ms for r in prof)
    short = sorted(r.gpu_kernel_ms - r.estimated_kernel_ms for r in prof)
    return [f"Profiled (torch.profiler, 3 forwards per row): aisim's kernel time (its GPU time with a zero replay "
            f"gap) is {gpu_mape:.1f}% (MAPE) from the summed kernel time on {len(prof)} rows, "
            f"from {max(-short[0], 0):.1f} ms over to {short[-1]:.1f} ms short: under a replay aisim takes each "
            "kernel's eager "
            "back-to-back time less the eager launch gap (efficiency.graph_replay_credit_s), and the gap it adds "
            "per kernel it counts also stands for the kernels it does not count (the profiles count more: "
            "cuBLAS split-K reductions, cuDNN attention's second kernel), so its split between kernel and gap is "
            "not quite the profiler's; the step's total is what the table compares. The measured step is "
            f"{gaps[0]:.1f}-{gaps[-1]:.1f} ms longer than its kernels: the gaps "
            "between the replayed kernels and the compiled call's host work before the replay (the replay "
            "constants above). The kernels confirm the structure: PyTorch picks cuDNN "
            "attention (cudnn_generated_fort_native_sdpa_sm80_flash_fprop + cudnn::fusion::lean_reduction_kernel "
            "per layer; with the same torch on the same GPU the sdpa_mask table's masked calls ran it too), "
            "Inductor's repeat_kv copies (triton_poi_fused_..._clone, two per layer) take 7.4 ms of Llama-3-8B's "
            "batch-32 step at 1039 slots (aisim 7.5) and 29.1 ms at 4096 (aisim 29.0), and every StaticLayer's "
            "fill-level add_ is its own kernel."]


FP8_DATA = tuple(Path(__file__).parent / "data" / "kernels" / name
                 for name in ("fp8-gemm-h100.jsonl", "fp8-gemm-smallm-h100.jsonl"))
FP8_CASE = {"model": "Meta-Llama-3-8B", "workload": "prefill", "batch": 8, "seq": 2048, "dtype": "bf16"}
FP8_DECODE = {"model": "Meta-Llama-3-8B", "workload": "decode", "seq": 1024, "dtype": "bf16", "runtime": "vllm"}


def fp8_lines(paths: tuple[Path, ...] = FP8_DATA) -> list[str]:
    """fp8 W8A8 GEMMs on an H100: the torch._scaled_mm microbenchmark (tensor-wise scales, as vLLM's
    Fp8LinearMethod) beside bf16 on the same shapes, aisim's time for each (the calibration's fp8 curves are derived
    from these records: in sample), a prefill under --quant fp8 on H100 and on A100 (no fp8 tensor cores), and the
    decode steps of vllm in bf16 and fp8."""
    from aisim.api import estimate
    from aisim.cost.efficiency import gemm_efficiency
    from aisim.specs import all_hardware, load_calibration

    paths = tuple(p for p in paths if p.exists())
    if not paths:
        return []
    gpu, cal = all_hardware()["h100-sxm"], load_calibration("h100-sxm")
    runs, rows, errors = [], [], {"small": [], "large": []}
    for path in paths:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        header = records[0]
        runs.append(f"validation/data/kernels/{path.name}: {header.get('gpu_name')}, driver {header.get('driver')}, "
                    f"torch {header.get('torch')}, {header.get('date', '?')[:10]}")
        cases = {(r["kernel"], r["m"], r["k"], r["n"]): r for r in records
                 if r.get("type") == "case" and r.get("status") == "ok"}
        for (kernel, m, k, n), r in sorted(cases.items(), key=lambda kv: kv[0][1:]):
            bf16 = cases.get(("bf16", m, k, n))
            if kernel != "fp8-tensor" or bf16 is None:
                continue
            flops, nbytes = 2.0 * m * n * k, m * k + k * n + 2 * m * n
            peak = gpu.peak_for("fp8")
            memory_bound = nbytes / gpu.memory_bw_bytes_per_s > flops / peak
            eff = gemm_efficiency(cal, "fp8", m, n, k, flops, nbytes, memory_bound, gpu)
            seconds = max(flops / peak, nbytes / gpu.memory_bw_bytes_per_s) / eff
            err = 100 * (seconds * 1e3 - r["median_ms"]) / r["median_ms"]
            errors["small" if m <= 64 else "large"].append(abs(err))
            rows.append((m, k, n, f"| {m} | {k} | {n} | {bf16['tflops']:.1f} | {r['tflops']:.1f} | "
                                  f"{r['tflops'] / bf16['tflops']:.2f} | {flops / seconds / 1e12:.1f} | {err:+.1f} |"))
    lines = [f"fp8 W8A8 GEMMs ({'; '.join(runs)}; torch._scaled_mm with tensor-wise scales, as vLLM's "
             "Fp8LinearMethod runs --quantization fp8) beside bf16 torch.mm on the same shapes, and aisim's time for "
             "each (its fp8 curves, h100-sxm.yaml gemm_efficiency.fp8 over FLOPs and fp8-memory over bytes for the "
             "memory-bound calls, are derived from these records by python -m "
             "aisim.validation.scripts.derive_fp8_curve: in sample):", "",
             "| M | K | N | bf16 measured TFLOP/s | fp8 measured TFLOP/s | fp8 / bf16 | fp8 aisim TFLOP/s | error % |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|", *(line for *_, line in sorted(rows))]
    h100 = {q: estimate(device="h100", quant=q, **FP8_CASE) for q in ("none", "fp8")}
    a100 = estimate(device="a100", quant="fp8", **FP8_CASE)
    note = next((n for n in a100.assumptions if "fp8" in n), "no note")
    decode = {(q, b): estimate(device="h100", quant=q, batch=b, **FP8_DECODE).runtime_ms
              for q in ("none", "fp8") for b in (1, 8, 32)}
    mape = {key: sum(v) / max(len(v), 1) for key, v in errors.items()}
    lines += ["", f"aisim's fp8 time against the measured one: MAPE {mape['large']:.1f}% over the "
              f"{len(errors['large'])} shapes of M >= 128, {mape['small']:.1f}% over the {len(errors['small'])} of "
              "M <= 64 (single calls of one shape there run up to 60% slower than their neighbours in M, and the two "
              "runs' M = 16 4096 x 4096 calls differ by 52%). "
              f"{FP8_CASE['model']} prefill {FP8_CASE['batch']} x {FP8_CASE['seq']} on an H100: "
              f"{h100['none'].runtime_ms:.1f} ms in bf16, {h100['fp8'].runtime_ms:.1f} ms with --quant fp8 "
              "(the GEMMs at the fp8 rate, the activations quantized per call); on an A100 --quant fp8 gives "
              f"{a100.runtime_ms:.1f} ms with the note: \"{note}\". {FP8_DECODE['model']} decode at context "
              f"{FP8_DECODE['seq']} under --runtime vllm on an H100, batch 1 / 8 / 32: "
              + " / ".join(f"{decode[('none', b)]:.2f}" for b in (1, 8, 32)) + " ms in bf16, "
              + " / ".join(f"{decode[('fp8', b)]:.2f}" for b in (1, 8, 32)) + " ms with --quant fp8 (before the "
              "small-M run, fp8's FLOPs curve started at M = 16 and made batch 1 slower than bf16: 6.69 ms)."]
    return lines


def engines_section() -> list[str]:
    """Markdown lines for the engine profiles: no measured graphs/vLLM data yet, and the decode op table of each
    runtime for the issue's case (no whole-cache copy under vllm or graphs)."""
    from aisim.api import estimate

    lines = ["## Engine profiles (vllm, graphs)", "", *graphs_lines(), "", *fp8_lines(), "",
             "No vLLM run was made. Op tables of "
             f"{ENGINE_CASE['model']} decode, batch {ENGINE_CASE['batch']} at context {ENGINE_CASE['seq']}, bf16, "
             "one H100:", ""]
    for runtime in ("eager", "graphs", "vllm"):
        est = estimate(**ENGINE_CASE, runtime=runtime, top_ops=8)
        lines += [f"**{runtime}**: {est.runtime_ms:.2f} ms per step", "", "| op | count | GB moved | ms | % of step |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {r.name} | {r.count} | {r.bytes / GB:.2f} | {r.time_ms:.3f} | {100 * r.share:.1f} |"
                  for r in est.top_ops]
        lines.append("")
    return lines


if __name__ == "__main__":
    print("\n".join(moe_section() + engines_section()))
