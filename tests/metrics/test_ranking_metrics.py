"""Ranking metrics at k against torchmetrics' Retrieval metrics, hand-computed cases, DDP sums."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.retrieval import (
    RetrievalMAP,
    RetrievalMRR,
    RetrievalNormalizedDCG,
    RetrievalPrecision,
    RetrievalRecall,
)
from torchmetrics.utilities.data import dim_zero_sum

from lightning_sampled.metrics import MAP, MRR, NDCG, Precision, RankingMetric, Recall, ranking_hits

OURS: dict[str, type[RankingMetric]] = {
    "ndcg": NDCG,
    "recall": Recall,
    "precision": Precision,
    "mrr": MRR,
    "map": MAP,
}
REFERENCE = {
    "ndcg": RetrievalNormalizedDCG,
    "recall": RetrievalRecall,
    "precision": RetrievalPrecision,
    "mrr": RetrievalMRR,
    "map": RetrievalMAP,
}
NAMES = tuple(OURS)
B, N = 37, 53  # non-powers of two


def make_scores(seed: int, rows: int = B, cols: int = N) -> Tensor:
    """Strictly positive, tie-free scores ``[rows, cols]`` (torchmetrics ignores scores <= 0)."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(rows, cols, generator=gen, dtype=torch.float64).float() + 0.05
    assert all(len(set(r.tolist())) == cols for r in scores)
    return scores


def make_relevance(seed: int, rows: int = B, cols: int = N, p: float = 0.12) -> Tensor:
    """Bool ``[rows, cols]`` with rows 0 and 5 empty and row 1 all relevant."""
    gen = torch.Generator().manual_seed(seed + 1000)
    rel = torch.rand(rows, cols, generator=gen) < p
    rel[0] = False
    rel[5] = False
    rel[1] = True
    return rel


def padded_ids(rel: Tensor, seed: int) -> Tensor:
    """The relevant ids of each row of ``rel`` ``[Q, N]``, shuffled, padded with -1: ``[Q, R]``."""
    gen = torch.Generator().manual_seed(seed + 2000)
    width = int(rel.sum(1).max()) + 2
    out = torch.full((rel.shape[0], width), -1, dtype=torch.long)
    for q in range(rel.shape[0]):
        ids = rel[q].nonzero().flatten()
        row = torch.cat([ids, torch.full((width - len(ids),), -1, dtype=torch.long)])
        out[q] = row[torch.randperm(width, generator=gen)]
    return out


def reference(name: str, scores: Tensor, rel: Tensor, k: int, **kwargs: object) -> float:
    """torchmetrics' Retrieval metric with one group per query over the full score matrix."""
    metric = REFERENCE[name](top_k=k, **kwargs)
    indexes = torch.arange(scores.shape[0]).repeat_interleave(scores.shape[1])
    metric.update(scores.flatten(), rel.flatten(), indexes=indexes)
    return float(metric.compute())


def ours(name: str, k: int, preds: Tensor, target: Tensor, **kwargs: object) -> float:
    metric = OURS[name](k, **kwargs)
    metric.update(preds, target)
    return float(metric.compute())


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 7, 20])
def test_single_target_equals_torchmetrics(name: str, seed: int, k: int) -> None:
    scores = make_scores(seed)
    target = torch.randint(0, N, (B,), generator=torch.Generator().manual_seed(seed + 7))
    rel = torch.nn.functional.one_hot(target, N).bool()
    expected = reference(name, scores, rel, k)
    top = scores.topk(k + 3).indices
    assert ours(name, k, scores, target) == pytest.approx(expected, abs=1e-6)
    assert ours(name, k, top, target) == pytest.approx(expected, abs=1e-6)
    assert ours(name, k, top, target, num_classes=N) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 6, 20])
def test_multi_label_equals_torchmetrics(name: str, seed: int, k: int) -> None:
    scores, rel = make_scores(seed), make_relevance(seed)
    expected = reference(name, scores, rel, k)
    top = scores.topk(k).indices
    for target in (rel, rel.float(), padded_ids(rel, seed)):
        assert ours(name, k, scores, target) == pytest.approx(expected, abs=1e-6)
        assert ours(name, k, top, target) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("action", ["neg", "pos", "skip"])
def test_empty_target_action_equals_torchmetrics(name: str, action: str) -> None:
    scores, rel = make_scores(3), make_relevance(3, p=0.05)
    assert int((rel.sum(1) == 0).sum()) >= 2
    expected = reference(name, scores, rel, 5, empty_target_action=action)
    got = ours(name, 5, scores.topk(5).indices, rel, empty_target_action=action)
    assert got == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_empty_target_action_error(name: str) -> None:
    metric = OURS[name](5, empty_target_action="error")
    with pytest.raises(ValueError, match="empty_target_action"):
        metric.update(make_scores(0), make_relevance(0))


@pytest.mark.parametrize("name", NAMES)
def test_all_queries_skipped_gives_zero(name: str) -> None:
    metric = OURS[name](3, empty_target_action="skip")
    metric.update(make_scores(0, 4, 9), torch.zeros(4, 9, dtype=torch.bool))
    assert float(metric.compute()) == 0.0


@pytest.mark.parametrize("name", NAMES)
def test_k_larger_than_num_classes_equals_torchmetrics(name: str) -> None:
    scores, rel = make_scores(4, 11, 6), make_relevance(4, 11, 6, p=0.3)
    assert ours(name, 9, scores, rel) == pytest.approx(reference(name, scores, rel, 9), abs=1e-6)


def test_precision_adaptive_k_equals_torchmetrics() -> None:
    scores, rel = make_scores(5, 11, 6), make_relevance(5, 11, 6, p=0.3)
    for adaptive in (False, True):
        expected = reference("precision", scores, rel, 9, adaptive_k=adaptive)
        got = ours("precision", 9, scores, rel, adaptive_k=adaptive)
        assert got == pytest.approx(expected, abs=1e-6)
    # the two differ here, so the default (False, as torchmetrics) is really checked
    assert ours("precision", 9, scores, rel) != pytest.approx(
        ours("precision", 9, scores, rel, adaptive_k=True)
    )


def test_sequence_shaped_inputs_are_flattened() -> None:
    scores = make_scores(6, 12, N).reshape(3, 4, N)
    target = torch.randint(0, N, (3, 4), generator=torch.Generator().manual_seed(1))
    target[0, 1] = -100  # skipped query
    keep = target.flatten() != -100
    for name in NAMES:
        flat = ours(name, 5, scores.reshape(12, N)[keep], target.flatten()[keep])
        assert ours(name, 5, scores, target) == pytest.approx(flat, abs=1e-7)


def test_negative_top_k_ids_are_not_retrieved() -> None:
    # ranks 2 and 3 hold no class: the target (7) is at rank 4
    preds = torch.tensor([[3, -1, -1, 7, 9]])
    target = torch.tensor([7])
    assert ours("mrr", 5, preds, target) == pytest.approx(1 / 4)
    assert ours("mrr", 3, preds, target) == 0.0


def test_minus_inf_scores_are_never_retrieved() -> None:
    scores = torch.tensor([[0.3, -math.inf, 0.9, -math.inf]])
    assert ours("recall", 4, scores, torch.tensor([1])) == 0.0
    assert ours("recall", 4, scores, torch.tensor([0])) == 1.0


# -- hand-computed cases --------------------------------------------------------------------------

# classes 4, 2, 0, 1, 3 in rank order
HAND_SCORES = torch.tensor([[0.5, 0.2, 0.7, 0.1, 0.9]])


def test_hand_single_target_at_rank_three() -> None:
    target = torch.tensor([0])
    assert ours("ndcg", 5, HAND_SCORES, target) == pytest.approx(1 / math.log2(4))
    assert ours("mrr", 5, HAND_SCORES, target) == pytest.approx(1 / 3)
    assert ours("map", 5, HAND_SCORES, target) == pytest.approx(1 / 3)
    assert ours("recall", 5, HAND_SCORES, target) == pytest.approx(1.0)
    assert ours("recall", 2, HAND_SCORES, target) == 0.0
    assert ours("precision", 4, HAND_SCORES, target) == pytest.approx(1 / 4)
    assert ours("ndcg", 2, HAND_SCORES, target) == 0.0
    assert ours("mrr", 2, HAND_SCORES, target) == 0.0


def test_hand_multi_label() -> None:
    # relevant: 4 (rank 1), 0 (rank 3) and 3 (rank 5, outside k = 4)
    target = torch.tensor([[0, 3, 4, -1]])
    k = 4
    ideal = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert ours("ndcg", k, HAND_SCORES, target) == pytest.approx((1 + 1 / math.log2(4)) / ideal)
    assert ours("recall", k, HAND_SCORES, target) == pytest.approx(2 / 3)
    assert ours("precision", k, HAND_SCORES, target) == pytest.approx(2 / 4)
    assert ours("mrr", k, HAND_SCORES, target) == pytest.approx(1.0)
    # torchmetrics' AP@k: mean precision over the relevant classes retrieved in the top k
    assert ours("map", k, HAND_SCORES, target) == pytest.approx((1 / 1 + 2 / 3) / 2)
    rel = torch.zeros(1, 5, dtype=torch.bool)
    rel[0, [0, 3, 4]] = True
    for name in NAMES:
        assert ours(name, k, HAND_SCORES, rel) == pytest.approx(
            reference(name, HAND_SCORES, rel, k), abs=1e-6
        )


def test_hand_batch_mean_over_queries() -> None:
    scores = torch.cat([HAND_SCORES, HAND_SCORES])
    target = torch.tensor([4, 1])  # rank 1 and rank 4
    assert ours("mrr", 5, scores, target) == pytest.approx((1 + 1 / 4) / 2)
    assert ours("ndcg", 5, scores, target) == pytest.approx((1 + 1 / math.log2(5)) / 2)


# -- accumulation, reset, forward, DDP ------------------------------------------------------------


def batches(seed: int) -> tuple[Tensor, Tensor, list[slice]]:
    scores, rel = make_scores(seed), make_relevance(seed)
    return scores, rel, [slice(0, 5), slice(5, 6), slice(6, 30), slice(30, B)]


@pytest.mark.parametrize("name", NAMES)
def test_accumulation_reset_and_forward(name: str) -> None:
    scores, rel, parts = batches(8)
    whole = ours(name, 6, scores, rel)
    metric = OURS[name](6)
    for part in parts:
        metric.update(scores[part].topk(6).indices, rel[part])
    assert float(metric.compute()) == pytest.approx(whole, abs=1e-7)
    assert float(metric.compute()) == pytest.approx(reference(name, scores, rel, 6), abs=1e-6)

    metric.reset()
    metric.update(scores[parts[2]], rel[parts[2]])
    assert float(metric.compute()) == pytest.approx(
        ours(name, 6, scores[parts[2]], rel[parts[2]]), abs=1e-7
    )

    metric.reset()
    batch_values = [float(metric(scores[p], rel[p])) for p in parts]
    for part, value in zip(parts, batch_values, strict=True):
        assert value == pytest.approx(ours(name, 6, scores[part], rel[part]), abs=1e-7)
    assert float(metric.compute()) == pytest.approx(whole, abs=1e-7)


@pytest.mark.parametrize("name", NAMES)
def test_states_are_scalar_sums(name: str) -> None:
    metric = OURS[name](4)
    assert set(metric._reductions) == {"score_sum", "num_scored", "num_empty"}
    assert all(fn is dim_zero_sum for fn in metric._reductions.values())
    for _ in range(3):
        metric.update(make_scores(0), make_relevance(0))
    for state in metric.metric_state.values():
        assert isinstance(state, Tensor) and state.dim() == 0
    assert int(metric.num_scored) + int(metric.num_empty) == 3 * B


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("action", ["neg", "pos", "skip"])
def test_merge_state_equals_one_metric(name: str, action: str) -> None:
    scores, rel, _ = batches(9)
    first, second = (
        OURS[name](5, empty_target_action=action),
        OURS[name](5, empty_target_action=action),
    )
    first.update(scores[:20], rel[:20])
    second.update(scores[20:], padded_ids(rel[20:], 0))
    first.merge_state(second)
    expected = ours(name, 5, scores, rel, empty_target_action=action)
    assert float(first.compute()) == pytest.approx(expected, abs=1e-7)


@pytest.mark.parametrize("name", NAMES)
def test_simulated_ddp_sync_equals_one_metric(name: str) -> None:
    """Runs torchmetrics' own DDP sync path in ``compute`` with a fake two-rank all-gather."""
    scores, rel, _ = batches(10)
    rank1 = OURS[name](5)
    rank1.update(scores[11:], rel[11:])

    def all_gather(tensor: Tensor, group: object = None) -> list[Tensor]:
        attr = next(a for a in rank0._reductions if getattr(rank0, a) is tensor)
        return [tensor, getattr(rank1, attr)]

    rank0 = OURS[name](5, dist_sync_fn=all_gather, distributed_available_fn=lambda: True)
    rank0.update(scores[:11], rel[:11])
    assert float(rank0.compute()) == pytest.approx(ours(name, 5, scores, rel), abs=1e-7)
    # compute unsyncs afterwards: the local states are this rank's alone again
    assert int(rank0.num_scored) + int(rank0.num_empty) == 11


def test_metric_collection() -> None:
    scores, rel, _ = batches(11)
    collection = MetricCollection({n: OURS[n](5) for n in NAMES})
    collection.update(scores.topk(5).indices, rel)
    out = collection.compute()
    for n in NAMES:
        assert float(out[n]) == pytest.approx(reference(n, scores, rel, 5), abs=1e-6)


def test_metric_class_attributes() -> None:
    for cls in OURS.values():
        assert cls.higher_is_better is True
        assert cls.is_differentiable is False
        assert cls.full_state_update is False


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"k": 0}, "k must be a positive integer, got 0"),
        ({"k": 2.5}, "k must be a positive integer, got 2.5"),
        ({"k": True}, "k must be a positive integer, got True"),
        ({"k": 3, "num_classes": 0}, "num_classes must be a positive integer, got 0"),
        ({"k": 3, "empty_target_action": "drop"}, "empty_target_action .* got 'drop'"),
        ({"k": 3, "ignore_index": 4}, "ignore_index .* got 4"),
        ({"k": 3, "ignore_index": 5, "num_classes": 9}, "ignore_index .* got 5"),
        ({"k": 3, "ignore_index": "x"}, "ignore_index must be an int or None, got 'x'"),
    ],
)
def test_bad_constructor_arguments(name: str, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OURS[name](**kwargs)


def test_bad_adaptive_k() -> None:
    with pytest.raises(ValueError, match="adaptive_k must be a bool, got 1"):
        Precision(3, adaptive_k=1)


def test_ignore_index_beyond_num_classes_is_allowed() -> None:
    metric = Recall(2, num_classes=5, ignore_index=5)
    metric.update(make_scores(0, 3, 5), torch.tensor([5, 5, 5]))
    assert int(metric.num_scored) == 0


@pytest.mark.parametrize(
    ("preds", "target", "error", "match"),
    [
        (torch.rand(4, 9), torch.tensor([1, 2, 3, 9]), IndexError, "target .* got 9"),
        (torch.rand(4, 9), torch.tensor([1, 2, -3, 0]), IndexError, "target .* got -3"),
        (torch.tensor([[0, 1, 12]]), torch.tensor([[True] * 9]), IndexError, "preds .* got 12"),
        (torch.rand(2, 9), torch.tensor([[0, 11, -1], [1, 2, 3]]), IndexError, "target .* got 11"),
        (torch.tensor([[1.0, math.nan, 0.2]]), torch.tensor([0]), ValueError, "preds .*NaN"),
        (torch.rand(4, 9), torch.tensor([1, 2, 3]), ValueError, r"target .* \(4,\)"),
        (torch.rand(4, 9), torch.rand(4), ValueError, "target .* integer .*float32"),
        (torch.rand(4, 9), torch.ones(4, 8, dtype=torch.bool), ValueError, "target .* 9 columns"),
        (torch.rand(4, 9), torch.full((4, 9), 0.5), ValueError, "0 and 1"),
        (torch.rand(9), torch.tensor(1), ValueError, "preds must have shape"),
        (torch.tensor([[0, 1]]), torch.tensor([0]), ValueError, "top-2 .* k=3"),
        (torch.tensor([[0, 1, 1]]), torch.tensor([0]), ValueError, "preds repeats class id 1"),
        (torch.ones(2, 3, dtype=torch.bool), torch.tensor([0, 1]), ValueError, "preds .* dtype"),
        (torch.rand(2, 9), torch.rand(2, 9, 1), ValueError, "target must have shape"),
        (torch.rand(2, 4), torch.tensor([[0, 1, 0, 1]] * 2), ValueError, r"pass target\.bool\(\)"),
    ],
)
def test_bad_update_input(preds: Tensor, target: Tensor, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Recall(3).update(preds, target)


def test_num_classes_checks_top_k_ids_and_targets() -> None:
    with pytest.raises(IndexError, match="preds must hold class ids in \\[0, 10\\), got 10"):
        NDCG(2, num_classes=10).update(torch.tensor([[10, 1]]), torch.tensor([1]))
    with pytest.raises(IndexError, match="target must hold class ids in \\[0, 10\\), got 12"):
        NDCG(2, num_classes=10).update(torch.tensor([[3, 1]]), torch.tensor([12]))
    with pytest.raises(ValueError, match="num_classes=10 columns, got 9"):
        NDCG(2, num_classes=10).update(torch.rand(1, 9), torch.tensor([1]))


def test_ranking_hits_shapes() -> None:
    hits, num_relevant, n = ranking_hits(torch.rand(3, 4, 11), torch.zeros(3, 4, 11).bool(), 5)
    assert hits.shape == (12, 5) and hits.dtype == torch.bool
    assert num_relevant.shape == (12,) and n == 11
