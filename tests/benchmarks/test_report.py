"""benchmarks.report on small synthetic result files: ratios against the right reference row,
a "not measured" line for every missing input, the papers' numbers beside ours, and the
provenance of every row."""

import csv
import json
import re
from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.report import readme as readme_module

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
    (dirs.recipes / "lstm_ptb_table4_static.json").write_text(json.dumps(rows))
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
    assert "| 0.19 | 0.95x | 0.1337 | 0.985x | 0.1877 | 0.4817 |" in row(
        ml, "GRU4Rec", "MIDX-rq", "10"
    )


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
    third = [{"head": "uniform", "epochs": 3, "test/ppl": 220.0, "best val/ppl": 230.0}]
    (dirs.recipes / "lstm_ptb_convention_corrected_all.json").write_text(json.dumps(third))
    report.main(
        [f"--benchmarks={dirs.benchmarks}", f"--recipes={dirs.recipes}"]
        + [f"--results-md={dirs.results_md}"]
    )
    text = section(dirs.out.read_text(), "6.")
    assert "| test ppl | 150 | — | 0.75x |" in row(text, "PTB LSTM", "uniform", "exact_positive")
    assert "| test ppl | 220 | 230 | 1.1x | P2 |" in row(
        text, "PTB LSTM", "uniform", "corrected_all"
    )
    assert "On PTB LSTM the consistent default beats" in text
    assert "and `corrected_all` falls short of it (1.1x)." in text
    assert "side by side on SASRec ML-1M, GRU4Rec ML-1M." in text


def ppl_row(head: str, ppl: float, **extra) -> dict:
    return {"head": head, "epochs": 3, "test/ppl": ppl, "best val/ppl": ppl + 10, **extra}


def test_table4_compares_each_convention_with_the_one_full_softmax_row(dirs):
    (dirs.recipes / "lstm_ptb_table4_full.json").write_text(json.dumps([ppl_row("full", 100)]))
    (dirs.recipes / "lstm_ptb_table4_static.json").write_text(
        json.dumps([ppl_row("uniform", 400), ppl_row("unigram", 300)])
    )
    (dirs.recipes / "lstm_ptb_table4_tensorflow_static.json").write_text(
        json.dumps([ppl_row("uniform", 150)])
    )
    ptb = section(report.build_report(dirs), "3.")
    assert "| 400 | 4x | 159.9701 |" in row(ptb, "PTB LSTM", "uniform", "3")
    assert "| 300 | 3x | 139.7837 |" in row(ptb, "PTB LSTM", "unigram", "3")
    tensorflow = "PTB LSTM, TensorFlow's convention"
    assert "| 150 | 1.5x |" in row(ptb, tensorflow, "uniform", "3")
    assert "| 100 | 1x |" in row(ptb, tensorflow, "full softmax", "3")
    assert "`exact_positive`: unigram 300 < uniform 400; the paper's: MIDX-rq < MIDX-pq" in ptb
    assert "`tensorflow`: uniform" not in ptb  # one proposal alone has no order
    assert "Not measured yet: MIDX-rq's test perplexity against the codebook size K" in ptb
    headline = row(section(report.build_report(dirs), "Headline"), "uniform")
    assert "| 4.000 / — / 1.500 (3 ep) |" in headline  # exact_positive / corrected_all / tensorflow


def test_a_later_table4_run_of_a_head_replaces_the_earlier_one_under_its_convention(dirs):
    """MIDX-Learn's re-run (``lstm_ptb_table4_corrected_learn``) replaces its row of the earlier
    file under ``corrected_all`` only; the earlier file's other head and the other convention's
    row stay; the paper's column has Table 5's MIDX-Learn-rq."""
    (dirs.recipes / "lstm_ptb_table4_full.json").write_text(json.dumps([ppl_row("full", 100)]))
    (dirs.recipes / "lstm_ptb_table4_corrected_learn_pq.json").write_text(
        json.dumps([ppl_row("midx_learn", 900), ppl_row("midx_pq", 160)])
    )
    (dirs.recipes / "lstm_ptb_table4_learn_ove.json").write_text(
        json.dumps([ppl_row("midx_learn", 5000)])
    )
    (dirs.recipes / "lstm_ptb_table4_corrected_learn.json").write_text(
        json.dumps([ppl_row("midx_learn", 150)])
    )
    (dirs.recipes / "lstm_ptb_table4_corrected_all.json").write_text(
        json.dumps([ppl_row("midx_rq", 140)])
    )
    ptb = section(report.build_report(dirs), "3.")
    corrected = "PTB LSTM, every logit corrected"
    assert "| 150 | 1.5x | 112.30 | 1.03x |" in row(ptb, corrected, "MIDX-learn", "3")
    assert "test ppl: `corrected_all` 150, behind MIDX-rq's 140." in ptb  # Table 5's comparison
    assert "| 160 | 1.6x |" in row(ptb, corrected, "MIDX-pq", "3")
    assert "| 5000 | 50x |" in row(ptb, "PTB LSTM", "MIDX-learn", "3")
    assert "| 900 |" not in ptb


def test_sweeps_take_the_table4_row_as_their_default_point(dirs):
    (dirs.recipes / "lstm_ptb_table4_tensorflow_midx.json").write_text(
        json.dumps([ppl_row("midx_pq", 130), ppl_row("midx_rq", 120)])
    )
    for k, ppl in ((8, 140), (128, 110)):
        (dirs.recipes / f"lstm_ptb_codebook_{k}.json").write_text(
            json.dumps([ppl_row("midx_rq", ppl)])
        )
    ptb = section(report.build_report(dirs), "3.")
    points = [ptb.index(row(ptb, k, "3")) for k in ("8", "32", "128")]
    assert points == sorted(points)
    assert "| 32 | 3 | 120 | 130 |" in ptb
    assert "goes from 140 at codebook size K = 8 to 110 at 128" in ptb
    assert "Not measured yet: MIDX-rq's test perplexity against the negatives M" in ptb


def test_movielens_shows_the_cutoff_50_where_a_run_logged_it(dirs):
    rows = [
        compare_row("full", 10, 0.2, **{"test/ndcg@50": 0.3, "test/recall@50": 0.6}),
        compare_row("uniform", 10, 0.1),
    ]
    (dirs.recipes / "gru4rec_ml-1m_table7.json").write_text(json.dumps(rows))
    (dirs.recipes / "gru4rec_ml-1m.json").write_text(json.dumps([compare_row("cane", 10, 0.1)]))
    ml = section(report.build_report(dirs), "4.")
    # N@50, R@10, R@50, seconds per epoch, then N@10
    assert "| 10 | 0.3 | 0.5 | 0.6 | — | 0.2 | 1x |" in row(ml, "GRU4Rec", "full softmax", "10")
    assert "| 10 | — | 0.5 | — | — | 0.1 | 0.5x |" in row(ml, "GRU4Rec", "uniform", "10")
    # an earlier run (@10 only) goes to its own table, after the current one
    current, earlier = ml.split("Earlier runs")
    assert "| GRU4Rec | CANE |" not in current and "| GRU4Rec | CANE | 10 |" in earlier
    assert "Only earlier runs (@10) have GRU4Rec CANE." in current


def test_ddp_section_quotes_both_throughput_ratios_and_the_worst_difference(dirs):
    base = {"steps": 10, "positions": 1000, "train s": 1, "test/ndcg@10": 0.1}
    write_csv(
        dirs.benchmarks / "ddp_scaling.csv",
        [
            {
                "processes": 1,
                "threads / process": 1,
                **base,
                "positions/s": 100,
                "vs 1 process x 1 thread": 1,
            },
            {
                "processes": 1,
                "threads / process": 2,
                **base,
                "positions/s": 120,
                "vs 1 process x 1 thread": 1.2,
            },
            {
                "processes": 2,
                "threads / process": 1,
                **base,
                "positions/s": 180,
                "vs 1 process x 1 thread": 1.8,
            },
        ],
    )
    write_csv(
        dirs.benchmarks / "ddp_scaling_equality.csv",
        [
            {"weights": "w", "metric": "val/ndcg@10", "relative difference": 0.0},
            {"weights": "w", "metric": "test/recall@10", "relative difference": 2e-7},
        ],
    )
    ddp = section(report.build_report(dirs), "7.")
    assert "Two processes train 1.8x the positions per second" in ddp
    assert "and 1.5x those of one process on both cores" in ddp
    assert "is 2e-07 (test/recall@10)" in ddp
    assert "Not measured yet" not in ddp


def test_proposal_kl_is_listed_per_epoch_beside_its_plot(dirs):
    training = [{"epoch": e, "sampler_diagnostics/head/kl": kl} for e, kl in ((0, 2.5), (1, 1.5))]
    (dirs.recipes / "lstm_ptb_table4_midx_rq.json").write_text(
        json.dumps([ppl_row("midx_rq", 120, training=training)])
    )
    (dirs.recipes / "lstm_ptb_table4_midx_rq_proposal.png").write_bytes(b"png")
    text = section(report.build_report(dirs), "8.")
    assert "| 1 | 2.5 |" in text and "| 2 | 1.5 |" in text
    assert "lstm_ptb_table4_midx_rq_proposal.png" in text
    assert "proposal-distribution plot" not in text


def test_numbers_keep_four_digits_and_diverged_ones_an_exponent():
    assert report.common.fmt(0.123456) == "0.1235" and report.common.fmt(None) == "—"
    assert report.common.fmt(30_998_950) == "30,998,950"
    assert report.common.fmt(1.738e16) == "1.74e+16"


def gcide_row(head: str, steps: int, tokens_per_s: float, ppl: float) -> dict:
    return {
        "head": head,
        "steps": steps,
        "train positions": steps * 1120,
        "positions/s": tokens_per_s,
        "refresh s": 0,
        "peak RSS MB": 1000,
        "val/ppl": ppl,
        "test/ppl": ppl + 1,
    }


def test_gcide_rows_compare_with_the_full_softmax_of_their_own_session(dirs):
    # the older session ran on a busier machine: its full softmax was slower
    for stem, rows in (
        ("gcide_full", [gcide_row("full", 30, 50.0, 400.0)]),
        ("gcide_tokens", [gcide_row("sparse_uniform", 30, 1000.0, 800.0)]),
        ("gcide_full_rerun", [gcide_row("full", 30, 100.0, 400.0)]),
        ("gcide_tokens_more", [gcide_row("unigram", 30, 4000.0, 600.0)]),
        ("gcide_time_full_rerun", [gcide_row("full", 100, 100.0, 400.0)]),
        ("gcide_time_more", [gcide_row("unigram", 300, 4000.0, 300.0)]),
    ):
        (dirs.recipes / f"{stem}.json").write_text(json.dumps(rows))
    headline = section(report.build_report(dirs), "Headline")
    assert "| 0.750 |" in row(headline, "unigram")  # equal wall clock, its own session's full
    text = section(report.build_report(dirs), "5.")
    tokens = text.split("Equal wall clock")[0]
    assert "| 1000 | 20x |" in row(tokens, "uniform", "30")
    assert "| 4000 | 40x |" in row(tokens, "unigram", "30")  # against 100 tokens/s, not 50
    assert "the best sampled head, uniform, reaches 2x of its validation perplexity" in tokens
    assert "the best sampled head, unigram, reaches 1.5x of its validation perplexity" in tokens
    assert "Not run on GCIDE yet: MIDX-pq, MIDX-rq, MIDX-learn, TAPAS, One-vs-Each, CANE." in text


def test_a_later_gcide_run_of_a_sampled_head_replaces_the_earlier_one(dirs):
    """MIDX-Learn's re-run replaces its earlier row at the same budget and is compared with the
    full softmax of its own session; both sessions' full-softmax rows stay."""
    for stem, rows in (
        ("gcide_time_full_rerun", [gcide_row("full", 100, 100.0, 400.0)]),
        ("gcide_time_more", [gcide_row("midx_learn", 300, 4000.0, 9e9)]),
        ("gcide_time_full_rerun_learn", [gcide_row("full", 100, 50.0, 500.0)]),
        ("gcide_time_learn", [gcide_row("midx_learn", 300, 1000.0, 250.0)]),
    ):
        (dirs.recipes / f"{stem}.json").write_text(json.dumps(rows))
    text = section(report.build_report(dirs), "5.").split("Equal wall clock")[1]
    assert "| 1000 | 20x |" in row(text, "MIDX-learn", "300")
    assert "| 250 | 251 | 0.5x |" in row(text, "MIDX-learn", "300")
    assert "9e+09" not in text and "| 4000 |" not in text
    assert "| 100 | 1x |" in row(text, "full softmax", "100", "112,000", "100")
    assert "| 50 | 1x |" in row(text, "full softmax", "100", "112,000", "50")


def test_make_report_copies_the_headline_table_into_the_readme(dirs, tmp_path):
    write_csv(
        dirs.benchmarks / "head_step.csv",
        [step(100, "plain_cross_entropy", 2.0, 100.0), step(100, "uniform", 1.0, 50.0)],
    )
    readme = tmp_path / "README.md"
    readme.write_text(
        f"# Title\n\nBefore.\n\n{readme_module.START}\n| old |\n{readme_module.END}\n\nAfter.\n"
    )
    args = [f"--benchmarks={dirs.benchmarks}", f"--recipes={dirs.recipes}", f"--readme={readme}"]
    report.main([*args, f"--results-md={dirs.results_md}"])
    text = readme.read_text()
    assert text.startswith("# Title\n\nBefore.\n\n") and text.endswith("\n\nAfter.\n")
    block = text.split(readme_module.START)[1].split(readme_module.END)[0]
    assert "| old |" not in block and "| uniform | 1e2 | 0.5x | 0.5x |" in block
    assert "provenance" not in block and "P1" not in block
    assert block.count("\n|") == 3  # header, rule, uniform (plain cross-entropy is the reference)
    report.main([*args, f"--results-md={dirs.results_md}"])  # idempotent
    assert readme.read_text() == text
    readme.write_text("no markers")
    with pytest.raises(ValueError, match="no .* block"):
        report.main([*args, f"--results-md={dirs.results_md}"])


def test_serving_section_carries_each_top_k_benchmark_through_its_load_line(dirs):
    planted = [
        "# CANE beam top-k beside faiss",
        "",
        "| section | method | recall_at_10 |",
        "|---|---|---|",
        "| top-10 | beam_topk beam=20 | 0.917 |",
        "",
        "## Targets",
        "",
        "- recall@10 >= 0.9 at beam 20, N = 100,000: 0.917: met",
        "",
        "Command: `python -m benchmarks.cane_topk`; seed 0.",
        "Load average (`/proc/loadavg`, 1 / 5 / 15 min) before: 1.4; after: 2.3.",
        "",
        "The long description of the method, left in the source.",
    ]
    (dirs.benchmarks / "cane_topk.md").write_text("\n".join(planted) + "\n")
    report.main(
        [f"--benchmarks={dirs.benchmarks}", f"--recipes={dirs.recipes}"]
        + [f"--results-md={dirs.results_md}"]
    )
    serving = section(dirs.out.read_text(), "12.")
    assert row(serving, "top-10", "beam_topk beam=20") == "| top-10 | beam_topk beam=20 | 0.917 |"
    assert "#### Targets" in serving and "N = 100,000: 0.917: met" in serving
    assert "Load average" in serving and "long description" not in serving
    assert "[cane_topk.md](cane_topk.md)" in serving
    trained = serving.split("### Trained class tables")[1]
    assert "Not measured yet: " in trained and "benchmarks.cane_topk_trained" in trained
    written = dirs.out.read_text()
    assert written.count("(cane_topk.md)") == serving.count("(cane_topk.md)")  # not in "Other"


def test_estimator_section_carries_the_large_catalog_levers_with_demoted_headings(dirs):
    args = [f"--benchmarks={dirs.benchmarks}", f"--recipes={dirs.recipes}"]
    args.append(f"--results-md={dirs.results_md}")
    report.main(args)
    assert "Not measured yet: the large catalog's levers" in section(dirs.out.read_text(), "10.")
    page = [
        "# Large catalog at equal steps (issue 31, item 4)",
        "",
        "- machine: box",
        "",
        "| method | convention | mean ratio to full |",
        "|---|---|---|",
        "| in_batch | corrected_all | 1.008 |",
        "",
        "## Every configuration against the target",
        "",
        "- in_batch, corrected_all: reaches 0.95x on every seed (ratios 1.014)",
    ]
    (dirs.benchmarks / "large_catalog_levers").mkdir()
    (dirs.benchmarks / "large_catalog_levers" / "large_catalog.md").write_text("\n".join(page))
    report.main(args)
    levers = section(dirs.out.read_text(), "10.").split("### Large catalog at equal steps")[1]
    assert row(levers, "in_batch", "corrected_all") == "| in_batch | corrected_all | 1.008 |"
    assert "##### Every configuration against the target" in levers
    assert "# Large catalog at equal steps (issue 31" not in levers  # the page's own title
    assert "[large_catalog.md](large_catalog_levers/large_catalog.md)" in levers
    assert "Not measured yet" not in levers
