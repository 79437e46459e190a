"""Class-id arithmetic shared by samplers and heads: ranks among the classes other than
``padding_idx``."""

from __future__ import annotations

from torch import Tensor


def skip_padding(ranks: Tensor, padding_idx: int | None) -> Tensor:
    """Maps ranks in ``[0, N - 1)`` onto the class ids ``[0, N)`` minus ``padding_idx``."""
    if padding_idx is None:
        return ranks
    return ranks + (ranks >= padding_idx).to(ranks.dtype)


def padding_to_rank(ids: Tensor, padding_idx: int | None) -> Tensor:
    """The inverse of :func:`skip_padding` for ids other than ``padding_idx``."""
    if padding_idx is None:
        return ids
    return ids - (ids > padding_idx).to(ids.dtype)
