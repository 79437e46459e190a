"""k-means through faiss on a sample of the points, warm-started, with empty clusters re-seeded.

faiss' ``Kmeans`` trains on a random sample of at most ``max_points_per_centroid * k`` points
(faiss' own subsampling, default 256 per centroid as in faiss); every point is then assigned to
its nearest centroid in row chunks. At a million classes and ``k = 32`` that trains on 8,192
points instead of a million, which makes a refresh cost about one pass over the table rather than
``niter`` passes, for a quantisation error within a few percent of training on every point
(``max_points_per_centroid=None`` trains on all of them). A warm start (``init``) begins from the
previous centroids, so that an index rebuilt often moves smoothly. After training, any centroid left
without a point is moved onto the point that its own centroid represents worst (the largest squared
distance, as k-means implementations re-seed empty clusters), and the points are reassigned; this
repeats until no cluster is empty (or every point sits on its centroid: duplicated points), so that
no codeword, and no cell of a multi-index built on it, is left empty by accident.
:func:`reseed_empty` is also how learned codebooks (MIDX-Learn) get their dead codewords back.

faiss runs with as many OpenMP threads as ``torch.get_num_threads()`` (its own default is every
core, which under CPU contention made a 200k-class build 14x slower), restored afterwards. faiss
computes squared distances in fp32 and aborts the whole process on an overflow, so points (and
starting centroids) of norm beyond ``sqrt(fp32 max) / 2`` (about 9.2e18) are refused first with a
``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import faiss
import numpy as np
import torch
from torch import Tensor

_MAX_RESEED_ROUNDS = 10
# Largest norm of a point or centroid: every squared distance, at most (2 * norm)^2, stays finite
# in fp32, where faiss computes them.
MAX_NORM = math.sqrt(torch.finfo(torch.float32).max) / 2
_ROW_CHUNK = 65536


def nearest_centroid(x: Tensor, centroids: Tensor, chunk_size: int = 65536) -> Tensor:
    """Index of the nearest centroid (squared Euclidean distance) of every row, in row chunks.

    Args:
        x: ``[n, d]`` points.
        centroids: ``[k, d]`` centroids.
        chunk_size: rows per chunk; memory is ``O(chunk_size * k)``.

    Returns:
        long ``[n]`` centroid indices.
    """
    centroids = centroids.to(device=x.device, dtype=torch.float32)
    half_norms = 0.5 * (centroids * centroids).sum(dim=1)
    assignment = torch.empty(x.shape[0], dtype=torch.long, device=x.device)
    for start in range(0, x.shape[0], chunk_size):
        rows = x[start : start + chunk_size].float()
        # argmin_k ||x - c_k||^2 = argmin_k (||c_k||^2 / 2 - x . c_k)
        scores = torch.addmm(half_norms, rows, centroids.T, alpha=-1.0)
        torch.argmin(scores, dim=1, out=assignment[start : start + chunk_size])
    return assignment


def kmeans(
    x: Tensor,
    k: int,
    *,
    init: Tensor | None = None,
    niter: int = 25,
    seed: int = 0,
    max_points_per_centroid: int | None = 256,
) -> tuple[Tensor, Tensor]:
    """Clusters the rows of ``x`` into ``k`` clusters with faiss, trained on a sample.

    Args:
        x: ``[n, d]`` points (any device; faiss runs on CPU in fp32), ``n >= k``.
        k: the number of clusters.
        init: optional ``[k, d]`` starting centroids (the previous refresh's, for a warm start).
        niter: Lloyd iterations.
        seed: faiss' seed (also of its sample).
        max_points_per_centroid: train on at most this many points per centroid, a random
            sample drawn by faiss; ``None`` trains on every point.

    Returns:
        ``(centroids, assignment)``: fp32 ``[k, d]`` on ``x``'s device and long ``[n]``, the
        index of each point's nearest centroid.

    Raises:
        ValueError: if ``x`` is not 2-D or has fewer than ``k`` rows, or if a point or a starting
            centroid has a norm beyond :data:`MAX_NORM` (faiss' fp32 distances would overflow).
    """
    if x.dim() != 2 or x.shape[0] < k:
        raise ValueError(f"kmeans needs at least k={k} points [n, d], got shape {tuple(x.shape)}")
    check_norms("kmeans: x", x)
    if init is not None:
        check_norms("kmeans: init", init)
    n, d = x.shape
    points = np.ascontiguousarray(x.detach().float().cpu().numpy())
    km = faiss.Kmeans(
        d,
        k,
        niter=niter,
        seed=seed,
        max_points_per_centroid=(
            math.ceil(n / k) + 1 if max_points_per_centroid is None else max_points_per_centroid
        ),
        min_points_per_centroid=1,
        verbose=False,
    )
    start = None
    if init is not None:
        start = np.ascontiguousarray(init.detach().float().cpu().numpy())
    with faiss_threads(torch.get_num_threads()):
        km.train(points, init_centroids=start)
    centroids = torch.from_numpy(km.centroids.copy()).to(x.device)
    assignment = nearest_centroid(x, centroids)
    return reseed_empty(x, centroids, assignment)


@contextmanager
def faiss_threads(num_threads: int) -> Iterator[None]:
    """Runs the block with faiss' OpenMP thread count set to ``num_threads``, then restores it."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(num_threads)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def check_norms(name: str, x: Tensor) -> None:
    """Raises ``ValueError`` naming the largest row norm of ``x`` ``[n, d]`` if it exceeds
    :data:`MAX_NORM`.

    One pass of ``aminmax`` bounds the norms by ``sqrt(d) max |x|``; only a table that fails
    that bound has its row norms computed (fp64, in row chunks).
    """
    low, high = torch.aminmax(x.detach())
    if float(torch.maximum(-low, high)) * math.sqrt(x.shape[1]) <= MAX_NORM:
        return
    norms = torch.cat(
        [
            torch.linalg.vector_norm(x[start : start + _ROW_CHUNK].double(), dim=1)
            for start in range(0, x.shape[0], _ROW_CHUNK)
        ]
    )
    largest, row = torch.max(norms, dim=0)
    if float(largest) > MAX_NORM:
        raise ValueError(
            f"{name} has a row of norm {float(largest):.4g} (row {int(row)}), beyond "
            f"{MAX_NORM:.3g}: faiss' fp32 squared distances would overflow (faiss aborts the "
            f"process); scale the embeddings down"
        )


def reseed_empty(x: Tensor, centroids: Tensor, assignment: Tensor) -> tuple[Tensor, Tensor]:
    """Moves every centroid without a point onto a point its centroid represents worst.

    The empty centroids take the points with the largest squared distance to their own centroid
    (distinct points, each at a positive distance), then every point is reassigned; this repeats
    (at most 10 rounds) until no centroid is empty, or until every point sits on its centroid
    (duplicated points: nothing is left to split, and the remaining centroids stay empty).

    Args:
        x: ``[n, d]`` points.
        centroids: ``[k, d]`` fp32 centroids, changed in place.
        assignment: long ``[n]``: the nearest centroid of every point.

    Returns:
        ``(centroids, assignment)``, the latter the nearest centroid of every point.
    """
    k = centroids.shape[0]
    for _ in range(_MAX_RESEED_ROUNDS):
        empty = (torch.bincount(assignment, minlength=k) == 0).nonzero().squeeze(1)
        if empty.numel() == 0:
            break
        errors = _squared_errors(x, centroids, assignment)
        worst = errors.topk(min(empty.numel(), errors.numel()))
        chosen = worst.values > 0
        if not bool(chosen.any()):
            break
        centroids[empty[chosen]] = x[worst.indices[chosen]].float()
        assignment = nearest_centroid(x, centroids)
    return centroids, assignment


def _squared_errors(x: Tensor, centroids: Tensor, assignment: Tensor) -> Tensor:
    """``||x_i - centroids[assignment_i]||^2`` ``[n]`` fp32, in row chunks."""
    errors = torch.empty(x.shape[0], device=x.device)
    for start in range(0, x.shape[0], _ROW_CHUNK):
        end = start + _ROW_CHUNK
        diff = x[start:end].float() - centroids[assignment[start:end]]
        errors[start:end] = (diff * diff).sum(dim=1)
    return errors
