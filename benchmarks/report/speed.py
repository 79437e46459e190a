"""Section 1: one training step of every head and the peers against N
(``benchmarks/head_step.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import (
    Inputs,
    Provenance,
    divide,
    fmt,
    markdown_table,
    not_measured,
    number,
    ratio,
    read_csv,
    size,
    verdict,
)
from .gpu import speed_pointer

#: ``benchmarks/head_step.py`` method (``_sparse`` removed) -> recipe head key, where they differ
STEP_TO_HEAD = {"full_softmax_head": "full"}
#: head_step methods of results files written before they took the recipe configs' names
RENAMED_METHODS = {"one_vs_each": "ove", "one_vs_each_sparse": "ove_sparse"}
REFERENCE = "plain_cross_entropy"


STEP_1E7 = (
    "python -m benchmarks.head_step --threads 1 --sizes 100000 10000000 --name head_step_1e7 "
    "--methods adaptive_log_softmax full_softmax_head uniform_sparse uniform_shared_sparse "
    "unigram_sparse log_uniform_sparse in_batch_sparse midx_pq_sparse midx_rq_sparse "
    "midx_learn_sparse tapas_sparse ove_sparse cane_sparse"
)


def step_rows(path: Path) -> list[dict[str, Any]] | None:
    """head_step CSV rows with ``time_x`` and ``memory_x`` recomputed against the plain
    cross-entropy row of the same N and CSV (``None`` where either is missing)."""
    rows = read_csv(path)
    if rows is None:
        return None
    plain = {r["num_classes"]: r for r in rows if r["method"] == REFERENCE}
    for r in rows:
        r["method"] = RENAMED_METHODS.get(r["method"], r["method"])
        ref = plain.get(r["num_classes"], {})
        r["seconds"], r["mib"] = number(r.get("median_s")), number(r.get("peak_mib"))
        r["time_x"] = divide(r["seconds"], number(ref.get("median_s")))
        r["memory_x"] = divide(r["mib"], number(ref.get("peak_mib")))
    return rows


def base_method(method: str) -> str:
    return method.removesuffix("_sparse")


def step_pivot(rows: list[dict[str, Any]], prov: Provenance, value: str) -> list[str]:
    """One row per method, one column per N: ``value`` is ``"time"`` or ``"memory"``."""
    sizes = sorted({int(r["num_classes"]) for r in rows})
    by_key = {(r["method"], int(r["num_classes"])): r for r in rows}
    methods = list(dict.fromkeys(r["method"] for r in rows))

    def cell(r: dict[str, Any] | None) -> str:
        if r is None:
            return ""
        if r["seconds"] is None:
            return "skipped"
        text, x = (
            (f"{fmt(r['seconds'])} s", r["time_x"])
            if value == "time"
            else (f"{fmt(r['mib'])} MiB", r["memory_x"])
        )
        return text if x is None else f"{text} ({ratio(x)})"

    table = []
    for m in methods:
        cells = [by_key.get((m, n)) for n in sizes]
        keys = dict.fromkeys(prov.row(r) for r in cells if r is not None)
        table.append([m, *(cell(r) for r in cells), ", ".join(keys)])
    return markdown_table(["method", *(f"N = {size(n)}" for n in sizes), "provenance"], table)


def skipped_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"- {r['method']} at N = {int(r['num_classes']):,}: {r['status']}"
        for r in rows
        if r["seconds"] is None
    ]
    return ["Skipped:", "", *lines, ""] if lines else []


def largest_compared(rows: list[dict[str, Any]], method: str) -> dict[str, Any] | None:
    """The row of ``method`` at the largest N where it has a time ratio to plain CE."""
    found = [r for r in rows if r["method"] == method and r["time_x"] is not None]
    return max(found, key=lambda r: int(r["num_classes"]), default=None)


def speed_paragraph(rows: list[dict[str, Any]], rows_1e7: list[dict[str, Any]] | None) -> str:
    """Numeric sentences of section 1, generated from its rows."""
    compared = [r for r in rows if r["time_x"] is not None and r["method"] != REFERENCE]
    if not compared:
        return ""
    n = max(int(r["num_classes"]) for r in compared)
    at_n = {r["method"]: r for r in compared if int(r["num_classes"]) == n}
    parts = [
        f"{m} {ratio(r['time_x'])} of plain cross-entropy's step time and "
        f"{ratio(r['memory_x'])} of its memory"
        for m, r in at_n.items()
        if r["method"] in ("full_softmax_head", "cut_cross_entropy", "adaptive_log_softmax")
    ]
    text = f"At N = {n:,}: " + "; ".join(parts) + "." if parts else ""
    fastest = min(at_n.values(), key=lambda r: r["time_x"])
    text += f" Fastest there: {fastest['method']} at {ratio(fastest['time_x'])}."
    mine, peer = at_n.get("full_softmax_head"), at_n.get("cut_cross_entropy")
    if mine and peer:
        time_x = divide(mine["seconds"], peer["seconds"])
        memory_x = divide(mine["mib"], peer["mib"])
        text += (
            f" Against Cut Cross-Entropy our exact head {verdict(time_x, lower_is_better=True)} "
            f"it on time ({ratio(time_x)} its seconds) and "
            f"{verdict(memory_x, lower_is_better=True)} it on memory ({ratio(memory_x)})."
        )
    lce = largest_compared(rows, "linear_cross_entropy")
    if lce:
        text += (
            f" torch's linear_cross_entropy, last measured at N = {int(lce['num_classes']):,}, "
            f"took {ratio(lce['time_x'])} of plain cross-entropy's time."
        )
    return text + sparse_growth(rows_1e7 or [])


def sparse_growth(rows: list[dict[str, Any]]) -> str:
    """How much the ``_sparse`` heads' step grows from the smallest to the largest N."""
    sizes = sorted({int(r["num_classes"]) for r in rows})
    seconds = {(r["method"], int(r["num_classes"])): r["seconds"] for r in rows}
    growth = [
        divide(seconds.get((m, sizes[-1])), seconds.get((m, sizes[0])))
        for m in dict.fromkeys(r["method"] for r in rows if r["method"].endswith("_sparse"))
    ]
    growth = [g for g in growth if g is not None]
    if not growth:
        return ""
    return (
        f" From N = {size(sizes[0])} to {size(sizes[-1])} ({sizes[-1] // sizes[0]}x the classes) "
        f"the sparse heads' step time changes {min(growth):.2f}-{max(growth):.2f}x."
    )


def section_speed(inputs: Inputs) -> list[str]:
    lines = ["## 1. Speed and memory of one training step vs N, every head and the peers", ""]
    rows = step_rows(inputs.benchmarks / "head_step.csv")
    rows_1e7 = step_rows(inputs.benchmarks / "head_step_1e7.csv")
    if rows is None:
        return lines + not_measured("one training step of every head", "make bench")
    prov = Provenance()
    lines += [
        "Forward + backward at B = 1024, D = 128, Zipfian targets, one thread (settings in "
        "`benchmarks/head_step.py`). Each cell: median seconds (or peak extra MiB) and, in "
        "brackets, the ratio to plain cross-entropy at the same N in the same run; `_sparse`: "
        "`sparse_grad=True`. Command: `make bench` (`python -m benchmarks.head_step "
        "--threads 1`). No seed: timings only.",
        "",
        "Time:",
        "",
        *step_pivot(rows, prov, "time"),
        "Peak memory beyond the class table and inputs:",
        "",
        *step_pivot(rows, prov, "memory"),
        *skipped_lines(rows),
    ]
    if rows_1e7 is not None:
        lines += [
            f"The sparse heads at N = 1e7, beside N = 1e5 (plain cross-entropy does not fit): "
            f"`{STEP_1E7}`.",
            "",
            *step_pivot(rows_1e7, prov, "time"),
            *step_pivot(rows_1e7, prov, "memory"),
            *skipped_lines(rows_1e7),
        ]
    else:
        lines += not_measured("the sparse heads at N = 1e7", STEP_1E7)
    lines += speed_pointer(inputs)
    lines += [
        speed_paragraph(rows, rows_1e7)
        + " Why: the sampled heads never form the [B, N] logits, and with `sparse_grad=True` "
        "neither the [N, D] gradient, so their step follows the rows they touch, not N; the "
        "exact head and Cut Cross-Entropy form the logits in chunks, plain cross-entropy whole.",
        "",
        *prov.lines(),
        *inputs.plots(inputs.benchmarks / "head_step.png", inputs.benchmarks / "head_step_1e7.png"),
    ]
    return lines
