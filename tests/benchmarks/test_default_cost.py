"""benchmarks.default_cost at tiny shapes: both heads timed at every shape, the ratio against the
plain head of the same rounds, and the two heads the configurations they are named for."""

import csv

import torch

from benchmarks import default_cost


def test_main_times_the_default_and_the_plain_head_at_every_shape(tmp_path, monkeypatch):
    tiny = {
        "dense": default_cost.Shape("tiny", 60, 300, 8, 5, False),
        "sparse": default_cost.Shape("tiny_sparse", 40, 2_000, 8, 3, True),
    }
    monkeypatch.setattr(default_cost, "SHAPES", tiny)
    name = str(tmp_path / "dc")
    argv = ["--shapes", "dense", "sparse", "--limits", "8", "50", "--repeats", "2"]
    rows = default_cost.main([*argv, "--device", "cpu", "--name", name])
    assert [(r["recipe"], r["head"]) for r in rows] == [  # a limit at or above T is not timed
        ("tiny", "default"), ("tiny", "plain"), ("tiny", "default 8"), ("tiny", "default 50"),
        ("tiny_sparse", "default"), ("tiny_sparse", "plain"), ("tiny_sparse", "default 8"),
    ]  # fmt: skip
    for row in rows:
        assert row["median_ms"] > 0 and 0 < row["distinct_targets"] <= row["positions"]
        if row["head"] == "plain":
            assert row["vs_plain"] == 1.0
    with open(name + ".csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert "in_batch_negatives=False" in open(name + ".md").read()


def test_the_heads_are_the_default_and_the_plain_configuration():
    shape = default_cost.Shape("tiny", 6, 30, 4, 2, True)
    default = default_cost.make_head(shape, default_cost.HEADS["default"])
    plain = default_cost.make_head(shape, default_cost.HEADS["plain"])
    assert default.in_batch_setting == "auto" and plain.in_batch_setting is False
    assert default.sparse_grad and torch.equal(default.weight, plain.weight)
    limited = default_cost.heads_of(shape, [3, 6])
    assert list(limited) == ["default", "plain", "default 3"]
    assert limited["default 3"].max_in_batch_draws == 3
    assert limited["default"].max_in_batch_draws is None


def test_the_whole_block_variant_lifts_the_block_bound_for_its_step_only(tmp_path, monkeypatch):
    """``--whole-block`` times the default with no bound on a block of rows (one block, no
    checkpointing), and puts the bound back after each of its steps."""
    from lightning_sampled.ops import chunked

    tiny = {"dense": default_cost.Shape("tiny", 60, 300, 8, 5, False)}
    monkeypatch.setattr(default_cost, "SHAPES", tiny)
    monkeypatch.setattr(chunked, "MAX_BLOCK_ELEMENTS", 500)  # the default then takes blocks
    seen = []
    original = chunked.positions_per_block
    monkeypatch.setattr(
        chunked,
        "positions_per_block",
        lambda *a: seen.append(chunked.MAX_BLOCK_ELEMENTS) or original(*a),
    )
    argv = ["--shapes", "dense", "--limits", "--whole-block", "--repeats", "2"]
    rows = default_cost.main([*argv, "--name", str(tmp_path / "dc")])
    assert [r["head"] for r in rows] == ["default", "plain", "default, one block"]
    assert set(seen) == {500, 2**62} and chunked.MAX_BLOCK_ELEMENTS == 500
    assert "--whole-block" in (tmp_path / "dc.md").read_text()
