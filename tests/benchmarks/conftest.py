"""The report tests' input folders."""

from pathlib import Path

import pytest

from benchmarks import report


@pytest.fixture
def dirs(tmp_path: Path) -> report.Inputs:
    (tmp_path / "bench").mkdir()
    (tmp_path / "recipes").mkdir()
    out = tmp_path / "bench" / "REPORT.md"
    return report.Inputs(tmp_path / "bench", tmp_path / "recipes", tmp_path / "RESULTS.md", out)
