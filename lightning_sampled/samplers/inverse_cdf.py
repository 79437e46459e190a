"""Inverse-CDF draws from small unnormalised tables, safe against rounding.

MIDX draws its first codeword from ``P1`` ``[B, K]`` per query (:func:`inverse_cdf`) and, in
exact mode, its second from one row of ``P2(. | k1)`` ``[B, K, K]`` (:func:`inverse_cdf_in_row`).
Both normalise the running sums so that each row ends at exactly ``1``: no uniform in ``[0, 1)``
falls past the table or onto a zero-probability entry.
"""

from __future__ import annotations

import torch
from torch import Tensor


def cdf(probs: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Running sums of the rows ``probs`` ``[..., K]`` divided by their last entry, in ``dtype``.

    Each row then ends at exactly ``1.0`` (``x / x``), and rounding keeps the sums monotone, so
    ``searchsorted(cdf, u, right=True)`` with ``u`` in ``[0, 1)`` always lands on a positive
    entry: no draw falls past the table nor onto a zero-probability entry (an empty cell), which a
    table ending slightly below 1 in fp32 would allow without a clamp. All-zero rows (never
    searched) stay all zeros, which keeps shifted tables sorted.
    """
    sums = torch.cumsum(probs, dim=-1, dtype=dtype)
    return sums.div_(sums[..., -1:].clamp_min(torch.finfo(dtype).tiny))


def inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """Draws from the unnormalised rows ``probs`` ``[B, K]`` with uniforms ``u`` ``[B, S]``.

    Returns:
        long ``[B, S]`` indices in ``[0, K)`` with positive probability.
    """
    return torch.searchsorted(cdf(probs), u, right=True)


def inverse_cdf_in_row(probs: Tensor, rows: Tensor, u: Tensor) -> Tensor:
    """Draws a column of row ``rows`` of each query's table ``probs`` ``[B, K, K]`` (unnormalised).

    One search per draw without gathering a ``[B, S, K]`` table: the rows' normalised running
    sums, shifted by the row index, form one sorted fp64 sequence ``[B, K * K]`` per query (row
    ``r`` spans ``(r, r + 1]``), searched for ``rows + u``.

    Args:
        probs: ``[B, K, K]`` non-negative rows; the rows drawn must have positive sums.
        rows: long ``[B, S]`` the row of each draw.
        u: ``[B, S]`` uniforms in ``[0, 1)`` (fp32, so ``rows + u < rows + 1`` exactly in fp64).

    Returns:
        long ``[B, S]`` columns in ``[0, K)`` with positive probability.
    """
    batch, k, _ = probs.shape
    shift = torch.arange(k, device=probs.device, dtype=torch.float64)[:, None]
    table = cdf(probs, torch.float64).add_(shift).reshape(batch, k * k)
    index = torch.searchsorted(table, rows.double() + u.double(), right=True)
    return index - rows * k
