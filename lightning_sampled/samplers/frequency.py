"""``TargetFrequency``: each class's share of the training targets, the proposal of in-batch
negatives.

The other positions' targets in a batch are draws from the targets' distribution ``q_b``, so a head
that uses them as negatives corrects their logits by ``log q_b`` (Yi et al., RecSys 2019,
"Sampling-bias-corrected neural modeling for large corpus item recommendations"). Yi et al.
estimate ``q_b`` from the average number of steps between two sightings of a class; that estimate
saturates at one sighting per step, so a class that fills a quarter of every batch (a frequent
word, a popular item) is under-weighted by a large factor. Here ``q_b`` is a ratio of two
exponential moving averages over steps instead, kept lazily so that a step costs
``O(batch)``, not ``O(N)``:

- ``count_j``: the decayed number of occurrences of class ``j`` among the targets, updated only
  when ``j`` occurs (its decay since the last update is applied then);
- ``total``: the decayed number of targets.

``q_b(j) = count_j (1 - a)^(t - t_j) / total``, with ``a`` the decay per step and ``t_j`` the last
step that saw ``j``. Both averages start at zero and share the same start-up bias, which cancels
in the ratio. With ``counts`` given, ``q_b`` is fixed at ``counts / counts.sum()`` instead (for
example the training split's item counts).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .._validation import check_async, check_class_ids, check_positive_int

#: the smallest normal fp64: a total of 0 reads as this, so that a count of 0 gives -inf, not NaN
_TINY = torch.finfo(torch.float64).tiny
#: the fp64 buffers that a cast of the model leaves fp64
_KEPT_FP64 = ("count", "total")


class TargetFrequency(nn.Module):
    """Estimated share ``q_b(j)`` of each class among the training targets.

    Args:
        num_classes: ``N``.
        decay: the weight ``a`` of the newest step in the moving averages, in ``(0, 1]``; the
            estimate averages over about ``1 / a`` steps.
        counts: optional ``[N]`` non-negative class counts; when given, ``q_b`` is fixed at
            ``counts / counts.sum()`` and :meth:`update` does nothing.
    """

    def __init__(
        self, num_classes: int, *, decay: float = 0.01, counts: Tensor | None = None
    ) -> None:
        super().__init__()
        self.num_classes = check_positive_int("num_classes", num_classes)
        if not (isinstance(decay, (int, float)) and 0.0 < decay <= 1.0):
            raise ValueError(f"decay must be a number in (0, 1], got {decay!r}")
        self.decay = float(decay)
        self.fixed = counts is not None
        if counts is None:
            count = torch.zeros(num_classes, dtype=torch.float64)
        else:
            count = _checked_counts(counts, num_classes)
        self.register_buffer("count", count)
        self.register_buffer("last_step", torch.zeros(num_classes, dtype=torch.long))
        # [1], not 0-dim: under torch.compile (torch 2.13) the in-place updates of a 0-dim fp64
        # buffer are lost (tests/samplers/test_target_frequency.py)
        self.register_buffer("total", count.sum().reshape(1))
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        self.register_load_state_dict_pre_hook(_one_element_total_of_older_checkpoints)

    def _apply(self, fn: Any, recurse: bool = True) -> TargetFrequency:
        """Moves with the module (``.to(device)``, ``.cuda()``) but keeps its fp64 counts fp64
        through a cast of the whole model (``.bfloat16()``, Lightning's ``"bf16-true"``):
        decayed counts of ``1e-2`` and less would not survive bf16."""
        before = {name: getattr(self, name) for name in _KEPT_FP64}
        super()._apply(fn, recurse)
        for name, kept in before.items():
            moved = getattr(self, name)
            if moved.dtype != kept.dtype:  # cast, not only moved: keep the fp64 values
                setattr(self, name, kept.to(moved.device))
        return self

    def add_classes(self, num_new: int) -> None:
        """Grows to ``num_new`` new classes, never seen as targets (count 0; the floor of
        :meth:`log_prob` keeps them drawable)."""
        check_positive_int("num_new", num_new)
        self.num_classes += num_new
        self.count = torch.cat([self.count, self.count.new_zeros(num_new)])
        self.last_step = torch.cat([self.last_step, self.last_step.new_zeros(num_new)])

    @torch.no_grad()
    def update(self, targets: Tensor, mask: Tensor | None = None) -> None:
        """Counts one step's targets (long ``[T]``, class ids), or those of them that ``mask``
        (bool ``[T]``) keeps: the others (stand-ins of ignored positions) count for nothing.

        No host sync: every target writes its class's new count (the same value for repeated
        classes), with its number of occurrences found by a sort of the ``T`` targets. A
        left-out target's class gets its count decayed to this step, which leaves ``q_b`` as
        it was."""
        if self.fixed:
            return
        check_class_ids("targets", targets, self.num_classes)
        self.step += 1
        keep = 1.0 - self.decay
        ids = targets.reshape(-1).to(self.count.device)
        occurrences = occurrences_in(counted(ids, mask, self.num_classes), ids)
        stale = (self.step - self.last_step.index_select(0, ids)).double()
        decayed = self.count.index_select(0, ids) * keep**stale
        self.count.index_put_((ids,), decayed + self.decay * occurrences.double())
        self.last_step.index_put_((ids,), self.step.expand(ids.shape))
        self.total.mul_(keep).add_(self.decay * number_of(ids, mask))

    @property
    def ready(self) -> bool:
        """Whether there is an estimate: counts were given or some targets seen (reads
        ``total`` back: a host sync)."""
        return float(self.total) > 0.0

    def log_prob(
        self,
        ids: Tensor,
        batch: Tensor | None = None,
        batch_mask: Tensor | None = None,
        *,
        after_update: bool = False,
    ) -> Tensor:
        """``log q_b`` (fp32) of class ids of any shape; ``-inf`` for a class not seen yet.

        ``batch``, the targets drawn from ``q_b`` now (those that serve as in-batch
        negatives; with ``batch_mask``, bool of ``batch``'s shape, only those it keeps), floors
        the estimate of the classes in it, so that none gets ``q_b = 0``,
        whose correction ``-log((T - 1) q_b)`` is an infinite logit (a class missing from fixed
        ``counts``, one seen only in evaluation, one whose estimate decayed to nothing). A class
        found ``n_j`` times among the batch's ``T`` targets gets its share once they are counted,
        ``w n_j / (total + w T)``, with ``w`` the weight of one target:

        - moving averages: ``w = decay``, and the floor applies wherever it exceeds the
          estimate. In training mode the batch is already counted and it changes nothing;
        - fixed ``counts``: ``w`` is the smallest positive count (one occurrence, whatever the
          counts' scale), and only classes of count 0 are floored: the counts given stay as
          given.

        Like the estimate, the floor tends to the class's true share as the counted targets grow,
        so the correction stays consistent.

        No host sync on CUDA (the check below is then ``torch._assert_async``). Where ``ids``
        has more entries than there are classes, every class's ``log q_b`` is computed once and
        gathered: the same values, for ``N`` fp64 decays instead of one per entry.

        ``after_update``: the caller has just counted a batch (:meth:`update`), so no check. A
        batch whose targets were all left out (a static-shape step with every position ignored)
        counts none, and where nothing was counted before either, every class then reads
        ``-inf``, for the caller to leave unused.

        Raises:
            RuntimeError: before the first :meth:`update` (no estimate yet), unless
                ``after_update``.
        """
        if not after_update:
            check_async(
                self.total[0] > 0,
                "TargetFrequency has seen no targets yet: call update() with a batch's targets "
                "first, or give counts",
                RuntimeError,
            )
        check_class_ids("ids", ids, self.num_classes)
        lookups = ids.reshape(-1)
        # more lookups than classes (a recommender's [T, M] draws): each class's estimate once,
        # then a gather, so the fp64 decay and log run over N entries instead of T M
        per_class = lookups.numel() > self.num_classes
        flat = torch.arange(self.num_classes, device=self.count.device) if per_class else lookups
        count = self.count.index_select(0, flat)
        if not self.fixed:
            stale = (self.step - self.last_step.index_select(0, flat)).double()
            count = count * (1.0 - self.decay) ** stale
        log_q = count.log() - self.total.clamp(min=_TINY).log()  # -inf, not NaN, where 0
        if batch is not None:
            log_q = self._log_floor(flat, batch, batch_mask, log_q)
        log_q = log_q.float()
        return (log_q.index_select(0, lookups) if per_class else log_q).view(ids.shape)

    def _log_floor(
        self, ids: Tensor, batch: Tensor, batch_mask: Tensor | None, log_q: Tensor
    ) -> Tensor:
        """``log q_b`` fp64 of flat ``ids`` with the floor of :meth:`log_prob` from ``batch``
        (the targets ``batch_mask`` keeps)."""
        check_class_ids("batch", batch, self.num_classes)
        targets = batch.reshape(-1).to(self.count.device)
        found = occurrences_in(counted(targets, batch_mask, self.num_classes), ids)
        if self.fixed:
            weight = self.count.masked_fill(self.count == 0, torch.inf).amin()
        else:
            weight = torch.tensor(self.decay, dtype=torch.float64, device=self.count.device)
        seen = self.total + weight * number_of(targets, batch_mask)
        floor = (weight * found).log() - seen.log()
        if self.fixed:
            return torch.where(self.count.index_select(0, ids) == 0, floor, log_q)
        return torch.maximum(log_q, floor)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, decay={self.decay}, fixed={self.fixed}"


def _one_element_total_of_older_checkpoints(
    module: TargetFrequency, state_dict: dict[str, Any], prefix: str, *_: Any
) -> None:
    """A checkpoint from before ``total`` had shape ``[1]`` (it was 0-dim) loads."""
    total = state_dict.get(prefix + "total")
    if isinstance(total, Tensor) and total.dim() == 0:
        state_dict[prefix + "total"] = total.reshape(1)


def counted(targets: Tensor, mask: Tensor | None, beyond: int) -> Tensor:
    """``targets`` (long ``[T]``) with the positions ``mask`` (bool, ``T`` entries) leaves out
    set to ``beyond``, a value above every class id (``num_classes``, or more): no class finds
    them, and they sort after every target."""
    if mask is None:
        return targets
    return targets.where(mask.reshape(-1).to(targets.device), beyond)


def number_of(targets: Tensor, mask: Tensor | None) -> int | Tensor:
    """How many of ``targets`` count: all of them, or the fp64 number ``mask`` keeps (a scalar
    tensor, no host sync)."""
    if mask is None:
        return targets.numel()
    return mask.sum(dtype=torch.float64).to(targets.device)


def occurrences_in(targets: Tensor, ids: Tensor) -> Tensor:
    """How many times each of ``ids`` (long ``[K]``) is found among ``targets`` (long ``[T]``):
    long ``[K]``, by a sort of the targets and two binary searches (no ``[N]`` tensor)."""
    ordered = targets.sort().values
    return torch.searchsorted(ordered, ids, right=True) - torch.searchsorted(ordered, ids)


def _checked_counts(counts: Tensor, num_classes: int) -> Tensor:
    counts = torch.as_tensor(counts).detach().to(torch.float64).reshape(-1)
    if counts.numel() != num_classes:
        raise ValueError(f"counts must have {num_classes} entries, got {counts.numel()}")
    if not bool(torch.isfinite(counts).all()) or bool((counts < 0).any()):
        raise ValueError("counts must be finite and non-negative")
    if float(counts.sum()) <= 0.0:
        raise ValueError("counts must not be all zero")
    return counts
