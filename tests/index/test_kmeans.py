"""k-means through faiss: every point used, warm start, empty clusters re-seeded."""

import pytest
import torch

from lightning_sampled.index import kmeans, nearest_centroid
from lightning_sampled.index.kmeans import _reseed_empty


def blobs(n_per: int, centers: torch.Tensor, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.cat([c + 0.3 * torch.randn(n_per, centers.shape[1], generator=g) for c in centers])


def test_without_a_cap_centroids_are_means_over_all_points():
    # 2000 points per centroid: the default trains on 256 of them and the centroid is the mean of
    # that subsample, about 0.3 / 16 = 0.02 off the full mean; without a cap it is the full mean.
    x = blobs(2000, torch.tensor([[0.0, 0.0, 0.0], [4.0, 4.0, 4.0]]))
    centroids, assignment = kmeans(x, 2, niter=20, seed=3, max_points_per_centroid=None)
    for j in range(2):
        torch.testing.assert_close(centroids[j], x[assignment == j].mean(0), atol=1e-4, rtol=0)
    sampled, assignment = kmeans(x, 2, niter=20, seed=3)
    off = [float((sampled[j] - x[assignment == j].mean(0)).abs().max()) for j in range(2)]
    assert max(off) > 1e-3, off  # trained on a sample: not the mean of every point
    assert max(off) < 0.1, off  # but close to it


def test_assignment_is_the_nearest_centroid():
    x = torch.randn(500, 6, generator=torch.Generator().manual_seed(1))
    centroids, assignment = kmeans(x, 7, niter=10)
    brute = torch.cdist(x, centroids).argmin(1)
    assert torch.equal(assignment, brute)
    assert torch.equal(nearest_centroid(x, centroids, chunk_size=33), brute)


def test_same_seed_same_centroids_and_warm_start_stays_put():
    x = torch.randn(3000, 8, generator=torch.Generator().manual_seed(2))
    first, _ = kmeans(x, 16, niter=40, seed=5)
    again, _ = kmeans(x, 16, niter=40, seed=5)
    assert torch.equal(first, again)
    warm, _ = kmeans(x, 16, init=first, niter=2, seed=99)
    cold, _ = kmeans(x, 16, niter=2, seed=99)
    assert (warm - first).abs().max() < 0.15
    assert (cold - first).abs().max() > 1.0


def test_no_cluster_left_empty():
    x = torch.randn(300, 4, generator=torch.Generator().manual_seed(4))
    for k in (2, 17, 150, 300):
        _, assignment = kmeans(x, k, niter=5)
        assert torch.bincount(assignment, minlength=k).min() >= 1


def test_empty_centroids_are_reseeded_onto_points():
    x = torch.randn(100, 3, generator=torch.Generator().manual_seed(0))
    centroids = torch.stack([x[:50].mean(0), x[50:].mean(0), torch.full((3,), 1e3), -x[0]])
    assignment = nearest_centroid(x, centroids)
    assert torch.bincount(assignment, minlength=4)[2] == 0
    centroids, assignment = _reseed_empty(x, centroids, assignment, seed=0)
    assert torch.bincount(assignment, minlength=4).min() >= 1
    assert torch.equal(assignment, nearest_centroid(x, centroids))


def test_duplicated_points_terminate_with_empty_clusters_allowed():
    x = torch.cat([torch.zeros(10, 2), torch.ones(10, 2)])
    centroids, assignment = kmeans(x, 3, niter=5)
    assert centroids.shape == (3, 2)
    assert sorted(torch.bincount(assignment, minlength=3).tolist()) == [0, 10, 10]


def test_too_few_points_is_an_error():
    with pytest.raises(ValueError, match="at least k=5 points"):
        kmeans(torch.randn(4, 2), 5)
