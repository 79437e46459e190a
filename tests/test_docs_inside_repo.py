"""The project documents itself: README, docstrings, recipes and benchmarks point to files inside
the repository (the architecture page is ``docs/architecture.md``), never to folders beside it."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"\.\./shared|shared/DESIGN|FIELD-NOTES")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".toml"}


def project_texts():
    yield ROOT / "README.md"
    for folder in ("lightning_sampled", "recipes", "benchmarks", "docs"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in SUFFIXES and path.is_file():
                yield path


def test_no_reference_leaves_the_repository():
    offenders = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in project_texts()
        for match in OUTSIDE.finditer(path.read_text(errors="replace"))
    ]
    assert not offenders


def test_the_architecture_page_names_existing_modules():
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()
    modules = set(re.findall(r"`((?:heads|samplers|index|inference)/\w+\.py)`", page))
    assert modules
    missing = [m for m in modules if not (ROOT / "lightning_sampled" / m).is_file()]
    assert not missing
