"""Hit at k against RecBole 1.2.1's own ``Hit`` (``recbole/evaluator/metrics.py``): one or several
relevant ids per query, ``ignore_index``, ``-1`` ids, accumulation over updates, DDP sums."""

from __future__ import annotations

import sys
from types import ModuleType

import numpy as np
import pytest
import torch
from recbole_reference import load_recbole_metrics
from torch import Tensor
from torchmetrics.retrieval import RetrievalHitRate
from torchmetrics.utilities.data import dim_zero_sum

from lightning_sampled.metrics import Hit, Recall

B, N = 43, 29
KS = (1, 3, 5, 10)


@pytest.fixture(scope="module")
def recbole() -> ModuleType:
    return load_recbole_metrics()


def recbole_hit(recbole: ModuleType, top: Tensor, relevant: list[set[int]]) -> dict[int, float]:
    """RecBole's ``Hit.calculate_metric`` on the top-``max(KS)`` ids ``[U, K]`` of ``U`` users with
    relevant sets ``relevant``: ``rec.topk`` is RecBole's ``[U, K + 1]`` matrix of 0/1 hits at
    each rank followed by the number of relevant items (a ``-1`` id is never relevant)."""
    k_max = max(KS)
    pos_index = [
        [int(i) in rel for i in row[:k_max].tolist()]
        for row, rel in zip(top, relevant, strict=True)
    ]
    pos_len = [[len(rel)] for rel in relevant]
    rec_topk = torch.cat([torch.tensor(pos_index, dtype=torch.long), torch.tensor(pos_len)], 1)
    metric = recbole.Hit({"topk": list(KS), "metric_decimal_place": 12})
    out = metric.calculate_metric({"rec.topk": rec_topk})
    return {k: out[f"hit@{k}"] for k in KS}


def ours(k: int, *updates: tuple[Tensor, Tensor], **kwargs: object) -> float:
    metric = Hit(k, **kwargs)
    for preds, target in updates:
        metric.update(preds, target)
    return float(metric.compute())


def scores(seed: int, rows: int = B, cols: int = N) -> Tensor:
    """Tie-free, strictly positive scores ``[rows, cols]``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(rows, cols, generator=gen, dtype=torch.float64).float() + 0.05


def relevance(seed: int, rows: int = B, cols: int = N) -> Tensor:
    """Bool ``[rows, cols]``, about 3 relevant per row; rows 0 and 4 empty, row 2 all relevant."""
    gen = torch.Generator().manual_seed(seed + 100)
    rel = torch.rand(rows, cols, generator=gen) < 0.1
    rel[0] = rel[4] = False
    rel[2] = True
    return rel


def padded_ids(rel: Tensor) -> Tensor:
    """The relevant ids of each row of ``rel`` ``[Q, N]``, reversed, padded with -1: ``[Q, R]``."""
    width = int(rel.sum(1).max()) + 1
    out = torch.full((rel.shape[0], width), -1, dtype=torch.long)
    for q, row in enumerate(rel):
        ids = row.nonzero().flatten().flip(0)
        out[q, : len(ids)] = ids
    return out


def sets(rel: Tensor) -> list[set[int]]:
    return [set(row.nonzero().flatten().tolist()) for row in rel]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_single_target_equals_recbole(recbole: ModuleType, seed: int) -> None:
    s = scores(seed)
    target = torch.randint(0, N, (B,), generator=torch.Generator().manual_seed(seed + 7))
    top = s.topk(max(KS) + 2).indices
    expected = recbole_hit(recbole, top, [{int(t)} for t in target])
    assert expected[1] < expected[10] < 1.0
    for k in KS:
        assert ours(k, (s, target)) == pytest.approx(expected[k], abs=1e-7)
        assert ours(k, (top, target)) == pytest.approx(expected[k], abs=1e-7)
        assert ours(k, (top, target), num_classes=N) == pytest.approx(expected[k], abs=1e-7)
        # with one relevant id per query the hit ratio is the recall
        assert ours(k, (top, target)) == pytest.approx(
            float(Recall(k).forward(top, target)), abs=1e-7
        )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_multi_label_equals_recbole(recbole: ModuleType, seed: int) -> None:
    s, rel = scores(seed), relevance(seed)
    top = s.topk(max(KS)).indices
    expected = recbole_hit(recbole, top, sets(rel))
    for k in KS:
        for target in (rel, rel.float(), padded_ids(rel)):
            assert ours(k, (s, target)) == pytest.approx(expected[k], abs=1e-7)
            assert ours(k, (top, target)) == pytest.approx(expected[k], abs=1e-7)
        # torchmetrics' RetrievalHitRate agrees (positive scores; empty queries count 0)
        reference = RetrievalHitRate(top_k=k)
        indexes = torch.arange(B).repeat_interleave(N)
        reference.update(s.flatten(), rel.flatten(), indexes=indexes)
        assert ours(k, (s, rel)) == pytest.approx(float(reference.compute()), abs=1e-6)


def test_hand_example_counts_a_query_once() -> None:
    top = torch.tensor([[3, 1, 4, 0], [2, 0, 1, 3], [0, 1, 2, 3]])
    target = torch.tensor([[1, 4, -1], [3, 4, -1], [4, -1, -1]])  # relevant ids, -1 = padding
    # k = 3: query 0 finds both of its relevant ids, query 1 none, query 2 none -> 1/3
    assert ours(3, (top, target)) == pytest.approx(1 / 3)
    # Recall counts found relevant ids: (2/2 + 0/2 + 0/1) / 3, Hit counts queries with any
    assert ours(2, (top, target)) == pytest.approx(1 / 3)
    assert float(Recall(2).forward(top, target)) == pytest.approx(0.5 / 3)
    # k = 4: query 1 finds 3 -> 2/3
    assert ours(4, (top, target)) == pytest.approx(2 / 3)


def test_one_query(recbole: ModuleType) -> None:
    top = torch.tensor([[5, 2, 7, 1, 0, 3, 4, 6, 8, 9]])
    expected = recbole_hit(recbole, top, [{7}])
    assert expected == {1: 0.0, 3: 1.0, 5: 1.0, 10: 1.0}
    for k in KS:
        assert ours(k, (top, torch.tensor([7]))) == expected[k]


def test_empty_queries_count_zero_as_in_recbole(recbole: ModuleType) -> None:
    s, rel = scores(5), relevance(5)
    top = s.topk(max(KS)).indices
    expected = recbole_hit(recbole, top, sets(rel))
    assert ours(5, (top, rel)) == pytest.approx(expected[5], abs=1e-7)
    nonempty = rel.any(1)
    assert ours(5, (top, rel), empty_target_action="skip") == pytest.approx(
        recbole_hit(recbole, top[nonempty], sets(rel[nonempty]))[5], abs=1e-7
    )


@pytest.mark.parametrize("ignore_index", [-100, -1])
def test_ignore_index_and_sequence_shapes(recbole: ModuleType, ignore_index: int) -> None:
    s = scores(6, 6 * 7)
    target = torch.randint(0, N, (6 * 7,), generator=torch.Generator().manual_seed(6))
    ignored = torch.rand(6 * 7, generator=torch.Generator().manual_seed(60)) < 0.3
    target_padded = torch.where(ignored, ignore_index, target)
    top = s.topk(max(KS)).indices
    expected = recbole_hit(recbole, top[~ignored], [{int(t)} for t in target[~ignored]])
    for k in KS:
        got = ours(
            k, (top.reshape(6, 7, -1), target_padded.reshape(6, 7)), ignore_index=ignore_index
        )
        assert got == pytest.approx(expected[k], abs=1e-7)


def test_negative_top_k_ids_are_no_item(recbole: ModuleType) -> None:
    top = scores(7).topk(max(KS)).indices
    top[::3, 2:] = -1  # every third list holds two items only
    top[1] = -1  # an empty list
    rel = relevance(7)
    rel[1, :] = True  # relevant everywhere, but nothing was retrieved
    expected = recbole_hit(recbole, top, sets(rel))
    for k in KS:
        assert ours(k, (top, rel)) == pytest.approx(expected[k], abs=1e-7)
        assert ours(k, (top, padded_ids(rel))) == pytest.approx(expected[k], abs=1e-7)


def test_accumulates_over_updates(recbole: ModuleType) -> None:
    s, rel = scores(8), relevance(8)
    top = s.topk(max(KS)).indices
    expected = recbole_hit(recbole, top, sets(rel))
    parts = [slice(0, 1), slice(1, 17), slice(17, 18), slice(18, B)]
    for k in KS:
        metric = Hit(k)
        for i, part in enumerate(parts):
            target = padded_ids(rel[part]) if i % 2 else rel[part]
            metric.update(top[part] if i < 2 else s[part], target)
        assert float(metric.compute()) == pytest.approx(expected[k], abs=1e-7)
        metric.reset()
        metric.update(top[parts[1]], rel[parts[1]])
        assert float(metric.compute()) == pytest.approx(
            recbole_hit(recbole, top[parts[1]], sets(rel[parts[1]]))[k], abs=1e-7
        )


def test_states_are_scalar_sums() -> None:
    metric = Hit(4)
    assert set(metric._reductions) == {"score_sum", "num_scored", "num_empty"}
    assert all(fn is dim_zero_sum for fn in metric._reductions.values())
    metric.update(scores(0), relevance(0))
    assert all(v.dim() == 0 for v in metric.metric_state.values())
    assert Hit.short_name == "hit" and Hit.higher_is_better is True


@pytest.mark.parametrize("action", ["neg", "pos", "skip"])
def test_merge_state_equals_one_metric(action: str) -> None:
    s, rel = scores(9), relevance(9)
    first, second = Hit(5, empty_target_action=action), Hit(5, empty_target_action=action)
    first.update(s[:20], rel[:20])
    second.update(s[20:].topk(5).indices, padded_ids(rel[20:]))
    first.merge_state(second)
    assert float(first.compute()) == pytest.approx(
        ours(5, (s, rel), empty_target_action=action), abs=1e-7
    )


def test_simulated_ddp_sync_equals_one_metric(recbole: ModuleType) -> None:
    """torchmetrics' own sync path in ``compute`` with a fake two-rank all-gather."""
    s, rel = scores(10), relevance(10)
    rank1 = Hit(3)
    rank1.update(s[13:], rel[13:])

    def all_gather(tensor: Tensor, group: object = None) -> list[Tensor]:
        attr = next(a for a in rank0._reductions if getattr(rank0, a) is tensor)
        return [tensor, getattr(rank1, attr)]

    rank0 = Hit(3, dist_sync_fn=all_gather, distributed_available_fn=lambda: True)
    rank0.update(s[:13], rel[:13])
    expected = recbole_hit(recbole, s.topk(max(KS)).indices, sets(rel))[3]
    assert float(rank0.compute()) == pytest.approx(expected, abs=1e-7)
    assert int(rank0.num_scored) + int(rank0.num_empty) == 13


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="k must be a positive integer, got 0"):
        Hit(0)
    with pytest.raises(ValueError, match="ignore_index .* got 3"):
        Hit(2, ignore_index=3)
    with pytest.raises(ValueError, match="preds repeats class id 1"):
        Hit(3).update(torch.tensor([[0, 1, 1]]), torch.tensor([0]))
    with pytest.raises(IndexError, match="target .* got -3"):
        Hit(3).update(scores(0, 2, 9), torch.tensor([1, -3]))


def test_recbole_reference_is_recbole() -> None:
    module = load_recbole_metrics()
    assert (
        "recbole.evaluator.metrics" not in sys.modules
        or sys.modules["recbole.evaluator.metrics"] is not module
    )  # the stand-ins were not left behind
    hits = np.array([[0, 0, 1], [1, 0, 0]], dtype=bool)
    assert module.Hit({"topk": [1], "metric_decimal_place": 4}).metric_info(hits).tolist() == [
        [0, 0, 1],
        [1, 1, 1],
    ]
