"""Section 11: time to quality per recipe (issue 31, item 3).

Reads ``benchmarks/results/recipe_time_to_quality/recipe_time_to_quality.md``, written with its
CSVs and one plot per recipe by ``python -m benchmarks.recipe_time_to_quality`` (or ``--report``,
from ``step_time.csv``), and carries its provenance, tables and sources over, the plots as links.
"""

from __future__ import annotations

from .common import Inputs, not_measured

COMMAND = (
    "OMP_NUM_THREADS=1 python -m benchmarks.recipe_time_to_quality --rounds 5 --threads 1 "
    "--budget-s 1380 --background TEXT"
)


def section_time_to_quality(inputs: Inputs) -> list[str]:
    """The benchmark's Markdown, headings one level down, and links to its CSVs and plots."""
    folder = inputs.benchmarks / "recipe_time_to_quality"
    lines = [
        "## 11. Time to quality per recipe, on a time axis measured side by side (issue 31)",
        "",
    ]
    source = folder / "recipe_time_to_quality.md"
    if not source.is_file():
        return [*lines, *not_measured("the recipes' time to quality", COMMAND)]
    text = source.read_text().splitlines()
    body = [line for line in text[1:] if not line.startswith("![")]
    lines += [
        "Recorded validation curves (`recipes/results/*.json`) against training seconds from "
        f"one round-robin timing run (`{COMMAND}`). Source: "
        + ", ".join(
            link
            for link in (
                inputs.link(source),
                inputs.link(folder / "step_time.csv"),
                inputs.link(folder / "curves.csv"),
            )
            if link
        )
        + ".",
        "",
        *(line.replace("## ", "### ", 1) if line.startswith("## ") else line for line in body),
        "",
        *inputs.plots(*sorted(folder.glob("*.png"))),
    ]
    return lines
