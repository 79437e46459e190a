"""k-means' torch backend (Lloyd on the points' device) against its definition and faiss."""

import pytest
import torch

from lightning_sampled.index import kmeans, nearest_centroid
from lightning_sampled.index.kmeans import Points, lloyd


def mixture(n: int = 6000, d: int = 8, modes: int = 40, seed: int = 0) -> torch.Tensor:
    """Points around ``modes`` random centres of different spreads: k-means has local optima."""
    g = torch.Generator().manual_seed(seed)
    centres = 3.0 * torch.randn(modes, d, generator=g)
    spread = 0.2 + torch.rand(modes, 1, generator=g)
    which = torch.randint(modes, (n,), generator=g)
    return centres[which] + spread[which] * torch.randn(n, d, generator=g)


def mse(x: torch.Tensor, centroids: torch.Tensor, assignment: torch.Tensor) -> float:
    return float((x - centroids[assignment]).square().sum(1).mean())


def test_one_iteration_moves_each_centroid_to_the_mean_of_its_points():
    x = mixture(n=500, d=3, modes=5)
    init = x[:6].clone()
    init[5] = 1e3  # takes no point: stays where it is
    assignment = torch.cdist(x, init).argmin(1)
    expected = init.clone()
    for j in range(6):
        if (assignment == j).any():
            expected[j] = x[assignment == j].mean(0)
    torch.testing.assert_close(lloyd(x, 6, init=init, niter=1), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("k", [16, 64])
def test_quantisation_error_within_a_few_percent_of_faiss(k):
    x = mixture()
    errors = {
        backend: sum(mse(x, *kmeans(x, k, niter=25, seed=s, backend=backend)) for s in range(3))
        for backend in ("faiss", "torch")
    }
    assert abs(errors["torch"] / errors["faiss"] - 1.0) < 0.05, errors


def test_deterministic_with_a_seed_and_warm_started():
    x = mixture(n=3000)
    first, assignment = kmeans(x, 16, niter=30, seed=5, backend="torch")
    again, _ = kmeans(x, 16, niter=30, seed=5, backend="torch")
    assert torch.equal(first, again)
    assert torch.equal(assignment, nearest_centroid(x, first))
    other, _ = kmeans(x, 16, niter=30, seed=6, backend="torch")
    assert not torch.equal(first, other)
    warm, _ = kmeans(x, 16, init=first, niter=2, seed=99, backend="torch")
    cold, _ = kmeans(x, 16, niter=2, seed=99, backend="torch")
    assert (warm - first).abs().max() < 0.15
    assert (cold - first).abs().max() > 1.0


def test_empty_clusters_are_reseeded():
    x = mixture(n=300, d=4, modes=10)
    init = x[:8].clone()
    init[3] = 1e3  # no point comes near it during training
    centroids, assignment = kmeans(x, 8, init=init, niter=5, backend="torch")
    assert torch.bincount(assignment, minlength=8).min() >= 1
    assert centroids.abs().max() < 100.0
    for k in (2, 150, 300):
        _, assignment = kmeans(x, k, niter=5, backend="torch")
        assert torch.bincount(assignment, minlength=k).min() >= 1


def test_residual_points_and_the_training_sample_are_shared_with_faiss():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2000, 5, generator=g)
    shift, which = torch.randn(4, 5, generator=g), torch.randint(4, (2000,), generator=g)
    from_points, _ = kmeans(
        Points(x, shift, which), 8, seed=2, max_points_per_centroid=64, backend="torch"
    )
    from_copy, _ = kmeans(x - shift[which], 8, seed=2, max_points_per_centroid=64, backend="torch")
    torch.testing.assert_close(from_points, from_copy)


def test_auto_is_faiss_on_the_cpu_and_a_wrong_backend_is_refused():
    x = mixture(n=1000)
    auto, _ = kmeans(x, 8, seed=1)
    assert torch.equal(auto, kmeans(x, 8, seed=1, backend="faiss")[0])
    assert not torch.equal(auto, kmeans(x, 8, seed=1, backend="torch")[0])
    with pytest.raises(ValueError, match="backend"):
        kmeans(x, 8, backend="cuda")
