"""Beyond-accuracy metrics of recommended lists at ``k``: item coverage, average popularity, Gini,
Shannon entropy, tail percentage.

The definitions are RecBole's (``ItemCoverage``, ``AveragePopularity``, ``GiniIndex``,
``ShannonEntropy`` and ``TailPercentage`` in ``recbole.evaluator.metrics``, version 1.2.1), for the
top-``k`` lists ``R(u)`` of the users ``U`` seen so far and a catalog of ``N`` items:

- ``ItemCoverage@k = |union_u R(u)| / N``, the fraction of the catalog recommended to anyone;
- ``AveragePopularity@k = mean_u sum_{i in R(u)} phi(i) / |R(u)|``, with ``phi(i)`` the number of
  training interactions of item ``i`` (lower: fewer blockbusters);
- ``GiniIndex@k = sum_{j=1}^{N} (2j - N - 1) P_(j) / (N sum_j P_(j))``, where ``P_(1) <= ... <=
  P_(N)`` are the exposure counts of all ``N`` items (how many lists hold each item) in increasing
  order, never-recommended items included (0: every item equally exposed; ``(N - 1) / N``: one
  item in every list and nothing else);
- ``ShannonEntropy@k = -sum_{i: P_i > 0} p_i ln p_i / |{i: P_i > 0}|`` with ``p_i = P_i / sum_j
  P_j``: the entropy of the exposure distribution *divided by the number of distinct recommended
  items* (RecBole's quirk, see :class:`ShannonEntropy`);
- ``TailPercentage@k = mean_u |R(u) & T| / |R(u)|``, the share of long-tail items ``T`` in each
  list, with RecBole's tail set from the training counts ``phi`` (see :class:`TailPercentage`).

``N`` is the number of classes the head scores. RecBole's ``num_items`` also counts its padding
item, as ``num_classes`` does in the recipes (item 0), so the values agree with RecBole's on the
same lists.

The states are sums, reduced by summation under DDP: an exposure count per item (long ``[N]``)
for coverage, Gini and entropy; a sum of per-list values and a list count for the average
popularity and the tail percentage. Lists arrive in chunks as top-``k'`` class ids ``[..., k']``
(``k' >= k``, rank order, e.g. from a head's ``topk``); a negative id means "no item at this rank"
and is not a recommendation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from .._validation import check_positive_int
from .ranking import _check_ids_below, _check_int_tensor, _check_no_duplicates, check_ignore_index


def recommended_ids(
    preds: Tensor,
    k: int,
    num_classes: int,
    target: Tensor | None = None,
    ignore_index: int | None = -100,
) -> Tensor:
    """Validates a chunk of top-``k'`` lists and returns the first ``k`` ids of each kept list.

    Args:
        preds: integer class ids ``[..., k']`` in rank order, ``k' >= k``; negative entries mean
            "no item at this rank".
        k: how many ranks count.
        num_classes: ``N``; ids must be below it.
        target: optional integer ``[...]`` (one relevant id per query, as the ranking metrics
            take); queries whose target equals ``ignore_index`` are dropped (padded positions).
        ignore_index: the target value of a query to drop; ``None`` drops none.

    Returns:
        long ``[Q, k]``: the kept queries' top-``k`` ids, negative where a rank holds no item.

    Raises:
        ValueError: float or non-integer ``preds``, fewer than ``k`` columns, a repeated id in a
            list, or a ``target`` whose shape is not ``preds``' without its last dim.
        IndexError: an id ``>= num_classes``.
    """
    if not isinstance(preds, Tensor) or preds.dim() < 2:
        shape = tuple(preds.shape) if isinstance(preds, Tensor) else type(preds).__name__
        raise ValueError(f"preds must be top-k class ids [..., k'] (at least 2-D), got {shape}")
    _check_int_tensor("preds (top-k class ids; take head.topk(z, k) of scores first)", preds)
    if preds.shape[-1] < k:
        raise ValueError(
            f"preds holds top-{preds.shape[-1]} class ids but k={k} needs at least {k} columns"
        )
    ids = preds[..., :k].reshape(-1, k).long()
    if target is not None:
        if not isinstance(target, Tensor) or tuple(target.shape) != tuple(preds.shape[:-1]):
            shape = tuple(target.shape) if isinstance(target, Tensor) else type(target).__name__
            raise ValueError(
                f"target must have shape {tuple(preds.shape[:-1])} (one id per query), got {shape}"
            )
        if ignore_index is not None:
            ids = ids[target.reshape(-1).to(ids.device) != ignore_index]
    _check_ids_below("preds", ids, num_classes)
    _check_no_duplicates("preds", ids.sort(dim=-1).values)
    return ids


class _RecommendedListMetric(Metric):
    """Base of the beyond-accuracy metrics: validated top-``k`` lists over ``N`` classes.

    Args:
        k: how many ranks of each list count, a positive int.
        num_classes: ``N``, the catalog size (the padding class included, as RecBole counts it).
        ignore_index: target value of a query whose list is skipped (see :meth:`update`).
        kwargs: passed to :class:`torchmetrics.Metric` (``sync_on_compute``, ...).
    """

    is_differentiable: bool = False
    full_state_update: bool = False

    #: lower-case name used for result keys (``"item_coverage"`` in ``"item_coverage@10"``).
    short_name: str = ""

    def __init__(
        self, k: int, num_classes: int, *, ignore_index: int | None = -100, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.k = check_positive_int("k", k)
        self.num_classes = check_positive_int("num_classes", num_classes)
        self.ignore_index = check_ignore_index(ignore_index, self.num_classes)

    def update(self, preds: Tensor, target: Tensor | None = None) -> None:
        """Adds a chunk of recommended lists.

        Args:
            preds: integer top-``k'`` class ids ``[..., k']`` (``k' >= k``, rank order, negative =
                no item at that rank), e.g. ``head.topk(z, k)[1]``.
            target: optional integer ``[...]``, the ranking metrics' one relevant id per query:
                queries whose target is ``ignore_index`` are skipped; the other targets play no
                part (so the metric can share a ``MetricCollection`` with ``NDCG``).
        """
        self._add_lists(recommended_ids(preds, self.k, self.num_classes, target, self.ignore_index))

    def _add_lists(self, ids: Tensor) -> None:
        """Adds validated lists, long ``[Q, k]`` with negative = no item."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"k={self.k}, num_classes={self.num_classes}"


class _ExposureMetric(_RecommendedListMetric):
    """Keeps ``exposure`` (long ``[N]``, summed under DDP): how many lists hold each item."""

    exposure: Tensor

    def __init__(self, k: int = 10, *, num_classes: int, **kwargs: Any) -> None:
        super().__init__(k, num_classes, **kwargs)
        self.add_state(
            "exposure",
            default=torch.zeros(self.num_classes, dtype=torch.long),
            dist_reduce_fx="sum",
        )

    def _add_lists(self, ids: Tensor) -> None:
        shown = ids[ids >= 0]
        self.exposure += torch.bincount(shown, minlength=self.num_classes)


class ItemCoverage(_ExposureMetric):
    """Item coverage at ``k``: the fraction of the ``N`` classes that appear in any top-``k`` list.

    RecBole's ``ItemCoverage``. Args: ``k``, keyword ``num_classes`` (``N``, the denominator),
    ``ignore_index`` and torchmetrics' ``kwargs``, as in :class:`_RecommendedListMetric`.
    """

    higher_is_better: bool = True
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0
    short_name = "item_coverage"

    def compute(self) -> Tensor:
        """``|items recommended at least once| / N``, a float32 scalar (0 before any list)."""
        return (self.exposure > 0).sum().float() / self.num_classes


class GiniIndex(_ExposureMetric):
    """Gini index at ``k`` of the exposure counts of all ``N`` classes in the top-``k`` lists.

    RecBole's ``GiniIndex``: 0 when every class is recommended equally often, ``(N - 1) / N`` when
    one class fills every list. Args as in :class:`ItemCoverage`.
    """

    higher_is_better: bool = False
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0
    short_name = "gini_index"

    def compute(self) -> Tensor:
        """``sum_j (2j - N - 1) P_(j) / (N sum_j P_(j))`` over the sorted exposure counts
        ``P_(j)``, a float32 scalar (0 before any list)."""
        counts = self.exposure.sort().values.double()
        n = self.num_classes
        total = counts.sum()
        if float(total) == 0.0:
            return torch.zeros((), dtype=torch.float32, device=counts.device)
        rank = torch.arange(1, n + 1, dtype=torch.float64, device=counts.device)
        return ((2 * rank - n - 1) * counts).sum().div(n * total).float()


class ShannonEntropy(_ExposureMetric):
    """Shannon entropy at ``k`` of the classes' exposure in the top-``k`` lists, over ``D`` classes.

    RecBole 1.2.1's ``ShannonEntropy``: with ``P_i`` the number of lists that hold class ``i`` and
    ``p_i = P_i / sum_j P_j``, the value is ``-sum_{i: P_i > 0} p_i ln p_i / D`` where ``D`` is the
    number of distinct classes recommended (natural log). Quirk kept from RecBole: the entropy is
    divided by ``D`` (``get_entropy`` returns ``result / len(item_count)``), so it is not the
    plain entropy and does not grow with diversity as the entropy does: ``D`` classes shown
    equally often give ``ln(D) / D``, which falls as ``D`` grows beyond 3. ``sum_j P_j`` counts
    the ranks that hold a class (``|U| k`` unless lists are padded with negative ids, which RecBole
    never has). Args as in :class:`ItemCoverage`; the state is ``exposure`` (long ``[N]``, summed
    under DDP).
    """

    higher_is_better: bool = True
    plot_lower_bound: float = 0.0
    short_name = "shannon_entropy"

    def compute(self) -> Tensor:
        """``-sum_i p_i ln p_i / D`` over the ``D`` classes with ``P_i > 0``, a float32 scalar (0
        before any list)."""
        counts = self.exposure[self.exposure > 0].double()
        if counts.numel() == 0:
            return torch.zeros((), dtype=torch.float32, device=counts.device)
        p = counts / counts.sum()
        return (-(p * p.log()).sum() / counts.numel()).float()


class AveragePopularity(_RecommendedListMetric):
    """Average popularity at ``k``: the mean over lists of the mean training count of their items.

    RecBole's ``AveragePopularity``: ``mean_u sum_{i in R(u)} phi(i) / |R(u)|`` with ``phi`` the
    training interaction counts. ``|R(u)|`` counts the ranks that hold an item (``k`` unless the
    list is padded with negative ids); a list without any item is skipped.

    States (sums under DDP): ``popularity_sum`` (float64, the lists' mean popularities) and
    ``num_lists`` (long). ``phi`` is a non-persistent buffer: it stays out of checkpoints.

    Args:
        k: how many ranks of each list count.
        class_counts: ``phi``, non-negative ``[N]`` training counts (e.g. the recipes' data
            module's ``class_counts``); ``N`` is its length.
        ignore_index: target value of a query whose list is skipped.
        kwargs: passed to :class:`torchmetrics.Metric`.
    """

    higher_is_better: bool = False
    plot_lower_bound: float = 0.0
    short_name = "average_popularity"

    popularity: Tensor
    popularity_sum: Tensor
    num_lists: Tensor

    def __init__(
        self, k: int = 10, *, class_counts: Tensor | Sequence[float], **kwargs: Any
    ) -> None:
        counts = _check_class_counts(class_counts)
        super().__init__(k, counts.numel(), **kwargs)
        self.register_buffer("popularity", counts, persistent=False)
        self.add_state(
            "popularity_sum",
            default=torch.tensor(0.0, dtype=torch.float64),
            dist_reduce_fx="sum",
        )
        self.add_state("num_lists", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def _add_lists(self, ids: Tensor) -> None:
        shown = ids >= 0
        popularity = self.popularity[ids.clamp(min=0)] * shown
        length = shown.sum(dim=1)
        kept = length > 0
        self.popularity_sum += (popularity.sum(dim=1)[kept] / length[kept]).sum()
        self.num_lists += kept.sum()

    def compute(self) -> Tensor:
        """The mean over lists, a float32 scalar (0 before any list)."""
        if int(self.num_lists) == 0:
            return torch.zeros((), dtype=torch.float32, device=self.popularity_sum.device)
        return (self.popularity_sum / self.num_lists).float()


class TailPercentage(_RecommendedListMetric):
    """Tail percentage at ``k``: the mean over lists of the share of long-tail classes in them.

    RecBole 1.2.1's ``TailPercentage``: ``mean_u |R(u) & T| / |R(u)|``. The tail set ``T`` comes
    from the training counts ``phi`` as RecBole's ``get_tail`` builds it from
    ``dataset.item_counter``, which holds only the items seen in training:

    - ``tail_ratio > 1``: an absolute count, ``T = {i : 0 < phi(i) <= tail_ratio}``;
    - ``0 < tail_ratio <= 1``: a share, ``T`` = the ``max(int(M * tail_ratio), 1)`` classes with
      the smallest ``phi`` among the ``M`` classes with ``phi > 0``, ties broken by the smaller
      class id (RecBole sorts by ``(count, id)``; ``int`` truncates the product in floating point).

    Quirks kept from RecBole: a class with ``phi = 0`` (never seen in training, such as the padding
    class) is never in the tail, since ``item_counter`` does not hold it; ``tail_ratio = 1`` means
    every class with ``phi > 0``, not ``phi <= 1``; with ``M = 0`` the tail is empty. RecBole
    replaces a ``tail_ratio`` that is ``None`` or ``<= 0`` by 0.1 silently; here ``None`` means 0.1
    and a value ``<= 0`` raises ``ValueError``. ``|R(u)|`` counts the ranks that hold a class
    (``k`` unless the list is padded with negative ids); a list without any class is skipped.

    States (sums under DDP): ``tail_sum`` (float64, the lists' tail shares) and ``num_lists``
    (long). ``tail`` (bool ``[N]``, the tail set) is a non-persistent buffer.

    Args:
        k: how many ranks of each list count.
        class_counts: ``phi``, non-negative ``[N]`` training counts; ``N`` is its length.
        tail_ratio: RecBole's ``tail_ratio``: a share of the classes in ``(0, 1]`` or a count
            ``> 1`` (see above); ``None`` for RecBole's default 0.1.
        ignore_index: target value of a query whose list is skipped.
        kwargs: passed to :class:`torchmetrics.Metric`.
    """

    higher_is_better: bool = True
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0
    short_name = "tail_percentage"

    tail: Tensor
    tail_sum: Tensor
    num_lists: Tensor

    def __init__(
        self,
        k: int = 10,
        *,
        class_counts: Tensor | Sequence[float],
        tail_ratio: float | None = 0.1,
        **kwargs: Any,
    ) -> None:
        counts = _check_class_counts(class_counts)
        if tail_ratio is None:
            tail_ratio = 0.1
        if (
            isinstance(tail_ratio, bool)
            or not isinstance(tail_ratio, (int, float))
            or not math.isfinite(tail_ratio)
            or tail_ratio <= 0
        ):
            raise ValueError(
                f"tail_ratio must be a share in (0, 1] or a count > 1, got {tail_ratio!r}"
            )
        super().__init__(k, counts.numel(), **kwargs)
        self.tail_ratio = tail_ratio
        self.register_buffer("tail", tail_classes(counts, tail_ratio), persistent=False)
        self.add_state(
            "tail_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum"
        )
        self.add_state("num_lists", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def _add_lists(self, ids: Tensor) -> None:
        shown = ids >= 0
        in_tail = self.tail[ids.clamp(min=0)] & shown
        length = shown.sum(dim=1)
        kept = length > 0
        share = in_tail.sum(dim=1, dtype=torch.float64)[kept] / length[kept]
        self.tail_sum += share.sum()
        self.num_lists += kept.sum()

    def compute(self) -> Tensor:
        """The mean tail share over lists, a float32 scalar (0 before any list)."""
        if int(self.num_lists) == 0:
            return torch.zeros((), dtype=torch.float32, device=self.tail_sum.device)
        return (self.tail_sum / self.num_lists).float()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, tail_ratio={self.tail_ratio}"


def tail_classes(class_counts: Tensor, tail_ratio: float) -> Tensor:
    """RecBole 1.2.1's long-tail set (``TailPercentage.get_tail``) as a bool ``[N]`` mask.

    Args:
        class_counts: float64 ``[N]`` training counts ``phi``; classes with ``phi = 0`` are never
            in the tail (RecBole's ``item_counter`` does not hold them).
        tail_ratio: ``> 1``: ``phi <= tail_ratio``; in ``(0, 1]``: the ``max(int(M * tail_ratio),
            1)`` least-counted of the ``M`` classes with ``phi > 0``, ties by smaller id.

    Returns:
        bool ``[N]``, ``True`` for the classes in the tail.
    """
    seen = class_counts > 0
    if tail_ratio > 1:
        return seen & (class_counts <= tail_ratio)
    seen_ids = seen.nonzero().flatten()
    cut = max(int(seen_ids.numel() * tail_ratio), 1)
    # a stable sort of the seen classes (in id order) by count = RecBole's sort by (count, id)
    order = class_counts[seen_ids].sort(stable=True).indices
    tail = torch.zeros_like(seen)
    tail[seen_ids[order[:cut]]] = True
    return tail


def _check_class_counts(class_counts: Tensor | Sequence[float]) -> Tensor:
    """``class_counts`` as a float64 ``[N]`` tensor, or ``ValueError`` naming the bad value."""
    try:
        counts = torch.as_tensor(class_counts, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"class_counts must be a [N] sequence of counts, got {err}") from None
    if counts.dim() != 1 or counts.numel() == 0:
        raise ValueError(
            f"class_counts must be a non-empty [N] vector, got shape {tuple(counts.shape)}"
        )
    if not bool(torch.isfinite(counts).all()) or bool((counts < 0).any()):
        bad = counts[~torch.isfinite(counts) | (counts < 0)][0]
        raise ValueError(f"class_counts must be finite and >= 0, got {float(bad)}")
    return counts
