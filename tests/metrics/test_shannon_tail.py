"""Shannon entropy and tail percentage at k against RecBole 1.2.1's own ``ShannonEntropy`` and
``TailPercentage`` (``recbole/evaluator/metrics.py``): random lists for several k and tail ratios,
the tail set itself, ``ignore_index`` and ``-1`` ids, edge cases, accumulation, DDP sums."""

from __future__ import annotations

import math
from collections import Counter
from types import ModuleType

import numpy as np
import pytest
import torch
from recbole_reference import load_recbole_metrics
from torch import Tensor
from torchmetrics.utilities.data import dim_zero_sum

from lightning_sampled.metrics import ShannonEntropy, TailPercentage, tail_classes

KS = (1, 2, 5, 8)
K_MAX = max(KS)


@pytest.fixture(scope="module")
def recbole() -> ModuleType:
    return load_recbole_metrics()


def item_counter(phi: list[int]) -> Counter:
    """RecBole's ``data.count_items`` (``dataset.item_counter``): a Counter of the training
    interactions, so it holds only the items with a count > 0."""
    return Counter({i: c for i, c in enumerate(phi) if c > 0})


def recbole_config(**extra: object) -> dict[str, object]:
    return {"topk": list(KS), "metric_decimal_place": 12, **extra}


def recbole_entropy(recbole: ModuleType, lists: Tensor) -> dict[int, float]:
    """RecBole's ``ShannonEntropy.calculate_metric`` on full lists ``[U, K_MAX]``."""
    out = recbole.ShannonEntropy(recbole_config()).calculate_metric({"rec.items": lists[:, :K_MAX]})
    return {k: out[f"shannonentropy@{k}"] for k in KS}


def recbole_tail(
    recbole: ModuleType, lists: Tensor, phi: list[int], tail_ratio: float | None
) -> dict[int, float]:
    """RecBole's ``TailPercentage.calculate_metric`` on full lists ``[U, K_MAX]``."""
    metric = recbole.TailPercentage(recbole_config(tail_ratio=tail_ratio))
    data = {"rec.items": lists[:, :K_MAX], "data.count_items": item_counter(phi)}
    out = metric.calculate_metric(data)
    return {k: out[f"tailpercentage@{k}"] for k in KS}


def recbole_padded(
    recbole: ModuleType, lists: Tensor, k: int, phi: list[int], tail_ratio: float
) -> tuple[float, float]:
    """Both metrics for lists padded with negative ids ``[U, k']``, which RecBole never has: the
    entropy is RecBole's ``get_entropy`` of all shown ids as one row (its ``p`` divides by the
    number of ids shown); the tail share is RecBole's ``get_tail`` of each list's shown ids over
    their number, averaged over the lists that show any."""
    shown = [row[row >= 0].numpy() for row in lists[:, :k]]
    entropy_metric = recbole.ShannonEntropy(recbole_config())
    entropy = entropy_metric.get_entropy(np.concatenate(shown)[None, :])
    tail_metric = recbole.TailPercentage(recbole_config(tail_ratio=tail_ratio))
    shares = [tail_metric.get_tail(r[None, :], item_counter(phi)).mean() for r in shown if len(r)]
    return float(entropy), float(np.mean(shares))


def random_lists(seed: int, users: int, num_items: int, width: int = K_MAX) -> Tensor:
    """``[users, width]`` lists of distinct items, drawn towards low ids (an unequal exposure)."""
    gen = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, num_items + 1, dtype=torch.float64)
    return torch.multinomial(weights.expand(users, -1), width, generator=gen)


def random_counts(seed: int, num_items: int, high: int = 6) -> list[int]:
    """Training counts in ``[0, high)``: many ties and several zeros (never-seen items)."""
    gen = torch.Generator().manual_seed(seed + 500)
    return torch.randint(0, high, (num_items,), generator=gen).tolist()


def entropy_of(k: int, num_classes: int, *updates: Tensor | tuple[Tensor, Tensor]) -> float:
    metric = ShannonEntropy(k, num_classes=num_classes)
    for update in updates:
        metric.update(*update) if isinstance(update, tuple) else metric.update(update)
    return float(metric.compute())


def tail_of(
    k: int, phi: list[int], tail_ratio: float | None, *updates: Tensor | tuple[Tensor, Tensor]
) -> float:
    metric = TailPercentage(k, class_counts=phi, tail_ratio=tail_ratio)
    for update in updates:
        metric.update(*update) if isinstance(update, tuple) else metric.update(update)
    return float(metric.compute())


TAIL_RATIOS = (0.1, 0.25, 0.5, 0.73, 1, 1.0, 2, 2.5, 3, None)


# -- Shannon entropy ------------------------------------------------------------------------------


def test_entropy_hand_example() -> None:
    lists = torch.tensor([[0, 1], [0, 2], [0, 1]])  # counts {0: 3, 1: 2, 2: 1} of 6, 3 distinct
    p = np.array([3, 2, 1]) / 6
    assert entropy_of(2, 5, lists) == pytest.approx(float(-(p * np.log(p)).sum() / 3), abs=1e-7)
    assert entropy_of(1, 5, lists) == 0.0  # item 0 alone: p = 1
    # one query with k distinct items: ln(k) / k (RecBole divides the entropy by the k items)
    assert entropy_of(4, 5, torch.tensor([[3, 0, 4, 1]])) == pytest.approx(math.log(4) / 4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_entropy_equals_recbole(recbole: ModuleType, seed: int) -> None:
    num_items = 31
    lists = random_lists(seed, 47, num_items)
    expected = recbole_entropy(recbole, lists)
    for k in KS:
        assert entropy_of(k, num_items, lists) == pytest.approx(expected[k], abs=1e-7)
        # a larger catalog (items never recommended) changes nothing
        assert entropy_of(k, 4 * num_items, lists) == pytest.approx(expected[k], abs=1e-7)
        # in several updates, one of them a single query, and as [B, L, k'] input
        chunks = (lists[:1], lists[1:20].reshape(19, 1, K_MAX), lists[20:21], lists[21:])
        assert entropy_of(k, num_items, *chunks) == pytest.approx(expected[k], abs=1e-7)


def test_entropy_one_query_equals_recbole(recbole: ModuleType) -> None:
    lists = random_lists(3, 1, 12)
    expected = recbole_entropy(recbole, lists)
    assert expected[8] == pytest.approx(math.log(8) / 8)
    for k in KS:
        assert entropy_of(k, 12, lists) == pytest.approx(expected[k], abs=1e-7)


# -- tail percentage ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("tail_ratio", TAIL_RATIOS)
def test_tail_set_equals_recbole(recbole: ModuleType, seed: int, tail_ratio: float | None) -> None:
    num_items = 40
    phi = random_counts(seed, num_items)
    metric = recbole.TailPercentage(recbole_config(tail_ratio=tail_ratio))
    expected = metric.get_tail(np.arange(num_items)[None, :], item_counter(phi))[0].astype(bool)
    ours = TailPercentage(3, class_counts=phi, tail_ratio=tail_ratio).tail
    assert ours.tolist() == expected.tolist()
    assert ours.any() and not ours.all()
    assert not ours[torch.tensor(phi) == 0].any()  # never-seen items are never tail (RecBole)


@pytest.mark.parametrize(
    ("num_seen", "tail_ratio"),
    [(100, 0.29), (100, 0.57), (10, 0.7), (10, 0.3), (3, 0.1), (7, 1 / 7)],
)
def test_tail_cut_truncates_as_recbole(recbole: ModuleType, num_seen: int, tail_ratio: float):
    """``int(M * tail_ratio)`` in floating point: 100 * 0.29 = 28.999999999999996 -> 28 items;
    and at least one item even when the product is below 1."""
    phi = [0] + list(range(1, num_seen + 1))
    metric = recbole.TailPercentage(recbole_config(tail_ratio=tail_ratio))
    expected = metric.get_tail(np.arange(len(phi))[None, :], item_counter(phi))[0]
    ours = tail_classes(torch.tensor(phi, dtype=torch.float64), tail_ratio)
    assert ours.tolist() == expected.astype(bool).tolist()
    assert int(ours.sum()) == max(int(num_seen * tail_ratio), 1)


def test_tail_ties_broken_by_smaller_id(recbole: ModuleType) -> None:
    phi = [0, 4, 2, 2, 9, 2, 2, 1, 2]  # seen: 8 items; 0.5 -> the 4 least counted
    metric = recbole.TailPercentage(recbole_config(tail_ratio=0.5))
    expected = metric.get_tail(np.arange(len(phi))[None, :], item_counter(phi))[0]
    assert np.flatnonzero(expected).tolist() == [2, 3, 5, 7]
    ours = TailPercentage(2, class_counts=phi, tail_ratio=0.5).tail
    assert ours.nonzero().flatten().tolist() == [2, 3, 5, 7]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tail_ratio", TAIL_RATIOS)
def test_tail_percentage_equals_recbole(
    recbole: ModuleType, seed: int, tail_ratio: float | None
) -> None:
    num_items = 31
    lists = random_lists(seed, 47, num_items).flip(1)  # low-count ids
    phi = sorted(random_counts(seed, num_items, high=9), reverse=True)  # low ids: popular
    phi[0] = 0  # a popular list position that is never seen in training
    expected = recbole_tail(recbole, lists, phi, tail_ratio)
    assert 0.0 < expected[K_MAX] < 1.0
    for k in KS:
        assert tail_of(k, phi, tail_ratio, lists) == pytest.approx(expected[k], abs=1e-7)
        chunks = (lists[:1], lists[1:20].reshape(19, 1, K_MAX), lists[20:21], lists[21:])
        assert tail_of(k, phi, tail_ratio, *chunks) == pytest.approx(expected[k], abs=1e-7)


def test_tail_edge_cases(recbole: ModuleType) -> None:
    lists = random_lists(4, 9, 20)
    # all recommendations in the tail
    phi = [1] * 20
    assert recbole_tail(recbole, lists, phi, 1)[K_MAX] == 1.0
    assert tail_of(K_MAX, phi, 1, lists) == 1.0
    assert tail_of(K_MAX, phi, 1.5, lists) == 1.0
    # tail_ratio = 1 is a share (every seen item), not "count <= 1"
    phi = [5] * 20
    assert recbole_tail(recbole, lists, phi, 1)[K_MAX] == 1.0
    assert tail_of(K_MAX, phi, 1, lists) == 1.0
    assert tail_of(K_MAX, phi, 4.9, lists) == recbole_tail(recbole, lists, phi, 4.9)[K_MAX] == 0.0
    # a count tail_ratio > 1 keeps counts equal to it
    assert tail_of(K_MAX, phi, 5, lists) == recbole_tail(recbole, lists, phi, 5)[K_MAX] == 1.0
    # items never seen in training are never tail, even the only items recommended
    phi = [0] * 10 + [3] * 10
    low = torch.stack(
        [torch.randperm(10, generator=torch.Generator().manual_seed(i)) for i in range(9)]
    )
    assert recbole_tail(recbole, low, phi, 0.5)[K_MAX] == 0.0
    assert tail_of(K_MAX, phi, 0.5, low) == 0.0
    # nothing seen in training: RecBole's tail is empty (its cut of 1 slices an empty list)
    phi = [0] * 20
    assert not tail_classes(torch.zeros(20, dtype=torch.float64), 0.1).any()
    assert tail_of(K_MAX, phi, 0.1, lists) == recbole_tail(recbole, lists, phi, 0.1)[K_MAX] == 0.0


def test_tail_one_query(recbole: ModuleType) -> None:
    phi = random_counts(7, 15)
    lists = random_lists(7, 1, 15)
    for tail_ratio in (0.3, 2):
        expected = recbole_tail(recbole, lists, phi, tail_ratio)
        for k in KS:
            assert tail_of(k, phi, tail_ratio, lists) == pytest.approx(expected[k], abs=1e-7)


# -- both: padding, ignore_index, accumulation, DDP -----------------------------------------------


@pytest.mark.parametrize("k", KS)
def test_negative_ids_and_ignore_index_equal_recbole_on_shown_items(
    recbole: ModuleType, k: int
) -> None:
    num_items = 25
    lists = random_lists(5, 36, num_items)
    phi = random_counts(5, num_items)
    lists[::4, 1:] = -1  # short lists
    lists[3, :] = -1  # an empty list
    lists[::5, ::2] = -1  # holes
    target = torch.randint(0, num_items, (36,), generator=torch.Generator().manual_seed(5))
    target[::7] = -100
    kept = target != -100
    entropy, tail = recbole_padded(recbole, lists[kept], k, phi, 0.3)
    chunks = [
        (lists[:12].reshape(3, 4, K_MAX), target[:12].reshape(3, 4)),
        (lists[12:13], target[12:13]),
        (lists[13:], target[13:]),
    ]
    assert entropy_of(k, num_items, *chunks) == pytest.approx(entropy, abs=1e-7)
    assert tail_of(k, phi, 0.3, *chunks) == pytest.approx(tail, abs=1e-7)


@pytest.mark.filterwarnings("ignore:The ``compute`` method")
def test_nothing_seen_gives_zero() -> None:
    assert entropy_of(3, 5) == 0.0 and tail_of(3, [1] * 5, 0.5) == 0.0
    empty = torch.full((2, 3), -1)
    assert entropy_of(3, 5, empty) == 0.0 and tail_of(3, [1] * 5, 0.5, empty) == 0.0


def test_states_are_sums() -> None:
    entropy = ShannonEntropy(3, num_classes=11)
    assert set(entropy._reductions) == {"exposure"} and entropy.exposure.shape == (11,)
    tail = TailPercentage(3, class_counts=list(range(11)), tail_ratio=0.5)
    assert set(tail._reductions) == {"tail_sum", "num_lists"}
    for metric in (entropy, tail):
        assert all(fn is dim_zero_sum for fn in metric._reductions.values())
    assert "tail" not in tail.state_dict()  # the tail set stays out of checkpoints
    assert "tail_ratio=0.5" in repr(tail)
    assert ShannonEntropy.short_name == "shannon_entropy"
    assert TailPercentage.short_name == "tail_percentage"


def make(name: str, **kwargs: object) -> ShannonEntropy | TailPercentage:
    if name == "entropy":
        return ShannonEntropy(5, num_classes=23, **kwargs)
    return TailPercentage(5, class_counts=random_counts(6, 23), tail_ratio=0.4, **kwargs)


@pytest.mark.parametrize("name", ["entropy", "tail"])
def test_merge_state_equals_one_metric(recbole: ModuleType, name: str) -> None:
    lists = random_lists(6, 30, 23)
    first, second = make(name), make(name)
    first.update(lists[:11])
    second.update(lists[11:])
    first.merge_state(second)
    if name == "entropy":
        expected = recbole_entropy(recbole, lists)[5]
    else:
        expected = recbole_tail(recbole, lists, random_counts(6, 23), 0.4)[5]
    assert float(first.compute()) == pytest.approx(expected, abs=1e-7)


@pytest.mark.parametrize("name", ["entropy", "tail"])
def test_simulated_ddp_sync_equals_one_metric(recbole: ModuleType, name: str) -> None:
    """torchmetrics' own sync path in ``compute`` with a fake two-rank all-gather: the entropy's
    [N] exposure counts are summed, so items recommended on one rank only count."""
    lists = random_lists(8, 30, 23)
    rank1 = make(name)
    rank1.update(lists[17:])

    def all_gather(tensor: Tensor, group: object = None) -> list[Tensor]:
        attr = next(a for a in rank0._reductions if getattr(rank0, a) is tensor)
        return [tensor, getattr(rank1, attr)]

    rank0 = make(name, dist_sync_fn=all_gather, distributed_available_fn=lambda: True)
    rank0.update(lists[:17])
    if name == "entropy":
        expected = recbole_entropy(recbole, lists)[5]
    else:
        expected = recbole_tail(recbole, lists, random_counts(6, 23), 0.4)[5]
    assert float(rank0.compute()) == pytest.approx(expected, abs=1e-7)
    # compute unsyncs afterwards: the local states are this rank's alone again
    if name == "entropy":
        assert int(rank0.exposure.sum()) == 17 * 5
    else:
        assert int(rank0.num_lists) == 17


@pytest.mark.parametrize(
    ("make_metric", "match"),
    [
        (lambda: ShannonEntropy(0, num_classes=5), "k must be a positive integer, got 0"),
        (lambda: ShannonEntropy(2, num_classes=0), "num_classes must be a positive integer"),
        (lambda: ShannonEntropy(2, num_classes=5, ignore_index=3), "ignore_index must not be"),
        (lambda: TailPercentage(2, class_counts=[1, -1]), "class_counts must be .* got -1"),
        (lambda: TailPercentage(2, class_counts=[1], tail_ratio=0), "tail_ratio .* got 0"),
        (lambda: TailPercentage(2, class_counts=[1], tail_ratio=-0.5), "tail_ratio .* got -0.5"),
        (lambda: TailPercentage(2, class_counts=[1], tail_ratio=math.nan), "got nan"),
        (lambda: TailPercentage(2, class_counts=[1], tail_ratio=math.inf), "got inf"),
        (lambda: TailPercentage(2, class_counts=[1], tail_ratio=True), "got True"),
        (lambda: TailPercentage(2, class_counts=[1], tail_ratio="0.1"), "got '0.1'"),
    ],
)
def test_bad_constructor_arguments(make_metric, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_metric()


def test_none_tail_ratio_is_recbole_default() -> None:
    phi = random_counts(9, 50)
    assert TailPercentage(2, class_counts=phi, tail_ratio=None).tail.tolist() == (
        TailPercentage(2, class_counts=phi, tail_ratio=0.1).tail.tolist()
    )


@pytest.mark.parametrize(
    ("preds", "error", "match"),
    [
        (torch.rand(3, 5), ValueError, "integer tensor here"),
        (torch.tensor([[0], [1]]), ValueError, "top-1 class ids but k=2"),
        (torch.tensor([[0, 5]]), IndexError, "in \\[0, 5\\), got 5"),
        (torch.tensor([[2, 2]]), ValueError, "repeats class id 2 in row 0"),
    ],
)
def test_bad_update_input(preds: Tensor, error: type, match: str) -> None:
    for metric in (ShannonEntropy(2, num_classes=5), TailPercentage(2, class_counts=[1] * 5)):
        with pytest.raises(error, match=match):
            metric.update(preds)
