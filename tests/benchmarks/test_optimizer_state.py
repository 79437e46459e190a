"""benchmarks.optimizer_state at a tiny size: the bytes it reads from the tensors are the bytes
each option should hold, a table over ``--max-gb`` is extrapolated and says so, the targets are
judged, and a rerun keeps the hand-written quality section."""

import csv

import pytest

from benchmarks import optimizer_state

pytestmark = pytest.mark.usefixtures("one_torch_thread")

D = 8


def run(tmp_path, *extra):
    name = str(tmp_path / "optimizer_state")
    optimizer_state.main(
        ["--sizes", f"100x{D}", f"1000x{D}", "--ids", "50", "--time-size", f"200x{D}"]
        + ["--repeats", "1", "--touched", "20", "--name", name, *extra]
    )
    with open(f"{name}.csv") as f:
        return list(csv.DictReader(f)), (tmp_path / "optimizer_state.md").read_text()


def test_bytes_per_row_targets_times_and_the_kept_quality_section(tmp_path):
    (tmp_path / "optimizer_state.md").write_text("# old\n\n## Quality\n\n| seed | ndcg |\n")
    # 1000 x 8 with Adam's moments (96 kB fp32, 64 kB bf16) does not fit 5e-5 GiB (53.7 kB)
    rows, text = run(tmp_path, "--max-gb", "5e-5")
    by = {(int(r["N"]), r["option"]): r for r in rows}
    step = 4  # the step counter: a float32 scalar tensor
    expected_state = {  # bytes per row of the state at N = 100: what each option should hold
        "LazyAdam (today: fp32 table, Adam)": (4 * D, 8 * D),
        "fp32 table, Adam, bf16 moments": (4 * D, 4 * D),
        "fp32 table, row-wise Adagrad": (4 * D, 4),
        "bf16 table, Adam, bf16 moments": (2 * D, 4 * D),
        "bf16 table, row-wise Adagrad": (2 * D, 4),
        "bf16 table, row-wise Adagrad, bf16 state": (2 * D, 2),
    }
    assert {o.name for o in optimizer_state.OPTIONS} == set(expected_state)
    for name, (table, state) in expected_state.items():
        row = by[(100, name)]
        assert float(row["table B/row"]) == table
        assert float(row["state B/row"]) == pytest.approx(state + step / 100)
        assert row["bytes"] == "measured"
    assert by[(1000, "LazyAdam (today: fp32 table, Adam)")]["bytes"].startswith("extrapolated")
    assert by[(1000, "fp32 table, row-wise Adagrad")]["bytes"] == "measured"
    lean = by[(1000, "bf16 table, row-wise Adagrad")]
    assert float(lean["total / LazyAdam"]) == pytest.approx((2 * D + 4) / (12 * D), abs=1e-3)
    assert "- met: bf16 table + row-wise state <= 0.6x" in text
    # at D = 8 the state of a bf16 table is 4 / 16 of it: the 0.1x target is judged NOT met
    assert "- NOT met: row-wise state <= 0.1x of its table; worst 0.2525x" in text
    assert "## Step time" in text and text.count("| 200 | 8 | 50 |") == 6
    assert text.rstrip().endswith("## Quality\n\n| seed | ndcg |")


def test_bad_arguments_are_refused():
    for argv in (["--sizes", "1e6"], ["--max-gb", "0"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            optimizer_state.parse_args(argv)
