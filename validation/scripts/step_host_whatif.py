"""What the per-call host work of the depth sweeps would do to the judged figures, were the shipped calibrations
to carry it (they do not): each H100/H200 calibration with ``eager_step_host_adds`` from the depth sweeps, its
framework and train scales refitted with it (derive_op_host --step-adds) and its per-collective adds refitted on
those (derive_collective_host), against the shipped file.

    python -m aisim.validation.scripts.step_host_whatif

Runtime MAPE per category of the measured suites (own calibration; the H100 and H200 single-GPU datasets also with
the other GPU's file) and of the MoE cases (scored run). The sweeps (validation/data/kernels/framework-depth-h100.jsonl,
-run2.jsonl: tiny non-judged models at 1-16 layers on two H100 hosts) find 26 plain adds of host work per forward or
decode call and 58 per forward-backward that the per-op costs do not see; the 4-layer tiny models that set
eager_framework_scale carry it, so the shipped scale spreads it over every op and deep models are charged more host
time than they take. Nothing here is fitted to a judged row: this script only reports.
"""
from __future__ import annotations

import functools

from aisim.specs import load_calibration

from . import derive_collective_host, derive_op_host

DATASETS = {"h100.jsonl": ("h100-sxm", "h200"), "h200.jsonl": ("h200", "h100-sxm"), "tp2-h200.jsonl": ("h200",),
            "tp4-h200.jsonl": ("h200",), "whisper-h200.jsonl": ("h200",)}


@functools.cache
def with_step_adds(calibration: str):
    """The shipped calibration with the per-call adds, the scales refitted with them, and the per-collective adds
    refitted on those (they are read in plain adds before the framework scale)."""
    def refit(name: str):
        fit = derive_op_host.derive(name, with_step_adds=True)
        return load_calibration(name).model_copy(update={k: fit[k] for k in (
            "eager_step_host_adds", "eager_framework_scale", "eager_phase_scale")})

    collective = derive_collective_host.derive(reference=refit("h100-sxm"))["eager_collective_host_adds"]
    return refit(calibration).model_copy(update={"eager_collective_host_adds": collective})


def rows() -> list[tuple[str, str, str, float | None, float | None]]:
    """(dataset, calibration, category, shipped MAPE, with the per-call adds MAPE)."""
    from aisim.validation import moe_report
    from aisim.validation.transfer import runtime_mape

    out = []
    for dataset, cals in DATASETS.items():
        for cal in cals:
            shipped = runtime_mape(dataset, load_calibration(cal), categories=None)
            adds = runtime_mape(dataset, with_step_adds(cal), categories=None)
            out += [(dataset, cal, k, shipped[k], adds[k]) for k in shipped]
    shipped = moe_report.moe_mape(moe_report.compare_moe())
    adds = moe_report.moe_mape(moe_report.compare_moe(calibration=with_step_adds("h100-sxm")))
    out += [("moe-h100.jsonl", "h100-sxm", k, shipped[k], adds[k]) for k in shipped if k.endswith("runtime")]
    return out


def main() -> int:
    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    for cal in ("h100-sxm", "h200"):
        c = with_step_adds(cal)
        print(f"{cal}: eager_step_host_adds {c.eager_step_host_adds}, eager_framework_scale "
              f"{load_calibration(cal).eager_framework_scale} -> {c.eager_framework_scale}, train phase scale "
              f"{load_calibration(cal).eager_phase_scale.get('train')} -> {c.eager_phase_scale.get('train')}")
    print("| dataset | calibration | category | shipped MAPE (%) | with per-call adds (%) |\n|---|---|---|---:|---:|")
    for dataset, cal, category, a, b in rows():
        if a is not None or b is not None:
            print(f"| {dataset} | {cal} | {category} | {fmt(a)} | {fmt(b)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
