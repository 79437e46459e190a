"""Issue 16's report: speed, memory and quality of every head, the papers' numbers and the peers.

Assembles ``benchmarks/results/REPORT.md`` from result files that already exist: the benchmarks'
CSVs (``benchmarks/results``, machine, torch version and commit on every row) and the recipes'
JSONs (``recipes/results``, one row per head; they carry no provenance, so each names the
``recipes/RESULTS.md`` paragraph that states it). The PTB rows of three epochs were saved only as
a Markdown table, read from ``recipes/RESULTS.md``. One section per item of the issue; a section
whose measurements do not exist yet says so, with the command that would make them. Every sentence
with a number is generated from the tables, so the text cannot go stale. Nothing is measured here.

Run: ``python -m benchmarks.report [--benchmarks DIR] [--recipes DIR] [--results-md PATH]
[--out PATH]`` (defaults: this repository's result folders and ``benchmarks/results/REPORT.md``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: head keys (recipe head configs without ``sparse_``) in the issue's order, with readable labels
HEADS = {
    "full": "full softmax",
    "uniform": "uniform",
    "uniform_shared": "uniform, shared by the batch",
    "unigram": "unigram",
    "log_uniform": "log-uniform",
    "in_batch": "in-batch",
    "mixed": "mixed: in-batch + uniform",
    "midx_pq": "MIDX-pq",
    "midx_rq": "MIDX-rq",
    "midx_learn": "MIDX-learn",
    "midx_rq_log_uniform": "MIDX-rq + log-uniform",
    "tapas": "TAPAS",
    "ove": "One-vs-Each",
    "cane": "CANE",
}
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
#: ``benchmarks/head_step.py`` method (``_sparse`` removed) -> recipe head key
STEP_TO_HEAD = {"full_softmax_head": "full", "one_vs_each": "ove"}
REFERENCE = "plain_cross_entropy"

#: the MIDX paper's Table 4, LSTM on Penntreebank, test perplexity, as printed
PAPER_TABLE4 = {
    "full": "109.1965",
    "uniform": "159.9701",
    "unigram": "139.7837",
    "midx_pq": "121.5477",
    "midx_rq": "117.8317",
}
#: the MIDX paper's Table 7, MovieLens-10M (it has no MovieLens-1M row): N@10, N@50, R@10, R@50
PAPER_TABLE7 = {
    "SASRec": {
        "full": ("0.0922", "0.1440", "0.1738", "0.4114"),
        "uniform": ("0.0840", "0.1371", "0.1623", "0.4058"),
        "unigram": ("0.0885", "0.1406", "0.1705", "0.4100"),
        "midx_pq": ("0.0899", "0.1419", "0.1721", "0.4102"),
        "midx_rq": ("0.0916", "0.1433", "0.1752", "0.4125"),
    },
    "GRU4Rec": {
        "full": ("0.1358", "0.1892", "0.2365", "0.4808"),
        "uniform": ("0.1224", "0.1797", "0.2270", "0.4882"),
        "unigram": ("0.1261", "0.1818", "0.2304", "0.4847"),
        "midx_pq": ("0.1336", "0.1873", "0.2355", "0.4802"),
        "midx_rq": ("0.1337", "0.1877", "0.2355", "0.4817"),
    },
}
#: the AdaptiveSoftmax paper's Figure 1 average gains (delta 10%, eps 30%), as printed
PAPER_FIGURE1_GAIN = {"a": "3.953", "b": "29.039"}

ML1M = "recipes/RESULTS.md, MovieLens-1M section"
#: recipe JSONs on MovieLens-1M: file stem, model, head key override, where their provenance is
ML1M_RUNS = (
    ("sasrec_ml-1m_rerun", "SASRec", None, f"{ML1M}, 'current MIDX draw and defaults': f9f125d"),
    ("gru4rec_ml-1m_rerun", "GRU4Rec", None, f"{ML1M}, 'current MIDX draw and defaults': f9f125d"),
    ("sasrec_ml-1m", "SASRec", None, f"{ML1M}: code at 77fdf9c / c0731a7, TensorFlow convention"),
    ("gru4rec_ml-1m", "GRU4Rec", None, f"{ML1M}: code at 77fdf9c / c0731a7, TensorFlow convention"),
    ("sasrec_ml-1m_20_epochs", "SASRec", None, f"{ML1M}, 'SASRec, 20 epochs' (file of b04b93a)"),
    ("sasrec_ml-1m_in_batch", "SASRec", None, f"{ML1M}, 'in-batch and mixed negatives': ce5b199"),
    ("sasrec_ml-1m_tapas", "SASRec", None, f"{ML1M}, 'TAPAS and One-vs-Each': f8ca01a + work tree"),
    ("sasrec_ml-1m_ove", "SASRec", None, f"{ML1M}, 'TAPAS and One-vs-Each': 14dbed2 + work tree"),
    (
        "sasrec_ml-1m_uniform_shared",
        "SASRec",
        "uniform_shared",
        f"{ML1M}, 'TAPAS and One-vs-Each': 16fef5b + work tree",
    ),
    ("sasrec_ml-1m_cane", "SASRec", None, "recipes/RESULTS.md, CANE on SASRec paragraph: f9f125d"),
    ("gru4rec_ml-1m_table7", "GRU4Rec", None, f"{ML1M}, 'GRU4Rec, the paper's Table 7 heads'"),
    (
        "gru4rec_ml-1m_table7_midx",
        "GRU4Rec",
        None,
        f"{ML1M}, 'GRU4Rec, the paper's Table 7 heads'",
    ),
    ("sasrec_ml-1m_table7_full", "SASRec", None, f"{ML1M}, 'SASRec, unigram and MIDX-pq'"),
    ("sasrec_ml-1m_table7_unigram", "SASRec", None, f"{ML1M}, 'SASRec, unigram and MIDX-pq'"),
    ("sasrec_ml-1m_table7_midx_pq", "SASRec", None, f"{ML1M}, 'SASRec, unigram and MIDX-pq'"),
)
PTB = "recipes/RESULTS.md, 'LSTM on PTB, three epochs'"
#: recipe JSONs in the Table 4 setting (20 negatives, K = 32): file stem, the sampled-softmax
#: convention of its SampledSoftmaxHead rows (the full softmax, CANE and One-vs-Each have none)
PTB_TABLE4_RUNS = (
    ("lstm_ptb_table4_full", "exact_positive"),
    ("lstm_ptb_table4_static", "exact_positive"),
    ("lstm_ptb_table4_midx_rq", "exact_positive"),
    ("lstm_ptb_table4_learn_ove", "exact_positive"),
    ("lstm_ptb_table4_cane", "exact_positive"),
    ("lstm_ptb_table4_tensorflow_static", "tensorflow"),
    ("lstm_ptb_table4_tensorflow_midx", "tensorflow"),
    ("lstm_ptb_table4_corrected_all", "corrected_all"),
)
#: the task name of a Table 4 row under each convention
PTB_CONVENTION_TASKS = {
    "exact_positive": "PTB LSTM",
    "corrected_all": "PTB LSTM, every logit corrected",
    "tensorflow": "PTB LSTM, TensorFlow's convention",
}
#: the MIDX-rq head's Table 4 row under this convention is the sweeps' K = 32, M = 20 point
PTB_SWEEP_CONVENTION = "tensorflow"
#: the conventions of the headline's PTB column, side by side
HEADLINE_PTB = ("exact_positive", "corrected_all", "tensorflow")
#: the Table 4 run whose SamplerDiagnostics give the proposal-distribution plot
PROPOSAL_RUN = "lstm_ptb_table4_midx_rq"
#: the sweeps of the paper's Figures 3 and 7: file stem prefix, the swept setting, its Table 4
#: value, and the CLI override that sets it
PTB_SWEEPS = (
    ("lstm_ptb_codebook_", "codebook size K", 32, "sampler.init_args.codebook_size"),
    ("lstm_ptb_negatives_", "negatives M", 20, "head.init_args.num_negatives"),
)
GCIDE = "recipes/results/gcide.md: torch 2.13.0 CPU, 1 thread, 2 shared cores"
GCIDE_RUNS = (
    ("gcide_full", "both", f"{GCIDE} (file of de21590)"),
    ("gcide_time", "time", f"{GCIDE} (file of de21590)"),
    ("gcide_time_mixture", "time", f"{GCIDE}, mixture section (file of 4b16217)"),
    ("gcide_tokens", "tokens", f"{GCIDE} (file of de21590)"),
)
#: the result files other sections read; the rest are listed under "Other measurements"
USED_BENCHMARKS = ("head_step", "head_step_1e7", "sampler_time", "adaptive_softmax_synthetic")
USED_BENCHMARKS += ("adaptive_softmax_trained", "adaptive_softmax_wallclock", "REPORT")
USED_BENCHMARKS += ("ddp_scaling", "ddp_scaling_equality")

STEP_1E7 = (
    "python -m benchmarks.head_step --threads 1 --sizes 100000 10000000 --name head_step_1e7 "
    "--methods adaptive_log_softmax full_softmax_head uniform_sparse uniform_shared_sparse "
    "unigram_sparse log_uniform_sparse in_batch_sparse midx_pq_sparse midx_rq_sparse "
    "midx_learn_sparse tapas_sparse one_vs_each_sparse cane_sparse"
)


# ----------------------------------------------------------------------------- reading and format


def read_csv(path: Path) -> list[dict[str, str]] | None:
    """The rows of a CSV file, or ``None`` where it does not exist."""
    if not path.is_file():
        return None
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def read_json(path: Path) -> list[dict[str, Any]] | None:
    """The rows of a ``recipes.compare`` JSON file, or ``None`` where it does not exist."""
    return json.loads(path.read_text()) if path.is_file() else None


def number(value: Any) -> float | None:
    """``value`` as a float, ``None`` where it is empty or not a number."""
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(result) else result


def fmt(value: float | None) -> str:
    """4 significant digits, thousands separated from 10,000 on; an em dash for ``None``."""
    if value is None:
        return "—"
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


# ------------------------------------------------------------------------- the one-step benchmark


def step_rows(path: Path) -> list[dict[str, Any]] | None:
    """head_step CSV rows with ``time_x`` and ``memory_x`` recomputed against the plain
    cross-entropy row of the same N and CSV (``None`` where either is missing)."""
    rows = read_csv(path)
    if rows is None:
        return None
    plain = {r["num_classes"]: r for r in rows if r["method"] == REFERENCE}
    for r in rows:
        ref = plain.get(r["num_classes"], {})
        r["seconds"], r["mib"] = number(r.get("median_s")), number(r.get("peak_mib"))
        r["time_x"] = divide(r["seconds"], number(ref.get("median_s")))
        r["memory_x"] = divide(r["mib"], number(ref.get("peak_mib")))
    return rows


def head_label(head: str) -> str:
    """The readable label of a recipe head config name (``sparse_`` variants alike)."""
    return HEADS.get(head.removeprefix("sparse_"), head)


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
    if not any(r.get("device") == "cuda" for r in rows + (rows_1e7 or [])):
        lines += not_measured(
            "the same table on a GPU", "python -m benchmarks.head_step --device cuda"
        )
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


# ------------------------------------------------------------------------------ sampler timings


def section_sampling(inputs: Inputs) -> list[str]:
    lines = ["## 2. Sampling time and refresh time vs N (the MIDX paper's Figure 6)", ""]
    command = "python -m benchmarks.sampler_time --threads 1"
    rows = read_csv(inputs.benchmarks / "sampler_time.csv")
    if rows is None:
        return lines + not_measured("draw and refresh times", command)
    prov = Provenance()
    lines += [
        "Draw: M = 100 negatives with their log q for each of B = 256 queries, D = 64, MIDX "
        "K = 64 (fast mode); refresh: the MIDX index rebuild (faiss k-means), not part of the "
        f"draw, as in the paper. Median milliseconds, one thread. Command: `{command}`.",
        "",
    ]
    growth, refresh = [], []
    for measurement in ("draw", "refresh"):
        chosen = [r for r in rows if r["measurement"] == measurement]
        sizes = sorted({int(r["num_classes"]) for r in chosen})
        table = []
        for sampler in dict.fromkeys(r["sampler"] for r in chosen):
            cells = {int(r["num_classes"]): r for r in chosen if r["sampler"] == sampler}
            ms = [number(cells[n]["median_ms"]) if n in cells else None for n in sizes]
            keys = dict.fromkeys(prov.row(r) for r in cells.values())
            table.append([sampler, *(fmt(v) for v in ms), ", ".join(keys)])
            known = [(n, v) for n, v in zip(sizes, ms, strict=True) if v is not None]
            if measurement == "draw" and len(known) >= 2:
                growth.append(
                    f"{sampler} {known[-1][1] / known[0][1]:.2f}x from N = {size(known[0][0])} "
                    f"to {size(known[-1][0])}"
                )
            if measurement == "refresh" and known:
                refresh.append(f"{sampler} {known[-1][1] / 1000:.3g} s at N = {size(known[-1][0])}")
        columns = [measurement, *(f"N = {size(n)}" for n in sizes), "provenance"]
        lines += [f"{measurement.capitalize()} (ms):", "", *markdown_table(columns, table)]
    lines += [
        "The paper gives Figure 6 as a plot only (GPU, the same B, M and K), with MIDX's draw "
        "time nearly flat up to about 1e5 classes; there are no numbers to quote. Here the draw "
        "time changes "
        + ", ".join(growth)
        + "; a refresh takes "
        + ", ".join(refresh)
        + ". Why: a MIDX draw costs O(K D + K^2 + M K) per "
        "query whatever N, so only memory access grows with N; the refresh is k-means over the "
        "whole table, linear in N. The training-step and sequence-shape rows are in "
        f"{inputs.link(inputs.benchmarks / 'sampler_time.md') or 'sampler_time.md'}.",
        "",
        *prov.lines(),
        *inputs.plots(inputs.benchmarks / "sampler_time.png"),
    ]
    return lines


# -------------------------------------------------------------------------------- quality tables


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


def movielens_rows(recipes: Path) -> list[Quality]:
    rows = []
    for stem, model, head, source in ML1M_RUNS:
        for r in read_json(recipes / f"{stem}.json") or []:
            rows.append(
                Quality(
                    task=model,
                    head=head or r["head"],
                    epochs=int(r["epochs"]),
                    metric="test NDCG@10",
                    value=float(r["test/ndcg@10"]),
                    columns={
                        "test Recall@10": number(r.get("test/recall@10")),
                        **{
                            f"test {name}@50": number(r[f"test/{name.lower()}@50"])
                            for name in ("NDCG", "Recall")
                            if f"test/{name.lower()}@50" in r
                        },
                        "s / epoch": number(r.get("seconds/epoch")),
                    },
                    source=f"{source}; seed 0",
                )
            )
    return rows


def markdown_rows_after(text: str, header_start: str) -> list[list[str]]:
    """The cells of the first Markdown table whose header line starts with ``header_start``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(header_start):
            body = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                body.append([c.strip() for c in row.strip("|").split("|")])
            return body
    return []


def ptb_rows(inputs: Inputs) -> list[Quality]:
    """PTB LSTM validation perplexity after each epoch: the RESULTS.md table (saved only
    there) and CANE's metrics CSV."""
    text = inputs.results_md.read_text() if inputs.results_md.is_file() else ""
    rows = []
    labels = {"full softmax": "full", "uniform": "uniform", "MIDX-rq": "midx_rq"}
    for cells in markdown_rows_after(text, "| head | val ppl epoch 1 | epoch 2 | epoch 3 |"):
        head = labels.get(cells[0].split(",")[0])
        values = [number(c.replace(",", "")) for c in cells[1:4]]
        if head and None not in values:
            rows.append(ptb_row(head, values, f"{PTB} (TensorFlow convention); seed 0"))
    cane = read_csv(inputs.recipes / "lstm_ptb_cane_metrics.csv") or []
    values = [number(r["val/ppl"]) for r in cane if number(r.get("val/ppl")) is not None]
    if values:
        rows.append(ptb_row("cane", values, f"{PTB}, CANE paragraph (file of 701fac1); seed 0"))
    return rows


def ptb_row(head: str, values: list[float], source: str) -> Quality:
    return Quality(
        task="PTB LSTM",
        head=head,
        epochs=len(values),
        metric="val ppl",
        value=values[-1],
        columns={f"val ppl epoch {i + 1}": v for i, v in enumerate(values)},
        source=source,
    )


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


def missing_heads(have: set[str], task: str) -> str:
    """'Not run on TASK yet: ...' for the issue's heads not in ``have``; ``""`` if none."""
    missing = [HEADS[h] for h in ISSUE_HEADS if h not in have]
    return f"Not run on {task} yet: {', '.join(missing)}." if missing else ""


PTB_COMMAND = "python -m recipes.compare --config recipes/configs/lstm_ptb.yaml"
NEGATIVES_20 = "--model.init_args.head.init_args.num_negatives=20"


def ptb_test_row(r: dict[str, Any], task: str, stem: str) -> Quality:
    """A PTB ``recipes.compare`` row of ``recipes/results/<stem>.json`` as its test perplexity,
    with the best validation perplexity and the seconds per epoch beside it."""
    return Quality(
        task,
        r["head"],
        int(r["epochs"]),
        "test ppl",
        float(r["test/ppl"]),
        {
            "best val ppl": number(r.get("best val/ppl")),
            "s / epoch": number(r.get("seconds/epoch")),
        },
        f"recipes/results/{stem}.json; seed 0",
    )


def table4_rows(recipes: Path) -> list[Quality]:
    """Test perplexity of the Table 4 runs (:data:`PTB_TABLE4_RUNS`), one task per convention;
    the full softmax's row stands in every task that has sampled rows."""
    rows, full = [], []
    for stem, convention in PTB_TABLE4_RUNS:
        for r in read_json(recipes / f"{stem}.json") or []:
            row = ptb_test_row(r, PTB_CONVENTION_TASKS[convention], stem)
            (full if r["head"] == "full" else rows).append(row)
    tasks = list(dict.fromkeys(r.task for r in rows)) or [PTB_CONVENTION_TASKS["exact_positive"]]
    return [replace(f, task=task) for task in tasks for f in full] + rows


def table4_paragraph(rows: Sequence[Quality]) -> str:
    """The paper's four proposals ordered by test perplexity under each convention measured,
    beside the paper's order, and why the conventions part."""
    heads = ("uniform", "unigram", "midx_pq", "midx_rq")
    orders = []
    for name, task in PTB_CONVENTION_TASKS.items():
        found = sorted((r.value, r.head) for r in rows if r.task == task and r.head in heads)
        if len(found) > 1:
            order = " < ".join(f"{head_label(h)} {fmt(v)}" for v, h in found)
            orders.append(f"`{name}`: {order}")
    if not orders:
        return ""
    paper = sorted(heads, key=lambda h: float(PAPER_TABLE4[h]))
    return (
        "The proposals ordered by test perplexity under each convention (`exact_positive`, the "
        "default and the paper's Eq. 1: the positive uncorrected, accidental hits removed; "
        "`corrected_all`: every logit corrected by log(M q), hits kept; `tensorflow`: every "
        "logit corrected and hits removed, biased when a target is likely): "
        + "; ".join(orders)
        + "; the paper's: "
        + " < ".join(head_label(h) for h in paper)
        + ". Why: PTB's targets are Zipfian. When the positive is not corrected, a frequent word "
        "is pushed up as a positive at nearly every step and pushed down, with weight "
        "1 / (M q), only on the steps that draw it: unbiased, but with 20 draws of 10,000 "
        "classes so noisy that its logit runs away unless the proposal draws frequent words "
        "often (section 6 shows it for the uniform head at 100 negatives). Correcting the "
        "positive like the negatives damps exactly those words, and then the proposal's "
        "closeness to the softmax orders the heads."
    )


def sweep_lines(inputs: Inputs, prov: Provenance, table4: Sequence[Quality]) -> list[str]:
    """The paper's Figures 3 and 7: MIDX-rq's test perplexity against the codebook size and the
    number of negatives (:data:`PTB_SWEEPS`), the ``table4`` MIDX-rq row under
    :data:`PTB_SWEEP_CONVENTION` as the default point."""
    lines = []
    task = PTB_CONVENTION_TASKS[PTB_SWEEP_CONVENTION]
    reference = [r for r in table4 if r.task == task and r.head == "midx_rq"]
    full = [r for r in table4 if r.head == "full"][:1]
    versus = f" (the full softmax: {fmt(full[0].value)})" if full else ""
    convention = f"--model.init_args.head.init_args.convention={PTB_SWEEP_CONVENTION}"
    for prefix, setting, default, override in PTB_SWEEPS:
        points = {
            int(path.stem.removeprefix(prefix)): ptb_test_row(r, task, path.stem)
            for path in inputs.recipes.glob(f"{prefix}*.json")
            if path.stem.removeprefix(prefix).isdigit()
            for r in read_json(path) or []
        }
        if reference:
            points.setdefault(default, reference[0])
        command = (
            f"{PTB_COMMAND} --heads midx_rq --epochs 3 --seed 0 --out recipes/results/"
            f"{prefix}<value> -- {convention} "
            + ("" if override.endswith("num_negatives") else f"{NEGATIVES_20} ")
            + f"--model.init_args.{override}=<value>"
        )
        if len(points) < 2:
            lines += not_measured(f"MIDX-rq's test perplexity against the {setting}", command)
            continue
        table = [
            [
                v,
                r.epochs,
                fmt(r.value),
                fmt(r.columns["best val ppl"]),
                fmt(r.columns["s / epoch"]),
                prov.mark(r.source),
            ]
            for v, r in sorted(points.items())
        ]
        ends = [table[0], table[-1]]
        lines += [
            f"MIDX-rq against the {setting} ({PTB_SWEEP_CONVENTION} convention, the other "
            f"settings as in Table 4). Command: `{command}`.",
            "",
            *markdown_table(
                [setting, "epochs", "test ppl", "best val ppl", "s / epoch", "provenance"], table
            ),
            f"Test perplexity goes from {ends[0][2]} at {setting} = {ends[0][0]} to "
            f"{ends[1][2]} at {ends[1][0]}{versus}; the paper reports it falling as the "
            + ("codebook grows (Figure 3)." if "codebook" in setting else "draws grow (Figure 7)."),
            "",
        ]
    return lines


def section_ptb(inputs: Inputs) -> list[str]:
    lines = ["## 3. PTB, the MIDX paper's Table 4", ""]
    prov = Provenance()

    def paper(r: Quality | None) -> list[str]:
        if r is None:
            return ["paper test ppl", "paper vs full"]
        return [PAPER_TABLE4.get(r.head, "—"), ratio(paper_ratio(r))]

    def paper_ratio(r: Quality) -> float | None:
        return divide(number(PAPER_TABLE4.get(r.head)), number(PAPER_TABLE4["full"]))

    table4 = table4_rows(inputs.recipes)
    runs = [stem for stem, _ in PTB_TABLE4_RUNS]
    command = (
        f"{PTB_COMMAND} --heads <heads> --epochs 3 --seed 0 --out recipes/results/<file> -- "
        f"{NEGATIVES_20} --model.init_args.head.init_args.convention="
        "<exact_positive|corrected_all|tensorflow>"
    )
    if table4:
        epochs = sorted({r.epochs for r in table4})
        lines += [
            "Every head with 20 negatives per query and K = 32 (the paper's setting), "
            f"{' / '.join(map(str, epochs))} epochs, the best-validation checkpoint; test "
            "perplexity over the whole vocabulary, beside the paper's after up to 100 epochs "
            "with early stopping. CANE scores 20 classes too: 4 beam candidates against 16 "
            "noises. TAPAS picks its 20 shared negatives among 40 uniform presamples. Commands: "
            f"`{command}` for the sampled heads, the same without the overrides for `full`, "
            "and with `--model.init_args.head.init_args.num_candidates=4 "
            "--model.init_args.head.init_args.num_noise=16` for `cane`. The runs: "
            + ", ".join(f"`{stem}`" for stem in runs)
            + ".",
            "",
            *quality_table(table4, prov, paper),
            comparison_sentences(table4, paper_ratio, lower=True),
            "",
            table4_paragraph(table4),
            "",
            missing_heads({r.head for r in table4}, "PTB LSTM (Table 4 setting)"),
            "",
        ]
    else:
        lines += not_measured(
            "every head with 20 negatives and K = 32 at the same epochs (the paper's setting)",
            command,
        )
    rows = ptb_rows(inputs)
    if rows:
        lines += [
            "Earlier: three epochs, 100 negatives per query (TensorFlow convention), "
            "validation perplexity. Command: `python -m recipes fit --config "
            "recipes/configs/lstm_ptb.yaml --config recipes/configs/heads/<head>.yaml "
            "--trainer.max_epochs=3`.",
            "",
            *quality_table(rows, prov, paper),
            comparison_sentences(rows, paper_ratio, lower=True)
            + " Why: an adaptive proposal draws the negatives the model confuses with the target, "
            "so it needs fewer draws than a static one; with 100 negatives instead of the paper's "
            "20 and 3 epochs instead of up to 100, every head is nearer the full softmax here, so "
            "only the ordering compares.",
            "",
        ]
    lines += [
        "The paper's Table 5 (PTB LSTM, log perplexity as printed): MIDX-pq 4.8003, "
        "MIDX-Learn-pq 4.7320, MIDX-rq 4.7693, MIDX-Learn-rq 4.7212.",
        "",
        *sweep_lines(inputs, prov, table4),
        *prov.lines(),
        *inputs.plots(*(inputs.recipes / f"{stem}.png" for stem in runs)),
    ]
    return lines


def section_movielens(inputs: Inputs) -> list[str]:
    lines = ["## 4. MovieLens-1M, the MIDX paper's Table 7", ""]
    rows = movielens_rows(inputs.recipes)
    if not rows:
        return lines + not_measured(
            "SASRec and GRU4Rec on MovieLens-1M",
            "python -m recipes.compare --config recipes/configs/sasrec_ml-1m.yaml --heads full "
            "uniform midx_rq --epochs 10 --seed 0 --threads 1 --out recipes/results/sasrec_ml-1m",
        )
    prov = Provenance()

    def paper(r: Quality | None) -> list[str]:
        if r is None:
            return ["paper ML-10M N@10", "paper vs full", "paper N@50", "paper R@50"]
        theirs = PAPER_TABLE7.get(r.task, {}).get(r.head)
        if not theirs:
            return ["—", "—", "—", "—"]
        return [theirs[0], ratio(paper_ratio(r)), theirs[1], theirs[3]]

    def paper_ratio(r: Quality) -> float | None:
        table = PAPER_TABLE7.get(r.task, {})
        if r.head not in table:
            return None
        return divide(number(table[r.head][0]), number(table["full"][0]))

    lines += [
        "Test NDCG / Recall at 10 (and at 50 where the run logged it) ranking all 3,706 items, "
        "seen items excluded, leave-one-out, "
        "the best-validation checkpoint; 100 negatives per query unless the head says otherwise. "
        "Command: `python -m recipes.compare --config recipes/configs/<sasrec|gru4rec>_ml-1m.yaml "
        "--heads <heads> --epochs <epochs> --seed 0 --threads 1 --out recipes/results/<file>`. "
        "The paper's Table 7 has no MovieLens-1M rows: beside ours are its MovieLens-10M numbers "
        "(so compare the ratios to full softmax, not the values).",
        "",
        *quality_table(rows, prov, paper),
        comparison_sentences(rows, paper_ratio, lower=False)
        + " Why: with 3,707 classes, 100 negatives per query cover much of the catalogue, so "
        "every per-query head stays near the full softmax; heads that score fewer classes (shared "
        "negatives) or see few targets among their candidates (CANE) fall behind at equal epochs.",
        "",
        *(missing_heads({r.head for r in rows if r.task == m}, m) for m in PAPER_TABLE7),
        "",
        "The paper's Table 7, MovieLens-10M (N: NDCG, R: Recall):",
        "",
        *markdown_table(
            ["model", "sampler", "N@10", "N@50", "R@10", "R@50"],
            [
                [model, HEADS[h], *values]
                for model, table in PAPER_TABLE7.items()
                for h, values in table.items()
            ],
        ),
        *(
            []
            if any("test NDCG@50" in r.columns for r in rows)
            else not_measured(
                "NDCG@50 / Recall@50 (the MovieLens-1M configs log both cutoffs)",
                "python -m recipes.compare --config recipes/configs/gru4rec_ml-1m.yaml --heads "
                "full uniform unigram midx_pq midx_rq --epochs 10 --seed 0 --threads 1 --out "
                "recipes/results/gru4rec_ml-1m_table7",
            )
        ),
        *prov.lines(),
        *inputs.plots(
            inputs.recipes / "sasrec_ml-1m.png",
            inputs.recipes / "gru4rec_ml-1m.png",
            inputs.recipes / "sasrec_ml-1m_in_batch.png",
        ),
    ]
    return lines


# ---------------------------------------------------------------------------------------- GCIDE


def section_gcide(inputs: Inputs) -> list[str]:
    lines = ["## 5. GCIDE, 108,620 words: equal token budget and equal wall clock", ""]
    budgets: dict[str, list[tuple[dict[str, Any], str]]] = {"tokens": [], "time": []}
    for stem, budget, source in GCIDE_RUNS:
        for r in read_json(inputs.recipes / f"{stem}.json") or []:
            for b in budgets if budget == "both" else [budget]:
                budgets[b].append((r, source))
    if not any(budgets.values()):
        return lines + not_measured(
            "the GCIDE language model",
            "python -m recipes.compare --config recipes/configs/lstm_gcide.yaml --heads full "
            "sparse_midx_rq --max-time 8 --val-every 5000 --seed 0 --out "
            "recipes/results/gcide_time",
        )
    prov = Provenance()
    lines += [
        "Tied LSTM LM, 32 x 35 tokens a step, sampled heads on the sparse path with 20 "
        "negatives per token; exact perplexity over all words on the first 10,000 validation / "
        "test tokens, final weights; seed 0. Commands: "
        "`python -m recipes.compare --config recipes/configs/lstm_gcide.yaml --heads <heads> "
        "--max-steps 30` (equal tokens: what the full softmax trains in 8 minutes) or "
        "`--max-time 8` (equal wall clock), with `--val-every 5000 --seed 0 --out "
        "recipes/results/gcide_<tokens|time>`.",
        "",
    ]
    for budget, title in (("tokens", "Equal token budget"), ("time", "Equal wall clock")):
        runs = budgets[budget]
        full = next((r for r, _ in runs if r["head"] == "full"), None)
        table = [
            [
                head_label(r["head"]),
                r["steps"],
                fmt(number(r["train positions"])),
                fmt(number(r["positions/s"])),
                ratio(divide(number(r["positions/s"]), full and number(full["positions/s"]))),
                fmt(number(r["refresh s"])),
                fmt(number(r["peak RSS MB"])),
                fmt(number(r["val/ppl"])),
                fmt(number(r["test/ppl"])),
                ratio(divide(number(r["val/ppl"]), full and number(full["val/ppl"]))),
                prov.mark(source),
            ]
            for r, source in runs
        ]
        columns = ["head", "steps", "tokens", "tokens/s", "tokens/s vs full", "refresh s"]
        columns += ["peak RSS MB", "val ppl", "test ppl", "val ppl vs full", "provenance"]
        lines += [f"{title}:", "", *markdown_table(columns, table)]
        sampled = [r for r, _ in runs if r["head"] != "full"]
        if full and sampled:
            best = min(sampled, key=lambda r: float(r["val/ppl"]))
            rel = divide(number(best["val/ppl"]), number(full["val/ppl"]))
            lines += [
                f"{title}: the best sampled head, {head_label(best['head'])}, reaches "
                f"{ratio(rel)} of the full softmax's validation perplexity "
                f"({verdict(rel, lower_is_better=True)} it) at "
                f"{ratio(divide(number(best['positions/s']), number(full['positions/s'])))} "
                "its tokens per second.",
                "",
            ]
    have = {r["head"].removeprefix("sparse_") for runs in budgets.values() for r, _ in runs}
    lines += [
        "Why: the full softmax pays for 1,120 x 108,620 logits a step, so in equal time it sees "
        "a fraction of the tokens; at an equal (tiny) token budget the sampled heads have not yet "
        "learned the frequent words, which a log-uniform prior fixes (recipes/results/gcide.md).",
        "",
        missing_heads(have, "GCIDE") + " Peak RSS of heads run after another in one process "
        "includes what that process still held (gcide.md).",
        "",
        *prov.lines(),
        *inputs.plots(inputs.recipes / "gcide_time.png", inputs.recipes / "gcide_tokens.png"),
    ]
    return lines


# ------------------------------------------------------------------- convention, DDP, inference


#: recipe JSONs with both conventions of one head on the same code: file stem, model, the
#: metric (without its ``test/`` or ``best val/`` prefix) and whether lower is better
CONVENTION_RUNS = (
    ("sasrec_ml-1m_convention", "SASRec ML-1M", "ndcg@10", False),
    ("gru4rec_ml-1m_convention", "GRU4Rec ML-1M", "ndcg@10", False),
    ("lstm_ptb_convention", "PTB LSTM", "ppl", True),
)
CONVENTION_SOURCE = (
    "recipes/RESULTS.md, 'The two conventions side by side': TensorFlow's at 18661be, the "
    "default at f9f125d (MovieLens) or 18661be (PTB); the eager uniform path is the same in both"
)


def section_convention(inputs: Inputs) -> list[str]:
    """Both conventions of the uniform head on the same code and data: test and best validation
    metric, and the default's ratio to TensorFlow's."""
    lines = [
        "## 6. The sampled-softmax convention: TensorFlow's against the consistent default",
        "",
    ]
    table, sentences, missing = [], [], []
    prov = Provenance()
    for stem, model, metric, lower in CONVENTION_RUNS:
        rows = {r["convention"]: r for r in read_json(inputs.recipes / f"{stem}.json") or []}
        if "tensorflow" not in rows or "exact_positive" not in rows:
            missing.append(model)
            continue
        reference = number(rows["tensorflow"][f"test/{metric}"])
        for name in ("tensorflow", "exact_positive"):
            r = rows[name]
            table.append(
                [
                    model,
                    head_label(r["head"]),
                    name,
                    r["epochs"],
                    f"test {metric}",
                    fmt(number(r[f"test/{metric}"])),
                    fmt(number(r.get(f"best val/{metric}"))),
                    ratio(divide(number(r[f"test/{metric}"]), reference)),
                    prov.mark(f"{CONVENTION_SOURCE}; seed 0"),
                ]
            )
        rel = divide(number(rows["exact_positive"][f"test/{metric}"]), reference)
        sentences.append(
            f"On {model} the consistent default {verdict(rel, lower)} TensorFlow's convention "
            f"(test {metric} {ratio(rel)} of it)."
        )
    if table:
        lines += [
            "The uniform head, 100 negatives per query, with `convention=tensorflow` (every "
            "logit, the positive's too, corrected by log(M q)) and with the default "
            "`exact_positive` (the positive uncorrected); both mask accidental hits. Same code, "
            "data, epochs and seed. Command: `python -m recipes.compare --config "
            "recipes/configs/<model>.yaml --heads uniform --epochs <10 | 3 for PTB> --seed 0 "
            "--threads 1 -- --model.init_args.head.init_args.convention=<tensorflow|"
            "exact_positive>`.",
            "",
            *markdown_table(
                ["model", "head", "convention", "epochs", "metric", "test", "best val"]
                + ["vs TensorFlow's", "provenance"],
                table,
            ),
            " ".join(sentences),
            "",
            *prov.lines(),
        ]
    if missing:
        lines += not_measured(
            f"both conventions side by side on {', '.join(missing)}",
            "python -m recipes.compare --config recipes/configs/<model>.yaml --heads uniform "
            "--seed 0 --out recipes/results/<model>_convention -- "
            "--model.init_args.head.init_args.convention=<exact_positive|tensorflow>",
        )
    return lines


def section_ddp(inputs: Inputs) -> list[str]:
    lines = ["## 7. Two-process DDP on CPU (gloo)", ""]
    throughput = read_csv(inputs.benchmarks / "ddp_scaling.csv")
    equality = read_csv(inputs.benchmarks / "ddp_scaling_equality.csv")
    command = "python -m benchmarks.ddp_scaling"
    if not throughput or not equality:
        return lines + not_measured(
            "throughput of two processes against one, and equality of their metrics", command
        )
    prov = Provenance()
    columns = ["processes", "threads / process", "steps", "positions", "train s", "positions/s"]
    two = next(r for r in throughput if r["processes"] == "2")
    same_cores = next(
        r for r in throughput if r["processes"] == "1" and r["threads / process"] == "2"
    )
    worst = max(equality, key=lambda r: float(r["relative difference"]))
    return lines + [
        "SASRec on MovieLens-1M with the MIDX-rq head, one epoch from seed 0, each run a fresh "
        "process: one process with one thread, one with two, and two DDP processes with one "
        f"thread each and the recipe's batch each. Command: `{command}`.",
        "",
        *csv_table(throughput, [*columns, "vs 1 process x 1 thread", "test/ndcg@10"], prov),
        f"Two processes train {ratio(number(two['vs 1 process x 1 thread']))} the positions per "
        "second of one single-threaded process and "
        f"{ratio(divide(number(two['positions/s']), number(same_cores['positions/s'])))} those "
        "of one process on both cores. Their test NDCG@10 differs because each step sees twice "
        "the positions (half the steps per epoch), not because of DDP. The same weights "
        "evaluated by one and by two processes (the evaluation sets split without padding, "
        "metric states summed): the largest relative difference over every validation and test "
        f"metric, both ways, is {fmt(number(worst['relative difference']))} "
        f"({worst['metric']}); every metric in "
        f"{inputs.link(inputs.benchmarks / 'ddp_scaling_equality.md')}.",
        "",
        *prov.lines(),
    ]


def csv_table(rows: list[dict[str, str]], columns: Sequence[str], prov: Provenance) -> list[str]:
    """The chosen columns of CSV rows (numbers to 4 digits) and each row's provenance."""
    return markdown_table(
        [*columns, "provenance"],
        [
            [r[c] if number(r[c]) is None else fmt(number(r[c])) for c in columns] + [prov.row(r)]
            for r in rows
        ],
    )


def adaptive_synthetic(rows: list[dict[str, str]], prov: Provenance) -> list[str]:
    """Mean gain over the dimensions per dataset, beside the paper's Figure 1 average."""
    table, sentences = [], []
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        chosen = [r for r in rows if r["dataset"] == dataset]
        gains = [float(r["mean_gain"]) for r in chosen]
        mean = sum(gains) / len(gains)
        theirs = PAPER_FIGURE1_GAIN.get(dataset)
        keys = ", ".join(dict.fromkeys(prov.row(r) for r in chosen))
        success = min(float(r["success_rate"]) for r in chosen)
        table.append([dataset, len(chosen), ratio(mean), fmt(success), f"{theirs}x", keys])
        rel = divide(mean, number(theirs))
        sentences.append(
            f"dataset {dataset}: {ratio(mean)} against the paper's {theirs}x "
            f"({verdict(rel)} it; {ratio(gains[0])} at d = {chosen[0]['d']}, {ratio(gains[-1])} "
            f"at d = {chosen[-1]['d']})"
        )
    columns = ["dataset", "dimensions", "mean gain", "lowest success rate", "paper"]
    return [
        "Synthetic data of the AdaptiveSoftmax paper's Figure 1 (n = 100, eps 0.3, delta 0.1): "
        "gain in samples over brute force, averaged over the dimensions d. Command: `python -m "
        "benchmarks.adaptive_softmax`. Seeds: a fresh instance per trial.",
        "",
        *markdown_table([*columns, "provenance"], table),
        "Mean gain: " + "; ".join(sentences) + ". The paper's caption says the sample count of "
        "(a) scales with d, which would keep its gain flat; where ours grows with d on (a), the "
        "benchmark's notes do not say why.",
        "",
    ]


def section_adaptive_softmax(inputs: Inputs) -> list[str]:
    lines = ["## 8. AdaptiveSoftmax, and the proposal distribution on the trained PTB model", ""]
    prov = Provenance()
    synthetic = read_csv(inputs.benchmarks / "adaptive_softmax_synthetic.csv")
    if synthetic:
        lines += adaptive_synthetic(synthetic, prov)
    else:
        lines += not_measured("AdaptiveSoftmax on synthetic data", "make bench-full")
    trained = read_csv(inputs.benchmarks / "adaptive_softmax_trained.csv")
    if trained:
        columns = ["d", "delta", "cal_mean_gain", "cal_success_rate", "uncal_mean_gain"]
        lines += [
            "On the trained PTB LSTM head (the paper's Tables 1 and 2 setting): full softmax, "
            "1 epoch, seed 0. Command: `python -m benchmarks.adaptive_softmax_trained`.",
            "",
            *csv_table(trained, [*columns, "uncal_success_rate", "test_ppl"], prov),
        ]
    wall = read_csv(inputs.benchmarks / "adaptive_softmax_wallclock.csv")
    if wall:
        columns = ["variant", "n", "d", "batch", "dense_ms_per_query", "adaptive_ms_per_query"]
        lines += [
            "Wall clock against a dense softmax top-1 on random data (a nearly flat softmax, "
            "where the bandit reads nearly all of the matrix). Command: `python -m "
            "benchmarks.adaptive_softmax`.",
            "",
            *csv_table(wall, [*columns, "slowdown"], prov),
        ]
    lines += [
        *proposal_lines(inputs, prov),
        *prov.lines(),
        *inputs.plots(
            inputs.benchmarks / "adaptive_softmax_synthetic.png",
            inputs.recipes / f"{PROPOSAL_RUN}_proposal.png",
        ),
    ]
    return lines


def proposal_lines(inputs: Inputs, prov: Provenance) -> list[str]:
    """KL(softmax || MIDX-rq proposal) after each epoch of the Table 4 MIDX-rq run, logged by
    ``SamplerDiagnostics``; its last cumulative-probability plot is linked below the section."""
    rows = read_json(inputs.recipes / f"{PROPOSAL_RUN}.json") or []
    kl = [
        (t["epoch"], v)
        for r in rows
        for t in r.get("training", [])
        for k, v in t.items()
        if k.endswith("/kl")
    ]
    command = (
        f"{PTB_COMMAND} --heads midx_rq --epochs 3 --seed 0 --out recipes/results/{PROPOSAL_RUN} "
        f"-- {NEGATIVES_20} --config recipes/configs/diagnostics.yaml "
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger "
        "--trainer.logger.init_args.save_dir=<dir>"
    )
    if not kl or not (inputs.recipes / f"{PROPOSAL_RUN}_proposal.png").is_file():
        return not_measured(
            "the proposal-distribution plot (the MIDX paper's Figures 4 and 5) on the trained "
            "PTB model",
            command,
        )
    source = prov.mark(f"recipes/results/{PROPOSAL_RUN}.json; seed 0")
    return [
        "The MIDX-rq proposal against the softmax it stands in for (the MIDX paper's Figures 4 "
        "and 5), on 64 fixed validation positions of the Table 4 MIDX-rq run (default "
        "convention): classes in decreasing softmax probability, the cumulative mass of the "
        "softmax and of the proposal, computed exactly from `log_prob` (the paper estimates it "
        "from 5e8 draws). Command (the plots land in `<dir>/lightning_logs/version_0/"
        f"sampler_diagnostics/`): `{command}`.",
        "",
        *markdown_table(
            ["epoch", "KL(softmax, proposal)", "provenance"],
            [[epoch + 1, fmt(value), source] for epoch, value in kl],
        ),
        f"After epoch {kl[-1][0] + 1} the KL is {fmt(kl[-1][1])} nats per query. Beside the "
        "paper: its Figure 5, on embeddings trained to convergence, shows MIDX-rq the closest "
        "of its samplers to the softmax; this model is 3 epochs into a run under the default "
        "convention, which trains it poorly on PTB (section 3), so the comparison is of shape "
        "only. The paper's Table 5 'KL-loss' (1.5551 for MIDX-rq) is defined as log sum p^2 / "
        "p' (an order-2 Renyi divergence), not this KL, so the numbers do not compare.",
        "",
    ]


# ---------------------------------------------------------------------------------- the headline


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
    if not rows and not quality:
        return lines + not_measured("any head", "make bench")
    methods = [base_method(r["method"]) for r in rows if r["method"] != REFERENCE]
    known = {STEP_TO_HEAD.get(m, m) for m in methods}
    methods += [q.head for q in quality if q.head not in known]
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
        "provenance",
    ]
    lines += [
        "One training step (section 1) at the largest N where plain cross-entropy ran beside the "
        "head, as ratios to plain `F.cross_entropy(z @ W.T)` in the same run (time / memory; "
        "dense gradient / `sparse_grad=True`), and quality as a ratio to full softmax trained "
        "for the same epochs on the same task (sections 3 and 4; the most epochs measured). "
        "Command: `make report` (after `make bench`).",
        "",
        *markdown_table(columns, table),
        *prov.lines(),
    ]
    return lines


def other_measurements(inputs: Inputs) -> list[str]:
    others = [
        inputs.link(p)
        for p in sorted(inputs.benchmarks.glob("*.md"))
        if p.stem not in USED_BENCHMARKS and p.resolve() != inputs.out.resolve()
    ]
    if not others:
        return []
    return [
        "## Other measurements",
        "",
        "Reproductions of the TAPAS, CANE and One-vs-Each papers and the optimizer benchmarks, "
        "each with its command: " + ", ".join(others) + ".",
        "",
    ]


def build_report(inputs: Inputs) -> str:
    """The whole report as Markdown."""
    lines = [
        "# Report: speed, memory and quality of every head, the papers and the peers",
        "",
        "Generated by `python -m benchmarks.report` (`make report`) from the result files; "
        "edit those, not this file. Ratios are computed here from the rows' own numbers. The "
        "machine of every row is the project's 2-core CPU machine, shared with other jobs, so "
        "seconds compare within one run only.",
        "",
    ]
    sections = [
        section_headline(inputs),
        section_speed(inputs),
        section_sampling(inputs),
        section_ptb(inputs),
        section_movielens(inputs),
        section_gcide(inputs),
        section_convention(inputs),
        section_ddp(inputs),
        section_adaptive_softmax(inputs),
        other_measurements(inputs),
    ]
    text = "\n".join(line for section in sections for line in [*section, ""])
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return "\n".join(lines) + "\n" + text.strip() + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--benchmarks", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--recipes", type=Path, default=ROOT / "recipes" / "results")
    parser.add_argument("--results-md", type=Path, default=ROOT / "recipes" / "RESULTS.md")
    parser.add_argument("--out", type=Path, default=None, help="default: BENCHMARKS/REPORT.md")
    args = parser.parse_args(argv)
    out = args.out or args.benchmarks / "REPORT.md"
    inputs = Inputs(args.benchmarks, args.recipes, args.results_md, out)
    out.write_text(build_report(inputs))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
