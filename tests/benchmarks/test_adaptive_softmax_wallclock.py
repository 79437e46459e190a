"""benchmarks.adaptive_softmax_wallclock at small shapes: every regime timed at batch 1 and 64
against the dense top-1, its peaked queries as peaked as named, the lines counted within A, and
the targets read from the rows."""

import csv

import pytest
import torch

from benchmarks import adaptive_softmax_wallclock as wallclock


def test_peaked_queries_have_the_named_top_probability():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(500, 64, generator=g) / 8
    x = wallclock.peaked_queries(weight, 6, g)
    top = torch.softmax(x @ weight.T, dim=1).amax(1)
    torch.testing.assert_close(
        top, torch.full((6,), wallclock.PEAKED_TOP_PROBABILITY), atol=1e-4, rtol=0
    )


def test_main_times_every_regime_and_writes_its_targets(tmp_path):
    name = str(tmp_path / "wc")
    rows = wallclock.main(["--quick", "--name", name, "--success-queries", "32"])
    assert [(r["case"], r["batch"]) for r in rows] == [
        ("flat", 1), ("flat", 64), ("peaked", 1), ("peaked", 64), ("paper (b)", 1),
        ("paper (b)", 64),
    ]  # fmt: skip
    for row in rows:
        assert row["dense_ms_per_query"] > 0 and row["adaptive_ms_per_query"] > 0
        assert 0.0 <= row["dense_share"] <= 1.0 and row["entries"] > 0
        assert row["success"] >= 1 - wallclock.DELTA
        if row["batch"] == 1:
            assert 0.0 < row["cache_lines"] <= 1.0
    flat = [r for r in rows if r["case"] == "flat"]
    assert all(r["dense_share"] == 1.0 for r in flat), "random queries fall back"
    paper = [r for r in rows if r["case"] == "paper (b)"]
    assert paper[0]["dense_share"] == 0.0 and paper[0]["entries"] < 0.5, "sampled, with a gain"
    assert paper[0]["cache_lines"] < 1.0
    with open(name + ".csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    text = open(name + ".md").read()
    assert "## Targets (issue 55)" in text


@pytest.mark.parametrize(("vs_dense", "verdict"), [(1.1, "met"), (1.3, "NOT met")])
def test_targets_hold_the_flat_rows_to_1_2_and_the_wide_peaked_ones_to_1(vs_dense, verdict):
    def row(case, d, batch, ratio, success=0.95):
        return dict(case=case, n=10, d=d, batch=batch, vs_dense=ratio, success=success, queries=9)

    text = wallclock.targets(
        [row("flat", 64, 64, vs_dense), row("peaked", 1024, 1, vs_dense), row("peaked", 64, 1, 9)]
    )
    ratio = f"adaptive / dense = {vs_dense:.2f}"
    assert f"flat, (n, d) = (10, 64), batch 64: {ratio} (target <= 1.2): {verdict}" in text
    peaked = "met" if vs_dense <= 1.0 else "NOT met"
    assert f"peaked, (n, d) = (10, 1024), batch 1: {ratio} (target <= 1.0): {peaked}" in text
    assert "(10, 64), batch 1: adaptive" not in text  # a narrow peaked head has no time target
    assert text.count("success 0.950 over 9 queries (target >= 0.9): met") == 2
