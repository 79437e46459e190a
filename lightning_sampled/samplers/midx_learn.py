"""MIDX-Learn (Section 6.2.3): the terms of :meth:`MIDXSampler.auxiliary_loss`.

The objective, its encoders and its cost are described there; this module picks the queries and
classes it is computed over and computes its two terms chunk by chunk.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .._class_ids import skip_padding
from ..index import Quantizer

ENCODERS = ("soft", "hard")  # how the objective encodes a class: soft codeword weights or codes


def pick_queries(z: Tensor, num_queries: int | None, generator: torch.Generator | None) -> Tensor:
    """``num_queries`` queries of ``z`` ``[..., D]`` drawn without replacement (all of them if
    ``None`` or more than there are), detached fp32 ``[Q, D]``."""
    queries = z.detach().reshape(-1, z.shape[-1]).float()
    if num_queries is not None and num_queries < queries.shape[0]:
        picked = torch.randperm(queries.shape[0], device=z.device, generator=generator)
        queries = queries[picked[:num_queries]]
    return queries


def pick_classes(
    num_drawable: int,
    num_classes: int | None,
    padding_idx: int | None,
    device: torch.device,
    generator: torch.Generator | None,
) -> Tensor:
    """Long ids ``[S]`` of ``num_classes`` classes other than ``padding_idx``, drawn uniformly
    with replacement from the ``num_drawable`` ones (all of them, once each, if ``None`` or at
    least ``num_drawable``)."""
    if num_classes is None or num_classes >= num_drawable:
        return skip_padding(torch.arange(num_drawable, device=device), padding_idx)
    ranks = torch.randint(num_drawable, (num_classes,), device=device, generator=generator)
    return skip_padding(ranks, padding_idx)


def codeword_objective(
    queries: Tensor,
    class_embeddings: Tensor,
    ids: Tensor,
    codewords: Tensor,
    quantizer: Quantizer,
    *,
    encoder: str,
    chunk_size: int,
) -> tuple[Tensor, Tensor]:
    """MIDX-Learn's two terms over the classes ``ids``, in chunks recomputed in backward.

    Args:
        queries: fp32 ``[Q, D]`` (detached).
        class_embeddings: ``[N, D]`` class table (detached).
        ids: long ``[S]`` the classes of the objective.
        codewords: ``[2, K, D']`` the learnable codewords, the only input with gradients.
        quantizer: encodes and decodes classes with ``codewords``.
        encoder: one of :data:`ENCODERS`.
        chunk_size: classes per chunk (memory ``O(Q x chunk_size)``).

    Returns:
        fp32 scalars ``(L_recon, L_KL)``: the mean over the classes of ``||q^_i - q_i||^2``, and
        ``log sum_i p_i^2 / p'_i`` with ``p = softmax(z . q)`` and ``p' = softmax(z . q^)`` over
        the classes, averaged over the queries.
    """
    partials = [
        checkpoint(
            _chunk_terms,
            queries,
            class_embeddings[ids[start : start + chunk_size]].float(),
            codewords,
            quantizer,
            encoder,
            use_reentrant=False,
        )
        for start in range(0, ids.numel(), chunk_size)
    ]
    sums = torch.stack([p[0] for p in partials]).sum(0)
    lse = torch.logsumexp(torch.stack([p[1] for p in partials]), dim=0)
    reconstruction = sums / ids.numel()
    # lse[:, 0] = lse(2 o - o^), lse[:, 1] = lse(o), lse[:, 2] = lse(o^)
    divergence = (lse[:, 0] - 2.0 * lse[:, 1] + lse[:, 2]).mean()
    return reconstruction, divergence


def _chunk_terms(
    queries: Tensor, rows: Tensor, codewords: Tensor, quantizer: Quantizer, encoder: str
) -> tuple[Tensor, Tensor]:
    """One class chunk ``rows`` ``[C, D]``: summed reconstruction error and per-query
    log-sum-exps ``[Q, 3]``."""
    if encoder == "soft":
        decoded = quantizer.soft_decode(rows, codewords)
    else:
        codes = quantizer.encode(rows, codewords.detach())
        decoded = quantizer.decode(codes, codewords)
    reconstruction = ((decoded - rows) ** 2).sum()
    o = queries @ rows.T
    o_hat = queries @ decoded.T
    lse = torch.stack(
        [
            torch.logsumexp(2.0 * o - o_hat, dim=1),
            torch.logsumexp(o, dim=1),
            torch.logsumexp(o_hat, dim=1),
        ],
        dim=1,
    )
    return reconstruction, lse
