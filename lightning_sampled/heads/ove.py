"""``OneVsEachHead``: the doubly stochastic One-vs-Each bound on the softmax (Titsias, 2016).

The bound (the paper's Eq. 4) is ``p(y | x) >= prod_{k != y} sigmoid(f_y - f_k)``; its negative log,

    B(x, y) = sum_{k != y} softplus(f_k - f_y)  >=  -log softmax(f)_y,

is a sum over classes, so it can be estimated without the normaliser by subsampling the classes
other than the target (Eq. 15) on top of subsampling the data.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._class_ids import padding_to_rank, skip_padding
from .._random import rand, randint
from .._validation import check_positive_int
from ..ops.chunked import class_chunks
from ..samplers import Sampler
from .proposal import ProposalHead


class OneVsEachHead(ProposalHead):
    """The One-vs-Each bound, estimated from sampled classes: an unbiased estimate of
    ``mean_t B(x_t, y_t)`` with ``B(x, y) = sum_{k != y} softplus(f_k - f_y)``.

    For each query the loss is ``sum_m w_m softplus(f_{c_m} - f_y)`` over ``M`` sampled classes
    ``c_m``, whose weights make it exactly unbiased for ``B``:

    * default (``sampler=None``, per-query negatives): the paper's scheme. The ``M`` classes are
      drawn uniformly from the ``N' - 1`` classes *other than the target* (``N'`` = classes other
      than ``padding_idx``), so the target is never drawn and ``w_m = (N' - 1) / M`` (Eq. 15's
      subsampling). Without replacement (``replacement=False``) the ``M`` classes are distinct and
      the weight is the same; ``M = N' - 1`` then gives the exact bound.
    * any other case (a sampler is given, or ``shared_negatives=True``): the ``M`` classes are
      drawn from the sampler's ``q`` over all classes, the target included, and weighted by the
      importance weight ``w_m = 1 / (M q_m)``; draws equal to the target get weight ``0`` (the
      bound has no ``k = y`` term). A uniform sampler over ``N'`` classes thus weighs each
      non-target draw ``N' / M``: using ``(N' - 1) / M`` for draws that *may* hit the target
      would underestimate ``B`` by the factor ``(N' - 1) / N'``, and keeping the hits would add
      ``log 2`` per hit.

    The gradient is the unbiased estimate of Eq. 16. Evaluation (``logits``, ``log_prob``,
    ``topk``, ``full_loss``) stays exact; :meth:`bound_nll` gives the exact bound. A sampler
    with parameters (MIDX-Learn) adds its auxiliary loss (:class:`ProposalHead`).

    Args:
        num_classes: ``N``.
        dim: ``D``.
        sampler: ``None`` for the paper's uniform draws from the classes other than the target, or
            any proposal (its ``num_classes`` and ``padding_idx`` must match the head's).
        num_negatives: ``M``, sampled classes per query (or per batch when shared).
        shared_negatives: one set of ``M`` classes for the whole batch (needs a query-independent
            sampler; the default then draws uniformly over all ``N'`` classes).
        replacement: draw with replacement (default). ``False`` is only available for the default
            per-query scheme, needs ``M <= N' - 1``, and costs ``O(T x N)`` per step: meant for
            small ``N`` and diagnostics.
        **options: ``sparse_grad`` of :class:`ProposalHead`; ``weight``, ``bias``,
            ``padding_idx``, ``ignore_index``, ``chunk_size``, ``temperature``, ``normalize``,
            ``label_smoothing`` (0 only) of :class:`OutputHead`. ``f`` above is the head's
            logit (:meth:`~OutputHead.score_queries`), and the sampler sees the scored queries.
    """

    sharding_refusal = "its sampled pairwise bound has no stratified per-rank form yet"

    def __init__(
        self,
        num_classes: int,
        dim: int,
        sampler: Sampler | None = None,
        num_negatives: int = 100,
        *,
        shared_negatives: bool = False,
        replacement: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(num_classes, dim, sampler, **options)
        if shared_negatives:
            self.require_query_independent("shared_negatives=True")
        self.num_negatives = check_positive_int("num_negatives", num_negatives)
        self.shared_negatives = bool(shared_negatives)
        self.exclude_target = sampler is None and not shared_negatives
        num_others = self.sampler.num_drawable - 1
        if num_others < 1:
            raise ValueError(
                f"the One-vs-Each bound needs at least 2 drawable classes, got num_classes="
                f"{num_classes} with padding_idx={self.padding_idx}"
            )
        self.replacement = bool(replacement)
        if not self.replacement:
            if not self.exclude_target:
                raise ValueError(
                    "replacement=False is only available for the default sampler (sampler=None) "
                    "with per-query negatives (shared_negatives=False)"
                )
            if num_negatives > num_others:
                raise ValueError(
                    f"num_negatives must be <= {num_others} (the classes other than the target) "
                    f"when replacement=False, got {num_negatives}"
                )

    @torch.no_grad()
    def draw(self, z: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        """Draws the sampled classes of each scored query and their log-weights.

        Args:
            z: ``[T, D]`` valid queries.
            target: long ``[T]`` their targets.

        Returns:
            ``(ids, log_w)``: long class ids ``[T, M]`` (``[M]`` when shared) and fp32
            ``log w_m`` ``[T, M]`` (``-inf`` where a draw equals the query's target).
        """
        m, num_rows = self.num_negatives, target.shape[0]
        if self.exclude_target:
            num_others = self.sampler.num_drawable - 1
            device = target.device
            generator = self.sampler.draw_generator(device)
            if self.replacement:
                ranks = randint(num_others, (num_rows, m), device, generator)
            else:
                keys = rand((num_rows, num_others), device, generator)
                ranks = keys.topk(m, dim=1).indices
            # ranks index the drawable classes minus the target: step over the target's rank
            # among the drawable classes, then over the padding class.
            target_rank = padding_to_rank(target, self.padding_idx)[:, None]
            ranks = ranks + (ranks >= target_rank).to(ranks.dtype)
            ids = skip_padding(ranks, self.padding_idx)
            log_w = torch.full(ids.shape, math.log(num_others / m), device=ids.device)
            return ids, log_w
        sample = self.sampler.sample(z, m, shared=self.shared_negatives)
        log_w = (-(math.log(m) + sample.log_q.float())).expand(num_rows, -1)
        return sample.ids, log_w.masked_fill(sample.ids == target[:, None], -math.inf)

    def sampled_losses(self, queries: Tensor, target: Tensor) -> Tensor:
        """The unbiased estimate of ``B(x, y)`` of each scored position: fp32 ``[T]``.

        Args:
            queries: ``[T, D]`` scored queries.
            target: long ``[T]`` their targets.
        """
        ids, log_w = self.draw(queries, target)
        pos, neg = self.target_and_candidate_logits(queries, target, ids)
        return (F.softplus(neg - pos[:, None]) * log_w.exp()).sum(dim=1)

    def bound_nll(self, z: Tensor, target: Tensor) -> Tensor:
        """The exact negative log One-vs-Each bound ``B(x, y)`` over all classes, in class chunks.

        ``B(x, y) >= -log p(y | x)``, with equality when only two classes are drawable. Keeps the
        ``[T, chunk]`` softplus terms of every chunk for backward when gradients are on: meant for
        tests and diagnostics.

        Args:
            z: ``[..., D]`` queries.
            target: long ``[...]`` targets.

        Returns:
            fp32 ``[...]``, differentiable; ``0`` at ``ignore_index`` positions.
        """
        queries, y, mask = self._valid_rows(z, target)
        out = torch.zeros(target.shape, device=z.device, dtype=torch.float32)
        if y.numel() == 0:
            return out
        pos = self.candidate_logits(queries, y[:, None])
        total = torch.zeros(y.shape, device=z.device, dtype=torch.float32)
        for start, end in class_chunks(self.num_classes, self.chunk_for(queries.shape[0])):
            ids = torch.arange(start, end, device=z.device)
            skip = y[:, None] == ids
            if self.padding_idx is not None:
                skip = skip | (ids == self.padding_idx)
            terms = F.softplus(self.candidate_logits(queries, ids) - pos)
            total = total + terms.masked_fill(skip, 0.0).sum(dim=1)
        return out.masked_scatter(mask, total)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, num_negatives={self.num_negatives}, "
            f"shared_negatives={self.shared_negatives}, exclude_target={self.exclude_target}, "
            f"replacement={self.replacement}"
        )
