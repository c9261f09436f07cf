"""The one plain-text table format of every report the library prints.

A table is a list of (label, value) rows: the labels left-justified to the longest one, two
spaces, then the value as ``str`` gives it. The verification report, ``exactformer info``, the
float32 verdict and the Tikhonov diagnostic all print this way, so they line up alike (see
docs/verification.md, "The report").
"""

from __future__ import annotations


def format_table(rows: list[tuple[str, object]]) -> str:
    """The rows as lines ``label  value``, labels padded to one width (no trailing newline)."""
    width = max((len(label) for label, _ in rows), default=0)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    """The rows (dicts) as a Markdown table of the given columns: the benchmarks' results. A
    "|" inside a header or cell (max|θ|) is escaped, so it does not split the column."""
    def cell(v) -> str:
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(map(cell, columns)) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
