"""One CLI framework for the validation commands (typer, as the ``aisim`` command): each module's ``main(argv)``
runs its typer app and returns the exit code; a bad input is one line on stderr and exit code 2."""
from __future__ import annotations

import sys

import click
import typer

from ..errors import AisimError


def new_app(help_text: str) -> typer.Typer:
    return typer.Typer(add_completion=False, help=help_text, pretty_exceptions_enable=False)


def emit(text: str, out=None) -> int:
    """Write a report to ``out`` (a path) or stdout; exit code 0."""
    if out:
        out.write_text(text)
    else:
        print(text, end="")
    return 0


# typer 0.29+ runs on its own vendored copy of click (typer._click): its parse errors and exits are not the click
# package's classes, so both are caught (else a bad option value ended in a traceback)
_TYPER_CLICK = sys.modules.get(typer.BadParameter.__module__)
CLICK_ERRORS = tuple({click.ClickException, getattr(_TYPER_CLICK, "ClickException", click.ClickException)})
CLICK_EXITS = tuple({click.exceptions.Exit, typer.Exit, getattr(_TYPER_CLICK, "Exit", click.exceptions.Exit)})


def run(app: typer.Typer, argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run ``app`` on ``argv`` (default sys.argv[1:]); return its exit code."""
    try:
        result = app(args=argv, prog_name=prog, standalone_mode=False)
    except CLICK_EXITS as exc:
        return exc.exit_code
    except CLICK_ERRORS as exc:
        exc.show()
        return 2
    except (AisimError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0
