"""eager_framework_arch_scale: each architecture's host time per predicted op, relative to the four tiny families.

    python -m aisim.validation.scripts.derive_framework_arch FILE.jsonl [FILE.jsonl ...] [--calibration h100-sxm]
        [--evaluate] [--write h100-sxm,h200]

Reads the records of validation/harness/framework_arch.py (tiny models of every shipped architecture, width 64,
interleaved rounds). Per round and phase: each architecture's measured step time over the host time aisim predicts
for its traced step (``--calibration``'s per-op host costs, no framework, phase or architecture scale:
framework_overhead.predicted_config_host_s), divided by the median of that ratio over the four families
eager_framework_scale is fitted on (llama, opt, gpt2, bloom) in the same round; the table is the median over every
round of every file. The median family gets about 1, so the calibrated eager_framework_scale keeps its meaning;
an architecture whose HF model code does more Python between its ops than the ops' own dispatch gets more.

Phases: forward (forward and prefill steps), decode, train (forward-backward; dense models only).
Nothing here sees a judged row: the models are tiny configs. --write puts the table (and a provenance comment) into
the named calibration files. --evaluate prints every measured H100 / H200 dataset's and MoE run's runtime MAPE
without and with the table.

Not shipped. From validation/data/kernels/framework-arch-h100.jsonl (one H100 host, 13 rounds) the table gives llama
about 0.81, gpt2 1.1 and the MoE architectures 0.87-1.03; it made h100.jsonl and h200.jsonl better (decode 10.6 ->
6.8%, 7.6 -> 6.4%) and the later runs of the same suite, the TP suites and every MoE run worse (MoE decode of the
scored run 15.3 -> 17.9%): the tiny models' differences between architectures are not the real models' (the
reruns' hosts differ from each other more than the architectures do), so the file keeps one scale for all.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from . import calibration_name, run_main

CAL_DIR = Path(__file__).resolve().parents[2] / "hardware_specs" / "calibration"
PHASE_KEY = {"forward": "forward", "decode": "decode", "forward-backward": "train"}
COMMENT = "# eager_framework_arch_scale:"


def read(paths: list[Path]) -> tuple[list[dict], dict[str, dict], list[dict]]:
    """(the ok framework_arch records, each file's tiny config per architecture, the files' header lines); a
    record's round is made unique per file."""
    records, configs, headers = [], {}, []
    for i, path in enumerate(paths):
        with open(path) as f:
            for r in map(json.loads, f):
                if r.get("type") == "header":
                    headers.append(r)
                elif r.get("type") == "config":
                    configs[r["arch"]] = r["config"]
                elif r.get("bench") == "framework_arch" and r.get("status") == "ok":
                    records.append({**r, "round": (i, r["round"])})
    return records, configs, headers


def derive(records: list[dict], configs: dict[str, dict], calibration: str) -> tuple[dict, dict]:
    """(model_type -> {phase key: median relative ratio}, model_type -> {phase key: [per-round values]})."""
    from aisim.specs import load_calibration
    from aisim.validation.framework_overhead import TINY, predicted_config_host_s

    cal = load_calibration(calibration).model_copy(update={"eager_framework_arch_scale": {}})
    predicted: dict[tuple[str, str], float] = {}
    ratios: dict[tuple, dict[str, float]] = {}
    for r in records:
        key = (r["arch"], r["phase"])
        if key not in predicted:
            predicted[key] = predicted_config_host_s(configs[r["arch"]], cal, r["phase"])
        ratios.setdefault((r["round"], r["phase"]), {})[r["arch"]] = r["time_s"] / predicted[key]
    rel: dict[str, dict[str, list[float]]] = {}
    for (_, phase), by_arch in ratios.items():
        base = [by_arch[f] for f in TINY if f in by_arch]
        if len(base) < len(TINY):
            continue
        median = statistics.median(base)
        for arch, ratio in by_arch.items():
            rel.setdefault(arch, {}).setdefault(PHASE_KEY[phase], []).append(ratio / median)
    table = {arch: {k: round(statistics.median(v), 3) for k, v in phases.items()} for arch, phases in rel.items()}
    return table, rel


def evaluate(table: dict) -> list[str]:
    """Runtime MAPE per category of every measured H100 / H200 dataset (own calibration file) and of every MoE run,
    without and with ``table`` (a what-if: the shipped files carry no table)."""
    from aisim.specs import load_calibration
    from aisim.validation import moe_report, transfer

    def fmt(mapes: dict) -> str:
        return ", ".join(f"{k.replace(' runtime', '')} {v:.2f}" for k, v in mapes.items() if v is not None)

    lines = []
    for dataset, (own, _) in transfer.RUN_TRANSFERS.items():
        cal = load_calibration(own)
        with_table = cal.model_copy(update={"eager_framework_arch_scale": table})
        lines.append(f"{dataset} ({own}): without {fmt(transfer.runtime_mape(dataset, cal, None))}; with "
                     f"{fmt(transfer.runtime_mape(dataset, with_table, None))}")
    cal = load_calibration(transfer.TRANSFERS["h100.jsonl"][0])   # the MoE runs: H100s
    with_table = cal.model_copy(update={"eager_framework_arch_scale": table})
    for path in moe_report.RUNS:
        mapes = [{k: v for k, v in moe_report.moe_mape(moe_report.compare_moe(path, c)).items() if "runtime" in k}
                 for c in (cal, with_table)]
        lines.append(f"{path.name}: without {fmt(mapes[0])}; with {fmt(mapes[1])}")
    return lines


def _flow(table: dict) -> str:
    return "{" + ", ".join(f"{arch}: {{" + ", ".join(f"{k}: {v}" for k, v in phases.items()) + "}"
                           for arch, phases in table.items()) + "}"


def write(calibration: str, table: dict, note: str) -> None:
    path = CAL_DIR / f"{calibration}.yaml"
    text = path.read_text()
    line = f"eager_framework_arch_scale: {_flow(table)}"
    for pattern, new in ((rf"^{re.escape(COMMENT)}.*$", note), (r"^eager_framework_arch_scale:.*$", line)):
        if re.search(pattern, text, re.M):
            text = re.sub(pattern, lambda _m, new=new: new, text, flags=re.M)
        else:
            text = text.rstrip("\n") + "\n" + new + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--calibration", default="h100-sxm", type=calibration_name,
                        help="whose per-op host costs predict the steps")
    parser.add_argument("--write", default=None, help="comma-separated calibration names to write the table into")
    parser.add_argument("--evaluate", action="store_true",
                        help="print the measured datasets' runtime MAPE without and with the table (minutes)")
    args = parser.parse_args(argv)
    for path in args.files:
        if not path.is_file():
            parser.error(f"{path} is not a file")
    try:
        records, configs, headers = read(args.files)
    except (OSError, ValueError, KeyError) as exc:
        parser.error(f"not framework_arch records ({type(exc).__name__}: {exc})")
    if not records:
        parser.error("no framework_arch records in " + ", ".join(map(str, args.files)))
    table, rel = derive(records, configs, args.calibration)
    for arch, phases in table.items():
        spread = ", ".join(f"{k} {v} ({min(rel[arch][k]):.2f}-{max(rel[arch][k]):.2f}, {len(rel[arch][k])} rounds)"
                           for k, v in phases.items())
        print(f"{arch}: {spread}")
    if args.evaluate:
        print("\n".join(evaluate(table)))
    if args.write:
        runs = "; ".join(f"{h.get('gpu_name')}, driver {h.get('driver')}, torch {h.get('torch')}, transformers "
                         f"{h.get('transformers')}, {str(h.get('date', ''))[:16]}" for h in headers)
        rounds = len({r["round"] for r in records})
        note = (f"{COMMENT} python -m aisim.validation.scripts.derive_framework_arch "
                + " ".join(str(p) for p in args.files) + f" --calibration {args.calibration} ({rounds} rounds of "
                f"validation/harness/framework_arch.py: tiny width-64 models of each architecture, interleaved; "
                f"{runs}). Per architecture and phase, its measured / predicted host time over the median of "
                f"llama, opt, gpt2 and bloom in the same round; median over the rounds.")
        for name in args.write.split(","):
            if not (CAL_DIR / f"{name}.yaml").is_file():
                parser.error(f"--write: no calibration file {name}.yaml in {CAL_DIR}")
            write(name, table, note)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
