"""``benchmarks/cane_topk_trained.py``'s comparison on a tiny random table (no training): the
exact top-k is its own reference, a beam of N is exact, every method has a row, and the targets
and equal-recall lines follow the numbers."""

import argparse

import pytest
import torch

from benchmarks import cane_topk_trained


def tiny_args(**kwargs):
    defaults = dict(
        beams=[10, 300], searches=["auto", "root", "fitted"], nprobes=[1, 64], efs=[16],
        max_hnsw=10_000, max_clusters=None, repeats=1, seed=0,
    )  # fmt: skip
    return argparse.Namespace(**{**defaults, **kwargs})


def test_exact_is_the_reference_and_a_beam_of_n_is_exact():
    generator = torch.Generator().manual_seed(0)
    table = torch.randn(300, 16, generator=generator)
    z = torch.randn(40, 16, generator=generator)
    fit_z = torch.randn(40, 16, generator=generator)
    rows = cane_topk_trained.table_rows("tiny", table, z, tiny_args(), fit_z)
    by_method = {row["method"]: row for row in rows}
    assert set(by_method) == {
        "exact", "beam_topk beam=10", "beam_topk beam=300", "beam_topk beam=10 from root",
        "beam_topk beam=300 from root", "beam_topk beam=10 fitted", "beam_topk beam=300 fitted",
        "IVFFlat nlist=69 nprobe=1", "IVFFlat nlist=69 nprobe=64", "HNSWFlat M=32 efSearch=16",
    }  # fmt: skip
    assert all(row["table"] == "tiny" and row["num_classes"] == 300 for row in rows)
    assert by_method["exact"]["recall_at_10"] == 1.0
    for search in ("", " from root", " fitted"):
        assert by_method[f"beam_topk beam=300{search}"]["recall_at_10"] == 1.0  # a beam of N
        assert by_method[f"beam_topk beam=10{search}"]["recall_at_10"] < 1.0  # a small one
    assert all(row["queries_per_s"] > 0 for row in rows)
    lines = cane_topk_trained.equal_recall(rows, "tiny")
    assert len(lines) == 6 and all(line.startswith("- tiny, beam_topk") for line in lines)
    with pytest.raises(ValueError, match="the fitted search needs fit_z"):
        cane_topk_trained.table_rows("tiny", table, z, tiny_args())


def test_targets_follow_the_numbers():
    rows = [
        {"table": "gcide", "method": "beam_topk beam=20", "recall_at_10": 0.95},
        {"table": "ml1m", "method": "beam_topk beam=20", "recall_at_10": 0.85},
    ]
    rows.append({"table": "ml1m", "method": "beam_topk beam=20 fitted", "recall_at_10": 0.97})
    lines = cane_topk_trained.targets(rows, ["gcide", "ml1m", "other"])
    assert lines[0].endswith("gcide, node means: 0.950: met")
    assert lines[1].endswith("gcide, node vectors fitted: not measured: NOT met")
    assert lines[2].endswith("ml1m, node means: 0.850: NOT met")
    assert lines[3].endswith("ml1m, node vectors fitted: 0.970: met")
    assert lines[4].endswith("other, node means: not measured: NOT met")


def test_equal_recall_names_the_faster_side():
    rows = [
        {"table": "t", "method": "beam_topk beam=20", "recall_at_10": 0.9, "queries_per_s": 100},
        {"table": "t", "method": "IVFFlat nprobe=1", "recall_at_10": 0.8, "queries_per_s": 900},
        {"table": "t", "method": "IVFFlat nprobe=4", "recall_at_10": 0.95, "queries_per_s": 50},
        {"table": "t", "method": "beam_topk beam=50", "recall_at_10": 0.99, "queries_per_s": 10},
    ]
    beats, wins = cane_topk_trained.equal_recall(rows, "t")
    assert "IVFFlat nprobe=4" in beats and "the beam tree beats faiss (2.00x)" in beats
    assert "no faiss setting here reaches that recall" in wins
