"""Exact ranking metrics at ``k`` (NDCG, Recall, Precision, MRR, MAP, Hit) with O(1) sum states.

torchmetrics' ``Retrieval*`` metrics keep every prediction in list states and loop over queries in
Python. The metrics here take each query's top-``k`` (or its full score row, from which they take
the top-``k``) and keep three sums: the per-query scores, the number of scored queries and the
number of queries without a relevant item. They are reduced by summation under DDP and cost O(1)
memory, whatever the number of queries.

Definitions equal torchmetrics' ``RetrievalNormalizedDCG``, ``RetrievalRecall``,
``RetrievalPrecision``, ``RetrievalMRR`` and ``RetrievalMAP`` with ``top_k=k`` when each query is
one group (``indexes`` = query id) and ``preds`` is the full score matrix, with binary relevance and
tie-free scores; ``Hit`` is RecBole 1.2.1's ``Hit`` (torchmetrics' ``RetrievalHitRate``). Two
differences, both deliberate:

- torchmetrics' Recall, Precision, MRR and MAP treat a relevant item whose score is ``<= 0`` as
  irrelevant (they filter ``target`` with ``preds > 0``). Only ranks matter here; with strictly
  positive scores both agree.
- Ties are broken by ``torch.topk``'s order here; torchmetrics' NDCG averages over tied scores.

Inputs accepted by :meth:`update` (see :func:`ranking_hits`):

==========================  ==============================  ====================================
``preds``                   ``target``                      meaning
==========================  ==============================  ====================================
float ``[..., N]``          integer ``[...]``               scores; one relevant id per query
integer ``[..., k']``       integer ``[...]``               top-``k'`` ids in rank order, k' >= k
either                      bool / 0-1 float ``[..., N]``   relevance matrix (multi-label)
either                      integer ``[..., R]``            relevant ids, negative = padding
==========================  ==============================  ====================================

The target's form is decided by its number of dimensions (one fewer than ``preds``: one relevant
id per query; as many: multi-label) and, for multi-label targets, by its dtype (bool or floating:
a relevance matrix; integer: a padded list of ids). A 0/1 *integer* matrix would read as a list of
ids; it is caught by the duplicate-id check: pass ``target.bool()`` instead.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor
from torchmetrics import Metric

from .._validation import check_positive_int

EmptyTargetAction = Literal["neg", "pos", "skip", "error"]
EMPTY_TARGET_ACTIONS: tuple[str, ...] = ("neg", "pos", "skip", "error")
_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _check_optional_num_classes(num_classes: int | None) -> int | None:
    if num_classes is None:
        return None
    return check_positive_int("num_classes", num_classes)


def check_ignore_index(ignore_index: int | None, num_classes: int | None) -> int | None:
    """Returns ``ignore_index`` if it is ``None`` or an int that is not a valid class id.

    Raises:
        ValueError: if ``ignore_index`` is not an int, or could be a class id (``>= 0`` while
            ``num_classes`` is unknown, or in ``[0, num_classes)``).
    """
    if ignore_index is None:
        return None
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise ValueError(f"ignore_index must be an int or None, got {ignore_index!r}")
    if ignore_index >= 0 and (num_classes is None or ignore_index < num_classes):
        bound = "num_classes is not given" if num_classes is None else f"[0, {num_classes})"
        raise ValueError(
            f"ignore_index must not be a possible class id ({bound}), got {ignore_index}; "
            f"use a negative value such as -100"
        )
    return ignore_index


def _check_int_tensor(name: str, x: Tensor) -> None:
    if x.dtype not in _INT_DTYPES:
        raise ValueError(f"{name} must be an integer tensor here, got dtype {x.dtype}")


def _check_ids_below(name: str, ids: Tensor, num_classes: int | None) -> None:
    """Raises ``IndexError`` if a non-negative entry of ``ids`` is ``>= num_classes``."""
    if num_classes is None or ids.numel() == 0:
        return
    hi = int(ids.max())
    if hi >= num_classes:
        raise IndexError(f"{name} must hold class ids in [0, {num_classes}), got {hi}")


def _check_no_duplicates(name: str, sorted_ids: Tensor, hint: str = "") -> None:
    """Raises ``ValueError`` if a row of ``sorted_ids`` ``[Q, C]`` repeats a non-negative id."""
    if sorted_ids.shape[-1] < 2:
        return
    same = (sorted_ids[:, 1:] == sorted_ids[:, :-1]) & (sorted_ids[:, 1:] >= 0)
    if bool(same.any()):
        row = int(same.any(dim=1).nonzero()[0])
        dup = int(sorted_ids[row, 1:][same[row]][0])
        raise ValueError(f"{name} repeats class id {dup} in row {row}{hint}")


def ranking_hits(
    preds: Tensor,
    target: Tensor,
    k: int,
    *,
    num_classes: int | None = None,
    ignore_index: int | None = -100,
) -> tuple[Tensor, Tensor, int | None]:
    """Validates one batch of rankings and marks which of each query's top-``k`` are relevant.

    Args:
        preds: float scores ``[..., N]`` (the top-``k`` is taken here; a class scored ``-inf`` is
            never retrieved, as an excluded class), or integer class ids ``[..., k']`` in rank order
            with ``k' >= k`` (negative entries mean "no class at this rank").
        target: integer ``[...]`` (one relevant id per query; queries equal to ``ignore_index`` are
            dropped), a bool or 0/1 float relevance matrix ``[..., N]``, or an integer ``[..., R]``
            list of relevant ids per query padded with negative entries.
        k: how many ranks count.
        num_classes: ``N`` if known, to check that ids are in range.
        ignore_index: value of a one-id-per-query target that marks a query to skip.

    Returns:
        ``(hits, num_relevant, num_candidates)``: bool ``[Q, k]`` (``hits[q, r]``: the class at
        rank ``r`` of query ``q`` is relevant), long ``[Q]`` (relevant classes of each query, ``0``
        for a query without any) and ``N`` if known (else ``None``), where ``Q`` is the number of
        queries kept.

    Raises:
        ValueError: bad shapes or dtypes, NaN scores, fewer than ``k`` predicted ids, repeated
            ids in a row, a float relevance matrix with values other than 0 and 1.
        IndexError: a class id outside ``[0, N)`` (in ``preds`` or ``target``).
    """
    if not isinstance(preds, Tensor) or not isinstance(target, Tensor):
        raise ValueError(
            f"preds and target must be tensors, got {type(preds).__name__} and "
            f"{type(target).__name__}"
        )
    if preds.dim() < 2:
        raise ValueError(
            f"preds must have shape [..., N] (scores) or [..., k'] (top-k ids) with at least one "
            f"query dimension, got {tuple(preds.shape)}"
        )
    is_scores = preds.is_floating_point()
    if not is_scores and preds.dtype not in _INT_DTYPES:
        raise ValueError(
            f"preds must be float scores [..., N] or integer top-k class ids [..., k'], "
            f"got dtype {preds.dtype}"
        )
    lead = tuple(preds.shape[:-1])

    if target.dim() == preds.dim() - 1:
        form = "single"
        if tuple(target.shape) != lead:
            raise ValueError(
                f"target with one relevant id per query must have shape {lead} (preds without its "
                f"last dim), got {tuple(target.shape)}"
            )
        _check_int_tensor("target (one relevant id per query)", target)
    elif target.dim() == preds.dim():
        if tuple(target.shape[:-1]) != lead:
            raise ValueError(
                f"multi-label target must have shape {lead} + (N,) or {lead} + (R,), "
                f"got {tuple(target.shape)}"
            )
        if target.dtype == torch.bool or target.is_floating_point():
            form = "mask"
        elif target.dtype in _INT_DTYPES:
            form = "ids"
        else:
            raise ValueError(
                f"multi-label target must be bool / 0-1 float [..., N] or integer ids [..., R], "
                f"got dtype {target.dtype}"
            )
    else:
        raise ValueError(
            f"target must have shape {lead} (one id per query) or {lead} + (N,) / {lead} + (R,) "
            f"(multi-label) for preds of shape {tuple(preds.shape)}, got {tuple(target.shape)}"
        )

    n = num_classes
    if is_scores:
        if n is not None and preds.shape[-1] != n:
            raise ValueError(
                f"preds scores must have num_classes={n} columns, got {preds.shape[-1]}"
            )
        n = preds.shape[-1]
    if form == "mask":
        if n is not None and target.shape[-1] != n:
            raise ValueError(
                f"target relevance matrix must have {n} columns (one per class), "
                f"got {target.shape[-1]}"
            )
        n = target.shape[-1]

    preds = preds.reshape(-1, preds.shape[-1])
    if form == "single":
        target = target.reshape(-1)
        if ignore_index is not None:
            keep = target != ignore_index
            if not bool(keep.all()):
                preds, target = preds[keep], target[keep]
    else:
        target = target.reshape(-1, target.shape[-1])
    device = preds.device
    target = target.to(device)

    # -- top-k ids [Q, kk] with validity ------------------------------------------------------
    if is_scores:
        if bool(torch.isnan(preds).any()):
            raise ValueError(f"preds contains NaN scores (shape {tuple(preds.shape)})")
        kk = min(k, preds.shape[-1])
        values, ids = preds.topk(kk, dim=-1)
        valid = values > -math.inf
    else:
        if preds.shape[-1] < k:
            raise ValueError(
                f"preds holds top-{preds.shape[-1]} class ids but k={k} needs at least {k} columns"
            )
        ids = preds[:, :k].long()
        _check_ids_below("preds", ids, n)
        _check_no_duplicates("preds", ids.sort(dim=-1).values)
        valid = ids >= 0

    # -- relevance of each retrieved id ---------------------------------------------------------
    num_queries = ids.shape[0]
    if form == "single":
        target = target.long()
        if target.numel():
            lo = int(target.min())
            if lo < 0:
                extra = "" if ignore_index is None else f" (or ignore_index={ignore_index})"
                raise IndexError(f"target must hold class ids >= 0{extra}, got {lo}")
        _check_ids_below("target", target, n)
        hits = ids == target[:, None]
        num_relevant = torch.ones(num_queries, dtype=torch.long, device=device)
    elif form == "mask":
        if target.is_floating_point():
            if not bool(((target == 0) | (target == 1)).all()):
                raise ValueError(
                    "target relevance matrix must hold only 0 and 1 (binary relevance); "
                    f"got values such as {float(target[(target != 0) & (target != 1)][0])}"
                )
        relevant = target.bool()
        hits = relevant.gather(1, ids.clamp(min=0))
        num_relevant = relevant.sum(dim=1)
    else:
        target = target.long()
        _check_ids_below("target", target, n)
        sorted_target = target.sort(dim=-1).values
        _check_no_duplicates(
            "target",
            sorted_target,
            hint=" (an integer multi-label target is a list of relevant ids padded with negative "
            "entries; pass target.bool() for a 0/1 relevance matrix)",
        )
        num_relevant = (target >= 0).sum(dim=1)
        if target.shape[-1] == 0:
            hits = torch.zeros_like(ids, dtype=torch.bool)
        else:
            pos = torch.searchsorted(sorted_target, ids.contiguous())
            pos = pos.clamp(max=target.shape[-1] - 1)
            hits = sorted_target.gather(1, pos) == ids
    hits = hits & valid & (ids >= 0)
    if hits.shape[1] < k:
        pad = torch.zeros(num_queries, k - hits.shape[1], dtype=torch.bool, device=device)
        hits = torch.cat([hits, pad], dim=1)
    return hits, num_relevant, n


class RankingMetric(Metric):
    """Base of the ranking metrics at ``k``: the mean over queries of a per-query score.

    States (all sums, reduced by summation under DDP): ``score_sum`` (float64, the per-query scores
    of queries with at least one relevant item), ``num_scored`` and ``num_empty`` (long, the
    number of queries with and without a relevant item).

    Args:
        k: how many ranks count, a positive int.
        num_classes: ``N`` if known, so that ids are checked to be in ``[0, N)`` also when
            ``preds`` are top-k ids and ``target`` one id per query.
        empty_target_action: what a query without relevant items counts as, as in torchmetrics'
            Retrieval metrics: ``"neg"`` (0, the default), ``"pos"`` (1), ``"skip"`` (left out
            of the mean; 0 if every query is skipped) or ``"error"`` (``ValueError`` in
            :meth:`update`, where torchmetrics raises later, in ``compute``).
        ignore_index: value of a one-id-per-query target that marks a query to skip entirely
            (the heads' convention); ``None`` to skip none.
        kwargs: passed to :class:`torchmetrics.Metric` (``sync_on_compute``, ...).
    """

    is_differentiable: bool = False
    higher_is_better: bool = True
    full_state_update: bool = False
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0

    score_sum: Tensor
    num_scored: Tensor
    num_empty: Tensor

    #: short lower-case name used for result keys, e.g. ``"ndcg"`` in ``"ndcg@10"``.
    short_name: str = ""

    def __init__(
        self,
        k: int = 10,
        *,
        num_classes: int | None = None,
        empty_target_action: EmptyTargetAction = "neg",
        ignore_index: int | None = -100,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.k = check_positive_int("k", k)
        self.num_classes = _check_optional_num_classes(num_classes)
        if empty_target_action not in EMPTY_TARGET_ACTIONS:
            raise ValueError(
                f"empty_target_action must be one of {EMPTY_TARGET_ACTIONS}, "
                f"got {empty_target_action!r}"
            )
        self.empty_target_action = empty_target_action
        self.ignore_index = check_ignore_index(ignore_index, self.num_classes)
        self.add_state(
            "score_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum"
        )
        self.add_state(
            "num_scored", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum"
        )
        self.add_state("num_empty", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Adds a batch of queries.

        Args:
            preds: float scores ``[..., N]`` or integer top-``k'`` class ids ``[..., k']``
                (``k' >= k``, rank order, negative = no class at that rank).
            target: integer ``[...]`` (one relevant id per query), bool / 0-1 float ``[..., N]``
                (relevance matrix) or integer ``[..., R]`` (relevant ids, negative = padding).
                See :func:`ranking_hits`.
        """
        hits, num_relevant, num_candidates = ranking_hits(
            preds, target, self.k, num_classes=self.num_classes, ignore_index=self.ignore_index
        )
        nonempty = num_relevant > 0
        num_empty = (~nonempty).sum()
        if self.empty_target_action == "error" and int(num_empty):
            raise ValueError(
                f"target has {int(num_empty)} queries without a relevant item and "
                f"empty_target_action='error'"
            )
        scores = self._query_scores(hits[nonempty], num_relevant[nonempty], num_candidates)
        self.score_sum += scores.sum(dtype=torch.float64)
        self.num_scored += nonempty.sum()
        self.num_empty += num_empty

    def compute(self) -> Tensor:
        """The mean per-query score, a float32 scalar (``0`` when no query counts)."""
        total, count = self.score_sum, self.num_scored
        if self.empty_target_action == "pos":
            total, count = total + self.num_empty, count + self.num_empty
        elif self.empty_target_action == "neg":
            count = count + self.num_empty
        if int(count) == 0:
            return torch.zeros((), dtype=torch.float32, device=total.device)
        return (total / count).float()

    def _query_scores(
        self, hits: Tensor, num_relevant: Tensor, num_candidates: int | None
    ) -> Tensor:
        """Per-query scores, float64 ``[Q]``, of queries with at least one relevant item.

        Args:
            hits: bool ``[Q, k]``, relevance of each query's top-``k`` in rank order.
            num_relevant: long ``[Q]``, relevant classes per query (all ``>= 1``).
            num_candidates: ``N`` if known.
        """
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"k={self.k}"


class NDCG(RankingMetric):
    """Normalised discounted cumulative gain at ``k`` with binary relevance.

    ``DCG@k = sum_{r <= k, rel(r)} 1 / log2(r + 1)``, divided by the ideal
    ``sum_{r <= min(R, k)} 1 / log2(r + 1)`` for ``R`` relevant classes. Equals torchmetrics'
    ``RetrievalNormalizedDCG(top_k=k)``. Arguments are those of :class:`RankingMetric`.
    """

    short_name = "ndcg"

    def _query_scores(
        self, hits: Tensor, num_relevant: Tensor, num_candidates: int | None
    ) -> Tensor:
        ranks = torch.arange(self.k, device=hits.device, dtype=torch.float64)
        discount = 1.0 / torch.log2(ranks + 2.0)
        dcg = (hits.double() * discount).sum(dim=1)
        ideal = discount.cumsum(0)[num_relevant.clamp(max=self.k) - 1]
        return dcg / ideal


class Recall(RankingMetric):
    """Recall at ``k``: relevant classes in the top-``k`` over all relevant classes.

    Equals torchmetrics' ``RetrievalRecall(top_k=k)`` (for one relevant class per query it is the
    hit rate). Arguments are those of :class:`RankingMetric`.
    """

    short_name = "recall"

    def _query_scores(
        self, hits: Tensor, num_relevant: Tensor, num_candidates: int | None
    ) -> Tensor:
        return hits.sum(dim=1, dtype=torch.float64) / num_relevant


class Precision(RankingMetric):
    """Precision at ``k``: relevant classes in the top-``k`` over ``k``.

    Equals torchmetrics' ``RetrievalPrecision(top_k=k)``, whose ``adaptive_k`` defaults to
    ``False``: the denominator stays ``k`` even when fewer than ``k`` classes exist.

    Args:
        k: how many ranks count.
        adaptive_k: divide by ``min(k, N)`` instead of ``k`` when ``N`` is known (from score
            ``preds``, a relevance-matrix target or ``num_classes``), as torchmetrics'
            ``adaptive_k=True``.
        kwargs: the other arguments of :class:`RankingMetric`.
    """

    short_name = "precision"

    def __init__(self, k: int = 10, *, adaptive_k: bool = False, **kwargs: Any) -> None:
        if not isinstance(adaptive_k, bool):
            raise ValueError(f"adaptive_k must be a bool, got {adaptive_k!r}")
        super().__init__(k, **kwargs)
        self.adaptive_k = adaptive_k

    def _query_scores(
        self, hits: Tensor, num_relevant: Tensor, num_candidates: int | None
    ) -> Tensor:
        denominator = self.k
        if self.adaptive_k and num_candidates is not None:
            denominator = min(self.k, num_candidates)
        return hits.sum(dim=1, dtype=torch.float64) / denominator


class MRR(RankingMetric):
    """Mean reciprocal rank at ``k``: ``1 / rank`` of the first relevant class, 0 beyond ``k``.

    Equals torchmetrics' ``RetrievalMRR(top_k=k)``. Arguments are those of :class:`RankingMetric`.
    """

    short_name = "mrr"

    def _query_scores(
        self, hits: Tensor, num_relevant: Tensor, num_candidates: int | None
    ) -> Tensor:
        first = hits.to(torch.uint8).argmax(dim=1).double()
        return torch.where(hits.any(dim=1), 1.0 / (first + 1.0), torch.zeros_like(first))


class MAP(RankingMetric):
    """Mean average precision at ``k``.

    A query's ``AP@k`` is the mean, over the relevant classes found in its top-``k``, of the
    precision at their ranks (0 if none is found). As in torchmetrics' ``RetrievalMAP(top_k=k)``,
    which this equals, the mean is over the relevant classes *retrieved*, not over
    ``min(R, k)``. Arguments are those of :class:`RankingMetric`.
    """

    short_name = "map"

    def _query_scores(
        self, hits: Tensor, num_relevant: Tensor, num_candidates: int | None
    ) -> Tensor:
        h = hits.double()
        ranks = torch.arange(1, self.k + 1, device=hits.device, dtype=torch.float64)
        precision_at = h.cumsum(dim=1) / ranks
        return (precision_at * h).sum(dim=1) / h.sum(dim=1).clamp(min=1.0)


class Hit(RankingMetric):
    """Hit ratio at ``k``: 1 if any relevant class is in a query's top-``k``, else 0, averaged.

    RecBole 1.2.1's ``Hit`` (``recbole.evaluator.metrics``):
    ``HR@k = mean_u delta(R_k(u) & T(u) != {})``. For one relevant class per query it equals
    :class:`Recall`; with several it counts a query once however many of its relevant classes are
    found. RecBole evaluates only users with a relevant item; a query without one scores 0 under
    the default ``empty_target_action="neg"``, as an all-false row of RecBole's ``pos_index``
    does. Arguments are those of :class:`RankingMetric`.
    """

    short_name = "hit"

    def _query_scores(
        self, hits: Tensor, num_relevant: Tensor, num_candidates: int | None
    ) -> Tensor:
        return hits.any(dim=1).double()
