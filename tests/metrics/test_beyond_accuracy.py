"""Item coverage, average popularity and Gini index at k: RecBole's definitions on a hand example
and on random lists, chunked updates, DDP-style merges of sum states, bad input."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.utilities.data import dim_zero_sum

from lightning_sampled.metrics import (
    NDCG,
    AveragePopularity,
    GiniIndex,
    ItemCoverage,
    recommended_ids,
)

# Hand example: N = 5 items, three users' top-2 lists, training counts phi.
HAND_LISTS = torch.tensor([[0, 1], [0, 2], [0, 1]])
HAND_PHI = [10, 4, 1, 0, 7]


def metrics(k: int, num_classes: int, phi: list[float]) -> dict[str, object]:
    return {
        "item_coverage": ItemCoverage(k, num_classes=num_classes),
        "average_popularity": AveragePopularity(k, class_counts=phi),
        "gini_index": GiniIndex(k, num_classes=num_classes),
    }


def values(k: int, num_classes: int, phi: list[float], *chunks: Tensor) -> dict[str, float]:
    out = {}
    for name, metric in metrics(k, num_classes, phi).items():
        for chunk in chunks:
            metric.update(chunk)
        out[name] = float(metric.compute())
    return out


def recbole_reference(lists: np.ndarray, k: int, phi: list[float]) -> dict[str, float]:
    """RecBole 1.2.1's three definitions, written out for full top-k lists ``[U, k']``: coverage
    counts the distinct items; popularity averages each user's mean count; Gini weighs the sorted
    counts of the recommended items with ranks ``N - n + 1 .. N`` (the other items count 0)."""
    top = lists[:, :k]
    num_items = len(phi)
    counts = np.array(sorted(Counter(top.flatten().tolist()).values()), dtype=np.float64)
    ranks = np.arange(num_items - len(counts) + 1, num_items + 1)
    return {
        "item_coverage": len(np.unique(top)) / num_items,
        "average_popularity": float(np.mean([np.mean([phi[i] for i in row]) for row in top])),
        "gini_index": float(np.sum((2 * ranks - num_items - 1) * counts) / top.size / num_items),
    }


def random_lists(seed: int, users: int, num_items: int, width: int) -> Tensor:
    """``[users, width]`` lists of distinct items, drawn towards low ids (an unequal exposure)."""
    gen = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, num_items + 1, dtype=torch.float64)
    return torch.multinomial(weights.expand(users, -1), width, generator=gen)


def test_hand_example_at_two_and_one() -> None:
    # k = 2: items {0, 1, 2} of 5; popularities (10+4)/2, (10+1)/2, (10+4)/2 -> 6.5;
    # exposure sorted (0, 0, 1, 2, 3) with weights (-4, -2, 0, 2, 4) -> 16 / (5 * 6).
    assert values(2, 5, HAND_PHI, HAND_LISTS) == pytest.approx(
        {"item_coverage": 0.6, "average_popularity": 6.5, "gini_index": 16 / 30}, abs=1e-6
    )
    # k = 1: item 0 alone, in all three lists -> Gini 12 / 15 = (N - 1) / N.
    assert values(1, 5, HAND_PHI, HAND_LISTS) == pytest.approx(
        {"item_coverage": 0.2, "average_popularity": 10.0, "gini_index": 0.8}, abs=1e-6
    )
    assert recbole_reference(HAND_LISTS.numpy(), 2, HAND_PHI) == pytest.approx(
        values(2, 5, HAND_PHI, HAND_LISTS), abs=1e-6
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_random_lists_equal_recbole_definitions(seed: int, k: int) -> None:
    num_items = 23
    lists = random_lists(seed, 41, num_items, 7)
    phi = torch.randint(0, 50, (num_items,), generator=torch.Generator().manual_seed(seed))
    phi = phi.tolist()
    expected = recbole_reference(lists.numpy(), k, phi)
    assert values(k, num_items, phi, lists) == pytest.approx(expected, abs=1e-6)
    # in chunks, and as sequence-shaped [B, L, k'] input
    assert values(k, num_items, phi, lists[:10], lists[10:11], lists[11:]) == pytest.approx(
        expected, abs=1e-6
    )
    assert values(k, num_items, phi, lists[:40].reshape(4, 10, 7), lists[40:]) == pytest.approx(
        expected, abs=1e-6
    )


def test_gini_bounds() -> None:
    n = 6
    every_item_once = torch.arange(n).reshape(3, 2)
    assert values(2, n, [1.0] * n, every_item_once)["gini_index"] == pytest.approx(0.0, abs=1e-7)
    one_item_everywhere = torch.zeros(4, 1, dtype=torch.long)
    gini = values(1, n, [1.0] * n, one_item_everywhere)["gini_index"]
    assert gini == pytest.approx((n - 1) / n, abs=1e-7)


@pytest.mark.filterwarnings("ignore:The ``compute`` method")
def test_nothing_seen_gives_zero() -> None:
    for metric in metrics(3, 5, HAND_PHI).values():
        assert float(metric.compute()) == 0.0
    # lists without any item (negative ids only) count for nothing
    assert values(2, 5, HAND_PHI, torch.full((2, 2), -1)) == {
        "item_coverage": 0.0,
        "average_popularity": 0.0,
        "gini_index": 0.0,
    }


def test_negative_ids_are_no_item() -> None:
    padded = torch.tensor([[0, 1], [4, -1], [-1, -1]])
    got = values(2, 5, HAND_PHI, padded)
    # items {0, 1, 4}; popularity mean of (10+4)/2 and 7/1, the empty list skipped;
    # exposure sorted (0, 0, 1, 1, 1) with weights (-4, -2, 0, 2, 4) -> 6 / (5 * 3)
    assert got == pytest.approx(
        {"item_coverage": 0.6, "average_popularity": 7.0, "gini_index": 6 / 15}, abs=1e-6
    )


def test_target_ignore_index_skips_lists() -> None:
    lists = torch.tensor([[[0, 1], [2, 3]], [[4, 0], [1, 2]]])  # [B=2, L=2, k'=2]
    target = torch.tensor([[3, -100], [-100, 1]])
    for name, metric in metrics(2, 5, HAND_PHI).items():
        metric.update(lists, target)
        kept = values(2, 5, HAND_PHI, torch.tensor([[0, 1], [1, 2]]))[name]
        assert float(metric.compute()) == pytest.approx(kept, abs=1e-6), name
    none_skipped = ItemCoverage(2, num_classes=5, ignore_index=None)
    none_skipped.update(lists, target)
    assert float(none_skipped.compute()) == 1.0


def test_states_are_sums_without_lists() -> None:
    for metric in metrics(3, 11, list(range(11))).values():
        assert metric._reductions and all(f is dim_zero_sum for f in metric._reductions.values())
        assert all(isinstance(v, Tensor) for v in metric._defaults.values())
    exposure = ItemCoverage(3, num_classes=11)
    assert set(exposure._reductions) == {"exposure"} and exposure.exposure.shape == (11,)
    popularity = AveragePopularity(3, class_counts=list(range(11)))
    assert set(popularity._reductions) == {"popularity_sum", "num_lists"}
    assert "popularity" not in popularity.state_dict()  # phi stays out of checkpoints


@pytest.mark.parametrize("name", ["item_coverage", "average_popularity", "gini_index"])
def test_merge_state_equals_one_metric(name: str) -> None:
    num_items = 19
    lists = random_lists(3, 30, num_items, 5)
    phi = [float(i % 7) for i in range(num_items)]
    first, second = metrics(4, num_items, phi)[name], metrics(4, num_items, phi)[name]
    first.update(lists[:12])
    second.update(lists[12:])
    first.merge_state(second)
    expected = recbole_reference(lists.numpy(), 4, phi)[name]
    assert float(first.compute()) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("name", ["item_coverage", "average_popularity", "gini_index"])
def test_simulated_ddp_sync_equals_one_metric(name: str) -> None:
    """torchmetrics' own sync path in ``compute`` with a fake two-rank all-gather: the [N]
    exposure counts of the ranks are summed, so items recommended on one rank only count."""
    num_items = 13
    lists = random_lists(4, 20, num_items, 3)
    phi = [float(i) for i in range(num_items)]
    rank1 = metrics(3, num_items, phi)[name]
    rank1.update(lists[9:])

    def all_gather(tensor: Tensor, group: object = None) -> list[Tensor]:
        attr = next(a for a in rank0._reductions if getattr(rank0, a) is tensor)
        return [tensor, getattr(rank1, attr)]

    kwargs = {"dist_sync_fn": all_gather, "distributed_available_fn": lambda: True}
    rank0 = {
        "item_coverage": lambda: ItemCoverage(3, num_classes=num_items, **kwargs),
        "average_popularity": lambda: AveragePopularity(3, class_counts=phi, **kwargs),
        "gini_index": lambda: GiniIndex(3, num_classes=num_items, **kwargs),
    }[name]()
    rank0.update(lists[:9])
    expected = recbole_reference(lists.numpy(), 3, phi)[name]
    assert float(rank0.compute()) == pytest.approx(expected, abs=1e-6)


def test_collection_with_ranking_metrics() -> None:
    lists = random_lists(5, 16, 9, 4)
    target = lists[:, 0].clone()
    collection = MetricCollection(
        {
            "ndcg": NDCG(4),
            "coverage": ItemCoverage(4, num_classes=9),
            "gini": GiniIndex(4, num_classes=9),
        }
    )
    collection.update(lists, target)
    out = collection.compute()
    assert float(out["ndcg"]) == pytest.approx(1.0)
    assert float(out["coverage"]) == pytest.approx(len(lists.unique()) / 9)


def test_reset() -> None:
    metric = GiniIndex(2, num_classes=5)
    metric.update(HAND_LISTS)
    metric.reset()
    metric.update(torch.tensor([[3, 4]]))
    assert float(metric.compute()) == pytest.approx(
        values(2, 5, HAND_PHI, torch.tensor([[3, 4]]))["gini_index"]
    )


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: ItemCoverage(0, num_classes=5), "k must be a positive integer, got 0"),
        (lambda: GiniIndex(2, num_classes=0), "num_classes must be a positive integer, got 0"),
        (lambda: ItemCoverage(2, num_classes=5, ignore_index=3), "ignore_index must not be"),
        (
            lambda: AveragePopularity(2, class_counts=[1.0, -2.0]),
            "class_counts must be .* >= 0, got -2",
        ),
        (lambda: AveragePopularity(2, class_counts=[1.0, float("nan")]), "got nan"),
        (lambda: AveragePopularity(2, class_counts=[[1.0]]), "non-empty \\[N\\] vector, got shape"),
        (
            lambda: AveragePopularity(2, class_counts=[]),
            "non-empty \\[N\\] vector, got shape \\(0,\\)",
        ),
        (
            lambda: AveragePopularity(2, class_counts="abc"),
            "class_counts must be a \\[N\\] sequence",
        ),
    ],
)
def test_bad_constructor_arguments(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    ("preds", "target", "error", "match"),
    [
        (torch.rand(3, 5), None, ValueError, "integer tensor here, got dtype torch.float32"),
        (torch.tensor([0, 1]), None, ValueError, "at least 2-D\\), got \\(2,\\)"),
        (torch.tensor([[0], [1]]), None, ValueError, "top-1 class ids but k=2"),
        (torch.tensor([[0, 5]]), None, IndexError, "in \\[0, 5\\), got 5"),
        (torch.tensor([[2, 2]]), None, ValueError, "repeats class id 2 in row 0"),
        (
            torch.tensor([[0, 1]]),
            torch.tensor([[0]]),
            ValueError,
            "target must have shape \\(1,\\)",
        ),
    ],
)
def test_bad_update_input(preds: Tensor, target: Tensor | None, error: type, match: str) -> None:
    for metric in metrics(2, 5, HAND_PHI).values():
        with pytest.raises(error, match=match):
            metric.update(preds, target)


def test_recommended_ids_keeps_first_k_columns() -> None:
    ids = recommended_ids(torch.tensor([[[4, 3, 2]], [[0, 1, 2]]]), 2, 5)
    assert ids.tolist() == [[4, 3], [0, 1]]
