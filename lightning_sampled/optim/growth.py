"""Optimizer state for a parameter that gained rows (a class table whose catalog grew)."""

from __future__ import annotations

import torch
from torch import Tensor


def grow_state_rows(optimizer: torch.optim.Optimizer, param: Tensor, old_rows: int) -> None:
    """Extends ``optimizer``'s state of ``param`` (now ``[N + n, ...]``, before ``[N, ...]``
    with ``N = old_rows``) to its new rows: every state tensor of ``N`` rows (Adam's moments
    ``[N, D]``, the row-wise accumulator ``[N]``, Adagrad's sums) gains ``n`` rows of zeros, the
    state of a row never updated; the rest (step counts) stays. The old rows' state is kept
    exactly, so their updates continue as before. A parameter the optimizer does not hold, or
    holds no state for yet, is left as it is."""
    state = optimizer.state.get(param)
    if not state:
        return
    added = param.shape[0] - old_rows
    if added < 0:
        raise ValueError(f"param has {param.shape[0]} rows, fewer than old_rows={old_rows}")
    for key, value in state.items():
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == old_rows:
            zeros = value.new_zeros((added, *value.shape[1:]))
            state[key] = torch.cat([value, zeros])
