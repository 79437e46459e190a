"""The two-level flat clustering of ``ClassTree.from_vectors(num_clusters=C)``: planted clusters
kept whole, exactly ``C`` clusters, every class in one leaf, degenerate clusters, the ``"auto"``
rule, and beams exact at ``beam >= N`` on the trees it builds."""

import pytest
import torch

from lightning_sampled.index import ClassTree, beam_search
from lightning_sampled.index import tree as tree_module


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Many small matrix products: a second thread only spins on the shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def planted(num_clusters: int, size: int, dim: int = 32, noise: float = 0.25, seed: int = 0):
    """``(points [K * size, dim], owner [K * size])``: ``size`` points around each of ``K``
    random centres ``N(0, I)``, noise ``N(0, noise^2 I)``, in random order."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_clusters, dim, generator=g)
    owner = torch.arange(num_clusters).repeat_interleave(size)
    owner = owner[torch.randperm(owner.numel(), generator=g)]
    return centres[owner] + noise * torch.randn(owner.numel(), dim, generator=g), owner


def whole_fraction(owner: torch.Tensor, labels: torch.Tensor) -> float:
    """The fraction of planted clusters whose points all carry one label."""
    pairs = torch.unique(owner * (int(labels.max()) + 1) + labels)
    labels_per_cluster = torch.bincount(pairs // (int(labels.max()) + 1))
    return float((labels_per_cluster == 1).float().mean())


def two_level(x: torch.Tensor, num_clusters: int, **kwargs):
    generator = torch.Generator().manual_seed(0)
    return tree_module.two_level_kmeans(
        x, num_clusters, generator=generator, seed=0, iterations=10, **kwargs
    )


def test_two_level_keeps_planted_clusters_whole_in_exactly_c_clusters():
    x, owner = planted(200, 20)
    centroids, assignment = two_level(x, 200)
    assert centroids.shape == (200, 32)
    assert assignment.shape == owner.shape and assignment.dtype == torch.long
    assert torch.unique(assignment).numel() == 200  # every cluster holds points
    assert whole_fraction(owner, assignment) >= 0.95
    # each point's cluster is (nearly always) its nearest centroid: the probed search misses few
    exact = tree_module.nearest_centroid(x, centroids)
    assert float((exact == assignment).float().mean()) >= 0.99


def test_tree_keeps_each_planted_cluster_in_one_run_of_leaves():
    x, owner = planted(200, 20, seed=1)
    tree = ClassTree.from_vectors(x, 4, num_clusters=200, clustering="two_level")
    assert torch.equal(torch.sort(tree.leaf_order).values, torch.arange(x.shape[0]))
    assert torch.equal(tree.leaf_order[tree.leaf_position], torch.arange(x.shape[0]))
    positions = tree.leaf_position
    low = torch.full((200,), x.shape[0]).scatter_reduce(0, owner, positions, "amin")
    high = torch.zeros(200, dtype=torch.long).scatter_reduce(0, owner, positions, "amax")
    contiguous = (high - low + 1) == torch.bincount(owner, minlength=200)
    assert float(contiguous.float().mean()) >= 0.95


def test_auto_picks_two_level_above_the_threshold(monkeypatch):
    calls = []
    for name in ("flat_kmeans", "two_level_kmeans"):
        original = getattr(tree_module, name)
        monkeypatch.setattr(
            tree_module, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k)
        )
    x, _ = planted(20, 10, dim=8)
    monkeypatch.setattr(tree_module, "TWO_LEVEL_MIN_CLUSTERS", 20)
    ClassTree.from_vectors(x, 3, num_clusters=20)
    assert calls == ["flat_kmeans"]
    calls.clear()
    ClassTree.from_vectors(x, 3, num_clusters=21)
    assert calls[0] == "two_level_kmeans"
    calls.clear()
    ClassTree.from_vectors(x, 3, num_clusters=21, clustering="flat")
    assert calls == ["flat_kmeans"]
    with pytest.raises(ValueError, match="clustering"):
        ClassTree.from_vectors(x, 3, num_clusters=5, clustering="three_level")


def test_one_point_per_cluster_and_a_single_cluster():
    x, _ = planted(15, 4, dim=6, seed=2)
    _, assignment = two_level(x, x.shape[0])  # C = N: every cluster a single point
    assert torch.equal(torch.sort(assignment).values, torch.arange(x.shape[0]))
    centroids, assignment = two_level(x, 1)  # C = 1: one cluster of everything
    assert centroids.shape == (1, 6) and bool((assignment == 0).all())
    for num_clusters in (1, x.shape[0]):
        tree = ClassTree.from_vectors(x, 3, num_clusters=num_clusters, clustering="two_level")
        assert torch.equal(torch.sort(tree.leaf_order).values, torch.arange(x.shape[0]))


def test_duplicated_points_leave_clusters_empty_and_the_tree_valid():
    distinct = torch.randn(3, 5, generator=torch.Generator().manual_seed(3))
    x = distinct[torch.arange(60) % 3]
    _, assignment = two_level(x, 10)
    assert torch.unique(assignment).numel() <= 3  # copies of a point share one cluster
    for copy in range(3):
        assert torch.unique(assignment[copy::3]).numel() == 1
    tree = ClassTree.from_vectors(x, 3, num_clusters=10, clustering="two_level")
    assert torch.equal(torch.sort(tree.leaf_order).values, torch.arange(60))


def test_probed_search_is_exact_when_every_group_is_probed_and_falls_back_when_none_lists():
    g = torch.Generator().manual_seed(4)
    x, centroids = torch.randn(300, 8, generator=g), torch.randn(40, 8, generator=g)
    coarse = torch.randn(6, 8, generator=g)
    exact = tree_module.nearest_centroid(x, centroids)
    groups = tree_module.nearest_groups(x, coarse, 6)
    assert torch.equal(tree_module.probed_nearest(x, groups, centroids, coarse, 1), exact)
    # points that probe only a group listing no centroid are compared with all of them
    far = torch.cat([coarse[:1], torch.full((1, 8), 100.0)])  # group 1 is nobody's nearest
    alone = tree_module.probed_nearest(x, torch.ones(300, 1, dtype=torch.long), centroids, far, 1)
    assert torch.equal(alone, exact)


@pytest.mark.parametrize("beam_over_n", [0, 3])
def test_beams_of_n_are_exact_on_the_two_level_tree(beam_over_n):
    x, _ = planted(30, 10, dim=8, seed=5)
    n = x.shape[0]
    tree = ClassTree.from_vectors(x, 4, num_clusters=30, clustering="two_level")
    g = torch.Generator().manual_seed(6)
    z = torch.randn(7, 8, generator=g)
    levels = [torch.randn(size, 8, generator=g) for size in tree.level_sizes()[1:-1]] + [x]
    scores, ids = beam_search(tree, z, levels, n + beam_over_n, 10, accumulate=False)
    expected = torch.topk(z @ x.T, 10)
    torch.testing.assert_close(scores, expected.values)
    assert torch.equal(ids, expected.indices)
