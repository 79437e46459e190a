"""Section 10: the default estimator convention, cell by cell (issue 31).

Reads ``benchmarks/results/estimator_grid/estimator_grid.md``, written with its CSV and plot by
``python -m benchmarks.estimator_grid`` (on a GPU machine) or ``--report`` (from the CSV), and
carries its provenance, tables and verdicts over unchanged; then the large catalog's levers
(issue 31, item 4: ``benchmarks/results/large_catalog_levers*/large_catalog.md``, written by
``python -m benchmarks.large_catalog``), carried the same way.
"""

from __future__ import annotations

from .common import Inputs, not_measured

COMMAND = (
    "python -m benchmarks.estimator_grid --data .gpu_data --out benchmarks/results/estimator_grid"
)
#: the large catalog's runs of the levers: 100 negatives per query, then 355
LEVERS = ("large_catalog_levers", "large_catalog_levers_355")
LEVERS_COMMAND = (
    "OMP_NUM_THREADS=1 python -m benchmarks.large_catalog --out benchmarks/results/"
    "large_catalog_levers --methods full uniform midx_rq mixed frequency in_batch mixed_midx "
    "--conventions corrected_all"
)


def section_estimator(inputs: Inputs) -> list[str]:
    """The grid's provenance and tables, and links to its CSV and plot."""
    folder = inputs.benchmarks / "estimator_grid"
    lines = ["## 10. The default estimator convention, cell by cell (issue 31)", ""]
    grid = folder / "estimator_grid.md"
    if not grid.is_file():
        return [*lines, *not_measured("the grid of conventions", COMMAND), *levers_part(inputs)]
    text = grid.read_text().splitlines()
    first_table = next(i for i, line in enumerate(text) if line.startswith("### "))
    provenance = [line for line in text[:first_table] if line.startswith("- ")]
    tables = text[first_table:]
    lines += [
        "Which configuration `SampledSoftmaxHead` defaults to: each cell (task x proposal x "
        "negatives per query or shared) trained under each convention and, as "
        "`corrected_all+batch`, under `corrected_all` with the batch's other targets as further "
        'negatives, the default configuration since issue 31 (`in_batch_negatives="auto"`); '
        "several seeds, on a GPU or, where its task's line says so, on the CPU "
        f"(`{COMMAND}`; how it ran: `recipes/RESULTS.md`, 'The default estimator, cell by "
        "cell'). Source: "
        + inputs.link(grid)
        + ", "
        + inputs.link(folder / "estimator_grid.csv")
        + ".",
        "",
        *provenance,
        "",
        *(line.replace("### ", "#### ", 1) for line in tables),
        "",
        *inputs.plots(folder / "estimator_grid.png"),
    ]
    return lines + levers_part(inputs)


def levers_part(inputs: Inputs) -> list[str]:
    """The large catalog's levers: each run's setup, table and verdicts, headings demoted."""
    lines = ["### Large catalog at equal steps: what closes the gap (issue 31, item 4)", ""]
    pages = [inputs.benchmarks / name / "large_catalog.md" for name in LEVERS]
    pages = [page for page in pages if page.is_file()]
    if not pages:
        return [*lines, *not_measured("the large catalog's levers", LEVERS_COMMAND)]
    lines += [
        "200,000 clustered classes with Zipfian targets, 300 steps of 256: each sampled "
        "configuration's exact NDCG@10 as a ratio to the full softmax's of the same seed "
        f"(`{LEVERS_COMMAND}`, and the same with `--negatives 355`; `recipes/RESULTS.md`, "
        "'What closes the large catalog's gap'). Sources: "
        + ", ".join(inputs.link(page) for page in pages)
        + ".",
        "",
    ]
    for page in pages:
        text = page.read_text().splitlines()
        lines += [f"#### {page.parent.name}", ""]
        lines += [
            line.replace("## ", "##### ", 1) if line.startswith("## ") else line
            for line in text[1:]
        ]
        lines.append("")
    return lines
