"""``evaluate_ranking``: exact full-ranking evaluation of a head over a dataloader;
``evaluation_sampler``: each row evaluated exactly once under DDP."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence, Sized
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch import Tensor
from torch.utils.data import Sampler

from ..heads.base import OutputHead
from .ranking import (
    EMPTY_TARGET_ACTIONS,
    MAP,
    MRR,
    NDCG,
    EmptyTargetAction,
    Hit,
    Precision,
    RankingMetric,
    Recall,
)

#: metric names accepted by :func:`evaluate_ranking`, and their classes.
RANKING_METRICS: dict[str, type[RankingMetric]] = {
    "ndcg": NDCG,
    "recall": Recall,
    "precision": Precision,
    "mrr": MRR,
    "map": MAP,
    "hit": Hit,
}

EncodeFn = Callable[[Any], "tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor | None]"]


def _check_ks(ks: int | Sequence[int], num_classes: int) -> tuple[int, ...]:
    values = (ks,) if isinstance(ks, int) and not isinstance(ks, bool) else tuple(ks)
    if not values:
        raise ValueError(f"ks must be a positive int or a non-empty sequence of them, got {ks!r}")
    for k in values:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"ks must hold positive integers, got {k!r} in ks={ks!r}")
        if k > num_classes:
            raise ValueError(f"ks must be <= the head's num_classes={num_classes}, got {k}")
    return tuple(sorted(set(values)))


def evaluate_ranking(
    head: OutputHead,
    dataloader: Iterable[Any],
    encode: EncodeFn,
    *,
    ks: int | Sequence[int] = (10, 20),
    metrics: Sequence[str] = ("ndcg", "recall", "precision", "mrr", "map"),
    exclude_seen: bool = True,
    empty_target_action: EmptyTargetAction = "neg",
    progress: bool = False,
) -> dict[str, float]:
    """Evaluates a head by exact top-``k`` over all its classes, one batch at a time.

    For each batch, ``encode(batch)`` returns ``(z, target, exclude)``:

    - ``z``: ``[..., D]`` queries (e.g. ``[B, D]`` user states, or ``[B, L, D]`` sequences);
    - ``target``: integer ``[...]`` (one relevant id per query; ``head.ignore_index`` skips the
      query), a bool relevance matrix ``[..., N]`` or integer relevant ids ``[..., R]`` padded
      with negative entries (see :func:`~lightning_sampled.metrics.ranking.ranking_hits`);
    - ``exclude``: ``None`` or long ``[..., E]`` class ids never to recommend to that query (e.g.
      the items the user has already seen), padded with ``-1``. A 2-tuple ``(z, target)`` means no
      exclusion.

    The head's chunked :meth:`~lightning_sampled.heads.base.OutputHead.topk` runs under
    ``torch.no_grad()`` with ``max(ks)``, so memory stays ``O(batch x chunk)`` and no ``[B, N]``
    matrix is built; every metric is updated with the same top-``k`` ids. The function switches
    no module to eval mode: call ``model.eval()`` first if the encoder has dropout.

    Args:
        head: the head whose class table scores the queries.
        dataloader: any iterable of batches.
        encode: ``batch -> (z, target, exclude)``, see above.
        ks: the cut-offs, an int or a sequence of ints in ``[1, N]``.
        metrics: names among ``"ndcg"``, ``"recall"``, ``"precision"``, ``"mrr"``, ``"map"``.
        exclude_seen: pass ``exclude`` to the head (``False`` ignores it).
        empty_target_action: what a query without relevant items counts as (see
            :class:`~lightning_sampled.metrics.ranking.RankingMetric`).
        progress: show a tqdm progress bar.

    Returns:
        ``{"ndcg@10": 0.31, "recall@10": ..., ...}``: one float per metric and cut-off. Batches
        without queries (``z`` of shape ``[0, D]`` or ``[B, 0, D]``) count for nothing; when no
        query counts at all, every value is ``0``, as the metrics give.

    Raises:
        ValueError: bad ``ks``, ``metrics``, ``empty_target_action``, an ``encode`` result that is
            not a 2- or 3-tuple, or a dataloader that yields no batch. Bad targets raise from the
            metrics (``ValueError`` / ``IndexError``).
    """
    return ranking_loop(
        head,
        dataloader,
        encode,
        lambda z, target, exclude, k: head.topk(z, k, exclude=exclude)[1],
        ks=ks,
        metrics=metrics,
        exclude_seen=exclude_seen,
        empty_target_action=empty_target_action,
        progress=progress,
        name="evaluate_ranking",
    )


#: ``rank(z [..., D], target [...], exclude [..., E] or None, k) -> long [..., k]`` class ids
#: of each query's top ``k`` (``-1``: no class at that rank)
RankFn = Callable[[Tensor, Tensor, "Tensor | None", int], Tensor]


def ranking_loop(
    head: OutputHead,
    dataloader: Iterable[Any],
    encode: EncodeFn,
    rank: RankFn,
    *,
    ks: int | Sequence[int],
    metrics: Sequence[str],
    exclude_seen: bool,
    empty_target_action: EmptyTargetAction,
    progress: bool,
    name: str,
    prefix: str = "",
) -> dict[str, float]:
    """The loop of :func:`evaluate_ranking` with the top-``k`` of each batch from ``rank``; the
    result's keys are ``prefix`` + ``"ndcg@10"``, ..."""
    if not isinstance(head, OutputHead):
        raise ValueError(f"head must be an OutputHead, got {type(head).__name__}")
    if not callable(encode):
        raise ValueError(f"encode must be callable, got {type(encode).__name__}")
    ks = _check_ks(ks, head.num_classes)
    names = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    if not names:
        raise ValueError(f"metrics must name at least one metric, got {metrics!r}")
    for metric_name in names:
        if metric_name not in RANKING_METRICS:
            raise ValueError(
                f"metrics must be names among {sorted(RANKING_METRICS)}, got {metric_name!r}"
            )
    if empty_target_action not in EMPTY_TARGET_ACTIONS:
        raise ValueError(
            f"empty_target_action must be one of {EMPTY_TARGET_ACTIONS}, "
            f"got {empty_target_action!r}"
        )

    device = head.table_device
    results: dict[str, RankingMetric] = {}
    for metric_name in dict.fromkeys(names):
        for k in ks:
            results[f"{prefix}{metric_name}@{k}"] = RANKING_METRICS[metric_name](
                k,
                num_classes=head.num_classes,
                empty_target_action=empty_target_action,
                ignore_index=head.ignore_index,
            ).to(device)

    batches: Iterable[Any] = dataloader
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(dataloader, desc=name, leave=False)

    max_k = ks[-1]
    num_batches = 0
    with torch.no_grad():
        for batch in batches:
            out = encode(batch)
            if not isinstance(out, (tuple, list)) or len(out) not in (2, 3):
                raise ValueError(
                    "encode must return (z, target) or (z, target, exclude), "
                    f"got {type(out).__name__}"
                    + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else "")
                )
            z, target = out[0].to(device), out[1].to(device)
            exclude = out[2] if len(out) == 3 and exclude_seen else None
            if exclude is not None:
                exclude = exclude.to(device)
            indices = rank(z, target, exclude, max_k)
            for metric in results.values():
                metric.update(indices, target)
            num_batches += 1
    if num_batches == 0:
        raise ValueError("dataloader yielded no batch: nothing to evaluate")
    return {key: float(metric.compute()) for key, metric in results.items()}


def evaluation_sampler(dataset: Sized) -> Sampler[int] | None:
    """The sampler of an evaluation ``DataLoader`` that counts every row exactly once under DDP.

    Lightning gives evaluation loaders a ``DistributedSampler``, which pads each rank's share with
    repeated rows when the dataset size is not a multiple of the world size; the metrics, whose
    states are sums reduced across ranks, would count those rows twice. Under
    ``torch.distributed`` with several processes this returns Lightning's
    ``UnrepeatedDistributedSampler`` (rank ``r`` takes rows ``r, r + W, ...``, no padding; the
    ranks' batch counts may differ by one), which Lightning keeps because it is a
    ``DistributedSampler``; otherwise ``None`` (the ``DataLoader``'s sequential default). Call it
    where the loader is built, e.g. in ``val_dataloader()``, after the process group is set up::

        DataLoader(dataset, batch_size=256, sampler=evaluation_sampler(dataset))

    Every rank must hold at least one row. Log only metrics that are reduced once per epoch (our
    metrics objects, or ``self.log(..., sync_dist=True)`` on epoch): a collective in every step
    would wait forever on the rank with one batch fewer.

    Args:
        dataset: the ``[R]``-row map-style evaluation dataset.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    if len(dataset) < dist.get_world_size():
        raise ValueError(
            f"dataset has {len(dataset)} rows, fewer than the {dist.get_world_size()} processes: "
            f"every rank needs at least one row to evaluate"
        )
    return UnrepeatedDistributedSampler(dataset, shuffle=False)
