"""k-means through faiss: sampled training, warm start, re-seeding, residual points."""

import math

import faiss
import pytest
import torch

from lightning_sampled.index import check_norms, kmeans, nearest_centroid
from lightning_sampled.index.kmeans import Points, reseed_empty, training_sample


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
    centroids, assignment = reseed_empty(x, centroids, assignment)
    assert torch.bincount(assignment, minlength=4).min() >= 1
    assert torch.equal(assignment, nearest_centroid(x, centroids))


def test_empty_centroids_take_the_worst_represented_points():
    # Two tight blobs and one far outlier, all under centroid 0; centroids 1 and 2 hold nothing.
    g = torch.Generator().manual_seed(1)
    blob = 0.01 * torch.randn(40, 2, generator=g)
    x = torch.cat([blob[:20], blob[20:] + 3.0, torch.full((1, 2), 9.0)])
    centroids = torch.tensor([[0.0, 0.0], [100.0, 100.0], [-100.0, -100.0]])
    assignment = nearest_centroid(x, centroids)
    assert torch.bincount(assignment, minlength=3).tolist() == [41, 0, 0]
    errors = ((x - centroids[0]) ** 2).sum(1)
    worst_two = errors.topk(2).indices
    centroids, assignment = reseed_empty(x, centroids.clone(), assignment)
    # the first round moves the empty centroids onto the two farthest points: the outlier and a
    # point of the far blob; the blob then keeps its own centroid after reassignment
    assert torch.equal(centroids[1], x[worst_two[0]]) and torch.equal(centroids[2], x[worst_two[1]])
    assert sorted(torch.bincount(assignment, minlength=3).tolist()) == [1, 20, 20]


def test_duplicated_points_terminate_with_empty_clusters_allowed():
    x = torch.cat([torch.zeros(10, 2), torch.ones(10, 2)])
    centroids, assignment = kmeans(x, 3, niter=5)
    assert centroids.shape == (3, 2)
    assert sorted(torch.bincount(assignment, minlength=3).tolist()) == [0, 10, 10]


def test_too_few_points_is_an_error():
    with pytest.raises(ValueError, match="at least k=5 points"):
        kmeans(torch.randn(4, 2), 5)


def test_faiss_threads_follow_torch_during_the_build_and_are_restored(monkeypatch):
    seen = []
    train = faiss.Kmeans.train

    def spy(self, *args, **kwargs):
        seen.append(faiss.omp_get_max_threads())
        return train(self, *args, **kwargs)

    monkeypatch.setattr(faiss.Kmeans, "train", spy)
    x = torch.randn(200, 4, generator=torch.Generator().manual_seed(0))
    torch_threads = torch.get_num_threads()
    faiss.omp_set_num_threads(1)
    try:
        for threads in (3, 2):
            torch.set_num_threads(threads)
            kmeans(x, 4, niter=2)
    finally:
        torch.set_num_threads(torch_threads)
    assert seen == [3, 2]
    assert faiss.omp_get_max_threads() == 1


@pytest.mark.parametrize("where", ["x", "init"])
def test_norms_that_overflow_fp32_distances_are_refused_before_faiss(where):
    """faiss aborts the process (exit 134) on such a table; a ValueError names the norm."""
    x = torch.randn(50, 4, generator=torch.Generator().manual_seed(0))
    init = x[:3].clone()
    (x if where == "x" else init)[2, 1] = 3e38
    with pytest.raises(ValueError, match=rf"kmeans: {where} has a row of norm 3e\+38 \(row 2\)"):
        kmeans(x, 3, init=init, niter=2)
    # the largest norm allowed (9.2e18: squared distances up to 3.4e38) still clusters
    x[2] = torch.tensor([9e18, 0.0, 0.0, 0.0])
    centroids, assignment = kmeans(x, 3, niter=2)
    assert torch.isfinite(centroids).all() and assignment[2] != assignment[3]


def residual_points(n: int = 600, d: int = 5, seed: int = 4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    shift = torch.randn(7, d, generator=g)
    which = torch.randint(0, 7, (n,), generator=g)
    return Points(x, shift, which), x - shift[which]


def test_points_form_residuals_chunk_by_chunk_and_by_id():
    points, residuals = residual_points()
    chunks = list(points.chunks(chunk_size=128))
    assert [start for start, _ in chunks] == [0, 128, 256, 384, 512]
    torch.testing.assert_close(torch.cat([rows for _, rows in chunks]), residuals)
    ids = torch.tensor([599, 0, 17, 17])
    torch.testing.assert_close(points.take(ids), residuals[ids])
    with pytest.raises(ValueError, match="both shift and which"):
        Points(residuals, shift=torch.zeros(1, 5))


def test_kmeans_of_points_equals_kmeans_of_the_materialised_residuals():
    points, residuals = residual_points(n=3000)
    # capped: both train on the same seeded sample; uncapped: on every point
    for cap in (16, None):
        got = kmeans(points, 6, niter=8, seed=2, max_points_per_centroid=cap)
        expected = kmeans(residuals, 6, niter=8, seed=2, max_points_per_centroid=cap)
        torch.testing.assert_close(got[0], expected[0])
        assert torch.equal(got[1], expected[1])
    assert torch.equal(nearest_centroid(points, got[0], chunk_size=100), got[1])


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_training_sample_is_a_distinct_seeded_sample_on_the_device_only_beyond_the_cap(device):
    device = torch.device(device)
    assert torch.equal(training_sample(50, 4, 16, 0, device).cpu(), torch.arange(50))
    assert torch.equal(training_sample(50, 4, None, 0, device).cpu(), torch.arange(50))
    sample = training_sample(1000, 4, 16, 3, device)
    assert sample.device.type == device.type
    assert sample.numel() == 64 and sample.unique().numel() == 64
    assert torch.equal(sample, sample.sort().values)
    assert torch.equal(sample, training_sample(1000, 4, 16, 3, device))
    assert not torch.equal(sample, training_sample(1000, 4, 16, 4, device))


@pytest.mark.parametrize("value, kind", [(math.nan, "NaN"), (math.inf, "infinite")])
def test_a_non_finite_value_past_the_first_chunk_is_named_with_its_row(value, kind):
    x = torch.randn(70_000, 2, generator=torch.Generator().manual_seed(0))
    x[69_999, 1] = value  # the second chunk of 65,536 rows: each chunk must be checked
    with pytest.raises(ValueError, match=rf"t contains {kind} values \(row 69999 of"):
        check_norms("t", x)
    # residuals: every row is 0 - x[69_999], non-finite from row 0
    points = Points(torch.zeros(70_000, 2), x[69_999:], torch.zeros(70_000, dtype=torch.long))
    with pytest.raises(ValueError, match=rf"r contains {kind} values \(row 0 of"):
        check_norms("r", points)
