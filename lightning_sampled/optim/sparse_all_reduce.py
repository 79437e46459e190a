"""The mean over ranks of a row-sparse gradient, by dense collectives.

NCCL has no sparse all-reduce (``ProcessGroupNCCL::allreduce_sparse`` raises), so DDP over NCCL
cannot reduce the row-sparse gradient of a class table; gloo can. :func:`all_reduce_row_sparse`
does it with collectives every backend has: each rank coalesces its gradient to ``U_r`` distinct
rows, the ranks all-gather their counts, then their row ids (long ``[U_max]``) and rows
(``[U_max, D]``), padded to the largest count, and every rank sums the ``W`` sets into one
coalesced gradient and divides by ``W`` (as DDP averages). A step sends ``W U_max (D + 1)``
numbers per rank, whatever the table's ``N``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..sharding.collectives import all_gather_padded, gathered_sizes


def all_reduce_row_sparse(table: Tensor, group=None) -> Tensor | None:
    """The mean over the ranks of ``group`` of their gradients of ``table`` (``table.grad``),
    as a coalesced row-sparse COO tensor, or ``None`` where no rank touched a row.

    Every rank of ``group`` must call it, in the same order for the same tables.

    Args:
        table: an ``[N, D]`` parameter whose ``.grad`` is this rank's gradient: sparse COO with
            one sparse dimension (duplicate rows are summed), dense (its rows with a non-zero
            entry are sent), or ``None`` (this rank touched no row).
        group: the process group (default: the world).

    Returns:
        coalesced sparse COO ``[N, D]`` in the table's dtype and device: the sum of the ranks'
        gradients divided by the group's size; ``None`` where every rank's gradient is empty.

    Raises:
        ValueError: a sparse gradient with more than one sparse dimension.
    """
    ids, rows = local_rows(table)
    sizes = gathered_sizes(ids.numel(), ids.device, group)
    if max(sizes) == 0:
        return None
    ids = torch.cat(all_gather_padded(ids, sizes, group))
    rows = torch.cat(all_gather_padded(rows, sizes, group)).div_(len(sizes))
    return torch.sparse_coo_tensor(ids[None, :], rows, table.shape).coalesce()


def local_rows(table: Tensor) -> tuple[Tensor, Tensor]:
    """``(ids, rows)``: long ``[U]`` distinct row ids and their summed gradient ``[U, D]`` of
    this rank's ``table.grad`` (see :func:`all_reduce_row_sparse`), on the table's device."""
    grad = table.grad
    if grad is None:
        empty = torch.zeros(0, table.shape[1], dtype=table.dtype, device=table.device)
        return torch.zeros(0, dtype=torch.long, device=table.device), empty
    if grad.is_sparse:
        if grad.sparse_dim() != 1:
            raise ValueError(
                f"all_reduce_row_sparse takes row-sparse gradients (sparse_dim 1), got "
                f"sparse_dim {grad.sparse_dim()}"
            )
        grad = grad.coalesce()
        return grad.indices()[0], grad.values()
    ids = grad.ne(0).any(dim=1).nonzero()[:, 0]
    return ids, grad[ids]
