"""Exact references for AdaptiveSoftmax: the dense top-k softmax and the paper's success event."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class ExactTopK(NamedTuple):
    """The exact answer an :class:`~.adaptive_softmax.AdaptiveResult` approximates.

    Attributes:
        indices: long ``[B, k]`` classes in decreasing logit order.
        probs: float64 ``[B, k]`` their softmax probabilities.
        log_partition: float64 ``[B]`` ``log sum_i exp(logit_i / temperature)``.
    """

    indices: Tensor
    probs: Tensor
    log_partition: Tensor


def exact_topk_softmax(
    weight: Tensor,
    x: Tensor,
    k: int,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    padding_idx: int | None = None,
    chunk_size: int = 64,
) -> ExactTopK:
    """Dense float64 ``softmax((A x + b) / temperature)`` top-``k``, in query and class chunks.

    Args:
        weight: ``[n, d]`` the matrix ``A``.
        x: ``[B, d]`` queries.
        k: how many classes.
        bias: optional ``[n]`` per-class offsets.
        temperature: the softmax temperature.
        padding_idx: a class that is never predicted.
        chunk_size: queries per dense matmul.

    Returns:
        :class:`ExactTopK` for every query.
    """
    rows = max(1, (1 << 22) // weight.shape[1])  # classes per float64 copy of a slice of A
    parts = []
    for chunk in x.double().split(chunk_size):
        logits = torch.cat([chunk @ w.double().T for w in weight.split(rows)], dim=1)
        if bias is not None:
            logits = logits + bias.double()
        if padding_idx is not None:
            logits[:, padding_idx] = -torch.inf
        scaled = logits / temperature
        log_z = torch.logsumexp(scaled, dim=1)
        values, indices = scaled.topk(k, dim=1)
        parts.append((indices, torch.exp(values - log_z.unsqueeze(1)), log_z))
    indices, probs, log_z = (torch.cat(p) for p in zip(*parts, strict=True))
    return ExactTopK(indices, probs, log_z)


def adaptive_success(
    indices: Tensor, probs: Tensor, exact: ExactTopK, eps: float
) -> tuple[Tensor, Tensor]:
    """The paper's success events (eqs. 2-4), extended to top-``k``.

    Args:
        indices: long ``[B, k]`` returned classes.
        probs: ``[B, k]`` their estimated probabilities.
        exact: the reference from :func:`exact_topk_softmax`.
        eps: the multiplicative accuracy.

    Returns:
        ``(identified, success)``, bool ``[B]``: ``identified`` when the returned set of classes is
        the exact top-``k`` set (``E_id``); ``success`` when moreover every returned probability is
        within ``(1 +- eps)`` of its exact value (``E_id`` and ``E_est``).
    """
    order = indices.argsort(dim=1)
    got = indices.gather(1, order)
    want, want_order = exact.indices.sort(dim=1)
    identified = (got == want).all(dim=1)
    ratio = probs.double().gather(1, order) / exact.probs.gather(1, want_order)
    accurate = ((ratio - 1.0).abs() <= eps).all(dim=1)
    return identified, identified & accurate
