"""The README's copy of the report's headline table, kept in step by ``make report``.

The README marks the copy with two HTML comments, :data:`START` and :data:`END`; everything
between them is replaced by the headline table of the report, without its provenance column (the
README links the report, where the provenance notes are).
"""

from __future__ import annotations

from pathlib import Path

START = "<!-- headline: copied from benchmarks/results/REPORT.md by make report -->"
END = "<!-- /headline -->"


def headline_table(report: str) -> list[str]:
    """The Markdown table lines of the report's ``## Headline`` section, provenance column
    dropped."""
    section = report.split("## Headline", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    if not rows:
        raise ValueError("the report's Headline section has no table")
    cells = [line.strip("|").split("|") for line in rows]
    keep = [i for i, c in enumerate(cells[0]) if c.strip() != "provenance"]
    return ["|" + "|".join(row[i] for i in keep) + "|" for row in cells]


def sync_readme(readme: Path, report: str) -> bool:
    """Replaces the table between the markers of ``readme``; returns whether the file changed.

    Raises:
        ValueError: the markers are missing or out of order, or the report has no headline table.
    """
    text = readme.read_text()
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{readme} has no {START!r} ... {END!r} block")
    head, tail = text[: start + len(START)], text[end:]
    updated = head + "\n" + "\n".join(headline_table(report)) + "\n" + tail
    readme.write_text(updated)
    return updated != text
