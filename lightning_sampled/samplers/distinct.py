"""Draws without replacement as TensorFlow's unique candidate samplers make them: draw with
replacement until ``M`` distinct classes have come up, counting the draws (``tries``), and
correct each class by its expected count ``1 - (1 - q)^tries`` in place of ``M q``.

The expected count is TensorFlow's approximation (``tf.random.*_candidate_sampler(unique=True)``
returns it as ``sampled_expected_count``): it treats ``tries`` as fixed, while it is random and
depends on the classes drawn, so the corrected estimator is close to, not exactly, consistent.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

#: the most draws per distinct class before :func:`distinct_draws` gives up
MAX_TRIES_PER_CLASS = 1000


def first_occurrences(draws: Tensor) -> Tensor:
    """Bool, the shape of ``draws`` ``[..., P]``: where each row's values occur first."""
    values, order = draws.sort(dim=-1, stable=True)
    new = torch.ones_like(values, dtype=torch.bool)
    new[..., 1:] = values[..., 1:] != values[..., :-1]
    return torch.zeros_like(new).scatter_(-1, order, new)


def distinct_draws(
    draw: Callable[[tuple[int, ...]], Tensor], shape: tuple[int, ...]
) -> tuple[Tensor, Tensor]:
    """``M = shape[-1]`` distinct ids per row, in the order they first came up in a stream of
    draws with replacement, and how many draws that took.

    Args:
        draw: ``draw(shape) -> long ids`` of that shape, independent draws with replacement.
        shape: ``(M,)`` for one set, or ``(B, M)`` for one per row.

    Returns:
        ``(ids [*shape], tries)``: ``tries`` float64 ``[*shape[:-1]]`` (a 0-dim tensor for one
        set), the position of each row's ``M``-th distinct id in its stream, plus one.

    Raises:
        ValueError: if ``M`` distinct ids have not come up in ``MAX_TRIES_PER_CLASS * M`` draws
            (a proposal that puts almost no mass on most of the classes asked for).
    """
    *rows, m = shape
    stream = draw((*rows, 2 * m))
    while True:
        first = first_occurrences(stream)
        count = first.cumsum(dim=-1)
        if bool((count[..., -1] >= m).all()):
            break
        if stream.shape[-1] >= MAX_TRIES_PER_CLASS * m:
            raise ValueError(
                f"{m} distinct classes did not come up in {stream.shape[-1]} draws: the proposal "
                "has too little mass outside its most likely classes for unique=True at this "
                "num_negatives; lower num_negatives or draw with replacement"
            )
        stream = torch.cat([stream, draw((*rows, stream.shape[-1]))], dim=-1)
    ids = stream[first & (count <= m)].view(*rows, m)
    tries = (count < m).sum(dim=-1).double() + 1.0
    return ids, tries


def expected_count_log_q(log_q: Tensor, tries: Tensor, num_samples: int) -> Tensor:
    """fp32 ``log(E / M)`` with ``E = 1 - (1 - q)^tries`` the expected count of a class of
    probability ``exp(log_q)`` in ``tries`` draws: the ``log q`` that makes a head's
    ``log(M q)`` correction the expected count. ``tries`` broadcasts against ``log_q`` from the
    left (one per row of ``[B, K]``, or a 0-dim tensor)."""
    if tries.dim():
        tries = tries.view(*tries.shape, *([1] * (log_q.dim() - tries.dim())))
    q = log_q.double().exp()
    expected = -torch.expm1(tries * torch.log1p(-q))
    return (expected.log() - math.log(num_samples)).float()
