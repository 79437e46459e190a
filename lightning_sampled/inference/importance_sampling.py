"""Importance-weighted coordinate sampling without replacement for AdaptiveSoftmax.

The paper's Algorithms 5-7 and Appendix A.3: coordinates ``j`` of ``<A_i, x>`` are drawn with
weights ``w_j = |x_j| sum_i |A_ij|`` (Algorithm 5), without replacement, by sorting the
log-weights perturbed with i.i.d. Gumbel noise (Algorithm 6, the Gumbel-top-k trick). The first
``N`` coordinates of that order are a without-replacement sample of size ``N``; with the
``(N + 1)``-th largest perturbed key as the threshold ``tau``, the inclusion probability of a
sampled coordinate is ``pi_j = 1 - exp(-exp(log w_j - tau))`` (Algorithm 7, eq. 17), and
``sum_{j in S} v_j / pi_j`` is an unbiased (Horvitz-Thompson) estimate of ``sum_j v_j`` (eq. 18).

Every arm of a query reads the coordinates in the same order (Appendix C.5), so the sample of an
arm pulled ``N`` times is the prefix ``order[:N]``, and later pulls extend it (pull reuse, Appendix
C.1).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def pull_schedule(dim: int, first: int = 16, growth: float = 1.5) -> list[int]:
    """The pull counts an arm goes through: ``first``, then ``x growth`` each step, up to ``d``.

    The authors' released implementation starts at 16 pulls per arm and grows them geometrically
    by 1.5 rather than Algorithm 8's ``x 1.1`` or Appendix C.3's ``d / 10`` (whose fixed first
    phase would cap the gain at 10x; see :class:`~lightning_sampled.inference.AdaptiveSoftmax`).

    Args:
        dim: ``d``, the number of coordinates.
        first: pulls of the first step.
        growth: multiplicative growth between steps (> 1).

    Returns:
        Strictly increasing sample sizes ``[T_0, ..., T_L]`` with ``T_L = d``.
    """
    sizes = []
    size = first
    while size < dim:
        sizes.append(size)
        size = max(size + 1, math.floor(size * growth))
    sizes.append(dim)
    return sizes


def importance_weights(column_abs_sums: Tensor, x: Tensor) -> Tensor:
    """Algorithm 5: ``w_j = |x_j| * sum_i |A_ij|``.

    Args:
        column_abs_sums: ``[d]`` the l1 norms of the columns of ``A`` (computed once per matrix).
        x: ``[B, d]`` queries.

    Returns:
        ``[B, d]`` float64 weights (zero where ``x_j = 0`` or column ``j`` of ``A`` is zero: such
        coordinates contribute nothing to any ``<A_i, x>``).
    """
    return x.double().abs() * column_abs_sums.double()


def gumbel_permutation(
    log_weights: Tensor, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Algorithm 6: orders the coordinates of each query by Gumbel-perturbed log-weights.

    Each row gets its own noise, so no two queries share a permutation.

    Args:
        log_weights: ``[B, d]`` float64 ``log w`` (``-inf`` for zero weights, which sort last).
        generator: source of the noise (``None``: torch's global generator).

    Returns:
        ``(order, keys)``: long ``[B, d]`` coordinate ids in decreasing perturbed key, and the
        sorted perturbed keys ``[B, d]`` (float64), the thresholds of Algorithm 7.
    """
    uniform = torch.rand(
        log_weights.shape, generator=generator, dtype=torch.float64, device=log_weights.device
    )
    tiny = torch.finfo(torch.float64).tiny
    gumbel = -torch.log(-torch.log(uniform.clamp_(min=tiny, max=1.0 - 2**-53)))
    keys, order = torch.sort(log_weights + gumbel, dim=1, descending=True, stable=True)
    return order, keys


def sample_thresholds(keys: Tensor, sizes: list[int]) -> Tensor:
    """Thresholds ``tau`` of the prefixes of the Gumbel order of each size in ``sizes``.

    For a sample of the first ``N`` coordinates, ``tau`` is the ``(N + 1)``-th largest perturbed key
    (Appendix A.3.3); the paper's Algorithm 7 writes ``h_k`` for it. A sample of all ``d``
    coordinates has ``tau = -inf`` (every inclusion probability is one).

    Args:
        keys: ``[B, d]`` sorted perturbed keys from :func:`gumbel_permutation`.
        sizes: sample sizes ``N``, each in ``[1, d]``.

    Returns:
        ``[B, len(sizes)]`` float64 thresholds.
    """
    dim = keys.shape[1]
    inside = [n for n in sizes if n < dim]
    taus = keys[:, inside]
    tail = len(sizes) - len(inside)
    if tail:
        taus = torch.cat([taus, keys.new_full((keys.shape[0], tail), -math.inf)], dim=1)
    return taus


def inclusion_probabilities(log_weights: Tensor, thresholds: Tensor) -> tuple[Tensor, Tensor]:
    """Algorithm 7 / eq. 17: ``pi = 1 - exp(-exp(log w - tau))`` and ``1 - pi``.

    Broadcasts ``log_weights`` against ``thresholds``. Zero-weight coordinates (``log w = -inf``)
    get ``pi = 1``: they are only ever "sampled" once every positive-weight coordinate has been,
    and their product ``A_ij x_j`` is zero, so any finite weight leaves the estimates unchanged.

    Args:
        log_weights: float64 log importance weights of the sampled coordinates.
        thresholds: float64 thresholds ``tau`` (``-inf`` for a full sample).

    Returns:
        ``(pi, 1 - pi)``, each computed without cancellation.
    """
    rate = torch.exp(log_weights - thresholds)
    pi = -torch.expm1(-rate)
    complement = torch.exp(-rate)
    zero_weight = log_weights == -math.inf
    pi = torch.where(zero_weight, torch.ones_like(pi), pi)
    complement = torch.where(zero_weight, torch.zeros_like(complement), complement)
    return pi, complement
