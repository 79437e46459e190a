"""The estimator conventions of a sampled softmax, by name, decoded here and nowhere else.

A convention says three things: whether the negatives' logits are corrected by their log-size
(``o_j - log(M q_j)``, or a mixture's or an inclusion probability's), whether the positive's is
too, and whether negatives equal to the row's target (accidental hits) get ``-inf``. What each
choice does to the estimate, with the measurements behind the default, is the module docstring
of :mod:`lightning_sampled.heads.sampled`; TAPAS' own are
:class:`~lightning_sampled.heads.TapasHead`'s.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from torch import Tensor


class Convention(NamedTuple):
    """What a sampled softmax corrects and masks (module docstring).

    Attributes:
        name: the convention's name, as the heads take it.
        corrects_negatives: the negatives' logits become ``o_j - log_size_j``.
        corrects_positive: the positive's logit becomes ``o_y - log_size_y``.
        removes_accidental_hits: negatives equal to the row's target get ``-inf``.
    """

    name: str
    corrects_negatives: bool
    corrects_positive: bool
    removes_accidental_hits: bool

    def negatives(self, logits: Tensor, ids: Tensor, log_size: Tensor, target: Tensor) -> Tensor:
        """Candidate logits ``[T, C]`` as the convention scores them: minus their log-size
        ``log_size`` (broadcast to ``[T, C]``) where it corrects negatives, with the candidates
        ``ids`` (``[C]`` shared or ``[T, C]``) equal to the row's ``target`` ``[T]`` at ``-inf``
        where it removes accidental hits (a target of ``-1`` matches no candidate)."""
        if self.corrects_negatives:
            logits = logits - log_size
        if self.removes_accidental_hits:
            logits = logits.masked_fill(ids.expand_as(logits) == target[:, None], -math.inf)
        return logits

    def positive(self, logits: Tensor, log_size: Tensor) -> Tensor:
        """The positive's logits (any shape) minus ``log_size`` where the convention corrects
        it."""
        return logits - log_size if self.corrects_positive else logits


#: every convention, by name
CONVENTIONS = {
    convention.name: convention
    for convention in (
        Convention("exact_positive", True, False, True),
        Convention("corrected_all", True, True, False),
        Convention("tensorflow", True, True, True),
        Convention("uncorrected", False, False, True),
        Convention("uncorrected_with_hits", False, False, False),
    )
}
#: the conventions of the sampled softmax (:class:`~lightning_sampled.heads.SampledSoftmaxHead`,
#: :func:`~lightning_sampled.functional.sampled_softmax_loss`): the two consistent ones and
#: TensorFlow's defaults
SAMPLED_CONVENTIONS = ("exact_positive", "corrected_all", "tensorflow")
#: TAPAS' (:class:`~lightning_sampled.heads.TapasHead`): its paper's uncorrected form first
TAPAS_CONVENTIONS = ("uncorrected", "exact_positive", "corrected_all", "uncorrected_with_hits")


def convention_named(name: str, allowed: tuple[str, ...] = SAMPLED_CONVENTIONS) -> Convention:
    """The :class:`Convention` called ``name``.

    Raises:
        ValueError: ``name`` is not one of ``allowed``.
    """
    if name not in allowed:
        raise ValueError(f"convention must be one of {allowed}, got {name!r}")
    return CONVENTIONS[name]
