"""Export of a head's class table to a faiss index, for serving top-k outside PyTorch.

A head's logit of class ``c`` is ``q . r_c + b_c`` with ``q = head.score_queries(z)`` and ``r_c``
the scored class vector (the unit row under ``normalize``); maximum inner product over the
augmented vectors ``[r_c, b_c]`` and ``[q, 1]`` is then the head's exact ranking, so a flat
inner-product index (the default) returns the head's exact top-k, and an approximate one
(``IndexIVFFlat`` or ``IndexHNSWFlat`` with ``METRIC_INNER_PRODUCT``, passed empty as ``index``)
serves it approximately. The padding class is left out. A CANE head's rows are added in its
tree's leaf order (``tree_leaf_order``), so neighbouring classes lie next to each other in the
index's storage; the ids the index returns are class ids either way (``IndexIDMap2``).

This module reads the head through its public members only (``class_table()``, ``bias``,
``padding_idx``, ``normalize``, ``score_queries``, and ``tree_leaf_order`` where present), so
that ``inference`` does not import ``heads``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:  # faiss itself is imported by the functions that build or read an index
    import faiss

__all__ = ["class_table_index", "export_head", "faiss_queries", "faiss_topk"]


def class_table_index(
    table: Tensor,
    *,
    bias: Tensor | None = None,
    order: Tensor | None = None,
    exclude: int | None = None,
    index: faiss.Index | None = None,
) -> faiss.IndexIDMap2:
    """A faiss index over the rows ``[table[c], bias[c]]`` whose ids are the class ids ``c``.

    Args:
        table: ``[N, D]`` scored class vectors (any float dtype; faiss stores fp32).
        bias: optional ``[N]`` per-class bias (zeros when ``None``).
        order: optional long ``[N]`` permutation: the order the rows are added in (a tree's
            leaf order); class order when ``None``.
        exclude: optional class id left out of the index (the padding class).
        index: an empty inner-product faiss index of dimension ``D + 1`` (trained here on the
            rows when it needs training, e.g. ``IndexIVFFlat``); ``IndexFlatIP`` when ``None``.

    Returns:
        ``faiss.IndexIDMap2`` wrapping ``index``, holding ``N`` rows (``N - 1`` with ``exclude``).

    Raises:
        ValueError: if the shapes do not fit, ``order`` is not a permutation, ``exclude`` is out
            of range, or ``index`` is not empty, of dimension ``D + 1`` and inner product.
    """
    import faiss

    rows = augmented_rows(table, bias)
    ids = _row_ids(rows.shape[0], order, exclude)
    index = faiss.IndexFlatIP(rows.shape[1]) if index is None else index
    _check_index(index, rows.shape[1])
    vectors = np.ascontiguousarray(rows[ids].numpy())
    if not index.is_trained:
        index.train(vectors)
    mapped = faiss.IndexIDMap2(index)
    mapped.add_with_ids(vectors, ids.numpy().astype(np.int64))
    return mapped


def augmented_rows(table: Tensor, bias: Tensor | None) -> Tensor:
    """fp32 ``[N, D + 1]`` on the CPU: ``[table[c], bias[c]]`` (bias 0 when ``None``)."""
    if table.dim() != 2 or table.shape[0] < 1:
        raise ValueError(f"table must be [N, D] with N >= 1, got {tuple(table.shape)}")
    table = table.detach().float().cpu()
    if bias is None:
        bias = torch.zeros(table.shape[0])
    if tuple(bias.shape) != (table.shape[0],):
        raise ValueError(f"bias must be [{table.shape[0]}], got {tuple(bias.shape)}")
    return torch.cat([table, bias.detach().float().cpu()[:, None]], dim=1)


def faiss_queries(queries: Tensor) -> np.ndarray:
    """fp32 ``[T, D + 1]`` contiguous array ``[q, 1]`` of scored queries ``[T, D]``."""
    queries = queries.detach().float().cpu()
    return np.ascontiguousarray(torch.cat([queries, torch.ones(queries.shape[0], 1)], 1).numpy())


def faiss_topk(index: faiss.Index, queries: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-``k`` of scored queries ``[..., D]`` in an index of :func:`class_table_index`.

    Returns:
        ``(values fp32 [..., k], class_ids long [..., k])`` by decreasing inner product (the
        head's logits); ``-1`` ids (and ``-inf``-like values) where the index finds fewer than
        ``k`` classes (an approximate index with a small probe).
    """
    flat = queries.reshape(-1, queries.shape[-1])
    values, ids = index.search(faiss_queries(flat), k)
    shape = (*queries.shape[:-1], k)
    return torch.from_numpy(values).reshape(shape), torch.from_numpy(ids).long().reshape(shape)


def export_head(head: Any, index: faiss.Index | None = None) -> faiss.IndexIDMap2:
    """The faiss index of a head's class table (module docstring); query it with
    :func:`faiss_topk` on ``head.score_queries(z)``.

    Args:
        head: any :class:`~lightning_sampled.heads.OutputHead` (its ``class_table()``, ``bias``,
            ``padding_idx`` and ``normalize``); a head with a class tree (``tree_leaf_order``,
            :class:`~lightning_sampled.heads.CaneHead`) has its rows added in leaf order.
        index: as in :func:`class_table_index`.
    """
    with torch.no_grad():
        table = head.class_table()
        if head.normalize:
            table = F.normalize(table.float(), dim=-1)
        order = getattr(head, "tree_leaf_order", None)
        return class_table_index(
            table, bias=head.bias, order=order, exclude=head.padding_idx, index=index
        )


def _row_ids(num_classes: int, order: Tensor | None, exclude: int | None) -> Tensor:
    """Long ``[N']``: the class ids in the order their rows are added, ``exclude`` left out."""
    if order is None:
        order = torch.arange(num_classes)
    order = order.detach().cpu().long()
    if order.dim() != 1 or not torch.equal(order.sort().values, torch.arange(num_classes)):
        raise ValueError(f"order must be a permutation of 0..{num_classes - 1}")
    if exclude is None:
        return order
    if not 0 <= exclude < num_classes:
        raise ValueError(f"exclude must be in [0, {num_classes}), got {exclude}")
    return order[order != exclude]


def _check_index(index: faiss.Index, dim: int) -> None:
    import faiss

    if index.d != dim or index.ntotal != 0 or index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise ValueError(
            f"index must be an empty inner-product index of dimension D + 1 = {dim}, got "
            f"d={index.d}, ntotal={index.ntotal}, metric_type={index.metric_type}"
        )
