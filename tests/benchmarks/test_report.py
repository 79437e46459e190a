"""benchmarks.report on small synthetic result files: ratios against the right reference row,
a "not measured" line for every missing input, the papers' numbers beside ours, and the
provenance of every row."""

import csv
import json
import re
from pathlib import Path

import pytest

from benchmarks import report

STEP_COLUMNS = ["num_classes", "method", "sparse_grad", "device", "median_s", "time_vs_plain"]
STEP_COLUMNS += ["peak_mib", "status", "machine", "torch", "commit"]


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def step(n, method, seconds, mib, commit="c0ffee1", status="ok") -> dict:
    """A head_step row; its ``time_vs_plain`` is deliberately wrong (the report recomputes it)."""
    values = [n, method, False, "cpu", seconds, 9.99, mib, status, "box cpu x2", "2.13.0", commit]
    return dict(zip(STEP_COLUMNS, values, strict=True))


def compare_row(head: str, epochs: int, ndcg: float, **extra) -> dict:
    """A ``recipes.compare`` JSON row."""
    return {"head": head, "epochs": epochs, "test/ndcg@10": ndcg, "test/recall@10": 0.5, **extra}


@pytest.fixture
def dirs(tmp_path: Path) -> report.Inputs:
    (tmp_path / "bench").mkdir()
    (tmp_path / "recipes").mkdir()
    out = tmp_path / "bench" / "REPORT.md"
    return report.Inputs(tmp_path / "bench", tmp_path / "recipes", tmp_path / "RESULTS.md", out)


def section(text: str, number: str) -> str:
    """The text of the report section whose heading starts with ``## <number>``."""
    match = re.search(rf"^## {re.escape(number)}.*?(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no section {number}"
    return match.group(0)


def row(text: str, *cells: str) -> str:
    """The one table line of ``text`` whose first cells are ``cells``."""
    prefix = "| " + " | ".join(cells) + " |"
    found = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(found) == 1, (prefix, found)
    return found[0]


def test_step_ratios_use_the_plain_cross_entropy_row_of_the_same_size(dirs):
    write_csv(
        dirs.benchmarks / "head_step.csv",
        [
            step(1000, "plain_cross_entropy", 10.0, 1000.0),
            step(100, "uniform", 1.0, 50.0),
            step(100, "plain_cross_entropy", 2.0, 100.0),
            step(1000, "uniform", 1.0, 50.0),
            step(1000, "uniform_sparse", 0.5, 20.0),
        ],
    )
    text = report.build_report(dirs)
    speed = section(text, "1.")
    assert "| uniform | 1 s (0.5x) | 1 s (0.1x) |" in speed
    assert "| uniform | 50 MiB (0.5x) | 50 MiB (0.05x) |" in speed
    headline = row(section(text, "Headline"), "uniform")
    assert "| 1e3 | 0.1x / 0.05x | 0.05x / 0.02x |" in headline


def test_quality_ratio_uses_full_softmax_of_the_same_model_and_epochs(dirs):
    # read in this order: a full-softmax row of another model or epochs comes first
    (dirs.recipes / "sasrec_ml-1m.json").write_text(json.dumps([compare_row("full", 10, 0.2)]))
    (dirs.recipes / "gru4rec_ml-1m.json").write_text(
        json.dumps([compare_row("full", 10, 0.6), compare_row("uniform", 10, 0.45)])
    )
    (dirs.recipes / "sasrec_ml-1m_20_epochs.json").write_text(
        json.dumps([compare_row("full", 20, 0.3), compare_row("uniform", 20, 0.15)])
    )
    text = report.build_report(dirs)
    assert "| 0.45 | 0.75x |" in row(section(text, "4."), "GRU4Rec", "uniform", "10")
    assert "| 0.15 | 0.5x |" in row(section(text, "4."), "SASRec", "uniform", "20")
    assert "| 0.500 (20 ep) | 0.750 (10 ep) |" in row(section(text, "Headline"), "uniform")


def test_missing_inputs_give_a_not_measured_line_in_every_section(dirs):
    report.main(
        [f"--benchmarks={dirs.benchmarks}", f"--recipes={dirs.recipes}"]
        + [f"--results-md={dirs.results_md}"]
    )
    written = dirs.out.read_text()
    for number in ("Headline", "1.", "2.", "3.", "4.", "5.", "6.", "7.", "8."):
        assert "Not measured yet: " in section(written, number), number
    assert "|---|" not in written  # no table without rows
    assert "Command: `" in section(written, "3.")


def test_papers_numbers_stand_beside_ours(dirs):
    rows = [{"head": h, "epochs": 20, "test/ppl": p} for h, p in (("full", 100), ("midx_rq", 110))]
    (dirs.recipes / "lstm_ptb_table4.json").write_text(json.dumps(rows))
    (dirs.recipes / "gru4rec_ml-1m.json").write_text(
        json.dumps([compare_row("full", 10, 0.2), compare_row("midx_rq", 10, 0.19)])
    )
    dirs.results_md.write_text(
        "| head | val ppl epoch 1 | epoch 2 | epoch 3 | wall s (3 epochs) |\n"
        "|---|---|---|---|---|\n"
        "| full softmax | 300 | 200 | 150 | 1,000 |\n"
        "| uniform, 100 negatives per query | 1,300 | 250 | 180 | 900 |\n"
    )
    ptb = section(report.build_report(dirs), "3.")
    ours = row(ptb, "PTB LSTM", "MIDX-rq", "20")
    assert "| 110 | 1.1x | 117.8317 | 1.08x |" in ours
    three_epochs = row(ptb, "PTB LSTM", "uniform", "3")
    assert "| 1300 | 250 | 180 | 180 | 1.2x | 159.9701 | 1.46x |" in three_epochs
    ml = section(report.build_report(dirs), "4.")
    assert "| 0.19 | 0.95x | 0.1337 | 0.985x |" in row(ml, "GRU4Rec", "MIDX-rq", "10")


def test_every_row_names_its_provenance(dirs):
    write_csv(
        dirs.benchmarks / "head_step.csv",
        [
            step(100, "plain_cross_entropy", 2.0, 100.0, commit="aaaaaaa"),
            step(100, "uniform", 1.0, 50.0, commit="bbbbbbb"),
            step(100, "full_softmax_head", 1.0, 50.0, commit="ccccccc", status="skipped: slow"),
        ],
    )
    (dirs.recipes / "sasrec_ml-1m_tapas.json").write_text(json.dumps([compare_row("tapas", 10, 1)]))
    text = report.build_report(dirs)
    speed = section(text, "1.")
    notes = dict(re.findall(r"\*\*(P\d+)\*\* ([^;*]+; torch [^;]+; commit \w+)", speed))
    for method, commit in (("plain_cross_entropy", "aaaaaaa"), ("uniform", "bbbbbbb")):
        key = row(speed.split("Peak memory")[0], method).split("|")[-2].strip()
        assert notes[key].endswith(f"commit {commit}"), (method, key, notes)
    tapas = row(section(text, "4."), "SASRec", "TAPAS")
    key = tapas.split("|")[-2].strip()
    assert re.search(rf"\*\*{key}\*\* [^*]*f8ca01a", section(text, "4."))
    for header, body in tables(text):
        if header.startswith("| model | sampler |"):  # the paper's Table 7
            continue
        assert header.endswith("| provenance |"), header
        for line in body:
            assert re.fullmatch(r"P\d+(, P\d+)*", line.split("|")[-2].strip()), line


def tables(text: str) -> list[tuple[str, list[str]]]:
    """(header line, body lines) of every Markdown table in ``text``."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines[1:], start=1):
        if line.startswith("|---"):
            body = []
            for rest in lines[i + 1 :]:
                if not rest.startswith("|"):
                    break
                body.append(rest)
            found.append((lines[i - 1], body))
    return found


def test_convention_rows_are_compared_with_tensorflows_row_of_the_same_model(dirs):
    for stem, tf, default in (("sasrec", 0.10, 0.12), ("gru4rec", 0.20, 0.15)):
        rows = [
            compare_row("uniform", 10, tf, convention="tensorflow"),
            compare_row("uniform", 10, default, convention="exact_positive"),
        ]
        (dirs.recipes / f"{stem}_ml-1m_convention.json").write_text(json.dumps(rows))
    report.main(
        [f"--benchmarks={dirs.benchmarks}", f"--recipes={dirs.recipes}"]
        + [f"--results-md={dirs.results_md}"]
    )
    text = section(dirs.out.read_text(), "6.")
    assert "| 0.12 | — | 1.2x |" in row(text, "SASRec ML-1M", "uniform", "exact_positive")
    assert "| 0.15 | — | 0.75x |" in row(text, "GRU4Rec ML-1M", "uniform", "exact_positive")
    assert "| 1x |" in row(text, "GRU4Rec ML-1M", "uniform", "tensorflow")
    assert "On SASRec ML-1M the consistent default beats" in text
    assert "On GRU4Rec ML-1M the consistent default falls short of" in text
    assert "Not measured yet: both conventions side by side on PTB LSTM" in text


def test_lower_perplexity_under_the_default_convention_beats_tensorflows(dirs):
    rows = [
        {"head": "uniform", "epochs": 3, "test/ppl": 200.0, "convention": "tensorflow"},
        {"head": "uniform", "epochs": 3, "test/ppl": 150.0, "convention": "exact_positive"},
    ]
    (dirs.recipes / "lstm_ptb_convention.json").write_text(json.dumps(rows))
    report.main(
        [f"--benchmarks={dirs.benchmarks}", f"--recipes={dirs.recipes}"]
        + [f"--results-md={dirs.results_md}"]
    )
    text = section(dirs.out.read_text(), "6.")
    assert "| test ppl | 150 | — | 0.75x |" in row(text, "PTB LSTM", "uniform", "exact_positive")
    assert "On PTB LSTM the consistent default beats" in text
    assert "side by side on SASRec ML-1M, GRU4Rec ML-1M." in text
