"""Quality rows of any task (one number of one head) and how they compare with the full
softmax and with the paper."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .common import Provenance, divide, fmt, head_label, markdown_table, ratio, verdict


@dataclass
class Quality:
    """One measured quality number of one head on one task.

    Attributes:
        task: e.g. ``"SASRec"`` or ``"PTB LSTM"``; ratios compare rows of one task.
        head: a key of :data:`HEADS`.
        epochs: training epochs; ratios compare rows with the same epochs and metric.
        metric: e.g. ``"test NDCG@10"``.
        value: the number.
        columns: more numbers shown beside it (name -> value).
        source: where the row's provenance is stated.
    """

    task: str
    head: str
    epochs: int
    metric: str
    value: float
    columns: dict[str, float | None]
    source: str

    def relative(self, rows: Sequence[Quality]) -> float | None:
        """``value`` over the full softmax's on the same task, epochs and metric."""
        full = [
            r
            for r in rows
            if (r.head, r.task, r.epochs, r.metric) == ("full", self.task, self.epochs, self.metric)
        ]
        return divide(self.value, full[0].value) if full else None


def best_relative(rows: Sequence[Quality], task: str, head: str) -> tuple[float, Quality] | None:
    """The ratio to full softmax of ``head`` on ``task`` at the most epochs where one exists,
    with the row it comes from."""
    found = [
        (rel, r)
        for r in rows
        if r.task == task and r.head == head and (rel := r.relative(rows)) is not None
    ]
    return max(found, key=lambda x: x[1].epochs, default=None)


def quality_table(rows: Sequence[Quality], prov: Provenance, paper: Callable) -> list[str]:
    """Our rows with their ratio to full softmax, and the paper's number for the head beside."""
    extra = list(dict.fromkeys(k for r in rows for k in r.columns))
    names = list(dict.fromkeys(r.metric for r in rows))
    table = [
        [
            r.task,
            head_label(r.head),
            r.epochs,
            *(fmt(r.columns.get(k)) for k in extra if k not in names),
            fmt(r.value),
            ratio(r.relative(rows)),
            *paper(r),
            prov.mark(r.source),
        ]
        for r in rows
    ]
    columns = ["task", "head", "epochs", *(k for k in extra if k not in names)]
    columns += [" / ".join(names), "vs full", *paper(None), "provenance"]
    return markdown_table(columns, table)


def comparison_sentences(
    rows: Sequence[Quality], paper_ratio: Callable[[Quality], float | None], lower: bool
) -> str:
    """Which heads beat, match (within 1%) or fall short of full softmax at equal epochs, and
    whether each is closer to its full softmax than in the paper (its ratio to its own)."""
    verdicts: dict[str, list[str]] = {}
    against_paper = []
    for r in rows:
        rel = r.relative(rows)
        if r.head == "full" or rel is None:
            continue
        name = f"{r.task} {head_label(r.head)} ({r.epochs} epochs, {ratio(rel)})"
        verdicts.setdefault(verdict(rel, lower), []).append(name)
        theirs = paper_ratio(r)
        if theirs is not None:
            gap = abs(rel - 1) - abs(theirs - 1)
            if abs(gap) <= 0.01:
                where = "as close to full softmax as"
            else:
                where = "closer to full softmax than" if gap < 0 else "further from it than"
            against_paper.append(
                f"{r.task} {head_label(r.head)} {ratio(rel)} against {ratio(theirs)} ({where} "
                "in the paper)"
            )
    parts = [
        f"{v.capitalize()} full softmax's {rows[0].metric}: " + ", ".join(names) + "."
        for v, names in verdicts.items()
    ]
    if against_paper:
        parts.append("Beside the paper's ratios: " + "; ".join(against_paper) + ".")
    return " ".join(parts)
