"""``benchmarks/sharded.py`` at a tiny size: the bytes it counts equal its closed form at every
``N`` (so they do not grow with ``N``), and its targets say met or NOT met from the numbers."""

from benchmarks import sharded


def test_counted_bytes_equal_the_formula_at_every_n_and_the_targets_follow(tmp_path):
    name = str(tmp_path / "sharded")
    sharded.main(
        [
            "--classes", "1000", "3001",
            "--worlds", "1", "2",
            "--positions", "16",
            "--negatives", "5",
            "--steps", "2",
            "--warmup", "1",
            "--optimizers", "adam:float32:float32", "row_wise_adagrad:float32:bfloat16",
            "--name", name,
        ]
    )  # fmt: skip
    text = (tmp_path / "sharded.md").read_text()
    expected = sharded.expected_bytes(16, 64, 2)
    assert f"the formula gives {expected:,}: met" in text
    assert f"{expected:,} at N = 1,000, {expected:,} at N = 3,001" in text
    assert "- row-wise state <= 0.1x of the table (row_wise_adagrad:float32:bfloat16" in text
    assert "0.6x the memory" in text and "NOT met" not in text
    rows = (tmp_path / "sharded.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 * 2


def test_the_targets_say_not_met_when_the_bytes_grow_with_n():
    rows = [
        {"optimizer": "adam:float32:float32", "N": n, "ranks": 2, "bytes sent per step": b,
         "formula": 100, "table GiB per rank": 1.0, "optimizer state GiB per rank": 2.0}
        for n, b in ((10, 100), (20, 140))
    ]  # fmt: skip
    assert "NOT met" in sharded.targets(rows, "adam:float32:float32")[0]
