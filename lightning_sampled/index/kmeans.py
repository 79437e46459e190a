"""k-means on a sample of the points, warm-started, with empty clusters re-seeded.

Lloyd's iterations run through faiss on the host (``backend="faiss"``) or in torch on the
points' own device (``backend="torch"``); ``"auto"`` picks torch for CUDA points, so that an index
refresh on a GPU never copies the table to the host, and faiss otherwise. Either trains on a
seeded uniform sample (without replacement) of at most
``max_points_per_centroid * k`` points (default 256 per centroid, faiss' own default cap, drawn
here so that faiss copies only the sample to the host), starts from ``init`` or from ``k``
distinct points of the sample drawn with the seed, and leaves a centroid that loses all its
points where it was (faiss splits a large cluster instead; the re-seeding below then applies to
both); every point is then assigned to its nearest
centroid in row chunks. The points may be a table or :class:`Points`, whose rows can be residuals
``x - c[a]`` formed chunk by chunk (residual quantisation's second codebook never copies the
table). At a million classes and ``k = 32`` that trains on 8,192
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

import numpy as np
import torch
from torch import Tensor

_MAX_RESEED_ROUNDS = 10
# Largest norm of a point or centroid: every squared distance, at most (2 * norm)^2, stays finite
# in fp32, where faiss computes them.
MAX_NORM = math.sqrt(torch.finfo(torch.float32).max) / 2
_ROW_CHUNK = 65536
BACKENDS = ("auto", "faiss", "torch")  # the implementations of kmeans' Lloyd iterations


class Points:
    """The rows k-means clusters: a table ``x`` ``[n, d]``, or its residuals
    ``x - shift[which]`` (the second codebook of residual quantisation), formed chunk by chunk so
    that no residual ``[n, d]`` copy of the table is ever allocated.

    Args:
        x: ``[n, d]`` table (any float dtype; rows come out fp32).
        shift: optional ``[k, d]`` vectors subtracted from the rows.
        which: long ``[n]``: the row of ``shift`` subtracted from each row of ``x``.
    """

    def __init__(self, x: Tensor, shift: Tensor | None = None, which: Tensor | None = None):
        if (shift is None) != (which is None):
            raise ValueError("Points needs both shift and which, or neither")
        self.x = x.detach()
        self.shift = None if shift is None else shift.detach().float()
        self.which = which

    @property
    def shape(self) -> torch.Size:
        return self.x.shape

    @property
    def device(self) -> torch.device:
        return self.x.device

    def take(self, ids: Tensor) -> Tensor:
        """fp32 rows ``[len(ids), d]`` of the long ``ids`` ``[m]``."""
        rows = self.x.index_select(0, ids).float()
        if self.shift is not None:
            rows -= self.shift.index_select(0, self.which.index_select(0, ids))
        return rows

    def chunks(self, chunk_size: int = _ROW_CHUNK) -> Iterator[tuple[int, Tensor]]:
        """``(start, rows)``: consecutive fp32 chunks ``[<= chunk_size, d]`` of the rows."""
        for start in range(0, self.x.shape[0], chunk_size):
            rows = self.x[start : start + chunk_size].float()
            if self.shift is not None:
                which = self.which[start : start + chunk_size]
                rows = rows - self.shift.index_select(0, which)
            yield start, rows


def as_points(x: Tensor | Points) -> Points:
    """``x`` as :class:`Points` (a table ``[n, d]`` is wrapped, not copied)."""
    return x if isinstance(x, Points) else Points(x)


def nearest_centroid(x: Tensor | Points, centroids: Tensor, chunk_size: int = 65536) -> Tensor:
    """Index of the nearest centroid (squared Euclidean distance) of every row, in row chunks.

    Args:
        x: ``[n, d]`` points (a table or :class:`Points`).
        centroids: ``[k, d]`` centroids.
        chunk_size: rows per chunk; memory is ``O(chunk_size * (k + d))``.

    Returns:
        long ``[n]`` centroid indices.
    """
    points = as_points(x)
    centroids = centroids.to(device=points.device, dtype=torch.float32)
    half_norms = 0.5 * (centroids * centroids).sum(dim=1)
    assignment = torch.empty(points.shape[0], dtype=torch.long, device=points.device)
    for start, rows in points.chunks(chunk_size):
        # argmin_k ||x - c_k||^2 = argmin_k (||c_k||^2 / 2 - x . c_k)
        scores = torch.addmm(half_norms, rows, centroids.T, alpha=-1.0)
        torch.argmin(scores, dim=1, out=assignment[start : start + rows.shape[0]])
    return assignment


def kmeans(
    x: Tensor | Points,
    k: int,
    *,
    init: Tensor | None = None,
    niter: int = 25,
    seed: int = 0,
    max_points_per_centroid: int | None = 256,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """Clusters the rows of ``x`` into ``k`` clusters, trained on a sample.

    Args:
        x: ``[n, d]`` points, a table or :class:`Points` (any device; k-means runs in fp32),
            ``n >= k``.
        k: the number of clusters.
        init: optional ``[k, d]`` starting centroids (the previous refresh's, for a warm start).
        niter: Lloyd iterations.
        seed: the seed of the random start and of the training sample.
        max_points_per_centroid: train on at most this many points per centroid, a uniform
            sample without replacement; ``None`` trains on every point.
        backend: who runs Lloyd's iterations: ``"faiss"`` (on the host, the sample copied
            there), ``"torch"`` (:func:`lloyd`, on ``x``'s device, no host copy) or ``"auto"``
            (default: torch for CUDA points, faiss otherwise). Both give a quantisation error
            within a few percent of each other; their centroids differ (other random starts).

    Returns:
        ``(centroids, assignment)``: fp32 ``[k, d]`` on ``x``'s device and long ``[n]``, the
        index of each point's nearest centroid.

    Raises:
        ValueError: if ``x`` is not 2-D or has fewer than ``k`` rows, holds NaN or infinite
            values, or if a point or a starting centroid has a norm beyond :data:`MAX_NORM`
            (faiss' fp32 distances would overflow), or ``backend`` is not one of
            :data:`BACKENDS`.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    points = as_points(x)
    if len(points.shape) != 2 or points.shape[0] < k:
        raise ValueError(
            f"kmeans needs at least k={k} points [n, d], got shape {tuple(points.shape)}"
        )
    check_norms("kmeans: x", points)
    if init is not None:
        check_norms("kmeans: init", init)
    sample = training_sample(points.shape[0], k, max_points_per_centroid, seed, points.device)
    if backend == "torch" or (backend == "auto" and points.device.type == "cuda"):
        centroids = lloyd(points.take(sample), k, init=init, niter=niter, seed=seed)
    else:
        centroids = _faiss_lloyd(points.take(sample), k, init=init, niter=niter, seed=seed)
    assignment = nearest_centroid(points, centroids)
    return reseed_empty(points, centroids, assignment)


def lloyd(
    train: Tensor, k: int, *, init: Tensor | None = None, niter: int = 25, seed: int = 0
) -> Tensor:
    """Lloyd's iterations in torch on ``train``'s device, without a host sync.

    Starts from ``init``, or from ``k`` distinct rows of ``train`` chosen with ``seed``; each
    iteration assigns every row to its nearest centroid and moves each centroid to the mean of
    its rows (a centroid without rows stays where it is).

    Args:
        train: fp32 ``[m, d]`` training points, ``m >= k``.
        k: the number of centroids.
        init: optional ``[k, d]`` starting centroids.
        niter: iterations.
        seed: seed of the starting rows (when ``init`` is ``None``).

    Returns:
        fp32 ``[k, d]`` centroids on ``train``'s device.
    """
    if init is None:
        generator = torch.Generator(device=train.device).manual_seed(seed)
        start = torch.randperm(train.shape[0], generator=generator, device=train.device)[:k]
        centroids = train.index_select(0, start)
    else:
        centroids = init.detach().to(device=train.device, dtype=torch.float32).clone()
    ones = train.new_ones(train.shape[0])
    for _ in range(niter):
        assignment = nearest_centroid(train, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, assignment, train)
        counts = train.new_zeros(k).index_add_(0, assignment, ones)[:, None]
        centroids = torch.where(counts > 0, sums / counts.clamp(min=1.0), centroids)
    return centroids


def _faiss_lloyd(
    train: Tensor, k: int, *, init: Tensor | None = None, niter: int = 25, seed: int = 0
) -> Tensor:
    """:func:`lloyd` through faiss on the host (its own random start and empty-cluster
    splits): fp32 ``[k, d]`` centroids on ``train``'s device."""
    import faiss  # imported where an index is built, not with the package

    km = faiss.Kmeans(
        train.shape[1],
        k,
        niter=niter,
        seed=seed,
        max_points_per_centroid=math.ceil(train.shape[0] / k) + 1,  # faiss keeps them all
        min_points_per_centroid=1,
        verbose=False,
    )
    start = None
    if init is not None:
        start = np.ascontiguousarray(init.detach().float().cpu().numpy())
    with faiss_threads(torch.get_num_threads()):
        km.train(train.cpu().numpy(), init_centroids=start)
    return torch.from_numpy(km.centroids.copy()).to(train.device)


def training_sample(
    n: int, k: int, max_points_per_centroid: int | None, seed: int, device: torch.device
) -> Tensor:
    """Sorted long ids ``[m]`` on ``device`` of the points k-means trains on: all ``n`` when
    ``max_points_per_centroid`` is ``None`` or ``n <= k * max_points_per_centroid``, else a
    uniform sample of ``k * max_points_per_centroid`` distinct points, drawn on ``device`` by a
    generator seeded with ``seed`` (so the same seed gives the same sample on one kind of device,
    and a CUDA table is never shuffled on the host)."""
    if max_points_per_centroid is None or n <= k * max_points_per_centroid:
        return torch.arange(n, device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    chosen = torch.randperm(n, generator=generator, device=device)
    return chosen[: k * max_points_per_centroid].sort().values


@contextmanager
def faiss_threads(num_threads: int) -> Iterator[None]:
    """Runs the block with faiss' OpenMP thread count set to ``num_threads``, then restores it."""
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(num_threads)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def check_norms(name: str, x: Tensor | Points) -> None:
    """Raises ``ValueError`` if ``x`` ``[n, d]`` (a table or :class:`Points`) holds a NaN or
    infinite value (naming the first such row) or a row whose norm exceeds :data:`MAX_NORM`
    (naming the largest norm and its row).

    One pass of ``aminmax`` does both for a sound table: NaN and infinities propagate to its
    result, and it bounds the norms by ``sqrt(d) max |x|``. Only a table that fails a check is
    searched for its offending row (norms in fp64).
    """
    points = as_points(x)
    low, high = math.inf, -math.inf
    for _, rows in points.chunks():
        chunk_low, chunk_high = (float(v) for v in torch.aminmax(rows))
        if not (math.isfinite(chunk_low) and math.isfinite(chunk_high)):
            row = _first_non_finite_row(points)
            kind = "NaN" if bool(points.take(torch.tensor([row])).isnan().any()) else "infinite"
            raise ValueError(f"{name} contains {kind} values (row {row} of {tuple(points.shape)})")
        low, high = min(low, chunk_low), max(high, chunk_high)
    if max(-low, high) * math.sqrt(points.shape[1]) <= MAX_NORM:
        return
    norms = torch.cat(
        [torch.linalg.vector_norm(rows.double(), dim=1) for _, rows in points.chunks()]
    )
    largest, row = torch.max(norms, dim=0)
    if float(largest) > MAX_NORM:
        raise ValueError(
            f"{name} has a row of norm {float(largest):.4g} (row {int(row)}), beyond "
            f"{MAX_NORM:.3g}: fp32 squared distances would overflow (faiss, which computes "
            f"them, aborts the process); scale the embeddings down"
        )


def _first_non_finite_row(points: Points) -> int:
    """The first row of ``points`` holding a NaN or an infinity (there must be one)."""
    for start, rows in points.chunks():
        bad = ~torch.isfinite(rows).all(dim=1)
        if bool(bad.any()):
            return start + int(bad.nonzero()[0])
    raise AssertionError("aminmax saw a non-finite value that no row holds")


def reseed_empty(
    x: Tensor | Points, centroids: Tensor, assignment: Tensor
) -> tuple[Tensor, Tensor]:
    """Moves every centroid without a point onto a point its centroid represents worst.

    The empty centroids take the points with the largest squared distance to their own centroid
    (distinct points, each at a positive distance), then every point is reassigned; this repeats
    (at most 10 rounds) until no centroid is empty, or until every point sits on its centroid
    (duplicated points: nothing is left to split, and the remaining centroids stay empty).

    Args:
        x: ``[n, d]`` points (a table or :class:`Points`).
        centroids: ``[k, d]`` fp32 centroids, changed in place.
        assignment: long ``[n]``: the nearest centroid of every point.

    Returns:
        ``(centroids, assignment)``, the latter the nearest centroid of every point.
    """
    points = as_points(x)
    k = centroids.shape[0]
    for _ in range(_MAX_RESEED_ROUNDS):
        empty = (torch.bincount(assignment, minlength=k) == 0).nonzero().squeeze(1)
        if empty.numel() == 0:
            break
        errors = _squared_errors(points, centroids, assignment)
        worst = errors.topk(min(empty.numel(), errors.numel()))
        chosen = worst.values > 0
        if not bool(chosen.any()):
            break
        centroids[empty[chosen]] = points.take(worst.indices[chosen])
        assignment = nearest_centroid(points, centroids)
    return centroids, assignment


def _squared_errors(points: Points, centroids: Tensor, assignment: Tensor) -> Tensor:
    """``||x_i - centroids[assignment_i]||^2`` ``[n]`` fp32, in row chunks."""
    errors = torch.empty(points.shape[0], device=points.device)
    for start, rows in points.chunks():
        end = start + rows.shape[0]
        diff = rows - centroids.index_select(0, assignment[start:end])
        errors[start:end] = (diff * diff).sum(dim=1)
    return errors
