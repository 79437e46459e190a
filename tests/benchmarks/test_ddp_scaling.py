"""benchmarks.ddp_scaling: the recipe arguments of a run, the equality rows and the notes say
what was measured (the DDP runs themselves are exercised by tests/integration)."""

import pytest

from benchmarks import ddp_scaling


def test_recipe_args_choose_ddp_only_for_several_processes(tmp_path):
    one = ddp_scaling.recipe_args("c.yaml", "uniform", 1, 0, 1, str(tmp_path))
    two = ddp_scaling.recipe_args("c.yaml", "uniform", 1, 0, 2, str(tmp_path))
    assert "--trainer.strategy=auto" in one and "--trainer.devices=1" in one
    assert "--trainer.strategy=ddp" in two and "--trainer.devices=2" in two
    assert any(arg.endswith("heads/uniform.yaml") for arg in one)


def test_equality_rows_give_each_metric_both_ways_and_its_relative_difference():
    reference = {"processes": 2, "metrics": {"val/ndcg@10": 0.5, "test/ppl": 200.0}}
    other = {"processes": 1, "metrics": {"val/ndcg@10": 0.5, "test/ppl": 201.0}}
    rows = ddp_scaling.equality_rows(reference, other, "trained by 2 processes")
    by_name = {row["metric"]: row for row in rows}
    assert by_name["val/ndcg@10"]["relative difference"] == 0
    assert by_name["test/ppl"]["relative difference"] == pytest.approx(1 / 200)
    assert by_name["test/ppl"]["2 process(es)"] == 200.0
    assert by_name["test/ppl"]["1 process(es)"] == 201.0


def test_notes_quote_the_ratios_and_the_worst_difference():
    args = ddp_scaling.parse_args(["--config", "recipes/configs/sasrec_ml-100k.yaml"])
    throughput = [
        {
            "processes": 1,
            "threads / process": 1,
            "positions/s": 100.0,
            "vs 1 process x 1 thread": 1,
        },
        {
            "processes": 1,
            "threads / process": 2,
            "positions/s": 125.0,
            "vs 1 process x 1 thread": 1.25,
        },
        {
            "processes": 2,
            "threads / process": 1,
            "positions/s": 150.0,
            "vs 1 process x 1 thread": 1.5,
        },
    ]
    equality = [
        {"weights": "w", "metric": "val/ndcg@10", "relative difference": 0.0},
        {"weights": "w", "metric": "test/ppl", "relative difference": 3e-7},
    ]
    text = ddp_scaling.notes(args, throughput, equality)
    assert "1.50x the positions per second" in text and "1.20x that of one" in text
    assert "3e-07 (test/ppl" in text


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        ddp_scaling.parse_args(["--epochs", "0"])
    with pytest.raises(SystemExit):
        ddp_scaling.parse_args(["--config", "no/such.yaml"])
