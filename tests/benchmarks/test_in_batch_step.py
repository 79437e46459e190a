"""benchmarks.in_batch_step at tiny sizes: both builders timed at every size and head, the
ratios against the distinct builder of the same rounds, and the builders' losses compared."""

import csv

import pytest
import torch

from benchmarks import in_batch_step


def test_main_times_both_builders_at_every_size(tmp_path):
    name = str(tmp_path / "ibs")
    argv = ["--positions", "40", "90", "--classes", "300", "--dim", "8", "--repeats", "2"]
    rows = in_batch_step.main([*argv, "--name", name, "--device", "cpu"])
    assert [(r["positions"], r["head"], r["candidates"]) for r in rows] == [
        (t, h, c) for t in (40, 90) for h in ("in_batch", "mixed") for c in ("sorted", "distinct")
    ]
    for row in rows:
        assert row["median_ms"] > 0
        if row["candidates"] == "distinct":
            assert row["vs_distinct"] == 1.0
            assert row["logit_columns"] == row["distinct_targets"] < row["positions"]
        else:
            assert row["logit_columns"] == row["positions"]
    with open(name + ".csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert "torch.unique" in open(name + ".md").read()


def test_builders_that_disagree_are_refused():
    heads = {b: in_batch_step.make_head(50, 4, 0, b) for b in in_batch_step.BUILDERS}
    assert torch.equal(heads["sorted"].weight, heads["distinct"].weight)
    z, target = torch.randn(12, 4), torch.tensor([1, 1, 1, 2, 3, 3, 4, 5, 6, 6, 6, 7])
    in_batch_step.check_same_loss(heads, z, target)
    with torch.no_grad():
        heads["sorted"].weight[1] += 1.0  # another table: another loss
    with pytest.raises(RuntimeError, match="builders disagree"):
        in_batch_step.check_same_loss(heads, z, target)
