"""Scripts for GPU sessions (measurement and diagnosis)."""
from __future__ import annotations

import sys
from typing import Callable


def run_main(main: Callable[[], int]) -> int:
    """Run a derive script's ``main``; a missing or unreadable file, an unknown calibration or device name, or a
    malformed record ends in one ``error:`` line on stderr and exit status 2, not a traceback."""
    from aisim.errors import AisimError

    try:
        return main()
    except (OSError, AisimError, ValueError, KeyError) as exc:
        what = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        kind = f"missing field {what!r}" if isinstance(exc, KeyError) else str(what)
        print(f"error: {kind}. Pass a file written by its harness (validation/harness/) and a calibration name from "
              "hardware_specs/calibration/", file=sys.stderr)
        return 2


def calibration_name(name: str) -> str:
    """argparse type of --calibration: a shipped calibration file's name (hardware_specs/calibration/NAME.yaml)."""
    import argparse
    from pathlib import Path

    names = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "hardware_specs" / "calibration")
                   .glob("*.yaml"))
    if name not in names:
        raise argparse.ArgumentTypeError(f"unknown calibration {name!r}; one of {', '.join(names)}")
    return name
