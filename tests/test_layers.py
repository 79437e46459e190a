"""The package's folders import each other as ``docs/architecture.md``'s layout table says, both
ways, and without a cycle."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_sampled"
DOC = ROOT / "docs" / "architecture.md"


def unit_of(path: Path) -> str:
    """The layer a module belongs to: its folder under the package, or the top-level module."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_units(path: Path) -> set[str]:
    """The package's layers that the module at ``path`` imports (relative or absolute)."""
    package = list(path.relative_to(PACKAGE).parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            if node.module:
                found.add((base + node.module.split("."))[0])
            else:
                found.update((base + [alias.name])[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "lightning_sampled."
        ):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(
                a.name.split(".")[1] for a in node.names if a.name.startswith("lightning_sampled.")
            )
    return found


def actual_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__init__.py" and path.parent == PACKAGE:
            continue
        unit = unit_of(path)
        graph.setdefault(unit, set()).update(imported_units(path) - {unit})
    return graph


def documented_graph() -> dict[str, set[str]]:
    """``{layer: layers it may import}`` from the rows of the layout table that name package
    paths; the last column's backticked names are the layers."""
    graph = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) != 3 or not cells[0].startswith("`lightning_sampled/"):
            continue
        deps = set(re.findall(r"`([a-z_]+)`", cells[2]))
        for path in re.findall(r"`(?:lightning_sampled/)?([a-z_]+)(?:/|\.py)`", cells[0]):
            graph[path] = deps
    return graph


LEAVES = {"_validation", "_class_ids", "_random", "_deprecation"}


def test_the_layout_table_lists_every_layer():
    assert set(actual_graph()) == set(documented_graph())


@pytest.mark.parametrize("unit", sorted(actual_graph()))
def test_imports_match_the_layout_table(unit):
    """Leaf helpers may be used anywhere; any other import between layers is in the table, and
    the table lists no layer that is not imported."""
    actual = actual_graph()[unit] - LEAVES
    assert actual == documented_graph()[unit]


def test_layers_import_each_other_without_a_cycle():
    graph = actual_graph()
    done: set[str] = set()

    def visit(unit: str, path: tuple[str, ...]) -> None:
        assert unit not in path, f"import cycle: {' -> '.join((*path, unit))}"
        if unit in done:
            return
        for dep in graph.get(unit, ()):
            visit(dep, (*path, unit))
        done.add(unit)

    for unit in graph:
        visit(unit, ())
