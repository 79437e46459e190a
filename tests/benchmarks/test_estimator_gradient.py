"""benchmarks.estimator_gradient: the bias / spread arithmetic against closed forms, the brute
force against the exact gradient where the sampled head must meet it, the session batches'
structure, and a tiny run's files."""

import csv
import math

import torch

from benchmarks import estimator_gradient as eg
from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead


def test_spread_of_is_the_relative_bias_and_rms_deviation():
    exact = torch.tensor([3.0, 4.0], dtype=torch.float64)  # norm 5
    grads = exact + torch.tensor([[1.0, 0.0], [-1.0, 0.0], [1.0, 2.0], [-1.0, 2.0]]).double()
    stats = eg.spread_of(grads, exact)
    assert math.isclose(stats["bias"], 1.0 / 5)  # mean offset (0, 1)
    assert math.isclose(stats["spread"], math.sqrt(2.0) / 5)  # each row 1^2 + 1^2 from the mean
    same = eg.spread_of(exact.repeat(3, 1), exact)
    assert same["bias"] == 0 and same["spread"] == 0 and math.isclose(same["cosine"], 1.0)


def test_the_exact_gradient_is_the_full_softmax_of_plain_torch():
    g = torch.Generator().manual_seed(0)
    table, z = torch.randn(30, 4, generator=g), torch.randn(9, 4, generator=g)
    target = torch.randint(30, (9,), generator=g)
    head = FullSoftmaxHead(30, 4)
    with torch.no_grad():
        head.weight.copy_(table)
    got = eg.gradient(head, z, target)
    zz, ww = z.clone().requires_grad_(), table.clone().requires_grad_()
    torch.nn.functional.cross_entropy(zz @ ww.T, target).backward()
    want = torch.cat([zz.grad.reshape(-1), ww.grad.reshape(-1)]).double()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_many_uniform_draws_meet_the_exact_gradient_and_few_do_not():
    """The plain head's corrected_all bias falls as M grows: the brute force compares like with
    like (a wrong sign or a missing table gradient would leave it near 1 or above)."""
    g = torch.Generator().manual_seed(1)
    law = eg.population(40, g)
    target = eg.iid_targets(law, 64, g)
    table = torch.randn(40, 6, generator=g) * 0.3
    z = 2 * table[target] + 0.5 * torch.randn(64, 6, generator=g)
    full = FullSoftmaxHead(40, 6)
    with torch.no_grad():
        full.weight.copy_(table)
    exact = eg.gradient(full, z, target)

    def bias(m):
        head = SampledSoftmaxHead(40, 6, num_negatives=m, in_batch_negatives=False)
        with torch.no_grad():
            head.weight.copy_(table)
        grads = torch.stack([eg.gradient(head, z, target) for _ in range(8)])
        return eg.spread_of(grads, exact)["bias"]

    torch.manual_seed(0)
    few, many = bias(2), bias(4000)
    assert many < 0.02 < few


def test_sessions_keep_to_one_cluster_for_their_sticky_share():
    g = torch.Generator().manual_seed(2)
    law = eg.population(200, g)
    target = eg.session_targets(law, 4000, 100, clusters=10, stickiness=0.8, generator=g)
    assert target.shape == (4000,)
    shares = []
    for session in target.view(40, 100):
        clusters = torch.bincount(session % 10, minlength=10).double()
        shares.append(float(clusters.max() / 100))
    # the sticky 80% plus the population draws that fall in the same cluster
    assert 0.75 < sum(shares) / len(shares) < 0.95
    iid = eg.iid_targets(law, 4000, g)
    iid_share = sum(
        float(torch.bincount(s % 10, minlength=10).max() / 100) for s in iid.view(40, 100)
    )
    assert iid_share / 40 < 0.45


def test_a_tiny_run_writes_every_batch_and_head(tmp_path):
    name = str(tmp_path / "eg")
    argv = ["--positions", "120", "--classes", "50", "--dim", "4", "--negatives", "5"]
    argv += ["--limits", "8", "--repeats", "2", "--session-length", "30", "--name", name]
    rows = eg.main(argv)
    heads = ["plain", "default", "default K=8", "shared M", "shared M+K=8"]
    assert [(r["batch"], r["head"]) for r in rows] == [
        (b, h) for b in ("iid", "sessions") for h in heads
    ]
    assert {r["draws"] for r in rows if r["head"] == "shared M+K=8"} == {13}
    for row in rows:
        assert row["bias"] >= 0 and row["spread"] >= 0 and -1 <= row["cosine"] <= 1
    with open(name + ".csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert "population law" in open(name + ".md").read()
