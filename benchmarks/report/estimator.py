"""Section 10: the default estimator convention, cell by cell (issue 31).

Reads ``benchmarks/results/estimator_grid/estimator_grid.md``, written with its CSV and plot by
``python -m benchmarks.estimator_grid`` (on a GPU machine) or ``--report`` (from the CSV), and
carries its provenance, tables and verdicts over unchanged.
"""

from __future__ import annotations

from .common import Inputs, not_measured

COMMAND = (
    "python -m benchmarks.estimator_grid --data .gpu_data --out benchmarks/results/estimator_grid"
)


def section_estimator(inputs: Inputs) -> list[str]:
    """The grid's provenance and tables, and links to its CSV and plot."""
    folder = inputs.benchmarks / "estimator_grid"
    lines = ["## 10. The default estimator convention, cell by cell (issue 31)", ""]
    grid = folder / "estimator_grid.md"
    if not grid.is_file():
        return [*lines, *not_measured("the grid of conventions", COMMAND)]
    text = grid.read_text().splitlines()
    first_table = next(i for i, line in enumerate(text) if line.startswith("### "))
    provenance = [line for line in text[:first_table] if line.startswith("- ")]
    tables = text[first_table:]
    lines += [
        "Which convention `SampledSoftmaxHead` defaults to: each cell (task x proposal x "
        "negatives per query or shared) trained under each convention, several seeds, on a GPU "
        "or, where its task's line says so, on the CPU "
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
    return lines
