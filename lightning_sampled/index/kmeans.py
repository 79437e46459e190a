"""k-means through faiss on a sample of the points, warm-started, with empty clusters re-seeded.

faiss' ``Kmeans`` trains on a random sample of at most ``max_points_per_centroid * k`` points
(faiss' own subsampling, default 256 per centroid as in faiss); every point is then assigned to
its nearest centroid in row chunks. At a million classes and ``k = 32`` that trains on 8,192
points instead of a million, which makes a refresh cost about one pass over the table rather than
``niter`` passes, for a quantisation error within a few percent of training on every point
(``max_points_per_centroid=None`` trains on all of them). A warm start (``init``) begins from the
previous centroids, so that an index rebuilt often moves smoothly. After training, any centroid left
without a point is moved onto a random point of a cluster that has two or more, and the points are
reassigned; this repeats until no cluster is empty (or only duplicated points remain), so that no
codeword, and no cell of a multi-index built on it, is left empty by accident.
"""

from __future__ import annotations

import math

import faiss
import numpy as np
import torch
from torch import Tensor

_MAX_RESEED_ROUNDS = 10


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
        seed: faiss' seed (also of its sample), and the seed of the re-seeding of empty
            clusters.
        max_points_per_centroid: train on at most this many points per centroid, a random
            sample drawn by faiss; ``None`` trains on every point.

    Returns:
        ``(centroids, assignment)``: fp32 ``[k, d]`` on ``x``'s device and long ``[n]``, the
        index of each point's nearest centroid.

    Raises:
        ValueError: if ``x`` is not 2-D or has fewer than ``k`` rows.
    """
    if x.dim() != 2 or x.shape[0] < k:
        raise ValueError(f"kmeans needs at least k={k} points [n, d], got shape {tuple(x.shape)}")
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
    km.train(points, init_centroids=start)
    centroids = torch.from_numpy(km.centroids.copy()).to(x.device)
    assignment = nearest_centroid(x, centroids)
    return _reseed_empty(x, centroids, assignment, seed)


def _reseed_empty(
    x: Tensor, centroids: Tensor, assignment: Tensor, seed: int
) -> tuple[Tensor, Tensor]:
    """Moves empty centroids onto random points of clusters with >= 2 points, then reassigns."""
    k = centroids.shape[0]
    generator = torch.Generator().manual_seed(seed)
    for _ in range(_MAX_RESEED_ROUNDS):
        counts = torch.bincount(assignment, minlength=k)
        empty = (counts == 0).nonzero().squeeze(1)
        donors = (counts[assignment] > 1).nonzero().squeeze(1)
        if empty.numel() == 0 or donors.numel() == 0:
            break
        picks = torch.randint(donors.numel(), (empty.numel(),), generator=generator)
        centroids[empty] = x[donors[picks.to(donors.device)]].float()
        assignment = nearest_centroid(x, centroids)
    return centroids, assignment
