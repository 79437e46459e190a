"""Result tables of the recipes' runners (:mod:`recipes.compare`, :mod:`recipes.sweep`) as
Markdown and CSV."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cell(value: Any) -> str:
    """Floats to 4 significant digits (``0.06683``, ``217.0``), anything else as ``str``."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def columns_of(rows: list[dict[str, Any]]) -> list[str]:
    """Every key of the rows, in first-seen order."""
    return list(dict.fromkeys(key for row in rows for key in row))


def markdown_table(rows: list[dict[str, Any]], fmt: Callable[[Any], str] = cell) -> str:
    """A Markdown table, one line per row; a row's missing keys are empty cells."""
    columns = columns_of(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """The rows as CSV with a header (columns as :func:`columns_of`)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns_of(rows))
        writer.writeheader()
        writer.writerows(rows)
