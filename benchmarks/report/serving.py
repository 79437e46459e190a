"""Section 12: serving top-k, CANE's beam search beside faiss (issue 35).

Reads ``benchmarks/results/cane_topk.md`` (planted clusters, and CANE's training step) and
``cane_topk_trained.md`` (trained class tables with their real queries), written with their CSVs
by ``python -m benchmarks.cane_topk`` and ``python -m benchmarks.cane_topk_trained``, and carries
their tables, targets, machine, command and load over, up to the load line (the methods' long
descriptions stay in the sources).
"""

from __future__ import annotations

from .common import Inputs, not_measured

#: (file stem, what it measures, the command that writes it)
SOURCES = (
    (
        "cane_topk",
        "Planted clusters, and CANE's training step",
        "python -m benchmarks.cane_topk --threads 1 --repeats 7",
    ),
    (
        "cane_topk_trained",
        "Trained class tables (GCIDE's LSTM, SASRec on MovieLens-1M)",
        "nice -n 10 python -m benchmarks.cane_topk_trained --threads 1",
    ),
)


def section_serving(inputs: Inputs) -> list[str]:
    """Each source's Markdown from its first table through its load line, headings moved down."""
    lines = ["## 12. Serving top-k: CANE's beam search beside faiss (issue 35)", ""]
    lines += [
        "Recall@10 of the exact top-10 and queries per second on one CPU thread, "
        "`CaneHead.beam_topk` (from the level scored whole, its default, and from the root) "
        "beside faiss `IndexIVFFlat` and `IndexHNSWFlat`, on the same tables and queries.",
        "",
    ]
    for stem, what, command in SOURCES:
        source = inputs.benchmarks / f"{stem}.md"
        lines += [f"### {what}", ""]
        if not source.is_file():
            lines += not_measured(what.lower(), command)
            continue
        text = source.read_text().splitlines()
        first = next(i for i, line in enumerate(text) if line.startswith("| "))
        last = next(i for i, line in enumerate(text) if line.startswith("Load average"))
        body = text[first : last + 1]
        lines += [
            f"Source: {inputs.link(source)}, {inputs.link(inputs.benchmarks / f'{stem}.csv')}.",
            "",
            *(line.replace("## ", "#### ", 1) if line.startswith("## ") else line for line in body),
            "",
        ]
    return lines
