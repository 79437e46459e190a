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
        ("tiny", "products"), ("tiny_sparse", "default"), ("tiny_sparse", "plain"),
        ("tiny_sparse", "default 8"), ("tiny_sparse", "products"),
    ]  # fmt: skip
    for row in rows:
        assert row["median_ms"] > 0 and 0 < row["distinct_targets"] <= row["positions"]
        if row["head"] == "plain":
            assert row["vs_plain"] == 1.0
    with open(name + ".csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    text = open(name + ".md").read()
    assert "in_batch_negatives=False" in text and "## Targets (issue 52)" in text
    assert text.count(", time: (default - plain) / products = ") == 2  # one per shape
    assert ", memory:" not in text  # not measured without --memory


def test_targets_compare_the_extra_time_with_the_products_and_the_peaks():
    def row(head, ms, peak=""):
        ratio = peak / 10.0 if peak else ""
        return {"recipe": "r", "head": head, "median_ms": ms, "peak_mb": peak,
                "memory_vs_plain": ratio}  # fmt: skip

    rows = [row("default", 30.0, 14.0), row("plain", 10.0, 10.0), row("products", 16.0)]
    assert default_cost.targets(rows) == [
        "- r, time: (default - plain) / products = 20.0 / 16.0 ms = 1.25 (target <= 1.3): met",
        "- r, memory: default / plain peak = 14.0 / 10.0 MiB = 1.40 (target <= 1.5): met",
    ]
    rows[0].update(median_ms=31.0, peak_mb=16.0, memory_vs_plain=1.6)
    assert [line.endswith("NOT met") for line in default_cost.targets(rows)] == [True, True]


def test_memory_is_a_steps_peak_beyond_what_was_held_and_is_asked_of_each_head(
    tmp_path, monkeypatch
):
    """``--memory``: each head's (not the products') peak, from a fresh process on the CPU (run
    in this one here), and its ratio to the plain head's; a step's peak is positive."""
    shape = default_cost.Shape("tiny", 300, 2_000, 16, 5, False)
    assert default_cost.step_peak_mb(shape, "default 8", "cpu") >= 0.0
    assert default_cost.step_peak_mb(shape, "default 8 g4", "cpu") >= 0.0
    monkeypatch.setattr(default_cost, "SHAPES", {"dense": shape})
    asked = []

    def in_this_process(module, function, shape, head, device, env):
        asked.append(head)
        return {"default": 3.0, "plain": 2.0}.get(head, 1.0)

    monkeypatch.setattr(default_cost, "in_fresh_process", in_this_process)
    argv = ["--shapes", "dense", "--limits", "8", "--memory", "--repeats", "1"]
    rows = default_cost.main([*argv, "--name", str(tmp_path / "dc")])
    assert asked == ["default", "plain", "default 8"]
    at = {r["head"]: r for r in rows}
    assert at["default"]["memory_vs_plain"] == 1.5 and at["products"]["peak_mb"] == ""
    assert (
        "- tiny, memory: default / plain peak = 3.0 / 2.0 MiB = 1.50"
        in (tmp_path / "dc.md").read_text()
    )


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
    grouped = default_cost.heads_of(shape, [3], [1, 2, 6])  # a group of T rows: no draws
    assert list(grouped) == ["default", "plain", "default 3", "default 3 g2"]
    assert grouped["default 3 g2"].in_batch_group_size == 2


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
    assert [r["head"] for r in rows] == ["default", "plain", "default, one block", "products"]
    assert set(seen) == {500, 2**62} and chunked.MAX_BLOCK_ELEMENTS == 500
    assert "--whole-block" in (tmp_path / "dc.md").read_text()


def test_the_columns_variant_scores_the_batch_targets_unpooled_for_its_step_only(
    tmp_path, monkeypatch
):
    """``--columns`` times the default with the batch's targets as ``[T, U]`` columns: no pooled
    log-sum-exp in its step, while the default's step pools them, and the head's pooling is
    back after each of its steps."""
    from lightning_sampled.heads import SampledSoftmaxHead, sampled

    pooled = SampledSoftmaxHead.pooled
    calls = []
    original = sampled.in_batch_logsumexp
    monkeypatch.setattr(sampled, "in_batch_logsumexp", lambda *a: calls.append(1) or original(*a))
    shape = default_cost.Shape("tiny", 60, 300, 8, 5, False)
    target, z, _ = default_cost.batch_of(shape, torch.device("cpu"))
    head = default_cost.make_head(shape, "auto")
    default_cost.in_columns(default_cost.head_step(head, z, target))()
    assert calls == [] and SampledSoftmaxHead.pooled is pooled
    default_cost.head_step(head, z, target)()
    assert calls == [1]
    monkeypatch.setattr(default_cost, "SHAPES", {"dense": shape})
    argv = ["--shapes", "dense", "--limits", "--columns", "--repeats", "1"]
    rows = default_cost.main([*argv, "--name", str(tmp_path / "dc")])
    assert [r["head"] for r in rows] == ["default", "plain", "default, columns", "products"]
    assert default_cost.step_peak_mb(shape, "default, columns", "cpu") >= 0.0
