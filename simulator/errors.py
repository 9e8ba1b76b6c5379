"""Errors for bad input: each says what was wrong and what to do. The CLI prints them without a traceback."""
from __future__ import annotations

import difflib


class AisimError(Exception):
    """Bad input or an impossible request; the message is written for the user."""


class UnknownNameError(AisimError):
    def __init__(self, kind: str, name: str, known: list[str], hint: str):
        close = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=5, cutoff=0.4)
        by_lower = {k.lower(): k for k in known}
        close = [by_lower[c] for c in close]
        near = f" Did you mean: {', '.join(close)}?" if close else ""
        super().__init__(f"unknown {kind} {name!r}.{near} {hint}")
        self.close_matches = close


class DoesNotFit(AisimError):
    """A configuration whose memory does not hold what it must ("does not fit: <detail>; <hint>"). ``hint`` names the
    flags of the command that raised it; a study that searches those settings itself gives its own (``advise``)."""

    def __init__(self, detail: str, hint: str = ""):
        super().__init__(f"does not fit: {detail}" + (f"; {hint}" if hint else ""))
        self.detail, self.hint = detail, hint

    def advise(self, hint: str) -> "DoesNotFit":
        return DoesNotFit(self.detail, hint)
