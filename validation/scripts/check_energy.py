"""Energy per token of a measured suite with the shipped calibration and with the power rules before the power
overlap (power_overlap 0, compute_dynamic_ratio 1.46): the held-out check of the overlap on whole model steps.

    python -m aisim.validation.scripts.check_energy [FILE] [--calibration h200]

FILE: a suite run's JSONL (default validation/data/kernels/energy-heldout-h200.jsonl, validation/suites/
energy-heldout.yaml on an H200: models no energy table holds). Nothing is fitted.
"""
from __future__ import annotations

import argparse
import functools
import re
import tempfile
from pathlib import Path

from . import calibration_name, run_main

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "validation" / "data" / "kernels" / "energy-heldout-h200.jsonl"
BEFORE = {"power_overlap": "power_overlap: 0", "compute_dynamic_ratio": "compute_dynamic_ratio: 1.46"}


def before_file(calibration: str) -> Path:
    """The calibration file with the power rules as they were before the overlap (a temporary copy)."""
    from aisim.specs import calibration_path

    text = Path(calibration_path(calibration)).read_text()
    text = re.sub(r"^power_overlap:.*$", BEFORE["power_overlap"], text, flags=re.M)
    text = re.sub(r"compute_dynamic_ratio: [0-9.]+", BEFORE["compute_dynamic_ratio"], text)
    out = Path(tempfile.mkdtemp(prefix="aisim-energy-")) / f"{calibration}-before.yaml"
    out.write_text(text)
    return out


def rows(path: Path, calibration: str) -> list[tuple[str, float, float, float]]:
    """(case, measured J/token, aisim's now, aisim's before the overlap) for each case with energy."""
    import aisim
    from aisim.validation.report import compare, load_measurements

    from aisim.specs import calibration_path

    measured = load_measurements([path])
    now = compare(measured, functools.partial(aisim.estimate, calibration=str(calibration_path(calibration))))
    before = compare(measured, functools.partial(aisim.estimate, calibration=str(before_file(calibration))))
    out = []
    for a, b in zip(now, before):
        da, db = a.as_dict(), b.as_dict()
        if da.get("energy_j_per_token_error") is None:
            continue
        out.append((da["key"], da["energy_j_per_token_measured"], da["energy_j_per_token_estimated"],
                    db["energy_j_per_token_estimated"]))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", nargs="?", default=str(DATA))
    parser.add_argument("--calibration", default="h200", type=calibration_name)
    args = parser.parse_args(argv)
    table = rows(Path(args.data), args.calibration)
    if not table:
        raise ValueError("no case with a measured energy")
    print(f"{'case':<62} {'measured J/tok':>14} {'now %':>7} {'before %':>9}")
    for key, m, now, before in table:
        print(f"{key:<62} {m:>14.4g} {100 * (now / m - 1):>+7.1f} {100 * (before / m - 1):>+9.1f}")
    mape = [100 * sum(abs(row[i] / row[1] - 1) for row in table) / len(table) for i in (2, 3)]
    print(f"energy per token MAPE over {len(table)} cases: {mape[1]:.1f}% before the power overlap -> {mape[0]:.1f}% "
          "with it")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
