"""``evaluate_sampled_ranking``: the sampled-metrics protocol of papers that rank each test
item among ``M`` sampled items (e.g. "HR@10 among 100 negatives"), for comparison with them.

It is not the exact metric: a target's rank among ``1 + M`` candidates is not its rank among all
``N`` classes, and the two can disagree on which model is better (Krichene and Rendle, "On
Sampled Metrics for Item Recommendation", KDD 2020). Its results are therefore keyed
``"sampled_ndcg@10"``, ...; report :func:`~lightning_sampled.metrics.evaluate_ranking` as the
metric and these beside it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from .._validation import check_positive_int
from ..heads.base import OutputHead
from ..samplers import Sampler, UniformSampler
from ..samplers.distinct import first_occurrences
from .evaluate import EncodeFn, ranking_loop
from .ranking import EmptyTargetAction


def sampled_candidates_topk(
    head: OutputHead,
    z: Tensor,
    target: Tensor,
    k: int,
    sampler: Sampler,
    num_negatives: int,
    exclude: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Each query's top-``k`` among its target and ``num_negatives`` classes drawn from
    ``sampler``: long ``[..., k]`` class ids, ``-1`` past the candidates that can rank.

    Negatives equal to the target, to an earlier draw, or in the query's ``exclude`` ids
    ``[..., E]`` (``-1`` padded) are dropped (not redrawn); queries whose target is
    ``head.ignore_index`` get any ids (the metrics skip them).

    Args:
        head: scores the candidates (``head.candidate_logits`` of ``head.score_queries(z)``).
        z: ``[..., D]`` queries; target: long ``[...]``, one relevant class per query.
    """
    shape = target.shape
    queries = head.score_queries(z.reshape(-1, z.shape[-1]))
    target = target.reshape(-1)
    positive = target.where(target != head.ignore_index, 0 if head.padding_idx != 0 else 1)
    draws = sampler.sample(queries, num_negatives, generator=generator).ids
    dropped = (draws == positive[:, None]) | ~first_occurrences(draws)  # a class ranks once
    if exclude is not None:
        seen = exclude.reshape(target.shape[0], -1)
        dropped |= (draws[:, :, None] == seen[:, None, :]).any(dim=-1)
    candidates = torch.cat([positive[:, None], draws], dim=1)
    logits = head.candidate_logits(queries, candidates)
    logits[:, 1:] = logits[:, 1:].masked_fill(dropped, -math.inf)
    values, columns = logits.topk(min(k, candidates.shape[1]), dim=1)
    top = candidates.gather(1, columns).masked_fill(values == -math.inf, -1)
    if top.shape[1] < k:
        top = torch.cat([top, top.new_full((top.shape[0], k - top.shape[1]), -1)], dim=1)
    return top.view(*shape, k)


def evaluate_sampled_ranking(
    head: OutputHead,
    dataloader: Iterable[Any],
    encode: EncodeFn,
    *,
    num_negatives: int = 100,
    sampler: Sampler | None = None,
    seed: int = 0,
    ks: int | Sequence[int] = (10,),
    metrics: Sequence[str] = ("ndcg", "hit", "mrr"),
    exclude_seen: bool = True,
    empty_target_action: EmptyTargetAction = "neg",
    progress: bool = False,
) -> dict[str, float]:
    """The sampled-metrics protocol (module docstring): each query's target ranked among
    ``num_negatives`` classes drawn for it, by default uniformly and without replacement
    (``UniformSampler(unique=True)``) from a generator seeded with ``seed``, so that two models
    meet the same negatives.

    ``encode``, ``ks``, ``metrics``, ``exclude_seen`` (seen items are never negatives),
    ``empty_target_action`` and ``progress`` are those of
    :func:`~lightning_sampled.metrics.evaluate_ranking`; targets are one class per query.

    Returns:
        ``{"sampled_ndcg@10": ..., "sampled_hit@10": ..., ...}``.
    """
    check_positive_int("num_negatives", num_negatives)
    if sampler is None:
        sampler = UniformSampler(head.num_classes, padding_idx=head.padding_idx, unique=True)
    if not isinstance(sampler, Sampler) or sampler.num_classes != head.num_classes:
        raise ValueError(f"sampler must be a Sampler over the head's {head.num_classes} classes")
    generator = torch.Generator(head.table_device).manual_seed(seed)

    def rank(z: Tensor, target: Tensor, exclude: Tensor | None, k: int) -> Tensor:
        if target.shape != z.shape[:-1] or target.is_floating_point() or target.dtype == torch.bool:
            raise ValueError(
                "the sampled protocol ranks one target per query: target must be integer "
                f"{tuple(z.shape[:-1])}, got {target.dtype} {tuple(target.shape)}"
            )
        return sampled_candidates_topk(
            head, z, target, k, sampler, num_negatives, exclude, generator
        )

    return ranking_loop(
        head,
        dataloader,
        encode,
        rank,
        ks=ks,
        metrics=metrics,
        exclude_seen=exclude_seen,
        empty_target_action=empty_target_action,
        progress=progress,
        name="evaluate_sampled_ranking",
        prefix="sampled_",
    )
