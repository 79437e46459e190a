"""The headline: per head, step time and memory against plain cross-entropy and quality
against the full softmax, from the other sections' rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .common import Inputs, Provenance, markdown_table, not_measured, ratio, size
from .gcide import wall_clock_ratios
from .movielens import movielens_rows
from .ptb import HEADLINE_PTB, PTB_CONVENTION_TASKS, table4_rows
from .quality import Quality, best_relative
from .speed import REFERENCE, STEP_TO_HEAD, base_method, largest_compared, step_rows


def headline_step(rows: list[dict[str, Any]], method: str) -> list[dict[str, Any]]:
    """The dense row of ``method`` at the largest N with a ratio to plain CE, and its
    ``_sparse`` row at that N (either may be missing)."""
    first = largest_compared(rows, method) or largest_compared(rows, f"{method}_sparse")
    if first is None:
        return []
    n = first["num_classes"]
    return [
        r
        for r in rows
        if r["num_classes"] == n and r["method"] in (method, f"{method}_sparse") and r["time_x"]
    ]


def headline_cell(found: Sequence[tuple[float, Quality] | None]) -> str:
    """Ratios to full softmax joined by `` / `` (``—`` where missing), each with its epochs, or
    the epochs once when they agree; ``""`` when nothing was found."""
    present = [f for f in found if f]
    if not present:
        return ""
    epochs = {f[1].epochs for f in present}
    if len(epochs) == 1:
        values = " / ".join(f"{f[0]:.3f}" if f else "—" for f in found)
        return f"{values} ({epochs.pop()} ep)"
    return " / ".join(f"{f[0]:.3f} ({f[1].epochs} ep)" if f else "—" for f in found)


def section_headline(inputs: Inputs) -> list[str]:
    """Per head, at the largest N measured against plain CE: time and memory ratios (dense /
    sparse), and quality relative to full softmax where a recipe measured it."""
    lines = ["## Headline", ""]
    rows = step_rows(inputs.benchmarks / "head_step.csv") or []
    quality = movielens_rows(inputs.recipes) + table4_rows(inputs.recipes)
    wall_clock = wall_clock_ratios(inputs.recipes)
    if not rows and not quality and not wall_clock:
        return lines + not_measured("any head", "make bench")
    methods = [base_method(r["method"]) for r in rows if r["method"] != REFERENCE]
    known = {STEP_TO_HEAD.get(m, m) for m in methods}
    methods += [q.head for q in quality if q.head not in known]
    methods += [h for h in wall_clock if h not in known]
    prov = Provenance()
    table = []
    for method in dict.fromkeys(methods):
        picked = headline_step(rows, method)
        keys = [prov.row(r) for r in picked]
        cells = []
        for tasks in (["SASRec"], ["GRU4Rec"], [PTB_CONVENTION_TASKS[c] for c in HEADLINE_PTB]):
            found = [
                best_relative(quality, task, STEP_TO_HEAD.get(method, method)) for task in tasks
            ]
            for _, row in filter(None, found):
                keys.append(prov.mark(row.source))
            cells.append(headline_cell(found))
        gcide = wall_clock.get(STEP_TO_HEAD.get(method, method))
        if gcide:
            keys.append(prov.mark(gcide[1]))
        cells.append(f"{gcide[0]:.3f}" if gcide else "")
        if not keys:
            continue
        table.append(
            [
                method,
                size(int(picked[0]["num_classes"])) if picked else "",
                " / ".join(ratio(r["time_x"]) for r in picked),
                " / ".join(ratio(r["memory_x"]) for r in picked),
                *cells,
                ", ".join(dict.fromkeys(keys)),
            ]
        )
    columns = ["method", "N", "time vs plain CE (dense / sparse)", "memory vs plain CE"]
    columns += ["SASRec ML-1M NDCG@10 vs full", "GRU4Rec ML-1M NDCG@10 vs full"]
    columns += [
        "PTB test ppl vs full, Table 4 setting (lower better): "
        + " / ".join(f"`{c}`" for c in HEADLINE_PTB),
        "GCIDE (108,620 words) val ppl vs full, 8 min each (lower better)",
        "provenance",
    ]
    lines += [
        "One training step (section 1) at the largest N where plain cross-entropy ran beside the "
        "head, as ratios to plain `F.cross_entropy(z @ W.T)` in the same run (time / memory; "
        "dense gradient / `sparse_grad=True`), and quality as a ratio to full softmax trained "
        "for the same epochs on the same task (sections 3 and 4; the most epochs measured) or "
        "for the same wall clock on GCIDE (section 5, against the full softmax of the same "
        "session). "
        "Command: `make report` (after `make bench`).",
        "",
        *markdown_table(columns, table),
        *prov.lines(),
    ]
    return lines
