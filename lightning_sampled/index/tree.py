"""The class tree of CANE (Sections 4.2 and 5, supplementary B and C) and its batched beam search.

A :class:`ClassTree` is implicit: a leaf order (which class sits at each leaf position) and the
branching factor of every level. Node ``i`` of level ``l`` covers the leaf positions
``[i * span[l], min((i + 1) * span[l], N))`` with ``span[l] = prod(branchings[l:])``, so a tree of
a million classes is two ``[N]`` tensors, and a node's children, descendants and ancestors are
arithmetic on positions. The trees are built two ways:

- :meth:`ClassTree.balanced`: a given leaf order under a balanced ``b``-ary tree of depth
  ``ceil(log_b N)``;
- :meth:`ClassTree.from_vectors`: Algorithm 4, hierarchical k-means over class vectors; the leaves
  of the (unbalanced) k-means tree read left to right give the leaf order of a balanced tree.
  With ``num_clusters`` it first clusters the classes flat (one k-means with many centroids;
  above :data:`TWO_LEVEL_MIN_CLUSTERS` of them, a k-means whose steps search the centroids
  through coarse groups), orders the clusters by Algorithm 4 over their centroids and keeps each
  cluster's classes contiguous, so that a cluster is never cut across distant subtrees.
and :func:`frequency_subsets` gives the one layer of subsets of Section 5's language-model tree
(frequency-ordered classes in consecutive subsets of about equal total count), whose sizes differ,
so it is not such a tree.

:func:`beam_search` is Algorithm 3 batched over the queries: at every level it scores the children
of the beam of each query and keeps the best ``beam`` of them. It can start below the root, from a
level scored whole (every node, one matrix product): the upper levels' nodes are means of many
classes, which rank a query's best classes poorly, and :func:`whole_level_start` picks the deepest
level whose whole scoring costs no more than the gathers below it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from .kmeans import check_norms, kmeans, nearest_centroid, training_sample

# Memory of the padded points of a batch of clusters split together by k-means.
_KMEANS_BATCH_BYTES = 64 * 2**20
# Memory of the gathered ``[queries, beam * b, D]`` fp32 vectors of a query chunk of the beam
# search: chunks that stay in cache ran 1.5-2x faster than 64 MiB ones at beam 100 (one thread).
_BEAM_CHUNK_BYTES = 8 * 2**20
# The beam search scores a level whole (one matrix product, then a gather of scores) rather than
# gathering its vectors when it has at most this many times as many nodes as the children it
# scores per query: on one CPU thread a gathered row costs about as much as 64 scored by a
# matrix product (measured at D = 64).
_DENSE_LEVEL_RATIO = 32
# fit_node_vectors scores its sample queries against every leaf in chunks of about this much.
_FIT_CHUNK_BYTES = 64 * 2**20
# The Lloyd steps of a split train on at most this many random points per centroid. faiss uses
# 256; 1024 raised the beam search's recall of the exact top-10 by 0.03 on clustered tables of
# 1e5 and 1e6 classes, for 20% more build time.
_TRAINING_POINTS_PER_CENTROID = 1024
# The flat k-means of ``from_vectors(num_clusters=C)`` trains on at most this many random points
# per centroid (its cost is ``O(N C D)`` per Lloyd step, so the sample is kept small).
_FLAT_POINTS_PER_CENTROID = 64
# Its k-means++ seeds are drawn from this many random points per centroid (at least
# _SEEDING_POINTS, at most all): the seeding is ``O(m C D log C)`` for ``m`` points, and a natural
# cluster needs only a few of its points in the sample.
_SEEDING_POINTS_PER_CENTROID = 8
_SEEDING_POINTS = 4096
# from_vectors(num_clusters=C, clustering="auto") clusters flat by two_level_kmeans when C exceeds
# this, by flat_kmeans otherwise: the flat seeding's O(C^2) cost overtakes two-level's between
# C = 1000 (6.5 s against 9.4 s at N = 1e5, one thread) and C = 2000 (35 s against 10 s).
TWO_LEVEL_MIN_CLUSTERS = 1024
# two_level_kmeans: each point searches the fine centroids listed in its _PROBES nearest coarse
# groups, each centroid listed in its _LISTINGS nearest; with sqrt(C) groups on 1e6 planted points
# (1e4 clusters, D = 64) a point's true nearest centroid was missed 13% of the time at 4 x 1,
# 0.9% at 4 x 4 and 0.1% at 4 x 8 (twice the work). Its seeding counts a candidate's gain over
# the points whose _SEEDING_PROBES nearest groups hold the candidate's nearest one.
_PROBES = 4
_LISTINGS = 4
_SEEDING_PROBES = 8
# probed_kmeans_plus_plus adds its seeds in about this many batches.
_SEEDING_ROUNDS = 16
# two_level_kmeans' Lloyd steps train on at most this many random points per centroid.
_PROBED_POINTS_PER_CENTROID = 16
CLUSTERINGS = ("auto", "flat", "two_level")  # the flat clusterings of from_vectors


class ClassTree:
    """An implicit balanced tree over ``N`` classes: a leaf order and per-level branching factors.

    Level 0 is the root (one node), level ``L = len(branchings)`` holds the ``N`` leaves (leaf
    positions ``0..N-1``). Node ``i`` at level ``l`` covers leaf positions
    ``[i * span[l], min((i + 1) * span[l], N))`` with ``span[l] = prod(branchings[l:])``; its
    children are the nodes ``i * branchings[l] + c``, ``c < branchings[l]``, that exist
    (``start < N``). ``level_sizes()[l] = ceil(N / span[l])``.

    Attributes:
        branchings: ``(b_1, ..., b_L)``, every ``b_l >= 1`` and ``prod(branchings) >= N``.
        leaf_order: long ``[N]``: leaf position -> class id (a permutation of ``0..N-1``).
        leaf_position: long ``[N]``: class id -> leaf position (the inverse permutation).
    """

    def __init__(self, branchings: tuple[int, ...] | list[int], leaf_order: Tensor) -> None:
        """Validates and stores the tree.

        Args:
            branchings: the branching factor of every level, root first.
            leaf_order: long ``[N]``, a permutation of ``0..N-1``.

        Raises:
            ValueError: if ``leaf_order`` is not a permutation of ``0..N-1`` (``N >= 1``), if
                ``branchings`` is empty, holds a factor below 1, or has a product below ``N``.
        """
        _check_permutation("leaf_order", leaf_order)
        branchings = tuple(int(b) for b in branchings)
        num_classes = leaf_order.numel()
        if not branchings or min(branchings) < 1 or math.prod(branchings) < num_classes:
            raise ValueError(
                f"branchings must be factors >= 1 whose product covers the N={num_classes} "
                f"classes, got {branchings}"
            )
        self.branchings = branchings
        self.leaf_order = leaf_order
        self.leaf_position = torch.empty_like(leaf_order)
        self.leaf_position[leaf_order] = torch.arange(num_classes, device=leaf_order.device)
        self._spans = [math.prod(branchings[level:]) for level in range(len(branchings) + 1)]

    @property
    def num_classes(self) -> int:
        """``N``, the number of leaves."""
        return self.leaf_order.numel()

    @property
    def depth(self) -> int:
        """``L``, the level of the leaves."""
        return len(self.branchings)

    def level_sizes(self) -> list[int]:
        """The number of nodes of every level, ``[1, n_1, ..., n_L = N]``."""
        return [-(-self.num_classes // span) for span in self._spans]

    def ancestors(self, class_ids: Tensor) -> list[Tensor]:
        """The ancestors of classes at the internal levels ``1..L-1``.

        Args:
            class_ids: long ``[*S]`` class ids.

        Returns:
            ``L - 1`` long tensors ``[*S]``: the node index of each class's ancestor at level
            ``1, ..., L-1`` (the root and the leaf itself are left out).
        """
        positions = self.leaf_position.to(class_ids.device)[class_ids]
        return [
            torch.div(positions, self._spans[level], rounding_mode="floor")
            for level in range(1, self.depth)
        ]

    def to_tensors(self) -> tuple[Tensor, Tensor]:
        """``(branchings long [L], leaf_order long [N])``: the whole tree, for persistent buffers;
        :meth:`from_tensors` rebuilds it."""
        return torch.tensor(self.branchings, dtype=torch.long), self.leaf_order

    @classmethod
    def from_tensors(cls, branchings: Tensor, leaf_order: Tensor) -> ClassTree:
        """The tree that :meth:`to_tensors` returned (validated again)."""
        return cls(tuple(branchings.tolist()), leaf_order)

    @classmethod
    def balanced(cls, leaf_order: Tensor, branching: int) -> ClassTree:
        """A balanced ``branching``-ary tree over the given leaf order.

        Its depth is ``ceil(log_b N)``, and 1 for ``N = 1`` (a root over one leaf), so that the
        leaves are always a level of their own (the one :func:`beam_search` scores by class id).

        Args:
            leaf_order: long ``[N]``: leaf position -> class id, a permutation.
            branching: ``b >= 2``.

        Raises:
            ValueError: if ``branching < 2`` or ``leaf_order`` is not a permutation.
        """
        _check_branching(branching)
        return cls((branching,) * _balanced_depth(leaf_order.numel(), branching), leaf_order)

    @classmethod
    def from_vectors(
        cls,
        vectors: Tensor,
        branching: int,
        *,
        seed: int = 0,
        iterations: int = 5,
        num_clusters: int | None = None,
        cluster_iterations: int = 10,
        clustering: str = "auto",
    ) -> ClassTree:
        """Algorithm 4 (CANE supplementary C): hierarchical k-means, then a balanced tree.

        Level by level, every cluster of more than one class is split into ``branching``
        sub-clusters by ``iterations`` Lloyd steps, all clusters of a level at once
        (:func:`hierarchical_kmeans_positions`); the leaves of that k-means tree, read left to
        right, are the leaf order of a balanced ``branching``-ary tree (:meth:`balanced`), which
        keeps similar classes under the same nodes while bounding the depth. Extra memory: about
        one fp32 copy of ``vectors`` (the points of the first split, padded batches of about
        64 MiB below it). On one CPU thread, ``N = 1e6, D = 64, b = 10`` takes about 15 s of CPU.

        With ``num_clusters = C`` the build departs from Algorithm 4 at its top: a ``b``-way
        split of many natural clusters (far more than ``b``) cuts most of them across distant
        subtrees, whatever the clustering, so the classes are first clustered flat into ``C``
        clusters (:func:`~lightning_sampled.index.kmeans.kmeans`, ``cluster_iterations`` Lloyd
        steps on at most 64 random points per centroid); Algorithm 4 then runs on the ``C``
        centroids to order the clusters, and goes on inside each cluster (steps 3-17 from that
        first partition instead of the root), so every flat cluster is one contiguous run of
        leaves (:func:`cluster_positions`). Step 18 (the balanced tree) is unchanged. Choose
        ``C`` near the number of natural clusters or above (too few centroids merge and cut
        them).

        The flat clustering (step 9 of Algorithm 4 run once with ``C`` clusters instead of
        ``b``) is chosen by ``clustering``:

        - ``"flat"``: one k-means of ``C`` centroids (:func:`flat_kmeans`), greedy k-means++
          seeds; its seeding costs ``O(C^2 D log C)`` and its assignment ``O(N C D)``;
        - ``"two_level"``: the same k-means with every distance search pruned by
          ``round(sqrt(C))`` coarse k-means groups (:func:`two_level_kmeans`): each point
          compares itself with the ``~16 sqrt(C)`` centroids listed in its 4 nearest groups,
          ``O(N D sqrt(C))`` per pass, and the seeds are chosen in 16 batches;
        - ``"auto"`` (default): ``"two_level"`` when ``C`` exceeds
          :data:`TWO_LEVEL_MIN_CLUSTERS` (1024), else ``"flat"``. On one thread of this
          2-core machine (planted clusters of 100 classes, ``N = 100 C, D = 64``) the flat
          clustering took 6.5 s at ``C = 1000`` and 35 s at ``C = 2000``, two-level 9.4 s and
          10 s, for the same purity (0.99 of a planted cluster's classes in its main flat
          cluster); at ``N = 1e6, C = 1e4`` the whole build took 47 to 66 s with two-level
          (purity 0.98; load average 2-3), where the flat clustering, 5x slower for each
          doubling of ``C``, would take about 20 minutes.

        Args:
            vectors: ``[N, D]`` class vectors (class centres, or the class embeddings).
            branching: ``b >= 2``, both of the k-means splits and of the balanced tree.
            seed: seed of the random choice of the initial centroids.
            iterations: Lloyd steps per split, ``>= 0``.
            num_clusters: ``C`` with ``1 <= C <= N``: the flat clusters kept whole; ``None``
                (default) builds by Algorithm 4 from the root.
            cluster_iterations: Lloyd steps of the flat k-means (of the coarse and of the
                fine k-means when two-level), ``>= 0``.
            clustering: ``"auto"``, ``"flat"`` or ``"two_level"``, the flat clustering of
                ``num_clusters`` (see above); unused without ``num_clusters``.

        Raises:
            ValueError: if ``branching < 2``, ``iterations < 0``, ``cluster_iterations < 0``,
                ``clustering`` is not one of :data:`CLUSTERINGS`,
                ``num_clusters`` is not in ``[1, N]``, ``vectors`` is not a non-empty
                ``[N, D]`` table of finite values, or a row's norm would overflow fp32
                distances.
        """
        _check_branching(branching)
        if iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {iterations}")
        if cluster_iterations < 0:
            raise ValueError(f"cluster_iterations must be >= 0, got {cluster_iterations}")
        if clustering not in CLUSTERINGS:
            raise ValueError(f"clustering must be one of {list(CLUSTERINGS)}, got {clustering!r}")
        if vectors.dim() != 2 or vectors.shape[0] < 1:
            raise ValueError(f"vectors must be [N, D] with N >= 1, got {tuple(vectors.shape)}")
        if num_clusters is not None and not 1 <= num_clusters <= vectors.shape[0]:
            raise ValueError(
                f"num_clusters must be in [1, N={vectors.shape[0]}] or None, got {num_clusters}"
            )
        check_norms("from_vectors: vectors", vectors)  # NaN, infinities, overflowing norms
        x = vectors.detach().float()
        if num_clusters is None:
            positions = hierarchical_kmeans_positions(
                x, branching, seed=seed, iterations=iterations
            )
        else:
            positions = cluster_positions(
                x,
                branching,
                num_clusters,
                seed=seed,
                iterations=iterations,
                cluster_iterations=cluster_iterations,
                clustering=clustering,
            )
        leaf_order = torch.empty_like(positions)
        leaf_order[positions] = torch.arange(positions.numel(), device=positions.device)
        return cls.balanced(leaf_order, branching)


def frequency_subsets(
    counts: Tensor, num_subsets: int, min_size: int = 1, last: int | None = None
) -> tuple[Tensor, Tensor]:
    """Section 5's subsets for language models: the classes by decreasing count (ties by class
    id), cut into ``num_subsets`` consecutive subsets of about equal total count ("split by
    averaging over the word frequencies"), so that the first subsets hold a few frequent classes
    and the last the long tail.

    Subset ``s`` ends at the first class whose running count reaches ``(s + 1) / S`` of the total,
    moved right to give it ``min_size`` classes and left to leave every later subset
    ``min_size``; with all counts zero the first ``S - 1`` subsets hold ``min_size`` classes.

    Args:
        counts: ``[N]`` non-negative class frequencies.
        num_subsets: ``S >= 1``.
        min_size: the fewest classes of a subset, ``>= 1``.
        last: a class put after every subset, in none (e.g. a padding class).

    Returns:
        ``(order, starts)``: long ``[N]`` the classes in that order (``last`` at the end), and
        long ``[S + 1]``: subset ``s`` is ``order[starts[s] : starts[s + 1]]``, and
        ``starts[S]`` is ``N`` (``N - 1`` with ``last``).

    Raises:
        ValueError: if ``counts`` is not a non-empty 1-D tensor of finite non-negative values,
            or the subsets cannot each hold ``min_size`` classes.
    """
    if counts.dim() != 1 or counts.numel() < 1:
        raise ValueError(f"counts must be [N] with N >= 1, got shape {tuple(counts.shape)}")
    if not bool(torch.isfinite(counts).all()) or bool((counts < 0).any()):
        raise ValueError("counts must be finite and non-negative")
    order = torch.sort(counts, descending=True, stable=True).indices
    if last is not None:
        order = torch.cat([order[order != last], order[order == last]])
    size = counts.numel() - (last is not None)
    if num_subsets < 1 or min_size < 1 or num_subsets * min_size > size:
        raise ValueError(
            f"{num_subsets} subsets of at least {min_size} classes do not fit in {size} classes"
        )
    running = counts[order[:size]].double().cumsum(0)
    targets = running[-1] * torch.arange(1, num_subsets, dtype=torch.float64) / num_subsets
    ends = (torch.searchsorted(running, targets.to(running.device)) + 1).tolist()
    starts = [0]
    for subset, end in enumerate(ends, start=1):
        end = max(end, starts[-1] + min_size)
        starts.append(min(end, size - (num_subsets - subset) * min_size))
    starts.append(size)
    return order, torch.tensor(starts, dtype=torch.long, device=counts.device)


def cluster_positions(
    x: Tensor,
    branching: int,
    num_clusters: int,
    *,
    seed: int,
    iterations: int,
    cluster_iterations: int,
    clustering: str = "auto",
) -> Tensor:
    """Leaf positions that keep every flat k-means cluster contiguous
    (:meth:`ClassTree.from_vectors` with ``num_clusters``).

    The points are clustered flat into ``num_clusters`` clusters (:func:`flat_kmeans` or
    :func:`two_level_kmeans`, as ``clustering`` chooses); the centroids of the clusters that
    hold points are ordered by :func:`hierarchical_kmeans_positions`; every point starts in its
    cluster, numbered in that order, and the clusters are split further by the same
    hierarchical k-means, so the points of one cluster take consecutive positions.

    Args:
        x: ``[N, D]`` fp32 points.
        branching: ``b >= 2``.
        num_clusters: ``1 <= C <= N``.
        seed: seed of the flat k-means, of the centroids' order and of the splits.
        iterations: Lloyd steps per hierarchical split.
        cluster_iterations: Lloyd steps of the flat k-means (of each of its k-means when
            two-level).
        clustering: ``"flat"``, ``"two_level"`` or ``"auto"`` (two-level when ``C`` exceeds
            :data:`TWO_LEVEL_MIN_CLUSTERS`); see :meth:`ClassTree.from_vectors`.

    Returns:
        long ``[N]``: the leaf position of each point.
    """
    if clustering not in CLUSTERINGS:
        raise ValueError(f"clustering must be one of {list(CLUSTERINGS)}, got {clustering!r}")
    generator = torch.Generator(device=x.device).manual_seed(seed)
    two_level = clustering == "two_level" or (
        clustering == "auto" and num_clusters > TWO_LEVEL_MIN_CLUSTERS
    )
    cluster = two_level_kmeans if two_level else flat_kmeans
    centroids, assignment = cluster(
        x, num_clusters, generator=generator, seed=seed, iterations=cluster_iterations
    )
    # a cluster left empty (duplicated points) is dropped: the others are renumbered 0..C'-1
    held, assignment = torch.unique(assignment, return_inverse=True)
    order = hierarchical_kmeans_positions(
        centroids[held], branching, seed=seed, iterations=iterations
    )
    return hierarchical_kmeans_positions(
        x, branching, seed=seed, iterations=iterations, clusters=order[assignment]
    )


def flat_kmeans(
    x: Tensor, num_clusters: int, *, generator: torch.Generator, seed: int, iterations: int
) -> tuple[Tensor, Tensor]:
    """One k-means of ``C`` centroids over all the points, from greedy k-means++ seeds.

    The seeds (:func:`kmeans_plus_plus`, which puts one seed in each of well-separated clusters
    where random seeds leave some clusters two and others none, to be cut or merged) are drawn
    from :data:`_SEEDING_POINTS_PER_CENTROID` ``* C`` random points (at least
    :data:`_SEEDING_POINTS`); ``iterations`` Lloyd steps
    (:func:`~lightning_sampled.index.kmeans.kmeans`) train on at most
    :data:`_FLAT_POINTS_PER_CENTROID` ``* C`` random points; then every point takes its nearest
    centroid. Cost: ``O(C^2 D log C)`` for the seeds, ``O(N C D)`` for the assignment (and
    ``O(C^2 D)`` per Lloyd step).

    Args:
        x: ``[N, D]`` fp32 points.
        num_clusters: ``1 <= C <= N``.
        generator: source of the seeding sample and of the seeds.
        seed: seed of the Lloyd steps' training sample.
        iterations: Lloyd steps.

    Returns:
        ``(centroids fp32 [C, D], assignment long [N])``: a cluster may be empty only when
        points are duplicated (:func:`~lightning_sampled.index.kmeans.reseed_empty`).
    """
    if num_clusters == 1:
        return x.mean(0, keepdim=True), torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    sample = torch.randperm(x.shape[0], generator=generator, device=x.device)
    sample = x[sample[: max(_SEEDING_POINTS_PER_CENTROID * num_clusters, _SEEDING_POINTS)]]
    return kmeans(
        x,
        num_clusters,
        init=kmeans_plus_plus(sample, num_clusters, generator),
        niter=iterations,
        seed=seed,
        max_points_per_centroid=_FLAT_POINTS_PER_CENTROID,
    )


def two_level_kmeans(
    x: Tensor,
    num_clusters: int,
    *,
    generator: torch.Generator,
    seed: int,
    iterations: int,
    groups: int | None = None,
    probes: int = _PROBES,
    listings: int = _LISTINGS,
    seeding_probes: int = _SEEDING_PROBES,
) -> tuple[Tensor, Tensor]:
    """One k-means of ``C`` centroids whose every step looks only at nearby centroids, found
    through ``G`` coarse groups: ``O(N D sqrt(C))`` work per pass instead of ``O(N D C)``.

    A :func:`flat_kmeans` of ``G = round(sqrt(C))`` coarse centroids comes first. Every point
    then probes its ``p = probes`` nearest coarse centroids, and every fine centroid is listed
    in the groups of its ``q = listings`` nearest coarse centroids; a point is compared with the
    fine centroids listed in its ``p`` groups only (:func:`probed_nearest`, an IVF search with
    ``nprobe = p`` over lists that hold each centroid ``q`` times), about ``p q C / G`` of them.
    The fine centroids are seeded by greedy k-means++ over a random sample of
    :data:`_SEEDING_POINTS_PER_CENTROID` ``* C`` points (:func:`probed_kmeans_plus_plus`,
    where a candidate seed's gain and the distances it lowers are counted over the points that
    probe its group, and the seeds are added in batches), moved by ``iterations`` Lloyd steps
    on :data:`_PROBED_POINTS_PER_CENTROID` ``* C`` random points, and every point takes its
    nearest fine centroid by the probed search. A point's true nearest centroid can be missed
    when none of its groups lists it (0.9% of the points on the planted table below).

    The groups only prune the search: they are not a partition that the fine clusters must
    respect. Splitting the points into the coarse groups first and clustering each group apart
    (faiss' ``contrib.clustering.two_level_clustering``) cut most natural clusters at the groups'
    borders: on the planted table of 1e6 points in 1e4 clusters (D = 64) with 100 groups, 97% of
    the clusters had points in two groups or more, and the fine clusters held 54% of a planted
    cluster's points on average; with this search they held 98% (one k-means of ``C``: 99% at
    ``N = 1e5``), and the beam search's recall on the resulting tree equalled that of a tree
    built on the true planted clusters.

    Args:
        x: ``[N, D]`` fp32 points.
        num_clusters: ``1 <= C <= N``.
        generator: source of the seeding sample and of the seeds.
        seed: seed of the training samples.
        iterations: Lloyd steps of the coarse and of the fine k-means.
        groups: ``G``, ``1 <= G <= C``; by default ``round(sqrt(C))``.
        probes: ``p >= 1``, the coarse groups each point searches (at most ``G``).
        listings: ``q >= 1``, the coarse groups that list each fine centroid (at most ``G``).
        seeding_probes: the coarse groups each point of the seeding sample probes.

    Returns:
        ``(centroids fp32 [C, D], assignment long [N])``: a cluster may be left empty (its
        points all nearer another centroid), as a cluster of duplicated points is in
        :func:`flat_kmeans`.
    """
    num_points = x.shape[0]
    if groups is None:
        groups = max(1, round(math.sqrt(num_clusters)))
    if not 1 <= groups <= num_clusters:
        raise ValueError(f"groups must be in [1, C={num_clusters}], got {groups}")
    if min(probes, listings, seeding_probes) < 1:
        raise ValueError(
            f"probes, listings and seeding_probes must be >= 1, got "
            f"{probes}, {listings}, {seeding_probes}"
        )
    probes = min(probes, groups)
    coarse, _ = flat_kmeans(x, groups, generator=generator, seed=seed, iterations=iterations)
    sample = torch.randperm(num_points, generator=generator, device=x.device)
    sample = x[sample[: max(_SEEDING_POINTS_PER_CENTROID * num_clusters, _SEEDING_POINTS)]]
    centroids = probed_kmeans_plus_plus(
        sample, num_clusters, coarse, min(seeding_probes, groups), generator
    )
    train = x[
        training_sample(num_points, num_clusters, _PROBED_POINTS_PER_CENTROID, seed, x.device)
    ]
    train_groups = nearest_groups(train, coarse, probes)
    ones = train.new_ones(train.shape[0])
    for _ in range(iterations):
        assignment = probed_nearest(train, train_groups, centroids, coarse, listings)
        sums = torch.zeros_like(centroids).index_add_(0, assignment, train)
        counts = train.new_zeros(num_clusters).index_add_(0, assignment, ones)[:, None]
        centroids = torch.where(counts > 0, sums / counts.clamp(min=1.0), centroids)
    assignment = probed_nearest(x, nearest_groups(x, coarse, probes), centroids, coarse, listings)
    return centroids, assignment


def nearest_groups(x: Tensor, coarse: Tensor, probes: int, chunk_size: int = 65536) -> Tensor:
    """Long ``[n, probes]``: the ``probes`` nearest rows of ``coarse`` ``[G, D]`` (squared
    Euclidean distance) of every row of ``x`` ``[n, D]``, nearest first, in row chunks."""
    half_norms = 0.5 * (coarse * coarse).sum(1)
    return torch.cat(
        [
            torch.addmm(half_norms, rows, coarse.T, alpha=-1.0).topk(probes, 1, largest=False)[1]
            for rows in x.split(chunk_size)
        ]
    )


def _inverted_lists(keys: Tensor, num_lists: int) -> tuple[Tensor, list[int], list[int]]:
    """``(ids, starts, counts)``: the positions in ``keys`` (long, any shape, flattened) sorted by
    key, and where each key's run starts and how long it is."""
    flat = keys.reshape(-1)
    ids = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_lists)
    return ids, (torch.cumsum(counts, 0) - counts).tolist(), counts.tolist()


def probed_nearest(
    x: Tensor, groups: Tensor, centroids: Tensor, coarse: Tensor, listings: int
) -> Tensor:
    """Long ``[n]``: the nearest centroid of every row of ``x`` ``[n, D]`` among the centroids
    listed in its probed groups (``groups`` long ``[n, p]``), a centroid of ``centroids``
    ``[C, D]`` being listed in the groups of its ``listings`` nearest rows of ``coarse``
    ``[G, D]``. A row none of whose groups lists a centroid is compared with all of them."""
    num_groups, probes = coarse.shape[0], groups.shape[1]
    listings = min(listings, num_groups)
    listed, listed_starts, listed_counts = _inverted_lists(
        nearest_groups(centroids, coarse, listings), num_groups
    )
    listed = torch.div(listed, listings, rounding_mode="floor")
    slots, starts, counts = _inverted_lists(groups, num_groups)
    points = torch.div(slots, probes, rounding_mode="floor")
    half_norms = 0.5 * (centroids * centroids).sum(1)
    best = torch.full((x.shape[0],), math.inf, device=x.device)
    nearest = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    for group in range(num_groups):
        if listed_counts[group] == 0 or counts[group] == 0:
            continue
        mine = listed[listed_starts[group] : listed_starts[group] + listed_counts[group]]
        ids = points[starts[group] : starts[group] + counts[group]]
        scores = torch.addmm(half_norms[mine], x[ids], centroids[mine].T, alpha=-1.0)
        values, which = scores.min(1)
        better = values < best[ids]
        best[ids] = torch.where(better, values, best[ids])
        nearest[ids] = torch.where(better, mine[which], nearest[ids])
    lost = torch.isinf(best).nonzero().squeeze(1)
    if lost.numel():
        nearest[lost] = nearest_centroid(x[lost], centroids)
    return nearest


def probed_kmeans_plus_plus(
    x: Tensor, k: int, coarse: Tensor, probes: int, generator: torch.Generator
) -> Tensor:
    """Greedy k-means++ seeds (:func:`kmeans_plus_plus`) chosen in batches, with the distances
    cut down by coarse groups: fp32 ``[k, D]`` seeds, rows of ``x`` ``[m, D]``.

    Each of about :data:`_SEEDING_ROUNDS` rounds draws ``(2 + ln k)`` candidates per seed it
    adds, with probability proportional to their squared distance to the nearest seed so far,
    and scores each by its gain (the drop of the total squared distance to the nearest seed
    that it alone would bring), then adds the best candidates, skipping one that a better
    candidate of the round lies within half its squared distance to the nearest seed (two
    draws from one natural cluster). Every point probes its ``probes`` nearest rows of
    ``coarse`` ``[G, D]``; a candidate's gain and the distances it lowers are counted over the
    points that probe the candidate's own nearest group only, about ``probes * m / G`` points,
    so the work is ``O(m k D probes log k / G)`` instead of ``O(m k D log k)``; the other points
    are taken as too far to be helped. Extra memory: ``probes`` copies of ``x``.
    """
    num_groups = coarse.shape[0]
    groups = nearest_groups(x, coarse, probes)
    slots, starts, counts = _inverted_lists(groups, num_groups)
    members = torch.div(slots, probes, rounding_mode="floor")
    lists = (members, x[members], starts, counts)
    trials = 2 + int(math.log(k))
    first = torch.randint(x.shape[0], (1,), generator=generator, device=x.device)
    nearest = ((x - x[first]) ** 2).sum(1)
    chosen = [first]
    added = 1
    batch = max(1, -(-k // _SEEDING_ROUNDS))
    while added < k:
        size = min(batch, k - added)
        weights = nearest if bool(nearest.sum() > 0) else torch.ones_like(nearest)
        candidates = torch.multinomial(
            weights, trials * size, replacement=True, generator=generator
        )
        gains, _ = _probed_gains(x, candidates, groups[candidates, 0], nearest, lists)
        ranked = candidates[torch.argsort(gains, descending=True, stable=True)]
        pool = ranked[: 4 * size]
        picked = pool[~_covered(x[pool], nearest[pool])][:size]
        _, lowered = _probed_gains(x, picked, groups[picked, 0], nearest, lists)
        nearest = lowered
        nearest[picked] = 0.0
        chosen.append(picked)
        added += picked.numel()
    return x[torch.cat(chosen)]


def _covered(rows: Tensor, nearest: Tensor, chunk_size: int = 2048) -> Tensor:
    """Bool ``[c]``: whether an earlier row of ``rows`` ``[c, D]`` lies within half of each
    row's squared distance ``nearest`` ``[c]`` to its nearest seed (in row chunks, so memory is
    ``O(chunk_size * c)``)."""
    covered = torch.zeros(rows.shape[0], dtype=torch.bool, device=rows.device)
    for start in range(1, rows.shape[0], chunk_size):
        end = min(start + chunk_size, rows.shape[0])
        close = torch.cdist(rows[start:end], rows[:end]) ** 2 < 0.5 * nearest[start:end, None]
        earlier = torch.arange(end, device=rows.device) < torch.arange(start, end)[:, None]
        covered[start:end] = (close & earlier).any(1)
    return covered


def _probed_gains(
    x: Tensor,
    candidates: Tensor,
    homes: Tensor,
    nearest: Tensor,
    lists: tuple[Tensor, Tensor, list[int], list[int]],
) -> tuple[Tensor, Tensor]:
    """``(gains [c], lowered [m])`` of candidate seeds ``candidates`` (long ``[c]`` rows of ``x``
    ``[m, D]``, of nearest group ``homes``): the drop of ``sum(nearest)`` each alone brings over
    the points that probe its group, and ``nearest`` lowered by all of them together. ``lists``
    holds the points that probe each group, group after group: their ids, their rows, and the
    start and length of every group's run."""
    members, grouped, starts, counts = lists
    gains = torch.zeros(candidates.numel(), device=x.device)
    lowered = nearest.clone()
    rows = x[candidates]
    half_norms = 0.5 * (rows * rows).sum(1)
    by_home, home_starts, home_counts = _inverted_lists(homes, len(starts))
    for group, (start, count) in enumerate(zip(home_starts, home_counts, strict=True)):
        if count == 0 or counts[group] == 0:
            continue
        mine = by_home[start : start + count]
        run = slice(starts[group], starts[group] + counts[group])
        ids, points = members[run], grouped[run]
        # ||p - c||^2 = ||p||^2 + 2 (||c||^2 / 2 - p . c)
        distances = torch.addmm(half_norms[mine], points, rows[mine].T, alpha=-1.0)
        distances.mul_(2).add_((points * points).sum(1, keepdim=True)).clamp_(min=0)
        before = nearest[ids]
        gains[mine] = (before[:, None] - distances).clamp_(min=0).sum(0)
        lowered[ids] = torch.minimum(lowered[ids], distances.amin(1))
    return gains, lowered


def kmeans_plus_plus(x: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """Greedy k-means++ seeds (Arthur and Vassilvitskii, 2007; the greedy variant scikit-learn
    uses): ``k`` rows of ``x``; each seed is the best, by the total squared distance of the points
    to their nearest seed, of ``2 + floor(ln k)`` candidates drawn with probability proportional
    to their squared distance to the nearest seed drawn before.

    Args:
        x: ``[m, D]`` fp32 points, ``m >= k``.
        k: the number of seeds.
        generator: source of the draws.

    Returns:
        fp32 ``[k, D]`` seeds; ``O(m k D log k)`` work.
    """
    trials = 2 + int(math.log(k))
    first = torch.randint(x.shape[0], (1,), generator=generator, device=x.device)
    seeds = [x[first]]
    nearest = torch.cdist(x, seeds[0]).squeeze(1) ** 2
    for _ in range(1, k):
        weights = nearest if bool(nearest.sum() > 0) else torch.ones_like(nearest)
        candidates = x[torch.multinomial(weights, trials, replacement=True, generator=generator)]
        after = torch.minimum(nearest[:, None], torch.cdist(x, candidates) ** 2)
        best = int(after.sum(0).argmin())
        seeds.append(candidates[best : best + 1])
        nearest = after[:, best]
    return torch.cat(seeds)


def hierarchical_kmeans_positions(
    x: Tensor,
    branching: int,
    *,
    seed: int,
    iterations: int,
    clusters: Tensor | None = None,
) -> Tensor:
    """The leaf position of every point in the hierarchical k-means tree (Algorithm 4, steps 3-17).

    Clusters are numbered in the lexicographic order of their paths from the root. At every level
    each cluster of more than one point is split into ``branching`` sub-clusters
    (:func:`split_clusters`); the new clusters are renumbered in path order, until every cluster is
    one point, whose number is then its leaf position. A split that leaves every point of a cluster
    together (duplicated points) is redone by rank, and after ``2 * ceil(log_b N) + 2`` levels of
    k-means (a pathologically unbalanced tree) the remaining clusters are split by rank too, so
    the number of levels stays ``O(log_b N)`` beyond that.

    Args:
        x: ``[N, D]`` fp32 points.
        branching: ``b >= 2``.
        seed: seed of the initial centroids and of the rank order.
        iterations: Lloyd steps per split.
        clusters: optional long ``[N]``, a first partition numbered ``0..C-1`` in the order it
            keeps (every number used), split further; by default every point starts at the
            root (cluster 0).

    Returns:
        long ``[N]``: the leaf position of each point; the points of a cluster of ``clusters``
        take consecutive positions, clusters in their numbers' order.
    """
    num_points = x.shape[0]
    generator = torch.Generator(device=x.device).manual_seed(seed)
    if clusters is None:
        clusters = torch.zeros(num_points, dtype=torch.long, device=x.device)
    cluster = clusters
    num_clusters = int(cluster.max()) + 1
    kmeans_levels = 2 * _balanced_depth(num_points, branching) + 2
    level = 0
    while num_clusters < num_points:
        sizes = torch.bincount(cluster, minlength=num_clusters)
        splits = sizes > 1
        members = splits[cluster].nonzero().squeeze(1)
        sub = split_clusters(
            x,
            members,
            (torch.cumsum(splits, 0) - 1)[cluster[members]],
            sizes[splits],
            branching,
            generator=generator,
            iterations=iterations if level < kmeans_levels else None,
        )
        path = cluster * branching
        path[members] += sub
        cluster = torch.unique(path, return_inverse=True)[1]
        num_clusters = int(cluster.max()) + 1
        level += 1
    return cluster


def split_clusters(
    x: Tensor,
    members: Tensor,
    local: Tensor,
    sizes: Tensor,
    branching: int,
    *,
    generator: torch.Generator,
    iterations: int | None,
) -> Tensor:
    """Splits every given cluster into at most ``branching`` sub-clusters, by batched Lloyd steps.

    A cluster of more than ``b`` points seeds ``b`` centroids from distinct random members and
    runs ``iterations`` Lloyd steps on a random sample of at most
    :data:`_TRAINING_POINTS_PER_CENTROID` ``* b`` of its points (as faiss samples), in which its
    points see only its own centroids (a sub-cluster that empties keeps its centroid); then all
    of its points take their nearest centroid. Clusters of similar sizes are padded into one
    batch and split together (:func:`_split_batch`), so a level costs a few batched matrix
    products rather than one k-means call per cluster. Clusters of at most ``b`` points, a
    cluster whose points all end in one sub-cluster (duplicated points), and every cluster when
    ``iterations`` is ``None``, are split by the random rank of their points instead
    (``rank * b // size``), so that every cluster is split.

    Args:
        x: ``[N, D]`` fp32 points.
        members: long ``[m]``: the points to split (those of clusters of two points or more).
        local: long ``[m]``: the cluster ``0..C-1`` of each of them.
        sizes: long ``[C]``: the size of each cluster.
        branching: ``b``.
        generator: source of the seeds and ranks.
        iterations: Lloyd steps, or ``None`` to split every cluster by rank.

    Returns:
        long ``[m]``: the sub-cluster ``0..b-1`` of each member.
    """
    first = torch.cumsum(sizes, 0) - sizes
    by_cluster, rank = _random_ranks(local, first, generator)
    by_rank = torch.div(rank * branching, sizes[local], rounding_mode="floor")
    if iterations is None:
        return by_rank
    sub = by_rank.clone()
    unsplit = sizes <= branching
    row_bytes = 4 * (x.shape[1] + 3 * branching)
    for clusters in _batches_of_similar_size(sizes, (~unsplit).nonzero().squeeze(1), row_bytes):
        ranks = torch.arange(int(sizes[clusters].max()), device=x.device)
        real = ranks < sizes[clusters, None]
        batch = by_cluster[torch.where(real, first[clusters, None] + ranks, first[clusters, None])]
        points = x.index_select(0, members[batch.reshape(-1)]).view(*batch.shape, -1)
        batch_sub, unsplit[clusters] = _split_batch(points, real, branching, iterations)
        sub[batch[real]] = batch_sub[real]
    return torch.where(unsplit[local], by_rank, sub)


def _split_batch(
    points: Tensor, real: Tensor, branching: int, iterations: int
) -> tuple[Tensor, Tensor]:
    """k-means with ``b`` centroids on each of a batch of clusters at once.

    Args:
        points: ``[c, P, D]`` fp32: the points of ``c`` clusters of more than ``b`` points each,
            in random order, padded to ``P``.
        real: bool ``[c, P]``: which of them are points (the first ``size`` of each row).
        branching: ``b``.
        iterations: Lloyd steps, on the first :data:`_TRAINING_POINTS_PER_CENTROID` ``* b``
            points of each cluster (a random sample), from the first ``b`` as centroids.

    Returns:
        ``(sub long [c, P], unsplit bool [c])``: the index of each point's nearest centroid, and
        whether all of a cluster's points have the same one.
    """
    train = points[:, : _TRAINING_POINTS_PER_CENTROID * branching]
    train_real = real[:, : train.shape[1]]
    centroids = train[:, :branching].clone()
    for _ in range(iterations):
        sub = _nearest_centroid(train, centroids)
        one_hot = torch.nn.functional.one_hot(sub, branching).to(train.dtype)
        one_hot *= train_real[..., None]
        counts = one_hot.sum(1)
        sums = torch.bmm(one_hot.transpose(1, 2), train)
        centroids = torch.where(
            counts[..., None] > 0, sums / counts.clamp(min=1)[..., None], centroids
        )
    sub = _nearest_centroid(points, centroids)
    counts = torch.zeros_like(sub[:, :branching]).scatter_add_(1, sub, real.long())
    return sub, counts.amax(1) == real.sum(1)


def _nearest_centroid(points: Tensor, centroids: Tensor) -> Tensor:
    """Index ``[c, P]`` of the nearest of its own cluster's ``centroids [c, b, D]`` of every point
    of ``points [c, P, D]``, by squared Euclidean distance."""
    # argmin_j ||x - c_j||^2 = argmin_j (||c_j||^2 / 2 - x . c_j)
    half_norms = 0.5 * (centroids * centroids).sum(2)
    distances = torch.baddbmm(half_norms[:, None, :], points, centroids.transpose(1, 2), alpha=-1)
    return distances.argmin(2)


def _batches_of_similar_size(sizes: Tensor, clusters: Tensor, row_bytes: int) -> Iterator[Tensor]:
    """Groups ``clusters`` (long ``[C']`` ids into ``sizes [C]``) by size for padded batches: ids
    of clusters whose sizes lie in one power-of-two range ``(2^(j-1), 2^j]`` (so padding at most
    doubles the work), as many as keep ``count * 2^j * row_bytes`` near
    :data:`_KMEANS_BATCH_BYTES` (at least one)."""
    order = clusters[torch.argsort(sizes[clusters])]
    bins = torch.ceil(torch.log2(sizes[order].double())).long()
    bin_ids, bin_counts = torch.unique_consecutive(bins, return_counts=True)
    start = 0
    for bin_id, count in zip(bin_ids.tolist(), bin_counts.tolist(), strict=True):
        per_batch = max(1, _KMEANS_BATCH_BYTES // (2**bin_id * row_bytes))
        for offset in range(0, count, per_batch):
            yield order[start + offset : start + min(offset + per_batch, count)]
        start += count


@torch.no_grad()
def beam_search(
    tree: ClassTree,
    z: Tensor,
    level_vectors: list[Tensor],
    beam: int,
    k: int,
    *,
    accumulate: bool,
    leaf_bias: Tensor | None = None,
    chunk_size: int | None = None,
    start_level: int = 0,
) -> tuple[Tensor, Tensor]:
    """Algorithm 3 (CANE supplementary B), batched over the queries: the top-k leaves by beam.

    From the root down, every level scores the children of the nodes in each query's beam and
    keeps the ``beam`` best. A node's score is ``z . v_node``, or with ``accumulate`` its parent's
    score plus ``z . v_node`` (the path sums of the Beam Tree model, Eq. 9); ``leaf_bias`` is
    added to the leaves. With ``start_level = s > 0`` the search starts lower: every node of level
    ``s`` is scored (path sums through all of its ancestors with ``accumulate``) and the best
    ``beam`` of them are the first beam, so levels ``1..s`` prune nothing (Algorithm 3 is
    ``s = 0``). With ``beam >= N`` nothing is pruned and the result is the exact top-k.
    Not differentiated (selection only); memory
    ``O(chunk_size * max(beam * b * max(D, 32), n_s))``.

    Args:
        tree: the :class:`ClassTree` (its tensors on ``z``'s device).
        z: ``[T, D]`` queries.
        level_vectors: ``L`` tensors, ``level_vectors[l - 1]`` ``[n_l, D]`` the vectors of the
            nodes of level ``l``: levels ``1..L-1`` by node index, the last (the leaves) by class
            id, so a head passes its ``[N, D]`` class table as it is.
        beam: ``J >= k``, the nodes kept per level.
        k: the number of classes returned, ``1 <= k <= N``.
        accumulate: whether scores are path sums.
        leaf_bias: optional ``[N]`` per-class bias, by class id.
        chunk_size: queries per chunk; by default as many as keep the gathered
            ``[chunk, beam * b, D]`` fp32 vectors (or the ``[chunk, n_l]`` scores of a level
            scored whole) near 8 MiB.
        start_level: ``s`` in ``[0, L - 1]``, the level scored whole where the search starts
            (:func:`whole_level_start` gives the cost-balanced one); 0, the root, by default.

    Returns:
        ``(scores fp32 [T, k], class_ids long [T, k])``, sorted by descending score.

    Raises:
        ValueError: if ``k``, ``beam`` or ``chunk_size`` is out of range, or a tensor's shape
            does not match.
    """
    _check_beam_search(tree, z, level_vectors, beam, k, leaf_bias)
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if not 0 <= start_level < tree.depth:
        raise ValueError(f"start_level must be in [0, L - 1 = {tree.depth - 1}], got {start_level}")
    if chunk_size is None:
        width = beam * max(tree.branchings)
        whole = tree.level_sizes()[start_level]  # the scores of the level the search starts at
        row_bytes = 4 * max(width * max(z.shape[1], _DENSE_LEVEL_RATIO), whole)
        chunk_size = max(1, _BEAM_CHUNK_BYTES // row_bytes)
    results = [
        _beam_search_chunk(
            tree,
            z[first : first + chunk_size],
            level_vectors,
            beam,
            accumulate,
            leaf_bias,
            start_level,
        )
        for first in range(0, z.shape[0], chunk_size)
    ]
    scores = torch.cat([scores[:, :k] for scores, _ in results])
    positions = torch.cat([positions[:, :k] for _, positions in results])
    return scores, tree.leaf_order[positions]


def _beam_search_chunk(
    tree: ClassTree,
    z: Tensor,
    level_vectors: list[Tensor],
    beam: int,
    accumulate: bool,
    leaf_bias: Tensor | None,
    start_level: int,
) -> tuple[Tensor, Tensor]:
    """The beam of leaves of queries ``z`` ``[t, D]``: ``(scores [t, w], leaf positions [t, w])``
    sorted by descending score, ``w = min(beam, ...)``; the first ``min(beam, N)`` are leaves."""
    queries = z.shape[0]
    z = z.float()
    scores = torch.zeros(queries, 1, device=z.device)
    if start_level:  # every node of the start level; path sums also need the levels above it
        for level in range(1 if accumulate else start_level, start_level + 1):
            vectors = level_vectors[level - 1]
            whole = z @ vectors.float().T
            if accumulate:
                parent = parent_index(vectors.shape[0], tree.branchings[level - 1], z.device)
                whole += scores[:, parent]
            scores = whole
    nodes = torch.zeros(queries, 1, dtype=torch.long, device=z.device)
    if start_level > 0:
        scores, nodes = scores.topk(min(beam, scores.shape[1]), dim=1)
    exists = torch.ones_like(nodes, dtype=torch.bool)
    sizes = tree.level_sizes()
    for level, (branching, vectors) in enumerate(
        zip(tree.branchings[start_level:], level_vectors[start_level:], strict=True),
        start=start_level + 1,
    ):
        offsets = torch.arange(branching, device=z.device)
        children = (nodes[:, :, None] * branching + offsets).reshape(queries, -1)
        exists = exists[:, :, None] & (children < sizes[level]).view(queries, -1, branching)
        exists = exists.reshape(queries, -1)
        children = children.masked_fill(~exists, 0)
        rows = tree.leaf_order[children] if level == tree.depth else children
        child_scores = _gathered_dot(vectors, rows, z)
        if level == tree.depth and leaf_bias is not None:
            child_scores += leaf_bias[rows].float()
        if accumulate:
            child_scores += scores.repeat_interleave(branching, dim=1)
        child_scores.masked_fill_(~exists, -math.inf)
        scores, best = child_scores.topk(min(beam, child_scores.shape[1]), dim=1)
        nodes = children.gather(1, best)
        exists = exists.gather(1, best)
    return scores, nodes


def parent_index(num_nodes: int, branching: int, device: torch.device) -> Tensor:
    """Long ``[num_nodes]``: the parent of each node of a level whose parents branch
    ``branching`` ways (node ``i``'s parent is ``i // branching``)."""
    return torch.arange(num_nodes, device=device) // branching


def whole_level_start(tree: ClassTree, beam: int) -> int:
    """The deepest internal level whose nodes cost no more to score whole than the beam search's
    gathers below it: the ``start_level`` of a serving search (:func:`beam_search`).

    Level ``s`` (``n_s`` nodes) qualifies when ``n_s <= R * beam * (b_{s+1} + ... + b_L)``, the
    rows gathered per query by the levels below it at the exchange rate ``R =``
    :data:`_DENSE_LEVEL_RATIO` (a gathered row costs about as much as ``R`` rows of a matrix
    product), so starting there at most doubles the search's work; 0 (the root) when no level
    does. The node means of the levels above it, of many classes each, rank a query's best
    classes poorly: on planted clusters (``benchmarks/cane_topk.py``) starting at the level of
    about one node per flat cluster raised recall@10 at beam 20 from 0.88 to 0.92 at ``N = 1e5``
    and from 0.64 to 0.83 at ``N = 1e6``, at 1.0x and 0.82x the root's queries/s. On trained tables,
    where the last level loses the recall, it gained less than 0.01.

    Args:
        tree: the class tree.
        beam: the beam width, ``>= 1``.
    """
    sizes = tree.level_sizes()
    start = 0
    for level in range(1, tree.depth):
        gathered = beam * sum(tree.branchings[level:])
        if sizes[level] <= _DENSE_LEVEL_RATIO * gathered:
            start = level
    return start


@torch.no_grad()
def fit_node_vectors(
    tree: ClassTree,
    leaf_vectors: Tensor,
    queries: Tensor,
    start: list[Tensor],
    *,
    leaf_bias: Tensor | None = None,
    ridge: float = 1e-3,
    chunk_size: int | None = None,
) -> list[Tensor]:
    """Node vectors fitted to sample queries so that a node's score predicts its best leaf's.

    A node's mean ranks it by its average class, while a top-k search needs it ranked by its
    best class, and on trained tables (classes of very different norms) the two part: the beam
    then drops the nodes holding a query's top classes. For every internal node ``n`` this
    finds ``v_n = s_n + d_n`` minimising, over the sample queries ``z``,
    ``sum_z (z . v_n - max_{c under n} (z . w_c + b_c))^2 + lam |d_n|^2``: one ridge
    regression per node, all sharing the Gram matrix ``Z^T Z``, with ``lam = ridge *
    trace(Z^T Z) / D`` (scale-free; a large ``ridge`` keeps ``s``). Fit on queries drawn like
    the ones to be served, and measure on others. A node with no finite leaf score (only a
    ``-inf`` bias, e.g. padding) keeps ``s_n``. Cost: ``Q`` queries against all ``N`` leaves
    once, in chunks of about 64 MiB of ``[chunk, N]`` scores.

    Args:
        tree: the class tree.
        leaf_vectors: ``[N, D]`` class vectors by class id (the leaves' scores are
            ``z . w_c + b_c``).
        queries: ``[Q, D]`` sample queries, ``Q >= 1``.
        start: ``L - 1`` tensors, ``start[l - 1]`` ``[n_l, D]``: the vectors shrunk toward
            (e.g. the descendant means).
        leaf_bias: optional ``[N]`` bias ``b_c`` by class id (``-inf`` leaves a class out).
        ridge: ``> 0``, the shrinkage toward ``start`` relative to the queries' scale.
        chunk_size: queries per chunk; by default as many as keep ``[chunk, N]`` near 64 MiB.

    Returns:
        ``L - 1`` fp32 tensors ``[n_l, D]``, in node order: the ``level_vectors[:-1]`` of
        :func:`beam_search` (``accumulate=False``).

    Raises:
        ValueError: if a shape does not match, ``Q = 0`` or ``ridge <= 0``.
    """
    sizes = tree.level_sizes()
    if leaf_vectors.dim() != 2 or leaf_vectors.shape[0] != tree.num_classes:
        raise ValueError(
            f"leaf_vectors must be [N={tree.num_classes}, D], got {tuple(leaf_vectors.shape)}"
        )
    dim = leaf_vectors.shape[1]
    if queries.dim() != 2 or queries.shape[1] != dim or queries.shape[0] < 1:
        raise ValueError(f"queries must be [Q >= 1, D={dim}], got {tuple(queries.shape)}")
    if [tuple(v.shape) for v in start] != [(size, dim) for size in sizes[1:-1]]:
        raise ValueError(
            f"start must hold [n_l, {dim}] for the internal levels {sizes[1:-1]}, got "
            f"{[tuple(v.shape) for v in start]}"
        )
    if leaf_bias is not None and tuple(leaf_bias.shape) != (tree.num_classes,):
        raise ValueError(f"leaf_bias must be [{tree.num_classes}], got {tuple(leaf_bias.shape)}")
    if not ridge > 0:
        raise ValueError(f"ridge must be > 0, got {ridge}")
    z = queries.float()
    leaves = leaf_vectors.float()[tree.leaf_order]  # by leaf position
    bias = None if leaf_bias is None else leaf_bias.float()[tree.leaf_order]
    starts = [v.float() for v in start]
    rhs = [z.new_zeros(dim, size) for size in sizes[1:-1]]
    finite = [torch.zeros(size, dtype=torch.bool, device=z.device) for size in sizes[1:-1]]
    if chunk_size is None:
        chunk_size = max(1, _FIT_CHUNK_BYTES // (4 * tree.num_classes))
    for part in z.split(chunk_size):
        best = part @ leaves.T if bias is None else part @ leaves.T + bias
        for level in range(tree.depth - 1, 0, -1):  # each level's maxima from its children's
            branching = tree.branchings[level]
            padded = F.pad(best, (0, sizes[level] * branching - best.shape[1]), value=-math.inf)
            best = padded.view(part.shape[0], sizes[level], branching).amax(dim=2)
            known = best[0].isfinite()  # the same nodes for every query
            residual = torch.where(known, best - part @ starts[level - 1].T, 0.0)
            rhs[level - 1] += part.T @ residual
            finite[level - 1] |= known
    gram = z.T @ z
    gram += ridge * gram.diagonal().mean() * torch.eye(dim, device=z.device)
    return [
        torch.where(known[:, None], s + torch.linalg.solve(gram, r).T, s)
        for s, r, known in zip(starts, rhs, finite, strict=True)
    ]


def _gathered_dot(vectors: Tensor, rows: Tensor, z: Tensor) -> Tensor:
    """``vectors[rows[t, j]] . z[t]`` fp32 ``[t, w]`` (``rows`` long ``[t, w]``, ``z [t, D]``).

    A level of at most :data:`_DENSE_LEVEL_RATIO` ``* w`` vectors is scored whole by one matrix
    product and the scores are gathered; a larger one has its rows gathered, ``[t, w, D]``.
    """
    if vectors.shape[0] <= _DENSE_LEVEL_RATIO * rows.shape[1]:
        return (z.float() @ vectors.float().T).gather(1, rows)
    gathered = vectors.index_select(0, rows.reshape(-1)).view(*rows.shape, -1).float()
    return torch.bmm(gathered, z.float()[:, :, None]).squeeze(2)


def _random_ranks(
    local: Tensor, first: Tensor, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """A random order of the points within each cluster.

    Args:
        local: long ``[m]``: the cluster ``0..C-1`` of every point.
        first: long ``[C]``: where each cluster starts when the points are grouped by cluster.
        generator: source of the order.

    Returns:
        ``(by_cluster, rank)``, long ``[m]`` each: ``by_cluster[first[c] + r]`` is the point of
        rank ``r`` in cluster ``c``, and ``rank`` the rank of every point.
    """
    noise = torch.randint(0, 2**31, local.shape, generator=generator, device=local.device)
    by_cluster = torch.sort(local * 2**31 + noise).indices
    rank = torch.empty_like(local)
    rank[by_cluster] = torch.arange(local.numel(), device=local.device) - first[local[by_cluster]]
    return by_cluster, rank


def _balanced_depth(num_classes: int, branching: int) -> int:
    """``max(1, ceil(log_b N))``, in integers."""
    depth, span = 1, branching
    while span < num_classes:
        depth, span = depth + 1, span * branching
    return depth


def _check_branching(branching: int) -> None:
    if not isinstance(branching, int) or branching < 2:
        raise ValueError(f"branching must be an integer >= 2, got {branching!r}")


def _check_permutation(name: str, order: Tensor) -> None:
    """Raises ``ValueError`` unless ``order`` is a long ``[N]`` permutation of ``0..N-1``."""
    if order.dim() != 1 or order.numel() < 1 or order.dtype != torch.long:
        raise ValueError(
            f"{name} must be a non-empty 1-D long tensor, got {order.dtype} {tuple(order.shape)}"
        )
    low, high = torch.aminmax(order)
    if int(low) < 0 or int(high) >= order.numel():
        raise ValueError(
            f"{name} must be a permutation of 0..{order.numel() - 1}, holds values in "
            f"[{int(low)}, {int(high)}]"
        )
    counts = torch.bincount(order, minlength=order.numel())
    if bool((counts != 1).any()):
        first = int((counts != 1).nonzero()[0])
        raise ValueError(
            f"{name} must be a permutation of 0..{order.numel() - 1}: class {first} appears "
            f"{int(counts[first])} times"
        )


def _check_beam_search(
    tree: ClassTree,
    z: Tensor,
    level_vectors: list[Tensor],
    beam: int,
    k: int,
    leaf_bias: Tensor | None,
) -> None:
    """Raises ``ValueError`` on arguments of :func:`beam_search` that do not fit together."""
    num_classes = tree.num_classes
    if not 1 <= k <= num_classes:
        raise ValueError(f"k must be in [1, N={num_classes}], got {k}")
    if beam < k:
        raise ValueError(f"beam must be >= k={k}, got {beam}")
    if z.dim() != 2:
        raise ValueError(f"z must be [T, D], got shape {tuple(z.shape)}")
    if len(level_vectors) != tree.depth:
        raise ValueError(
            f"level_vectors must hold one tensor per level 1..{tree.depth}, got "
            f"{len(level_vectors)}"
        )
    for level, (size, vectors) in enumerate(
        zip(tree.level_sizes()[1:], level_vectors, strict=True), start=1
    ):
        if tuple(vectors.shape) != (size, z.shape[1]):
            raise ValueError(
                f"level_vectors[{level - 1}] must be [{size}, {z.shape[1]}] (level {level}), got "
                f"{tuple(vectors.shape)}"
            )
    if leaf_bias is not None and tuple(leaf_bias.shape) != (num_classes,):
        raise ValueError(f"leaf_bias must be [{num_classes}], got {tuple(leaf_bias.shape)}")
