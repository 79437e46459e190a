"""benchmarks.recipe_time_to_quality: reaching a threshold, the time axis, and its sources."""

import json

import pytest

from benchmarks import recipe_time_to_quality as ttq


def curve(*values: float) -> list[dict]:
    """Validations at steps 100, 200, ... with these values, on a time axis of 1 s a step."""
    return [
        {"step": 100 * (i + 1), "value": v, "train_s": 100.0 * (i + 1)}
        for i, v in enumerate(values)
    ]


def test_ndcg_threshold_is_reached_at_the_first_validation_at_least_that_good():
    target = ttq.threshold(0.5, 0.5, higher_is_better=True)
    assert target == 0.25
    # equal to the threshold reaches it; a later, better point does not count
    point = ttq.first_reaching(curve(0.1, 0.25, 0.2, 0.4), target, True)
    assert point["step"] == 200
    assert ttq.reach_seconds(curve(0.1, 0.25, 0.2, 0.4), target, True) == 200.0


def test_perplexity_threshold_divides_the_best_and_counts_equal_as_reached():
    target = ttq.threshold(100.0, 0.5, higher_is_better=False)
    assert target == 200.0  # ppl <= best / q
    point = ttq.first_reaching(curve(900.0, 300.0, 200.0, 150.0), target, False)
    assert point["step"] == 300


def test_a_head_that_never_reaches_and_a_zero_reference():
    assert ttq.first_reaching(curve(0.1, 0.2), ttq.threshold(0.5, 0.95, True), True) is None
    assert ttq.reach_seconds(curve(500.0, 400.0), 150.0, False) is None
    # the synthetic 1M full softmax scored NDCG@10 = 0: no meaningful threshold
    assert ttq.threshold(0.0, 0.95, True) is None
    assert ttq.first_reaching(curve(0.1), None, True) is None


def test_time_axis_is_steps_times_median_plus_refreshes():
    default = {"every_n_epochs": 1, "every_n_train_steps": None, "doubling_steps": 50}
    # before step 136 with 68-step epochs: global steps 0 (first batch), 50 (doubling),
    # 68 (epoch 1) and 100 (doubling)
    assert ttq.refreshes_before(136, 68, default) == 4
    assert ttq.refreshes_before(0, 68, default) == 0
    every_step = {"every_n_epochs": None, "every_n_train_steps": 1, "doubling_steps": None}
    assert ttq.refreshes_before(30, 1000, every_step) == 30
    assert ttq.refreshes_before(500, 68, None) == 0
    assert ttq.training_seconds(136, 2.0, 4, 5.0) == 136 * 2.0 + 4 * 5.0


def test_curve_rows_put_recorded_validations_on_the_measured_axis(tmp_path):
    runs = [
        {"head": "full", "validation": [{"epoch": 0, "step": 10, "val/ndcg@10": 0.1}]},
        {
            "head": "midx_rq",
            "validation": [
                {"epoch": 0, "step": 10, "val/ndcg@10": 0.05},
                {"epoch": 1, "step": 20, "val/ndcg@10": 0.1},
                {"epoch": 1, "step": 20, "val/ndcg@10": 0.1},  # a budget run's final validation
            ],
        },
    ]
    (tmp_path / "gru4rec_ml-1m_table7.json").write_text(json.dumps(runs))
    (tmp_path / "gru4rec_ml-1m_table7_midx.json").write_text(json.dumps(runs))
    schedule = json.dumps({"every_n_epochs": 1, "every_n_train_steps": None, "doubling_steps": 50})
    steps = [
        {"recipe": "gru4rec_ml-1m", "head": "full", "median_step_s": "1.5", "refresh_s": "0",
         "schedule": "null", "steps_per_epoch": "10"},
        {"recipe": "gru4rec_ml-1m", "head": "midx_rq", "median_step_s": "1.0", "refresh_s": "3",
         "schedule": schedule, "steps_per_epoch": "10"},
        {"recipe": "gru4rec_ml-1m", "head": "log_uniform", "median_step_s": "1.0",
         "refresh_s": "0", "schedule": "null", "steps_per_epoch": "10"},
    ]  # fmt: skip
    rows = ttq.curve_rows(steps, tmp_path)
    midx = [r for r in rows if r["head"] == "midx_rq"]
    assert [r["step"] for r in midx] == [10, 20]
    # refreshes before steps 10 and 20: global step 0, then epoch 1 at global step 10
    assert [r["refreshes"] for r in midx] == [1, 2]
    assert [r["train_s"] for r in midx] == [10 * 1.0 + 1 * 3.0, 20 * 1.0 + 2 * 3.0]
    assert [r["train_s"] for r in rows if r["head"] == "full"] == [15.0]
    assert not [r for r in rows if r["head"] == "log_uniform"]  # no recorded run


@pytest.mark.parametrize("recipe", list(ttq.RECIPES))
def test_manifest_files_exist_and_hold_their_heads(recipe):
    r = ttq.RECIPES[recipe]
    keys = [h.key for h in r.heads]
    for head in ("full", "uniform", "unigram", "log_uniform", "midx_rq", "midx_learn"):
        assert head in keys
    for head in ("in_batch", "mixed", "tapas", "cane"):
        assert head in keys
    assert r.heads[0].key == "full" and r.heads[0].recorded is not None
    for spec in r.heads:
        if spec.recorded is None:
            assert "python -m recipes.compare" in ttq.compare_command(r, spec)
            continue
        for stem in spec.recorded.files:
            path = ttq.RECIPE_RESULTS / f"{stem}.json"
            assert path.is_file(), path
            heads = [row["head"] for row in json.loads(path.read_text())]
            assert heads.count(spec.recorded.head) == 1, (stem, spec.recorded.head)
        points = ttq.recorded_curve(spec.recorded, r.metric)
        assert points and all(p["step"] > 0 for p in points)
        assert spec.recorded.convention and spec.recorded.provenance


def test_log_uniform_is_proposed_only_where_ids_are_sorted_by_frequency():
    """Its Zipfian proposal assumes id 0 is the most frequent class: true of the language
    models' vocabularies, not of MovieLens' or the synthetic catalog's item ids."""
    for name, recipe in ttq.RECIPES.items():
        (spec,) = [h for h in recipe.heads if h.key == "log_uniform"]
        sorted_ids = name in ("lstm_ptb", "lstm_gcide")
        assert (spec.unsuited is None) == sorted_ids, name
        assert spec.unsuited is None or spec.recorded is None


def test_report_section_says_what_to_run_then_carries_the_tables(dirs):
    from benchmarks.report.time_to_quality import section_time_to_quality

    assert "Not measured yet" in "\n".join(section_time_to_quality(dirs))
    folder = dirs.benchmarks / "recipe_time_to_quality"
    folder.mkdir()
    (folder / "recipe_time_to_quality.md").write_text(
        "# Title\n\nLoad.\n\n## lstm_ptb (x)\n\n| head |\n|---|\n| full |\n\n![p](lstm_ptb.png)\n"
    )
    (folder / "lstm_ptb.png").write_bytes(b"")
    (folder / "step_time.csv").write_text("recipe\n")
    text = "\n".join(section_time_to_quality(dirs))
    assert "### lstm_ptb (x)" in text and "| full |" in text and "# Title" not in text
    assert "recipe_time_to_quality/step_time.csv" in text and "lstm_ptb.png" in text
    assert "![p]" not in text
