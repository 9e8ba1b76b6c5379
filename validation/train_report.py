"""Measured training steps (validation/data/train/*.jsonl, written by validation/harness/train_step.py) against
aisim.studies.train, and the published large-scale table (validation/references/megatron_sc21.yaml).

    python -m aisim.validation.train_report [--data PATH ...] [--published]

Each measured case is estimated as it ran: the harness's model config, its precision (bf16-mixed under
torch.autocast for plain/DDP, FSDP2 MixedPrecisionPolicy for fsdp2), fused AdamW, HF checkpointing of every layer
when ``ckpt``, per-GPU batch x world as the global batch, plain = 1 GPU, ddp = ZeRO 0, fsdp2 = FSDP full. A case
recorded ``oom`` is a hit when the estimate says "does not fit". Memory is compared with the steady-state
``peak_allocated_gb`` (torch.cuda.max_memory_allocated, GB = 1e9) of the busiest rank.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "train"
CONFIGS = HERE / "harness" / "configs"
RUNTIME_GOAL_PCT = 10.0   # the issue's goals: runtime MAPE <= 10 %, peak memory MAPE <= 3 %
MEMORY_GOAL_PCT = 3.0
# regression ceilings (tests/test_train.py): the values when set (2026-11-26: 3.0 % and 1.2 %) plus half a point
RUNTIME_CEILING_PCT = 4.7   # 4.2% over 2 x H200 and 4 x H100 (the 4-GPU rows, out of sample, are 9-11% fast)
MEMORY_CEILING_PCT = 1.5   # 1.0 % with the 32-true rows (2026-11-26) + half a point
# fit verdicts wrong at most: none since the SDPA math path of fp32 with grouped KV heads is traced (the 32-true
# 1B step that ran out of memory on 80 GB is predicted at 90 GB: "does not fit")
FIT_VERDICT_MISSES_CEILING = 0
STRATEGY = {"plain": {}, "ddp": {"zero": 0}, "fsdp2": {"fsdp": "full"}}


def load_cases(paths: list[Path] | None = None) -> list[tuple[dict, dict]]:
    """(header, case) for every case line of the training datasets."""
    out = []
    for path in paths or sorted(DATA.glob("*.jsonl")):
        header = {}
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("type") == "header":
                header = row
            elif row.get("type") == "case":
                out.append((header, row))
    return out


def device_name(header: dict, world: int) -> str:
    gpu = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100-sxm"}.get(header.get("gpu_name"), "h100-sxm")
    return gpu if world == 1 else f"{gpu}x{world}"


def estimate_case(header: dict, case: dict):
    """The TrainResult of one measured case, estimated as it ran."""
    from aisim.scenario import scenario
    from aisim.studies.train import TrainRequest, train
    from aisim.workload import TrainPlan

    world = int(case["world"])
    sc = scenario(CONFIGS / f"{case['model']}.json", device_name(header, world), dtype="bf16", tp=1, pp=1,
                  dp=world, batch=case["batch"] * world)
    plan = TrainPlan(precision=case["precision"], recompute="full" if case["ckpt"] else "none",
                     optimizer_impl="fused" if "fused" in case.get("optimizer_impl", "fused") else "foreach",
                     **STRATEGY[case["strategy"]])
    return train(sc, TrainRequest(batch=case["batch"] * world, seq=case["seq"], plan=plan))


def provenance(paths: list[Path] | None = None) -> list[str]:
    """One line per dataset file: its GPUs, driver, torch, transformers and date, from its header."""
    out = []
    for path in paths or sorted(DATA.glob("*.jsonl")):
        h = next((json.loads(x) for x in path.read_text().splitlines() if '"header"' in x), {})
        out.append(f"{path.name}: {h.get('gpu_count', '?')} x {h.get('gpu_name', '?')}, driver {h.get('driver')}, "
                   f"torch {h.get('torch')}, transformers {h.get('transformers')}, {str(h.get('date', ''))[:10]}")
    return out


def case_class(case: dict) -> str:
    return f"{case['strategy']} {case['precision']}{' ckpt' if case['ckpt'] else ''}"


def rows(paths: list[Path] | None = None) -> list[dict]:
    out = []
    for header, case in load_cases(paths):
        if case.get("status") not in ("ok", "oom"):
            continue
        est = estimate_case(header, case)
        row = {"key": case["key"], "class": case_class(case), "status": case["status"], "fits": est.fits,
               "measured_ms": case.get("step_ms_median"), "estimated_ms": est.step_ms,
               "measured_gb": case.get("peak_allocated_gb"), "estimated_gb": est.memory.total_gb}
        if case["status"] == "ok" and est.fits:
            row["runtime_err_pct"] = 100 * (est.step_ms - row["measured_ms"]) / row["measured_ms"]
            row["memory_err_pct"] = 100 * (est.memory.total_gb - row["measured_gb"]) / row["measured_gb"]
        out.append(row)
    return out


# regression ceilings of the MoE training steps (tests/test_train.py): the values when measured (2026-11-28: 6.7 % and
# 0.2 %, every verdict right) plus half a point; runtime raised to 7.8 when the timeline walked the layers in order
# (7.3 %: the MoE steps' host time is under-estimated, which the old walk's idle GPU partly hid)
MOE_RUNTIME_CEILING_PCT = 7.8
MOE_MEMORY_CEILING_PCT = 0.7
# MoE training steps on one H100 (harness/train_step.py --suite-moe), kept apart from the dense training datasets
# (their ceilings are the dense rows'): HF eager with transformers' grouped-GEMM experts
MOE_TRAIN = HERE / "data" / "moe" / "moe-train-h100.jsonl"
# aisim's estimates of those cases, committed before the suite first ran (step ms or None where "does not fit",
# peak GB): the commit that added SUITE_MOE
MOE_TRAIN_PREDICTED = {
    "olmoe-1b-7b/plainx1/bf16-true/nockpt/2x1024": (134.5, 55.52),
    "olmoe-1b-7b/plainx1/bf16-true/ckpt/4x1024": (245.3, 55.9),
    "olmoe-1b-7b-8l/plainx1/bf16-true/nockpt/8x1024": (174.1, 40.22),
    "olmoe-1b-7b-8l/plainx1/bf16-mixed/nockpt/4x1024": (381.9, 57.51),
    "qwen1.5-moe-a2.7b-8l/plainx1/bf16-true/nockpt/4x1024": (115.6, 44.61),
    "mixtral-8x7b-4l/plainx1/bf16-true/nockpt/4x1024": (135.3, 49.25),
    "mixtral-8x7b-4l/plainx1/bf16-mixed/ckpt/2x1024": (None, 97.4),
}


def moe_train_lines(path: Path = MOE_TRAIN) -> list[str]:
    """Markdown lines: the measured MoE training steps against aisim, with the committed predictions."""
    if not path.exists():
        return []
    table = rows([path])
    s = summary(table)
    lines = ["### MoE training steps (one H100, HF eager)", "",
             "Measured: " + "; ".join(provenance([path])) + " (validation/harness/train_step.py --suite-moe; random "
             "bf16 weights, near-uniform routing; layer-cut configs in validation/harness/configs/). The last two "
             "columns are aisim as committed before the suite ran (train_report.MOE_TRAIN_PREDICTED).", "",
             "| case | measured ms | estimated ms | error | measured GB | estimated GB | error | predicted ms | "
             "predicted GB |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        pred_ms, pred_gb = MOE_TRAIN_PREDICTED.get(r["key"], (None, None))
        measured = "oom" if r["status"] == "oom" else _fmt(r["measured_ms"])
        lines.append(f"| {r['key']} | {measured} | {_fmt(r['estimated_ms']) if r['fits'] else 'does not fit'} | "
                     f"{_fmt(r.get('runtime_err_pct'), '+.1f')}% | {_fmt(r['measured_gb'], '.2f')} | "
                     f"{_fmt(r['estimated_gb'], '.2f')} | {_fmt(r.get('memory_err_pct'), '+.1f')}% | "
                     f"{_fmt(pred_ms) if pred_ms is not None else 'does not fit'} | {_fmt(pred_gb, '.2f')} |")
    lines += ["", f"Runtime MAPE {_fmt(s['runtime_mape_pct'])}%, peak memory MAPE {_fmt(s['memory_mape_pct'])}%, "
              f"fit verdicts right {s['fit_verdicts_right']}/{s['cases']}.", ""]
    return lines


def mape(values: list[float]) -> float | None:
    return sum(abs(v) for v in values) / len(values) if values else None


def summary(table: list[dict]) -> dict:
    timed = [r for r in table if "runtime_err_pct" in r]
    return {"cases": len(table), "runtime_mape_pct": mape([r["runtime_err_pct"] for r in timed]),
            "memory_mape_pct": mape([r["memory_err_pct"] for r in timed]),
            "fit_verdicts_right": sum((r["status"] == "ok") == r["fits"] for r in table)}


def _fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def train_section(paths: list[Path] | None = None) -> list[str]:
    """Markdown lines for docs/accuracy.md (validation/accuracy.py calls this)."""
    table = rows(paths)
    s = summary(table)
    lines = ["## Training steps (aisim.studies.train)", "",
             "Measured: validation/data/train (harness validation/harness/train_step.py): "
             + "; ".join(provenance(paths)) + ". Step time median; memory torch.cuda.max_memory_allocated of the "
             "busiest rank (GB = 1e9). The 32-true rows of train-fp32-h100.jsonl were predicted before they were "
             "measured (commit 1647a36).", "",
             "| case | class | measured ms | estimated ms | error | measured GB | estimated GB | error |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        lines.append(f"| {r['key']} | {r['class']} | {_fmt(r['measured_ms'])} | "
                     f"{_fmt(r['estimated_ms']) if r['fits'] else 'does not fit'} | "
                     f"{_fmt(r.get('runtime_err_pct'), '+.1f')}% | {_fmt(r['measured_gb'], '.2f')} | "
                     f"{_fmt(r['estimated_gb'], '.2f')} | {_fmt(r.get('memory_err_pct'), '+.1f')}% |")
    lines += ["", f"Runtime MAPE {_fmt(s['runtime_mape_pct'])}% (goal <= {RUNTIME_GOAL_PCT:g}%), peak memory MAPE "
              f"{_fmt(s['memory_mape_pct'])}% (goal <= {MEMORY_GOAL_PCT:g}%), fit verdicts right "
              f"{s['fit_verdicts_right']}/{s['cases']}.", ""]
    by_class: dict[str, list[dict]] = {}
    for r in table:
        if "runtime_err_pct" in r:
            by_class.setdefault(r["class"], []).append(r)
    lines += ["| class | cases | runtime MAPE | memory MAPE |", "|---|---:|---:|---:|"]
    for name, rs in sorted(by_class.items()):
        lines.append(f"| {name} | {len(rs)} | {_fmt(mape([r['runtime_err_pct'] for r in rs]))}% | "
                     f"{_fmt(mape([r['memory_err_pct'] for r in rs]))}% |")
    return lines + [""] + (moe_train_lines() if paths is None else [])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, nargs="*", default=None)
    parser.add_argument("--published", action="store_true", help="also the published large-scale table")
    args = parser.parse_args(argv)
    print("\n".join(train_section(args.data)))
    if args.published:
        from .published_train import published_section

        print("\n".join(published_section()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
