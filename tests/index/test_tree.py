"""The CANE class tree: shape of balanced trees, construction by hierarchical k-means and by
frequency, ancestors, and the batched beam search against brute force and a per-query reference."""

import math

import pytest
import torch

from lightning_sampled.heads.cane import descendant_means
from lightning_sampled.index import (
    ClassTree,
    beam_search,
    fit_node_vectors,
    frequency_subsets,
    whole_level_start,
)
from lightning_sampled.index import tree as tree_module


def random_tree(num_classes: int, branching: int, seed: int = 0) -> ClassTree:
    order = torch.randperm(num_classes, generator=torch.Generator().manual_seed(seed))
    return ClassTree.balanced(order, branching)


def two_level_tree(num_classes: int, num_subsets: int, seed: int = 0) -> ClassTree:
    """``num_subsets`` nodes of ``ceil(N / num_subsets)`` leaves under the root: uneven
    branchings, and a last node that may be short."""
    order = torch.randperm(num_classes, generator=torch.Generator().manual_seed(seed))
    return ClassTree((num_subsets, -(-num_classes // num_subsets)), order)


def children(tree: ClassTree, level: int, node: int) -> list[int]:
    """The children of ``node`` at ``level`` (0 = root), from the node spans."""
    sizes = tree.level_sizes()
    branching = tree.branchings[level]
    return [
        node * branching + c for c in range(branching) if node * branching + c < sizes[level + 1]
    ]


def node_range(tree: ClassTree, level: int, node: int) -> range:
    span = math.prod(tree.branchings[level:])
    return range(node * span, min((node + 1) * span, tree.num_classes))


def walk_from_root(tree: ClassTree, class_id: int) -> list[int]:
    """The nodes at levels 1..L on the way from the root to the leaf of ``class_id``."""
    position = int(tree.leaf_position[class_id])
    path, node = [], 0
    for level in range(tree.depth):
        (node,) = [
            c for c in children(tree, level, node) if position in node_range(tree, level + 1, c)
        ]
        path.append(node)
    return path


def random_level_vectors(tree: ClassTree, dim: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(size, dim, generator=g) for size in tree.level_sizes()[1:]]


def path_scores(tree: ClassTree, z, level_vectors, leaf_bias, accumulate: bool) -> torch.Tensor:
    """Brute force: the score ``[T, N]`` of every class, walking its path from the root."""
    scores = torch.empty(z.shape[0], tree.num_classes)
    for class_id in range(tree.num_classes):
        nodes = walk_from_root(tree, class_id)
        leaf = z @ level_vectors[-1][class_id] + leaf_bias[class_id]
        internal = [z @ level_vectors[level][node] for level, node in enumerate(nodes[:-1])]
        scores[:, class_id] = leaf + (sum(internal) if accumulate and internal else 0)
    return scores


def reference_beam_search(tree, z, level_vectors, beam, k, accumulate, leaf_bias, start=0):
    """Algorithm 3 one query at a time, with Python lists (no ties in random data); with
    ``start = s > 0`` the first beam is the best ``beam`` of every node of level ``s``, scored
    by its walk from the root."""
    all_scores, all_ids = [], []
    for query in z:
        frontier = [(0.0, 0)]
        if start:
            span = math.prod(tree.branchings[start:])
            scored = []
            for node in range(tree.level_sizes()[start]):
                path = walk_from_root(tree, int(tree.leaf_order[node * span]))[:start]
                sums = [float(query @ level_vectors[level][n]) for level, n in enumerate(path)]
                scored.append((sum(sums) if accumulate else sums[-1], node))
            frontier = sorted(scored, reverse=True)[:beam]
        for level in range(start, tree.depth):
            scored = []
            for parent_score, node in frontier:
                for child in children(tree, level, node):
                    is_leaf = level + 1 == tree.depth
                    row = int(tree.leaf_order[child]) if is_leaf else child
                    score = float(query @ level_vectors[level][row])
                    score += float(leaf_bias[row]) if is_leaf else 0.0
                    scored.append((score + (parent_score if accumulate else 0.0), child))
            frontier = sorted(scored, reverse=True)[:beam]
        all_scores.append([score for score, _ in frontier[:k]])
        all_ids.append([int(tree.leaf_order[leaf]) for _, leaf in frontier[:k]])
    return torch.tensor(all_scores), torch.tensor(all_ids)


@pytest.fixture(params=["gathered", "dense"])
def scoring(request, monkeypatch):
    """Runs a beam-search test with every level's vectors gathered, then with every level scored
    whole by a matrix product (the two ways :func:`beam_search` scores a level)."""
    monkeypatch.setattr(
        tree_module, "_DENSE_LEVEL_RATIO", 0 if request.param == "gathered" else 10**9
    )
    return request.param


@pytest.mark.parametrize(
    ("num_classes", "branching", "depth"),
    [(1, 2, 1), (1, 10, 1), (2, 2, 1), (2, 10, 1), (3, 2, 2), (4, 2, 2), (5, 2, 3), (10, 10, 1),
     (11, 10, 2), (100, 10, 2), (101, 10, 3), (1000, 10, 3), (1001, 10, 4), (27, 3, 3), (28, 3, 4),
     (100, 7, 3)],
)  # fmt: skip
def test_balanced_depth_is_ceil_log_b_n(num_classes, branching, depth):
    tree = random_tree(num_classes, branching)
    assert tree.branchings == (branching,) * depth
    assert tree.depth == depth
    sizes = tree.level_sizes()
    assert sizes[0] == 1 and sizes[-1] == num_classes
    # every level but the leaves holds ceil(size of the level below / b) nodes
    for level in range(depth):
        assert sizes[level] == -(-sizes[level + 1] // branching)


@pytest.mark.parametrize("num_classes", [1, 2, 7, 100, 1001])
def test_from_vectors_holds_every_class_at_exactly_one_leaf(num_classes):
    x = torch.randn(num_classes, 5, generator=torch.Generator().manual_seed(num_classes))
    tree = ClassTree.from_vectors(x, 3, seed=1)
    assert torch.equal(torch.sort(tree.leaf_order).values, torch.arange(num_classes))
    assert torch.equal(tree.leaf_position[tree.leaf_order], torch.arange(num_classes))
    assert tree.branchings == ClassTree.balanced(tree.leaf_order, 3).branchings


@pytest.mark.parametrize(
    "tree",
    [random_tree(1, 4), random_tree(10, 2), random_tree(64, 4), random_tree(65, 4),
     random_tree(1234, 10), two_level_tree(103, 7)],
)  # fmt: skip
def test_node_spans_partition_the_leaves_at_every_level(tree):
    for level, size in enumerate(tree.level_sizes()):
        ranges = [node_range(tree, level, node) for node in range(size)]
        assert all(len(r) > 0 for r in ranges)
        assert [p for r in ranges for p in r] == list(range(tree.num_classes))
        if level < tree.depth:  # the children of a node partition its leaves
            for node, r in enumerate(ranges):
                below = [node_range(tree, level + 1, c) for c in children(tree, level, node)]
                assert [p for c in below for p in c] == list(r)


@pytest.mark.parametrize(
    "tree", [random_tree(1, 3), random_tree(2, 3), random_tree(50, 3), random_tree(81, 3),
             two_level_tree(23, 5)],
)  # fmt: skip
def test_ancestors_match_a_walk_from_the_root(tree):
    ids = torch.arange(tree.num_classes).flip(0).reshape(-1, 1)
    ancestors = tree.ancestors(ids)
    assert len(ancestors) == tree.depth - 1
    for class_id in range(tree.num_classes):
        walk = walk_from_root(tree, class_id)
        row = tree.num_classes - 1 - class_id
        assert [int(a[row, 0]) for a in ancestors] == walk[:-1]
        assert all(a.shape == ids.shape for a in ancestors)


@pytest.mark.parametrize("tree", [random_tree(53, 3), random_tree(64, 4), random_tree(1, 2),
                                  two_level_tree(29, 4),
                                  ClassTree.from_vectors(torch.randn(47, 5), 3, num_clusters=6),
                                  ClassTree.from_vectors(torch.randn(4, 5), 10,
                                                         num_clusters=4)])  # fmt: skip
@pytest.mark.parametrize("beam_over_n", [0, 5])
def test_beam_of_n_is_the_exact_topk_of_the_leaf_scores(tree, beam_over_n, scoring):
    n = tree.num_classes
    g = torch.Generator().manual_seed(3)
    z = torch.randn(9, 6, generator=g)
    vectors = random_level_vectors(tree, 6, seed=4)
    bias = torch.randn(n, generator=g)
    k = min(5, n)
    scores, ids = beam_search(
        tree, z, vectors, n + beam_over_n, k, accumulate=False, leaf_bias=bias
    )
    expected = torch.topk(z @ vectors[-1].T + bias, k)
    torch.testing.assert_close(scores, expected.values)
    assert torch.equal(ids, expected.indices)
    assert scores.dtype == torch.float32 and ids.dtype == torch.long


@pytest.mark.parametrize("tree", [random_tree(53, 3), two_level_tree(29, 4)])
def test_accumulated_scores_are_the_path_sums(tree, scoring):
    n = tree.num_classes
    g = torch.Generator().manual_seed(5)
    z = torch.randn(7, 4, generator=g)
    vectors = random_level_vectors(tree, 4, seed=6)
    bias = torch.randn(n, generator=g)
    scores, ids = beam_search(tree, z, vectors, n, n, accumulate=True, leaf_bias=bias)
    brute = path_scores(tree, z, vectors, bias, accumulate=True)
    expected = torch.topk(brute, n)
    torch.testing.assert_close(scores, expected.values)
    assert torch.equal(ids, expected.indices)
    torch.testing.assert_close(scores, brute.gather(1, ids))


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize(
    ("num_classes", "branching", "beam", "k", "start"),
    [(100, 3, 4, 3, 0), (77, 5, 2, 2, 0), (100, 3, 4, 3, 2), (77, 5, 2, 2, 1), (100, 3, 4, 3, 4)],
)
def test_small_beam_matches_a_per_query_reference(
    accumulate, num_classes, branching, beam, k, start, scoring
):
    tree = random_tree(num_classes, branching, seed=7)  # depths 5 (b = 3) and 3 (b = 5)
    g = torch.Generator().manual_seed(8)
    z = torch.randn(12, 5, generator=g)
    vectors = random_level_vectors(tree, 5, seed=9)
    bias = torch.randn(num_classes, generator=g)
    expected = reference_beam_search(tree, z, vectors, beam, k, accumulate, bias, start)
    for chunk_size in (None, 1, 5):
        scores, ids = beam_search(
            tree,
            z,
            vectors,
            beam,
            k,
            accumulate=accumulate,
            leaf_bias=bias,
            chunk_size=chunk_size,
            start_level=start,
        )
        torch.testing.assert_close(scores, expected[0])
        assert torch.equal(ids, expected[1])
    exact = torch.topk(path_scores(tree, z, vectors, bias, accumulate), k).indices
    assert not torch.equal(ids, exact)  # the beam is small enough to prune a true top class


@pytest.mark.parametrize("accumulate", [False, True])
def test_every_start_level_is_exact_at_a_beam_of_n(accumulate):
    tree = random_tree(53, 3)  # levels of 1, 2, 6, 18, 53 nodes
    g = torch.Generator().manual_seed(11)
    z = torch.randn(6, 4, generator=g)
    vectors = random_level_vectors(tree, 4, seed=12)
    bias = torch.randn(53, generator=g)
    expected = torch.topk(path_scores(tree, z, vectors, bias, accumulate), 7)
    for start in range(tree.depth):
        scores, ids = beam_search(
            tree, z, vectors, 53, 7, accumulate=accumulate, leaf_bias=bias, start_level=start
        )
        torch.testing.assert_close(scores, expected.values)
        assert torch.equal(ids, expected.indices)


@pytest.mark.parametrize(
    ("num_classes", "beam", "start"),
    [(3706, 20, 3), (100_000, 10, 3), (100_000, 20, 3), (100_000, 50, 4), (1_000_000, 10, 3),
     (1_000_000, 20, 4), (1_000_000, 50, 4), (10, 20, 0), (11, 1, 1), (101, 1, 2)],
)  # fmt: skip
def test_whole_level_start_is_the_deepest_level_no_dearer_than_the_gathers_below(
    num_classes, beam, start
):
    tree = ClassTree.balanced(torch.arange(num_classes), 10)
    assert whole_level_start(tree, beam) == start
    ratio = tree_module._DENSE_LEVEL_RATIO
    sizes = tree.level_sizes()
    for level in range(1, tree.depth):  # brute force: the levels that qualify end at `start`
        cheap = sizes[level] <= ratio * beam * sum(tree.branchings[level:])
        assert cheap == (level <= start)


def test_whole_level_start_is_the_root_when_the_first_level_is_too_wide():
    tree = ClassTree((1000, 10), torch.arange(10_000))  # 1,000 nodes > 32 x 1 x 10
    assert whole_level_start(tree, 1) == 0
    assert whole_level_start(tree, 4) == 1  # 1,000 <= 32 x 4 x 10


def test_starting_at_the_whole_level_finds_the_planted_clusters_the_root_misses():
    """1,000 planted clusters of 20 classes (Gaussian centres, as ``benchmarks/cane_topk.py``):
    the means of 10 to 100 clusters at levels 2 and 3 route queries away from their own
    cluster; starting at level 4 (2,000 nodes of 10 classes, scored whole) does not."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(1000, 16, generator=g)
    table = centres.repeat_interleave(20, dim=0) + 0.5 * torch.randn(20_000, 16, generator=g)
    z = centres[torch.randint(0, 1000, (256,), generator=g)] + torch.randn(256, 16, generator=g)
    tree = ClassTree.from_vectors(table, 10, num_clusters=1000)  # levels 1, 2, 20, 200, 2,000
    levels = [*descendant_means(tree, table, torch.ones(20_000)), table]
    exact = (z @ table.T).topk(10).indices

    def recall(start: int) -> float:
        ids = beam_search(tree, z, levels, 20, 10, accumulate=False, start_level=start)[1]
        return (ids[:, :, None] == exact[:, None, :]).any(2).float().mean().item()

    assert whole_level_start(tree, 20) == 4
    assert recall(4) >= 0.8 and recall(4) >= recall(0) + 0.08  # measured: 0.818 and 0.715


def planted_hierarchy(group_sizes: list[int], dim: int = 8, seed: int = 0):
    """Vectors in 8 groups, split in halves at three scales (8, 2, 0.5) plus noise (0.05): each
    halving is far clearer than the next, so 2-means recovers the groups level by level."""
    g = torch.Generator().manual_seed(seed)
    signs = torch.tensor(
        [[1 - 2 * ((group >> bit) & 1) for bit in (2, 1, 0)] for group in range(8)]
    )
    centres = torch.zeros(8, dim)
    centres[:, :3] = signs * torch.tensor([8.0, 2.0, 0.5])
    groups = torch.repeat_interleave(torch.arange(8), torch.tensor(group_sizes))
    x = centres[groups] + 0.05 * torch.randn(len(groups), dim, generator=g)
    shuffle = torch.randperm(len(groups), generator=g)
    return x[shuffle], groups[shuffle], centres


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_from_vectors_puts_planted_clusters_in_contiguous_leaf_ranges(seed):
    x, groups, _ = planted_hierarchy([5, 9, 3, 7, 12, 4, 8, 6], seed=seed)
    tree = ClassTree.from_vectors(x, 2, seed=seed)
    for group in range(8):
        positions = tree.leaf_position[groups == group]
        assert int(positions.max() - positions.min()) + 1 == positions.numel(), group
    # a random order leaves them scattered
    scattered = random_tree(len(groups), 2, seed=seed).leaf_position[groups == 0]
    assert int(scattered.max() - scattered.min()) + 1 > scattered.numel()


def planted_flat_clusters(seed: int, num_clusters: int = 40, dim: int = 16):
    """``(x [n, dim], groups [n])``: ``num_clusters`` tight clusters (noise 0.1) of 4-15 points
    around centres drawn from ``N(0, I)``: no hierarchy among them, so a ``b``-way split of the
    whole set cuts some of them."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(4, 16, (num_clusters,), generator=g)
    centres = torch.randn(num_clusters, dim, generator=g)
    groups = torch.repeat_interleave(torch.arange(num_clusters), sizes)
    return centres[groups] + 0.1 * torch.randn(len(groups), dim, generator=g), groups


def cut_clusters(tree: ClassTree, groups: torch.Tensor) -> list[int]:
    """Brute force: the groups whose classes do not take one contiguous run of leaf positions."""
    cut = []
    for group in range(int(groups.max()) + 1):
        positions = tree.leaf_position[groups == group]
        if int(positions.max() - positions.min()) + 1 != positions.numel():
            cut.append(group)
    return cut


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_num_clusters_keeps_planted_clusters_whole_where_top_down_splits_cut_them(seed):
    x, groups = planted_flat_clusters(seed)
    whole = ClassTree.from_vectors(x, 4, seed=seed, num_clusters=40)
    assert cut_clusters(whole, groups) == []
    assert torch.equal(torch.sort(whole.leaf_order).values, torch.arange(len(groups)))
    assert whole.branchings == ClassTree.balanced(whole.leaf_order, 4).branchings
    assert len(cut_clusters(ClassTree.from_vectors(x, 4, seed=seed), groups)) >= 5


def test_num_clusters_tree_orders_the_inside_of_a_cluster_by_hierarchical_kmeans():
    # one flat cluster: the build is Algorithm 4 from a root holding every class
    x, groups, _ = planted_hierarchy([5, 9, 3, 7, 12, 4, 8, 6], seed=0)
    tree = ClassTree.from_vectors(x, 2, seed=0, num_clusters=1)
    assert cut_clusters(tree, groups) == []


@pytest.mark.parametrize(
    ("num_classes", "branching", "num_clusters"),
    [(1, 10, 1), (3, 10, 3), (3, 10, 1), (9, 10, 4), (30, 3, 30), (30, 3, 1), (31, 2, 7)],
)
def test_num_clusters_edge_cases_give_a_balanced_tree_over_every_class(
    num_classes, branching, num_clusters
):
    # N below the branching (a root over the leaves), one class per cluster, one cluster
    x = torch.randn(num_classes, 3, generator=torch.Generator().manual_seed(num_classes))
    tree = ClassTree.from_vectors(x, branching, num_clusters=num_clusters)
    assert torch.equal(torch.sort(tree.leaf_order).values, torch.arange(num_classes))
    assert tree.branchings == ClassTree.balanced(tree.leaf_order, branching).branchings


def test_num_clusters_survives_empty_clusters_of_duplicated_points():
    # 3 distinct points repeated: k-means with 8 centroids leaves at least 5 of them empty
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0)).repeat(10, 1)
    tree = ClassTree.from_vectors(x, 3, num_clusters=8)
    assert torch.equal(torch.sort(tree.leaf_order).values, torch.arange(30))
    assert cut_clusters(tree, torch.arange(30) % 3) == []


def test_num_clusters_is_seeded():
    x, _ = planted_flat_clusters(0)
    first = ClassTree.from_vectors(x, 4, seed=3, num_clusters=20)
    assert torch.equal(
        first.leaf_order, ClassTree.from_vectors(x, 4, seed=3, num_clusters=20).leaf_order
    )
    assert not torch.equal(
        first.leaf_order, ClassTree.from_vectors(x, 4, seed=4, num_clusters=20).leaf_order
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kmeans_plus_plus_seeds_nearly_every_well_separated_cluster(seed):
    x, groups = planted_flat_clusters(seed)
    centres = torch.stack([x[groups == g].mean(0) for g in range(40)])
    seeds = tree_module.kmeans_plus_plus(x, 40, torch.Generator().manual_seed(seed))
    assert torch.cdist(seeds, centres).argmin(1).unique().numel() >= 39
    # 40 random points seed about 25 of them
    random = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[:40]]
    assert torch.cdist(random, centres).argmin(1).unique().numel() <= 30


def mean_vectors(tree: ClassTree, class_vectors: torch.Tensor) -> list[torch.Tensor]:
    """The flat parameterisation: every internal node holds the mean of its classes' vectors."""
    means = []
    for level, nodes in enumerate(tree.ancestors(torch.arange(tree.num_classes)), start=1):
        size = tree.level_sizes()[level]
        sums = torch.zeros(size, class_vectors.shape[1]).index_add_(0, nodes, class_vectors)
        means.append(sums / torch.bincount(nodes, minlength=size)[:, None])
    return [*means, class_vectors]


def test_small_beam_on_a_clustered_tree_finds_the_exact_topk():
    x, groups, centres = planted_hierarchy([8] * 8, seed=3)
    tree = ClassTree.from_vectors(x, 2, seed=3)
    g = torch.Generator().manual_seed(4)
    z = centres[torch.arange(40) % 8] + torch.cat(
        [torch.zeros(40, 3), torch.randn(40, x.shape[1] - 3, generator=g)], dim=1
    )
    scores, ids = beam_search(tree, z, mean_vectors(tree, x), 8, 5, accumulate=False)
    exact = torch.topk(z @ x.T, 5)
    assert torch.equal(ids, exact.indices)
    torch.testing.assert_close(scores, exact.values)
    # the same beam over a random tree misses some of them
    shuffled = random_tree(x.shape[0], 2, seed=3)
    _, lost = beam_search(shuffled, z, mean_vectors(shuffled, x), 8, 5, accumulate=False)
    assert not torch.equal(lost, exact.indices)


def test_identical_vectors_are_split_by_rank_at_every_level(monkeypatch):
    # k-means puts identical points in one sub-cluster; the split by rank must take over at once,
    # not after the cap on k-means levels: 50 -> 17 -> 6 -> 2 -> 1 points per cluster
    calls = []
    split = tree_module.split_clusters
    monkeypatch.setattr(
        tree_module, "split_clusters", lambda *a, **kw: calls.append(1) or split(*a, **kw)
    )
    tree = ClassTree.from_vectors(torch.ones(50, 3), 3, iterations=2)
    assert torch.equal(torch.sort(tree.leaf_order).values, torch.arange(50))
    assert len(calls) == 4


def test_from_vectors_is_seeded_and_terminates_on_duplicates_and_chains():
    x = torch.randn(300, 4, generator=torch.Generator().manual_seed(0))
    first = ClassTree.from_vectors(x, 4, seed=11)
    assert torch.equal(first.leaf_order, ClassTree.from_vectors(x, 4, seed=11).leaf_order)
    assert not torch.equal(first.leaf_order, ClassTree.from_vectors(x, 4, seed=12).leaf_order)
    # identical vectors: k-means never separates them; the split by rank does
    same = ClassTree.from_vectors(torch.zeros(50, 3), 3, iterations=2)
    assert torch.equal(torch.sort(same.leaf_order).values, torch.arange(50))
    # points at 1.5^i on a line: 2-means splits off the far end, level after level
    chain = (1.5 ** torch.arange(60.0))[:, None]
    tree = ClassTree.from_vectors(chain, 2)
    assert torch.equal(torch.sort(tree.leaf_order).values, torch.arange(60))
    for iterations in (0, 1):  # no Lloyd step: the random seeds split; one step: still a tree
        assert ClassTree.from_vectors(x, 4, iterations=iterations).num_classes == 300


def test_frequency_subsets_cut_the_count_order_into_equal_masses():
    counts = torch.tensor([3, 50, 7, 50, 1, 20, 0, 9, 2, 11])  # total 153: 51 per subset
    order, starts = frequency_subsets(counts, 3)
    assert order.tolist() == [1, 3, 5, 9, 7, 2, 0, 8, 4, 6]  # ties by class id
    # running counts 50, 100, 120, 131, ...: the first reaching 51 and 102 end subsets 0 and 1
    assert starts.tolist() == [0, 2, 3, 10]
    # brute force: each subset ends at the first class whose running count reaches s / S
    running = counts[order].cumsum(0)
    for s, end in enumerate(starts[1:-1].tolist(), start=1):
        assert end == 1 + min(i for i in range(10) if running[i] * 3 >= s * int(running[-1]))


def test_frequency_subsets_keep_a_minimum_size_and_leave_the_padding_out():
    counts = torch.tensor([1000.0, 0.0, 5.0, 900.0, 4.0, 3.0, 2.0, 1.0, 800.0])
    order, starts = frequency_subsets(counts, 3, min_size=2, last=1)
    assert order.tolist() == [0, 3, 8, 2, 4, 5, 6, 7, 1]  # padding class 1 last, in no subset
    assert starts.tolist() == [0, 2, 4, 8]  # 1000 alone would be a third: moved to 2 classes
    sizes = starts.diff()
    assert bool((sizes >= 2).all()) and int(starts[-1]) == 8
    tight = frequency_subsets(counts, 4, min_size=2, last=1)[1]  # 4 x 2 = 8: all equal
    assert tight.tolist() == [0, 2, 4, 6, 8]
    zeros = frequency_subsets(torch.zeros(7), 3, min_size=2)[1]  # no mass: minimum sizes first
    assert zeros.tolist() == [0, 2, 4, 7]
    one = frequency_subsets(torch.tensor([4.0, 9.0, 1.0]), 1)
    assert one[0].tolist() == [1, 0, 2] and one[1].tolist() == [0, 3]


def test_tensors_round_trip():
    tree = two_level_tree(17, 4)
    branchings, leaf_order = tree.to_tensors()
    again = ClassTree.from_tensors(branchings, leaf_order.clone())
    assert again.branchings == tree.branchings
    assert torch.equal(again.leaf_order, tree.leaf_order)
    assert torch.equal(again.leaf_position, tree.leaf_position)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: ClassTree.balanced(torch.arange(5), 1),
            "branching must be an integer >= 2, got 1",
        ),
        (lambda: ClassTree.balanced(torch.arange(5), 2.0), "branching must be an integer >= 2"),
        (lambda: ClassTree.from_vectors(torch.randn(5, 2), 0), "branching must be an integer >= 2"),
        (lambda: ClassTree.balanced(torch.tensor([0, 2, 2]), 2), "class 1 appears 0 times"),
        (lambda: ClassTree.balanced(torch.tensor([0, 1, 3]), 2), "holds values in \\[0, 3\\]"),
        (lambda: ClassTree.balanced(torch.tensor([0, -1, 1]), 2), "holds values in \\[-1, 1\\]"),
        (lambda: ClassTree.balanced(torch.tensor([0.0, 1.0]), 2), "leaf_order must be a non-empty"),
        (lambda: ClassTree.balanced(torch.zeros(0, dtype=torch.long), 2), "leaf_order must be"),
        (
            lambda: ClassTree((2, 2), torch.arange(5)),
            "product covers the N=5 classes, got \\(2, 2\\)",
        ),
        (lambda: ClassTree((3, 0), torch.arange(2)), "branchings must be factors >= 1"),
        (lambda: ClassTree((), torch.arange(1)), "branchings must be factors"),
        (lambda: ClassTree.from_vectors(torch.randn(5), 2), "vectors must be \\[N, D\\]"),
        (lambda: ClassTree.from_vectors(torch.tensor([[0.0], [math.nan]]), 2), r"NaN values \(row"),
        (lambda: ClassTree.from_vectors(torch.tensor([[0.0], [math.inf]]), 2), r"infinite values"),
        (lambda: ClassTree.from_vectors(torch.tensor([[0.0], [1e30]]), 2), "norm 1e\\+30"),
        (lambda: ClassTree.from_vectors(torch.randn(4, 2), 2, iterations=-1), "iterations must"),
        (
            lambda: ClassTree.from_vectors(torch.randn(4, 2), 2, num_clusters=0),
            "num_clusters must be in \\[1, N=4\\] or None, got 0",
        ),
        (
            lambda: ClassTree.from_vectors(torch.randn(4, 2), 2, num_clusters=5),
            "num_clusters must be in \\[1, N=4\\] or None, got 5",
        ),
        (
            lambda: ClassTree.from_vectors(
                torch.randn(4, 2), 2, num_clusters=2, cluster_iterations=-1
            ),
            "cluster_iterations must be >= 0, got -1",
        ),
        (lambda: frequency_subsets(torch.rand(5), 0), "0 subsets of at least 1 classes"),
        (lambda: frequency_subsets(torch.rand(5), 3, 2), "3 subsets of at least 2 .* in 5"),
        (lambda: frequency_subsets(torch.rand(4), 2, 2, last=0), "do not fit in 3 classes"),
        (lambda: frequency_subsets(torch.tensor([1.0, -1.0]), 1), "non-negative"),
        (lambda: frequency_subsets(torch.rand(2, 2), 1), "counts must be \\[N\\]"),
    ],
)
def test_bad_trees_are_refused(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_bad_beam_search_arguments_are_refused():
    tree = random_tree(20, 3)  # levels of 1, 3, 7, 20 nodes
    vectors = random_level_vectors(tree, 4, seed=0)
    z = torch.randn(2, 4)
    with pytest.raises(ValueError, match="beam must be >= k=5, got 4"):
        beam_search(tree, z, vectors, 4, 5, accumulate=False)
    with pytest.raises(ValueError, match="k must be in \\[1, N=20\\], got 21"):
        beam_search(tree, z, vectors, 30, 21, accumulate=False)
    with pytest.raises(ValueError, match="k must be in \\[1, N=20\\], got 0"):
        beam_search(tree, z, vectors, 3, 0, accumulate=False)
    with pytest.raises(ValueError, match="one tensor per level 1..3, got 2"):
        beam_search(tree, z, vectors[1:], 3, 2, accumulate=False)
    with pytest.raises(ValueError, match="level_vectors\\[1\\] must be \\[7, 4\\] \\(level 2\\)"):
        beam_search(tree, z, [vectors[0], vectors[1][:6], vectors[2]], 3, 2, accumulate=False)
    with pytest.raises(ValueError, match="z must be \\[T, D\\]"):
        beam_search(tree, z[0], vectors, 3, 2, accumulate=False)
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got 0"):
        beam_search(tree, z, vectors, 3, 2, accumulate=False, chunk_size=0)
    with pytest.raises(ValueError, match="leaf_bias must be \\[20\\]"):
        beam_search(tree, z, vectors, 3, 2, accumulate=False, leaf_bias=torch.zeros(19))
    for start in (-1, 3):
        with pytest.raises(ValueError, match=f"in \\[0, L - 1 = 2\\], got {start}$"):
            beam_search(tree, z, vectors, 3, 2, accumulate=False, start_level=start)


# -- node vectors fitted to sample queries --------------------------------------------------------


def best_leaf_scores(tree: ClassTree, level: int, z, table, bias) -> torch.Tensor:
    """Brute force: ``[Q, n_level]``, each node's best leaf score, from its span of leaves."""
    scores = z @ table.T + bias
    nodes = range(tree.level_sizes()[level])
    columns = [
        scores[:, [int(tree.leaf_order[p]) for p in node_range(tree, level, node)]].amax(1)
        for node in nodes
    ]
    return torch.stack(columns, dim=1)


def test_fitted_node_vectors_are_each_nodes_least_squares_predictor_of_its_best_leaf():
    tree = random_tree(53, 3)  # internal levels of 2, 6, 18 nodes; the last node is short
    g = torch.Generator().manual_seed(13)
    table = torch.randn(53, 4, generator=g)
    bias = torch.randn(53, generator=g)
    z = torch.randn(40, 4, generator=g)
    start = random_level_vectors(tree, 4, seed=14)[:-1]
    fitted = fit_node_vectors(tree, table, z, start, leaf_bias=bias, ridge=1e-9)
    for level, (vectors, shrunk_to) in enumerate(zip(fitted, start, strict=True), start=1):
        target = best_leaf_scores(tree, level, z, table, bias)
        want = shrunk_to + torch.linalg.lstsq(z, target - z @ shrunk_to.T).solution.T
        torch.testing.assert_close(vectors, want, rtol=1e-3, atol=1e-3)
    for chunk_size in (1, 7):  # the sums over query chunks add up alike
        chunked = fit_node_vectors(
            tree, table, z, start, leaf_bias=bias, ridge=1e-9, chunk_size=chunk_size
        )
        for a, b in zip(chunked, fitted, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_a_large_ridge_keeps_the_start_and_a_node_of_excluded_leaves_keeps_it_at_any_ridge():
    tree = random_tree(30, 3)  # levels of 1, 2, 4, 10, 30 nodes
    g = torch.Generator().manual_seed(15)
    table = torch.randn(30, 4, generator=g)
    z = torch.randn(25, 4, generator=g)
    start = random_level_vectors(tree, 4, seed=16)[:-1]
    for kept, vectors in zip(
        start, fit_node_vectors(tree, table, z, start, ridge=1e9), strict=True
    ):
        torch.testing.assert_close(vectors, kept, rtol=1e-4, atol=1e-4)
    bias = torch.zeros(30)
    bias[tree.leaf_order[27:30]] = -math.inf  # the whole of node 9 of level 3
    fitted = fit_node_vectors(tree, table, z, start, leaf_bias=bias, ridge=1e-3)
    assert torch.equal(fitted[-1][9], start[-1][9])
    assert not torch.equal(fitted[-1][8], start[-1][8])
    assert all(v.isfinite().all() for v in fitted)


def test_fitted_node_vectors_find_more_of_the_top_classes_of_held_out_queries():
    """Classes in 50 directions with norms spread as a trained table's (log-normal): the
    node means rank nodes by their average class, the fitted vectors by their best one."""
    g = torch.Generator().manual_seed(0)
    directions = torch.nn.functional.normalize(torch.randn(50, 16, generator=g), dim=1)
    table = directions.repeat_interleave(100, 0) + 0.5 * torch.randn(5000, 16, generator=g)
    table = table * torch.exp(0.5 * torch.randn(5000, 1, generator=g))
    z = torch.randn(1024, 16, generator=g)
    fit, held = z[:512], z[512:]
    tree = ClassTree.from_vectors(table, 10, num_clusters=50)
    means = descendant_means(tree, table, torch.ones(5000))
    exact = (held @ table.T).topk(10).indices

    def recall(internal) -> float:
        start = whole_level_start(tree, 10)
        found = beam_search(tree, held, [*internal, table], 10, 10, accumulate=False,
                            start_level=start)[1]  # fmt: skip
        return (found[:, :, None] == exact[:, None, :]).any(2).float().mean().item()

    fitted = fit_node_vectors(tree, table, fit, means)
    assert recall(fitted) >= recall(means) + 0.08  # measured: 0.613 against 0.505


def test_bad_fit_arguments_are_refused():
    tree = random_tree(20, 3)  # internal levels of 3 and 7 nodes
    table, z = torch.randn(20, 4), torch.randn(5, 4)
    start = random_level_vectors(tree, 4, seed=0)[:-1]
    with pytest.raises(ValueError, match="leaf_vectors must be \\[N=20, D\\]"):
        fit_node_vectors(tree, table[:19], z, start)
    with pytest.raises(ValueError, match="queries must be \\[Q >= 1, D=4\\], got \\(0, 4\\)"):
        fit_node_vectors(tree, table, z[:0], start)
    with pytest.raises(ValueError, match="queries must be \\[Q >= 1, D=4\\], got \\(5, 3\\)"):
        fit_node_vectors(tree, table, z[:, :3], start)
    with pytest.raises(ValueError, match="start must hold \\[n_l, 4\\] for the internal levels"):
        fit_node_vectors(tree, table, z, start[:1])
    with pytest.raises(ValueError, match="leaf_bias must be \\[20\\]"):
        fit_node_vectors(tree, table, z, start, leaf_bias=torch.zeros(3))
    with pytest.raises(ValueError, match="ridge must be > 0, got 0"):
        fit_node_vectors(tree, table, z, start, ridge=0)
