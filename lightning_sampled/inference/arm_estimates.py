"""The bandit arms of AdaptiveSoftmax: one estimator of ``mu_i = <A_i, x_b>`` per class and query.

Arm ``i`` of query ``b`` that has been pulled ``N`` times has read the products ``A_ij x_j`` of the
first ``N`` coordinates of the query's Gumbel order (:mod:`.importance_sampling`). Its estimate is
the Horvitz-Thompson mean ``sum_{s < N} A_{i,j_s} x_{j_s} / pi_{j_s}(tau_N)`` (eq. 20) and its
variance estimate is ``sum_{s < N} (A_{i,j_s} x_{j_s})^2 (1 - pi_{j_s}) / pi_{j_s}^2`` (eq. 23, the
cross terms of eq. 22 dropped as in Appendix A.3.4).

Pull counts follow :func:`.importance_sampling.pull_schedule`, so every arm sits at one of a few
levels ``T_0 < T_1 < ... < T_L = d``. Because ``tau`` depends on ``N``, the estimate at level ``l``
is not a running sum of the estimate at level ``l - 1``; instead, when an arm reads the block of
coordinates ``[T_{l-1}, T_l)``, their products are weighted for every level ``l' >= l`` at once (one
batched matmul), so a product is read once and reused by every later phase (Appendix C.1) without
storing it. At the last level every ``pi`` is one and the estimate is the exact ``<A_i, x>``.

Arms of all queries of a batch advance together: pulls are grouped by level, not by query.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .importance_sampling import (
    gumbel_permutation,
    importance_weights,
    inclusion_probabilities,
    sample_thresholds,
)

#: Upper bound on the entries of ``A`` gathered at once (bounds peak memory, not the result).
GATHER_CHUNK = 1 << 22
#: A read whose arms are at least this share of every query's ``n`` arms reads whole rows of
#: ``A^T`` (contiguous, a batched product), discarding the entries of the arms outside it, rather
#: than gathering the entries of its arms one by one (:meth:`ArmEstimates._read`).
ROW_READ_SHARE = 0.875


def read_entries(columns: Tensor, flat_index: Tensor) -> Tensor:
    """Reads ``columns.view(-1)[flat_index]`` as fp32: the only place where ``A`` is read.

    ``columns`` is ``[A^T | 0]`` ``[d, n + 1]``: ``A`` is read through its transpose so that the
    arms pulling the same coordinate ``j`` read neighbouring memory (Appendix C.5), and the zero
    column ``n`` is what padding slots of a ragged batch read. Every entry of ``A`` read here is
    multiplied by its ``x_j`` exactly once, so the entries of ``A`` read (sentinel reads excluded)
    are the samples counted by :meth:`ArmEstimates.samples_used`; tests count them here.
    """
    values = columns.reshape(-1).index_select(0, flat_index.reshape(-1))
    return values.view(flat_index.shape).float()


def read_rows(columns: Tensor, coordinates: Tensor) -> Tensor:
    """Reads whole rows ``columns[coordinates]`` as fp32: ``[B, w, n + 1]`` for coordinate ids
    ``[B, w]``, every arm's entries of those coordinates (and the zero column). The other place
    where ``A`` is read (:func:`read_entries`): contiguous rows of ``A^T``, at the bandwidth of a
    dense product, for reads that concern nearly every arm."""
    rows = columns.index_select(0, coordinates.reshape(-1))
    return rows.view(*coordinates.shape, columns.shape[1]).float()


def estimator_weights(x: Tensor, pi: Tensor, complement: Tensor) -> tuple[Tensor, Tensor]:
    """fp32 weights of coordinates with query entries ``x`` sampled with inclusion probabilities
    ``pi`` (``complement = 1 - pi``, fp64, broadcast against ``x``): ``x / pi``, which times
    ``A_ij`` is a term of the mean (eq. 20), and ``x^2 (1 - pi) / pi^2``, which times
    ``A_ij^2`` is a term of the variance estimate (eq. 23)."""
    x = x.double()
    return (x / pi).float(), (x.square() * complement / pi.square()).float()


class ArmEstimates:
    """Estimates of ``<A_i, x_b>`` for all ``n`` arms of ``B`` queries, refined by pulling.

    Args:
        columns: ``[d, n + 1]`` contiguous ``[A^T | 0]`` (any float dtype; read as fp32).
        column_abs_sums: ``[d]`` ``sum_i |A_ij|`` for the importance weights.
        x: ``[B, d]`` fp32 queries.
        schedule: pull counts ``[T_0, ..., T_L]`` with ``T_L = d``.
        generator: source of the Gumbel noise (``None``: torch's global generator).
    """

    def __init__(
        self,
        columns: Tensor,
        column_abs_sums: Tensor,
        x: Tensor,
        schedule: list[int],
        generator: torch.Generator | None,
    ) -> None:
        self.columns = columns
        self.dim, self.num_arms = columns.shape[0], columns.shape[1] - 1
        self.schedule = schedule
        batch, levels = x.shape[0], len(schedule)
        log_w = importance_weights(column_abs_sums, x).log()
        self.order, self.keys = gumbel_permutation(log_w, generator)
        self.thresholds = sample_thresholds(self.keys, schedule)
        self.log_w_sorted = log_w.gather(1, self.order)
        self.x_sorted = x.gather(1, self.order)
        self.block_weights: dict[int, tuple[Tensor, Tensor]] = {}
        positive = (log_w > -math.inf).sum(1)
        sizes = torch.tensor(schedule, device=x.device)
        # Once the prefix holds every positive-weight coordinate the estimate is exact.
        self.exact_level = torch.searchsorted(sizes, positive).clamp(max=levels - 1)
        self.sizes = torch.cat([sizes.new_zeros(1), sizes])
        # Row ``n`` of the sums absorbs the (zero) contributions of padding slots. Both are
        # allocated by the first pull (:meth:`_sums`): a query that the caller finishes otherwise
        # (AdaptiveSoftmax's dense fall-back) never pays for its ``[n + 1, L]`` sums.
        self.sums_shape = (batch, self.num_arms + 1, levels)
        self.sum_mean: Tensor | None = None
        self.sum_var: Tensor | None = None
        self.level = torch.full((batch, self.num_arms), -1, dtype=torch.long, device=x.device)

    # -- state ------------------------------------------------------------------------------------

    def _sums(self) -> tuple[Tensor, Tensor]:
        """``(sum_mean, sum_var)``, each fp32 ``[B, n + 1, L]``, zeros until pulled into."""
        if self.sum_mean is None:
            self.sum_mean = torch.zeros(self.sums_shape, device=self.level.device)
            self.sum_var = torch.zeros(self.sums_shape, device=self.level.device)
        return self.sum_mean, self.sum_var

    def _at_level(self, sums: Tensor | None, empty: float) -> Tensor:
        if sums is None:  # nothing pulled yet
            return torch.full(self.level.shape, empty, device=self.level.device)
        current = sums[:, : self.num_arms].gather(2, self.level.clamp(min=0).unsqueeze(2))
        current = current.squeeze(2)
        return current.masked_fill(self.level < 0, empty)

    def mean(self) -> Tensor:
        """``[B, n]`` fp32 estimates ``mu_hat`` (0 for arms never pulled)."""
        return self._at_level(self.sum_mean, 0.0)

    def variance(self) -> Tensor:
        """``[B, n]`` fp32 variance estimates of ``mu_hat`` (``inf`` for arms never pulled)."""
        return self._at_level(self.sum_var, math.inf)

    def is_exact(self) -> Tensor:
        """``[B, n]`` bool: arms whose estimate is the exact ``<A_i, x_b>``."""
        return self.level >= self.exact_level.unsqueeze(1)

    def pulls(self) -> Tensor:
        """``[B, n]`` long: how many coordinates each arm has read."""
        return self.sizes[self.level + 1]

    def samples_used(self) -> Tensor:
        """``[B]`` long: the scalar products ``A_ij x_j`` computed for each query."""
        return self.pulls().sum(1)

    def prefix_variances(self, pulls: int) -> Tensor:
        """``[B, n]`` fp32: each arm's variance estimate (eq. 23) from the first ``pulls``
        coordinates of its query's order, ``pulls <= T_0``, read as whole rows of ``A^T``
        (:func:`read_rows`, a few queries at a time) and not counted into the estimates: a look
        that costs ``n pulls`` products per query, which a later :meth:`advance` reads again."""
        pi, complement = inclusion_probabilities(
            self.log_w_sorted[:, :pulls], sample_thresholds(self.keys, [pulls])
        )
        _, var_w = estimator_weights(self.x_sorted[:, :pulls], pi, complement)
        var_w = var_w.unsqueeze(1)  # [B, 1, pulls]
        queries = max(1, GATHER_CHUNK // (pulls * (self.num_arms + 1)))
        parts = []
        for start in range(0, var_w.shape[0], queries):
            rows = read_rows(self.columns, self.order[start : start + queries, :pulls])
            parts.append(torch.bmm(var_w[start : start + queries], rows.mul_(rows)))
        return torch.cat(parts)[:, 0, : self.num_arms]

    # -- pulling ----------------------------------------------------------------------------------

    def advance(self, mask: Tensor) -> None:
        """Moves every arm in ``mask`` ``[B, n]`` (that is not yet exact) up one level."""
        mask = mask & ~self.is_exact()
        if not bool(mask.any()):
            return
        levels = torch.unique(self.level[mask]).tolist()
        groups = [(level + 1, mask & (self.level == level)) for level in levels]
        for block, group in groups:
            mean_w, var_w = self._block_weights(block)
            start, end = self.schedule[block - 1] if block else 0, self.schedule[block]
            self._read(group, start, end, mean_w, var_w, block)
            self.level[group] = block

    def pull_to_variance(self, target: Tensor | float, mask: Tensor, scale: float = 1.0) -> None:
        """Algorithm 8: pulls the arms in ``mask`` until ``scale * variance <= target``.

        Args:
            target: variance target, a float or ``[B, n]``.
            mask: ``[B, n]`` bool, the arms concerned.
            scale: the tuned constant of Appendix C.4 multiplying the variance estimates.
        """
        while True:
            need = mask & (self.variance() * scale > target) & ~self.is_exact()
            if not bool(need.any()):
                return
            self.advance(need)

    def make_exact(self, mask: Tensor) -> None:
        """Computes ``<A_i, x_b>`` exactly for the arms in ``mask`` ``[B, n]`` (Appendix C.2).

        An arm pulled ``T_l`` times reads only the coordinates it has not read yet, in one step:
        the estimate of the exact level (where every ``pi = 1``) already sums its earlier products.
        """
        mask = mask & ~self.is_exact()
        if not bool(mask.any()):
            return
        levels = len(self.schedule)
        exact = self.exact_level.unsqueeze(1).expand_as(mask)
        keys = torch.unique((self.level * levels + exact)[mask]).tolist()
        groups = [(key, mask & (self.level * levels + exact == key)) for key in keys]
        for key, group in groups:
            level, target = divmod(key, levels)
            start = self.schedule[level] if level >= 0 else 0
            end = self.schedule[target]
            self._read(group, start, end, self.x_sorted[:, None, start:end], None, target)
            self.level[group] = target

    def _block_weights(self, block: int) -> tuple[Tensor, Tensor]:
        """fp32 ``[B, L + 1 - block, width]`` weights of block ``block`` for every level from it on.

        Entry ``[b, l, s]`` is ``x_j / pi_j(tau_l)`` for the mean and
        ``x_j^2 (1 - pi_j(tau_l)) / pi_j(tau_l)^2`` for the variance, ``j`` the ``s``-th coordinate
        of the block in query ``b``'s Gumbel order. Computed when a block is first read.
        """
        if block not in self.block_weights:
            start, end = self.schedule[block - 1] if block else 0, self.schedule[block]
            pi, complement = inclusion_probabilities(
                self.log_w_sorted[:, None, start:end], self.thresholds[:, block:, None]
            )
            self.block_weights[block] = estimator_weights(
                self.x_sorted[:, None, start:end], pi, complement
            )
        return self.block_weights[block]

    def _read(
        self,
        group: Tensor,
        start: int,
        end: int,
        mean_w: Tensor,
        var_w: Tensor | None,
        first_level: int,
    ) -> None:
        """Reads coordinates ``[start, end)`` of the Gumbel order for the arms in ``group``.

        Adds ``mean_w`` times ``A_ij`` (and ``var_w`` times ``A_ij^2``), with weights
        ``[B, m, end - start]``, into the sums of levels ``first_level .. first_level + m - 1``.
        """
        batch, width = group.shape[0], end - start
        counts = group.sum(1)
        levels = slice(first_level, first_level + mean_w.shape[1])
        if bool((counts >= ROW_READ_SHARE * self.num_arms).all()):
            self._read_rows(group, self.order[:, start:end], mean_w, var_w, levels)
            return
        slots_needed = int(counts.max())
        # Per query, the selected arm ids first, then the sentinel ``n`` as padding.
        slots = torch.argsort((~group).to(torch.int8), dim=1, stable=True)[:, :slots_needed]
        filled = torch.arange(slots_needed, device=group.device) < counts.unsqueeze(1)
        slots = slots.masked_fill(~filled, self.num_arms)
        # [B, width, 1]: row offsets into A^T, so that a row's arms are read one after another.
        offsets = (self.order[:, start:end] * (self.num_arms + 1)).unsqueeze(2)
        if self.columns.numel() < 2**31:  # int32 indices halve the index traffic
            offsets, slots = offsets.int(), slots.int()
        sum_mean, sum_var = self._sums()
        chunk = max(1, GATHER_CHUNK // (batch * width))
        for first in range(0, slots_needed, chunk):
            arms = slots[:, first : first + chunk]
            gathered = read_entries(self.columns, offsets + arms.unsqueeze(1))
            targets = arms.long().unsqueeze(2).expand(-1, -1, mean_w.shape[1])
            sum_mean[:, :, levels].scatter_add_(1, targets, torch.bmm(mean_w, gathered).mT)
            if var_w is not None:
                squares = torch.bmm(var_w, gathered * gathered).mT
                sum_var[:, :, levels].scatter_add_(1, targets, squares)

    def _read_rows(
        self,
        group: Tensor,
        coordinates: Tensor,
        mean_w: Tensor,
        var_w: Tensor | None,
        levels: slice,
    ) -> None:
        """:meth:`_read` by whole rows of ``A^T``: the coordinates ``[B, w]`` (of each query's
        order) for every arm (:func:`read_rows`, a few queries and coordinates at a time within
        :data:`GATHER_CHUNK` entries), weighted by one batched product, added into the sums'
        ``levels`` of the arms in ``group`` only."""
        sum_mean, sum_var = self._sums()
        keep = torch.cat([group, group.new_zeros(group.shape[0], 1)], dim=1).unsqueeze(2)
        width = coordinates.shape[1]
        per_chunk = max(1, GATHER_CHUNK // (self.num_arms + 1))
        queries = max(1, per_chunk // width)
        step = max(1, per_chunk // queries)
        for first in range(0, group.shape[0], queries):
            batch = slice(first, first + queries)
            for offset in range(0, width, step):
                part = slice(offset, min(offset + step, width))
                rows = read_rows(self.columns, coordinates[batch, part])
                means = torch.bmm(mean_w[batch, :, part], rows).mT
                sum_mean[batch, :, levels] += means * keep[batch]
                if var_w is not None:
                    squares = torch.bmm(var_w[batch, :, part], rows * rows).mT
                    sum_var[batch, :, levels] += squares * keep[batch]
