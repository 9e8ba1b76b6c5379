"""Scripts for GPU sessions (measurement and diagnosis)."""
from __future__ import annotations

import sys
from typing import Callable

# a malformed record (a line that is not an object, a missing field, an empty file) surfaces as one of these
RECORD_ERRORS = (KeyError, IndexError, TypeError, AttributeError)


def run_main(main: Callable[[], int]) -> int:
    """Run a derive script's ``main``; a missing or unreadable file, an unknown calibration or device name, or a
    malformed record ends in one ``error:`` line on stderr and exit status 2, not a traceback."""
    import json

    from aisim.errors import AisimError

    try:
        return main()
    except AisimError as exc:
        message = str(exc)
    except (OSError, json.JSONDecodeError) as exc:
        message = f"{exc}; pass a file written by its harness (validation/harness/)"
    except (ValueError, *RECORD_ERRORS) as exc:
        message = (f"{type(exc).__name__}: {exc}; the input is not what its harness writes (a record without "
                   "this field, a line that is not a record, an empty file)")
    print(f"error: {message.rstrip('.')}", file=sys.stderr)
    return 2


def calibration_name(name: str) -> str:
    """argparse type of --calibration: a GPU calibration file aisim finds (the user's directory or the shipped
    hardware_specs/calibration/NAME.yaml; not the default rules)."""
    import argparse
    from pathlib import Path

    from aisim.specs import calibration_path

    if name == "default" or calibration_path(name) is None:
        names = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "hardware_specs" / "calibration")
                       .glob("*.yaml") if p.stem != "default")
        raise argparse.ArgumentTypeError(f"unknown calibration {name!r}; one of {', '.join(names)}")
    return name
