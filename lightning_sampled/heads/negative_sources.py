"""Where a sampled softmax's negatives come from: each source yields candidate columns.

:class:`~lightning_sampled.heads.SampledSoftmaxHead` estimates the softmax of each scored
position from its positive and the columns of its negative sources, in one loop
(:meth:`~lightning_sampled.heads.SampledSoftmaxHead.estimate`), on a whole table and on a table
split across ranks alike:

- :class:`DrawnNegatives`: ``M`` draws from the head's proposal (the sampler), per query
  ``[T, M]`` or shared ``[M]``;
- :class:`InBatchNegatives`: the batch's distinct targets ``[U]`` weighted by how many other
  positions hold each (:mod:`lightning_sampled.ops.in_batch`);
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

from typing import NamedTuple

from torch import Tensor

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
        own: bool ``[T]`` the positions counted in ``candidates.counts`` under
            ``max_in_batch_draws`` (``None``: every one with a column).
        log_q: ``[U]`` their ``log q`` under the sampler, ``None`` where the head draws none.
    """

    ids: Tensor
    candidates: BatchCandidates
    own: Tensor | None
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
        (:class:`PooledNegatives`): no ``max_in_batch_draws`` (each row its own draw count) and
        ``log_q`` ``[U]`` or none, not ``[T, U]`` as a proposal that depends on the query (MIDX)
        gives."""
        return self.own is None and (self.log_q is None or self.log_q.dim() == 1)

    def rows(self, block: slice) -> InBatchNegatives:
        """The same candidates for the rows ``block``: their own columns and counted flags."""
        candidates = self.candidates._replace(column=self.candidates.column[block])
        own = None if self.own is None else self.own[block]
        return InBatchNegatives(self.ids, candidates, own, self.log_q)

    def columns(
        self, logits: Tensor, log_size: Tensor, convention: Convention, hits: Tensor
    ) -> Tensor:
        """Corrected columns ``[T, U]``
        (:func:`~lightning_sampled.ops.in_batch.in_batch_logits`): a position's own target's
        column holds its accidental hits, so ``hits`` is not needed."""
        del hits  # the own column is known from candidates.column
        return in_batch_logits(
            logits, log_size, self.candidates, convention.removes_accidental_hits, self.own
        )


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
NegativeSource = DrawnNegatives | InBatchNegatives | PooledNegatives
