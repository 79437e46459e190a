"""What every section of the report shares: reading result files, formatting numbers and
tables, provenance notes, where the inputs are, and the heads' labels (the recipe head configs'
labels, :data:`recipes.registry.LABELS`)."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from recipes.registry import LABELS

T = TypeVar("T")

#: readable head labels: the recipe head configs', and those of runs named after a config with
#: an option changed
HEAD_LABELS = LABELS | {"uniform_shared": "uniform, shared by the batch"}
#: the heads the issue asks for in every quality table
ISSUE_HEADS = (
    "full",
    "uniform",
    "unigram",
    "midx_pq",
    "midx_rq",
    "midx_learn",
    "tapas",
    "ove",
    "cane",
)


def read_csv(path: Path) -> list[dict[str, str]] | None:
    """The rows of a CSV file, or ``None`` where it does not exist."""
    if not path.is_file():
        return None
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def read_json(path: Path) -> list[dict[str, Any]] | None:
    """The rows of a ``recipes.compare`` JSON file, or ``None`` where it does not exist."""
    return json.loads(path.read_text()) if path.is_file() else None


def latest_runs(items: Sequence[T], key: Callable[[T], Hashable]) -> list[T]:
    """``items`` without those whose key recurs later: a later run of the same head (with the
    same key) replaces an earlier one, in the later one's place."""
    last = {key(item): i for i, item in enumerate(items)}
    return [item for i, item in enumerate(items) if last[key(item)] == i]


def number(value: Any) -> float | None:
    """``value`` as a float, ``None`` where it is empty or not a number."""
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(result) else result


def fmt(value: float | None) -> str:
    """4 significant digits, thousands separated from 10,000 on, 3 digits and an exponent from
    1e9 on (a diverged perplexity); an em dash for ``None``."""
    if value is None:
        return "—"
    if abs(value) >= 1e9:
        return f"{value:.3g}"
    if abs(value) >= 10_000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def ratio(value: float | None) -> str:
    """A ratio as ``0.0172x``."""
    return "—" if value is None else f"{value:.3g}x"


def size(n: int) -> str:
    """A class count as ``1e6``."""
    return f"{n:.0e}".replace("e+0", "e")


def divide(a: float | None, b: float | None) -> float | None:
    """``a / b``, ``None`` where either is missing or ``b`` is zero."""
    return None if a is None or not b else a / b


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """Markdown lines of a table; no lines at all when there are no rows."""
    body = ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    if not body:
        return []
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *body, ""]


def not_measured(what: str, command: str) -> list[str]:
    """The plain line of a section (or part) whose measurements do not exist yet."""
    return [f"Not measured yet: {what}. Command: `{command}`.", ""]


def verdict(value: float | None, lower_is_better: bool = False) -> str:
    """``beats`` / ``matches`` (within 1%) / ``falls short of`` for a ratio to a reference."""
    if value is None:
        return "has no counterpart in"
    better = value < 1 if lower_is_better else value > 1
    if abs(value - 1) <= 0.01:
        return "matches"
    return "beats" if better else "falls short of"


@dataclass
class Provenance:
    """Numbered provenance notes of one section: ``mark(text)`` gives a row its key."""

    notes: dict[str, str] = field(default_factory=dict)

    def mark(self, text: str) -> str:
        return self.notes.setdefault(text, f"P{len(self.notes) + 1}")

    def row(self, row: dict[str, str]) -> str:
        """The key of a CSV row's machine, torch version and commit."""
        parts = [row.get("machine") or "", row.get("torch") or "", row.get("commit") or ""]
        if not any(parts):
            return self.mark("not recorded in the CSV")
        return self.mark(f"{parts[0]}; torch {parts[1]}; commit {parts[2]}")

    def lines(self) -> list[str]:
        if not self.notes:
            return []
        return ["Provenance: " + "; ".join(f"**{k}** {t}" for t, k in self.notes.items()), ""]


@dataclass
class Inputs:
    """Where the result files are, and where the report goes (for relative links)."""

    benchmarks: Path
    recipes: Path
    results_md: Path
    out: Path

    def link(self, path: Path) -> str:
        """A Markdown link to ``path`` relative to the report, or ``""`` where it is missing."""
        if not path.is_file():
            return ""
        return f"[{path.name}]({os.path.relpath(path, self.out.parent)})"

    def plots(self, *paths: Path) -> list[str]:
        links = [self.link(p) for p in paths if p.is_file()]
        return ["Plots: " + ", ".join(links) + ".", ""] if links else []


def head_label(head: str) -> str:
    """The readable label of a recipe head config name, a ``sparse_`` variant labelled as its
    dense config where there is one (the gradient's form does not change the estimator)."""
    return HEAD_LABELS.get(head.removeprefix("sparse_")) or HEAD_LABELS.get(head, head)


def missing_heads(have: set[str], task: str) -> str:
    """'Not run on TASK yet: ...' for the issue's heads not in ``have``; ``""`` if none."""
    missing = [LABELS[h] for h in ISSUE_HEADS if h not in have]
    return f"Not run on {task} yet: {', '.join(missing)}." if missing else ""


def csv_table(rows: list[dict[str, str]], columns: Sequence[str], prov: Provenance) -> list[str]:
    """The chosen columns of CSV rows (numbers to 4 digits) and each row's provenance."""
    return markdown_table(
        [*columns, "provenance"],
        [
            [r[c] if number(r[c]) is None else fmt(number(r[c])) for c in columns] + [prov.row(r)]
            for r in rows
        ],
    )
