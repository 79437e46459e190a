"""Where a sampled softmax's negatives come from: each source yields candidate columns.

:class:`~lightning_sampled.heads.SampledSoftmaxHead` estimates the softmax of each scored
position from its positive and the columns of its negative sources, in one loop
(:meth:`~lightning_sampled.heads.SampledSoftmaxHead.estimate`), on a whole table and on a table
split across ranks alike:

- :class:`DrawnNegatives`: ``M`` draws from the head's proposal (the sampler), per query
  ``[T, M]`` or shared ``[M]``;
- :class:`InBatchNegatives`: the batch's distinct targets ``[U]`` weighted by how many other
  positions hold each (:mod:`lightning_sampled.ops.in_batch`);
- :class:`InBatchDraws`: under ``max_in_batch_draws=K``, the targets of ``K`` other positions
  drawn for each group of ``in_batch_group_size`` rows ``[G, K]``
  (:func:`~lightning_sampled.ops.in_batch.drawn_per_group`);
- :class:`PooledNegatives`: candidates that every row shares reduced, before the rows are
  scored, to one column, the log-sum-exp of their corrected columns (the batch's targets without
  a limit: :func:`~lightning_sampled.ops.in_batch.in_batch_logsumexp`).

A source gives its candidates' ids (rows of the head's table), their ``log q`` under the
sampler (``None`` where the head draws nothing), from which the head computes each candidate's
log-size (the correction, ``log(M q)`` or the mixture's), and turns the candidates' raw logits
and log-sizes into corrected columns under the head's
:class:`~lightning_sampled.ops.conventions.Convention`. The caller's own negatives
(``negatives=``) are the logits-level op of :mod:`lightning_sampled.ops.losses`, which
:func:`~lightning_sampled.functional.sampled_softmax_loss` shares.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from torch import Tensor

from ..ops.chunked import groups_of
from ..ops.conventions import Convention
from ..ops.in_batch import BatchCandidates, in_batch_logits


class DrawnNegatives(NamedTuple):
    """The sampler's draws.

    Attributes:
        ids: long ``[M]`` (shared) or ``[T, M]`` (per query), rows of the head's table.
        log_q: their ``log q`` under the sampler, the shape of ``ids``.
    """

    ids: Tensor
    log_q: Tensor

    @property
    def gathered_per_row(self) -> int:
        """Class vectors gathered for each scored row: ``M`` per query, none when shared (the
        ``[M, D]`` rows are gathered once for every row)."""
        return self.ids.shape[1] if self.ids.dim() == 2 else 0

    @property
    def num_columns(self) -> int:
        """Candidate columns of each row: ``M``."""
        return self.ids.shape[-1]

    def rows(self, block: slice) -> DrawnNegatives:
        """The draws of the rows ``block`` (shared draws: all of them)."""
        if self.ids.dim() == 1:
            return self
        return DrawnNegatives(self.ids[block], self.log_q[block])

    def columns(
        self, logits: Tensor, log_size: Tensor, convention: Convention, hits: Tensor
    ) -> Tensor:
        """Corrected columns ``[T, M]`` from the draws' raw logits ``[T, M]`` and log-sizes:
        a draw equal to a row's ``hits`` ``[T]`` (its target's row; ``-1``: none) is an
        accidental hit."""
        return convention.negatives(logits, self.ids, log_size, hits)


class InBatchNegatives(NamedTuple):
    """The batch's targets as negatives.

    Attributes:
        ids: long ``[U]`` the candidates' rows of the head's table.
        candidates: their :class:`~lightning_sampled.ops.in_batch.BatchCandidates` (counts,
            each position's column).
        log_q: ``[U]`` their ``log q`` under the sampler, or ``[T, U]`` under a proposal that
            depends on the query (MIDX), ``None`` where the head draws none.
    """

    ids: Tensor
    candidates: BatchCandidates
    log_q: Tensor | None

    #: the ``[U, D]`` candidate vectors are gathered once for every row
    gathered_per_row = 0

    @property
    def num_columns(self) -> int:
        """Candidate columns of each row: ``U``."""
        return self.ids.shape[-1]

    @property
    def shared_by_rows(self) -> bool:
        """Whether every row corrects the candidates alike, so that they can be pooled
        (:class:`PooledNegatives`): ``log_q`` ``[U]`` or none, not ``[T, U]`` as a proposal that
        depends on the query (MIDX) gives."""
        return self.log_q is None or self.log_q.dim() == 1

    def rows(self, block: slice) -> InBatchNegatives:
        """The same candidates for the rows ``block``: their own columns, and their rows of a
        per-query ``log_q``."""
        candidates = self.candidates._replace(column=self.candidates.column[block])
        log_q = self.log_q if self.shared_by_rows else self.log_q[block]
        return InBatchNegatives(self.ids, candidates, log_q)

    def columns(
        self, logits: Tensor, log_size: Tensor, convention: Convention, hits: Tensor
    ) -> Tensor:
        """Corrected columns ``[T, U]``
        (:func:`~lightning_sampled.ops.in_batch.in_batch_logits`): a position's own target's
        column holds its accidental hits, so ``hits`` is not needed."""
        del hits  # the own column is known from candidates.column
        remove_hits = convention.removes_accidental_hits
        return in_batch_logits(logits, log_size, self.candidates, remove_hits)


class InBatchDraws(NamedTuple):
    """The targets of ``K`` other positions drawn for each group of ``group_size`` consecutive
    rows (``max_in_batch_draws``, ``in_batch_group_size``), each a column of its own, corrected
    like a sampled draw by the mixture's ``log(M q_s + K q_b)``. The rows of a group share their
    draws, so they are scored by one ``[g, D] x [D, K]`` product per group instead of ``K``
    gathered vectors per row.

    Attributes:
        ids: long ``[G, K]`` rows of the head's table, those of each group (over a split
            table, any row where another rank holds the class: ``kept`` leaves it out).
        log_q: their ``log q`` under the sampler, ``[G, K]`` where it ignores the query (one
            per group), else ``[T, K]`` for each row's query; ``None`` where the head draws
            none.
        kept: bool, broadcasting to ``[G, K]``, the draws that count (none where no group has
            a scored position outside it; over a split table, those of the classes this rank
            holds), or ``None``: all.
        group_size: ``g``, the rows that share a group's draws (1: every row its own).
    """

    ids: Tensor
    log_q: Tensor | None
    kept: Tensor | None
    group_size: int = 1

    @property
    def gathered_per_row(self) -> int:
        """Class vectors gathered for each row: its group's ``K`` draws, shared by ``g`` rows."""
        return -(-self.ids.shape[1] // self.group_size)

    @property
    def num_columns(self) -> int:
        """Candidate columns of each row: ``K``."""
        return self.ids.shape[1]

    @property
    def log_q_per_group(self) -> bool:
        """Whether ``log_q`` is one row per group (``[G, K]``, a sampler that ignores the query)
        or absent, rather than one per row (``[T, K]``)."""
        return self.log_q is None or self.log_q.shape[0] == self.ids.shape[0]

    def rows(self, block: slice) -> InBatchDraws:
        """The draws of the rows ``block``, which starts at a group's first row."""
        groups = groups_of(block, self.group_size)
        log_q = self.log_q
        if log_q is not None:
            log_q = log_q[groups] if self.log_q_per_group else log_q[block]
        kept = self.kept
        if kept is not None and kept.dim() == 2:
            kept = kept[groups]
        return self._replace(ids=self.ids[groups], log_q=log_q, kept=kept)

    def per_row(self, groups: Tensor, num_rows: int) -> Tensor:
        """A ``[G, K]`` tensor of the groups (``ids``, ``kept``) as ``[num_rows, K]``, a row
        of it for each row of the groups."""
        if self.group_size == 1:
            return groups
        return groups.repeat_interleave(self.group_size, dim=0)[:num_rows]

    def columns(
        self, logits: Tensor, log_size: Tensor, convention: Convention, hits: Tensor
    ) -> Tensor:
        """Corrected columns ``[T, K]``: a draw of a row's own target is an accidental hit, as
        a sampled one is; the draws not kept are no candidates (``-inf``)."""
        ids = self.per_row(self.ids, logits.shape[0])
        columns = convention.negatives(logits, ids, log_size, hits)
        if self.kept is None:
            return columns
        kept = self.per_row(self.kept, logits.shape[0]) if self.kept.dim() == 2 else self.kept
        return columns.masked_fill(~kept, -math.inf)


class PooledNegatives(NamedTuple):
    """Candidates shared by every row, already reduced to the log-sum-exp of their corrected
    columns, so that a row is scored with one column for them and no ``[T, U]`` block is ever
    held (:meth:`~lightning_sampled.heads.SampledSoftmaxHead.pooled`).

    Attributes:
        logsumexp: fp32 ``[T]``, differentiable in the queries and the candidates' vectors.
    """

    logsumexp: Tensor

    #: the candidates' vectors were gathered when they were pooled
    gathered_per_row = 0
    #: one column per row
    num_columns = 1

    def rows(self, block: slice) -> PooledNegatives:
        """The pooled column of the rows ``block``."""
        return PooledNegatives(self.logsumexp[block])


#: a source of negatives
NegativeSource = DrawnNegatives | InBatchNegatives | InBatchDraws | PooledNegatives
