"""Generic table rendering: rows of cell strings under columns that may group sub-columns.

Used by the validation report and by the published-table comparisons. A ``Column`` with ``sub`` labels spans
one leaf per label (e.g. "Runtime (ms)" over Measured | Estimated | Error); every row holds one string per leaf.

- ``render_rst_grid``: an RST grid table in the layout of TorchCAP's benchmark page: the group titles in the
  header row, the ``=`` line under it, then the sub-column labels as the first body row.
- ``render_markdown``: one header row with flattened labels ("Runtime (ms) Measured").
- ``render_csv``: the same flattened labels, one line per row.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Literal, Sequence

Align = Literal["left", "right", "center"]


@dataclass(frozen=True)
class Column:
    """A column, or a group of sub-columns when ``sub`` is given. ``align`` applies to its data cells."""
    title: str
    sub: tuple[str, ...] = ()
    align: Align = "right"

    @property
    def leaves(self) -> int:
        return max(1, len(self.sub))


def leaf_labels(columns: Sequence[Column], sep: str = " ") -> list[str]:
    """Flattened header labels, one per leaf: "Model", "Runtime (ms) Measured", ..."""
    return [c.title if not c.sub else f"{c.title}{sep}{s}" for c in columns for s in (c.sub or (None,))]


def _check(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> int:
    n = sum(c.leaves for c in columns)
    for i, row in enumerate(rows):
        if len(row) != n:
            raise ValueError(f"row {i} has {len(row)} cells, the columns have {n} leaves")
    return n


def _pad(text: str, width: int, align: Align) -> str:
    """Cell content for a cell ``width`` characters wide (one space of margin on each side at least)."""
    if align == "left":
        return " " + text.ljust(width - 1)
    if align == "right":
        return text.rjust(width - 1) + " "
    return text.center(width)


def _leaf_widths(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[int]:
    widths, leaf = [], 0
    for col in columns:
        start = leaf
        for j in range(col.leaves):
            label = col.sub[j] if col.sub else col.title
            cells = [len(row[leaf]) for row in rows]
            widths.append(max([len(label), *cells]) + 2)
            leaf += 1
        span = sum(widths[start:leaf]) + (col.leaves - 1)
        short = len(col.title) + 2 - span
        if short > 0:   # the group title is wider than its sub-columns: widen the last one
            widths[leaf - 1] += short
    return widths


def render_rst_grid(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """An RST grid table; every line has the same width."""
    _check(columns, rows)
    widths = _leaf_widths(columns, rows)
    border = "+" + "+".join("-" * w for w in widths) + "+"
    header_rule = border.replace("-", "=")
    titles, leaf = [], 0
    for col in columns:
        span = sum(widths[leaf:leaf + col.leaves]) + col.leaves - 1
        titles.append(_pad(col.title, span, "left"))
        leaf += col.leaves
    lines = [border, "|" + "|".join(titles) + "|"]
    if any(c.sub for c in columns):  # a second header row; the header rule (=) goes under the last one
        subs, leaf = [], 0
        for col in columns:
            for j in range(col.leaves):
                subs.append(_pad(col.sub[j], widths[leaf], "center") if col.sub else " " * widths[leaf])
                leaf += 1
        lines += [border, "|" + "|".join(subs) + "|"]
    lines.append(header_rule)
    aligns = [c.align for c in columns for _ in range(c.leaves)]
    for row in rows:
        lines += ["|" + "|".join(_pad(cell, w, a) for cell, w, a in zip(row, widths, aligns)) + "|", border]
    return "\n".join(lines)


def render_markdown(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table with flattened labels."""
    _check(columns, rows)
    rule = {"left": ":---", "right": "---:", "center": ":---:"}
    aligns = [c.align for c in columns for _ in range(c.leaves)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(leaf_labels(columns)), "| " + " | ".join(rule[a] for a in aligns) + " |",
                      *(line(row) for row in rows)])


def render_csv(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """CSV with one header line of flattened labels."""
    _check(columns, rows)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    labels = leaf_labels(columns)
    percent = [all(_is_number(r[i]) and str(r[i]).endswith("%") or r[i] in (NA, "") for r in rows)
               and any(str(r[i]).endswith("%") for r in rows) for i in range(len(labels))]
    writer.writerow([f"{label} (%)" if pct else label for label, pct in zip(labels, percent)])
    writer.writerows([[_plain(cell) for cell in row] for row in rows])
    return buffer.getvalue()


NA = "n/a"


def _is_number(cell) -> bool:
    try:
        float(str(cell).replace(",", "").rstrip("%"))
        return True
    except ValueError:
        return False


def _plain(cell):
    """A CSV cell as a machine reads it: numbers without thousands separators or % (n/a stays n/a)."""
    return str(cell).replace(",", "").rstrip("%") if _is_number(cell) else cell


def rst_heading(text: str, char: str) -> str:
    return f"{text}\n{char * len(text)}"
