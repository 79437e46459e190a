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
    assert len(rows) == 1 + 9 + 2  # exact, 2 beams x 3 searches, IVF, HNSW; two steps
    exact = next(r for r in rows if ",exact," in r)
    beam_n = [r for r in rows if "beam=2000" in r]
    assert ",1.0," in exact  # the exact top-k is its own reference
    assert len(beam_n) == 3 and all(",1.0," in r for r in beam_n)  # a beam of N is exact
    by_method = {row["method"]: row for row in csv.DictReader(rows)}
    assert by_method["beam_topk beam=10"]["start_level"] == "3 of 4"  # 1, 2, 20, 200, 2,000
    assert by_method["beam_topk beam=10 fitted"]["start_level"] == "3 of 4"
    assert by_method["beam_topk beam=10 from root"]["start_level"] == "0 of 4"
    tree_build = float(by_method["beam_topk beam=10"]["build_s"])
    assert float(by_method["beam_topk beam=10 fitted"]["build_s"]) > tree_build  # + the fit
    # nothing measured at 1e6: NOT met, never met by default
    assert "N = 1,000,000, node means: not measured: NOT met" in text
    assert "N = 1,000,000, fitted: not measured: NOT met" in text


def test_targets_follow_the_numbers():
    rows = [
        {"num_classes": 100_000, "method": "beam_topk beam=20", "recall_at_10": 0.95,
         "speedup_vs_exact": 3.0},
        {"num_classes": 1_000_000, "method": "beam_topk beam=20", "recall_at_10": 0.7,
         "speedup_vs_exact": 20.0},
        {"num_classes": 3707, "method": "cane step", "step_vs_uniform": 1.6},
    ]  # fmt: skip
    rows.append({"num_classes": 1_000_000, "method": "beam_topk beam=20 fitted",
                 "recall_at_10": 0.85, "speedup_vs_exact": 9.0})  # fmt: skip
    lines = cane_topk.targets(rows)
    assert lines[0].endswith("N = 100,000, node means: 0.950: met")
    assert lines[1].endswith("N = 100,000, fitted: not measured: NOT met")
    assert lines[2].endswith("N = 1,000,000, node means: 0.700: NOT met")
    assert lines[3].endswith("N = 1,000,000, fitted: 0.850: met")
    assert lines[4].endswith("node means: 20.0x: met")
    assert lines[5].endswith("fitted: 9.0x: NOT met")
    assert lines[6].endswith("NOT met")  # the CANE step at 1.6x
