"""Constant tuning of Appendix C.4: bisection in log space for the smallest passing factor."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple


class CalibrationResult(NamedTuple):
    """What :meth:`~.adaptive_softmax.AdaptiveSoftmax.calibrate` found.

    Attributes:
        bandit_scale: factor on the variance estimates of best-arm identification.
        norm_scale: factor on the variance estimates of normalisation estimation.
        identification_rate: fraction of calibration queries whose top-``k`` set was exact.
        success_rate: fraction whose top-``k`` set was exact and every probability was within
            ``(1 +- eps)``, with both factors in place.
    """

    bandit_scale: float
    norm_scale: float
    identification_rate: float
    success_rate: float


def smallest_passing_factor(
    passes: Callable[[float], bool],
    low: float = 1e-6,
    high: float = 1.0,
    tolerance: float = 1e-2,
) -> float:
    """Bisection in ``log10`` space for the smallest factor in ``[low, high]`` that passes.

    Assumes ``passes`` is monotone (small factors mean fewer pulls and more failures). Returns
    ``high`` when even ``high`` fails (the untuned algorithm is kept), ``low`` when ``low`` passes,
    and otherwise the upper end of the final bracket, whose ``log10`` width is at most
    ``tolerance``.

    Args:
        passes: whether a factor meets the success target on the calibration queries.
        low: the smallest factor considered (``1e-6`` in the paper).
        high: the largest factor considered (``1`` in the paper).
        tolerance: stop when ``log10(hi) - log10(lo) <= tolerance`` (``1e-2`` in the paper).

    Returns:
        The factor.
    """
    if not passes(high):
        return high
    if passes(low):
        return low
    lo, hi = math.log10(low), math.log10(high)
    while hi - lo > tolerance:
        mid = 0.5 * (lo + hi)
        if passes(10.0**mid):
            hi = mid
        else:
            lo = mid
    return 10.0**hi
