"""``benchmarks/cane_topk.py`` at a toy size: every method has a row, the exact top-k has recall
1, and the targets say met or NOT met from the numbers."""

import csv

from benchmarks import cane_topk


def test_toy_run_writes_every_method_and_the_targets(tmp_path):
    cane_topk.main(
        ["--sizes", "2000", "--beams", "10", "2000", "--nprobes", "1", "--efs", "16",
         "--queries", "16", "--step-positions", "64", "--repeats", "1",
         "--name", str(tmp_path / "cane_topk")]
    )  # fmt: skip
    text = (tmp_path / "cane_topk.md").read_text()
    assert "## Targets" in text and "Load average" in text
    rows = (tmp_path / "cane_topk.csv").read_text().splitlines()
    assert len(rows) == 1 + 7 + 2  # exact, 2 beams from 2 starts, IVF, HNSW; two steps
    exact = next(r for r in rows if ",exact," in r)
    beam_n = [r for r in rows if "beam=2000" in r]
    assert ",1.0," in exact  # the exact top-k is its own reference
    assert len(beam_n) == 2 and all(",1.0," in r for r in beam_n)  # a beam of N is exact
    starts = {row["method"]: row["start_level"] for row in csv.DictReader(rows)}
    assert starts["beam_topk beam=10"] == "3 of 4"  # levels of 1, 2, 20, 200, 2,000 nodes
    assert starts["beam_topk beam=10 from root"] == "0 of 4"
    # nothing measured at 1e6: NOT met, never met by default
    assert "N = 1,000,000: not measured: NOT met" in text


def test_targets_follow_the_numbers():
    rows = [
        {"num_classes": 100_000, "method": "beam_topk beam=20", "recall_at_10": 0.95,
         "speedup_vs_exact": 3.0},
        {"num_classes": 1_000_000, "method": "beam_topk beam=20", "recall_at_10": 0.7,
         "speedup_vs_exact": 20.0},
        {"num_classes": 3707, "method": "cane step", "step_vs_uniform": 1.6},
    ]  # fmt: skip
    lines = cane_topk.targets(rows)
    assert lines[0].endswith(": met") and lines[1].endswith("NOT met")
    assert lines[2].endswith(": met") and lines[3].endswith("NOT met")
