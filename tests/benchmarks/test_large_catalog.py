"""benchmarks.large_catalog: the generator draws Zipf targets over a permutation and clustered
class vectors, the refresh schedule is IndexRefresh's, ratios and targets compare a seed with its
own full softmax, and the whole benchmark runs at tiny sizes with a trained full softmax that
beats the untrained model."""

import csv

import pytest
import torch

from benchmarks import large_catalog as lc

SMALL = lc.Problem(num_classes=2000, num_clusters=20)


@pytest.fixture(scope="module")
def catalog() -> lc.Catalog:
    return lc.make_catalog(SMALL, torch.Generator().manual_seed(0))


def test_targets_are_zipf_over_a_permutation(catalog):
    ranks = torch.arange(1, SMALL.num_classes + 1, dtype=torch.float64)
    expected = (1 / ranks) / (1 / ranks).sum()
    assert torch.allclose(catalog.popularity[catalog.order], expected)
    # popularity is unrelated to class id: the permutation is not near the identity
    ids = catalog.order.double()
    correlation = torch.corrcoef(torch.stack([ids, ranks]))[0, 1]
    assert abs(correlation) < 0.1
    _, y = lc.draw_examples(catalog, 200_000, 1.0, torch.Generator().manual_seed(1))
    counts = torch.bincount(y, minlength=SMALL.num_classes).double()
    top = catalog.order[:20]
    observed, wanted = counts[top], 200_000 * expected[:20]
    chi2 = ((observed - wanted) ** 2 / wanted).sum()
    assert chi2 < 45.3  # chi-square, 20 degrees of freedom, p = 0.001


def test_class_vectors_cluster_and_inputs_are_a_noisy_linear_view(catalog):
    offsets = catalog.vectors - catalog.centres[catalog.cluster]
    assert offsets.std().item() == pytest.approx(SMALL.cluster_noise, rel=0.02)
    assert offsets.mean().abs().item() < 0.01
    assert torch.bincount(catalog.cluster, minlength=SMALL.num_clusters).min() > 0
    separation = lc.cluster_separation(catalog)
    assert separation.min() > 1.0  # every class nearer its own centre
    assert separation.mean() < 2.5  # ... but not by far: the clusters overlap
    x, y = lc.draw_examples(catalog, 5000, 0.8, torch.Generator().manual_seed(2))
    residual = x - catalog.vectors[y] @ catalog.mixing.T
    assert residual.std().item() == pytest.approx(0.8, rel=0.03)


def test_refresh_schedule_doubles_or_is_regular():
    doubling = [s for s in range(300) if lc.refresh_due(s, None)]
    assert doubling == [0, 50, 100, 200]
    assert [s for s in range(300) if lc.refresh_due(s, 120)] == [0, 120, 240]


def rows(**ndcg: float) -> list[dict]:
    """CSV-like rows from ``method__convention__seed=ndcg`` keywords (``full__x__0``: full)."""
    out = []
    for key, value in ndcg.items():
        method, convention, seed = key.split("__")
        convention = "" if method == "full" else convention
        out.append(
            {
                "method": method,
                "convention": convention,
                "seed": int(seed),
                "negatives": 100 if convention else "",
                "ndcg@10": value,
                "train_s": 1.0,
            }
        )
    return out


def test_ratios_use_the_same_seeds_full_softmax():
    table = rows(
        full__x__0=0.5, full__x__1=0.25, uniform__adaptive__0=0.4, uniform__adaptive__1=0.2
    )
    table += rows(midx_rq__adaptive__2=0.3)  # seed 2 has no full row
    lc.add_ratios(table)
    assert [r["ratio_to_full"] for r in table] == [1.0, 1.0, 0.8, 0.8, ""]
    summary = {(r["method"], r["convention"]): r for r in lc.summary(table)}
    assert summary[("uniform", "adaptive")]["ratios"] == [0.8, 0.8]
    assert summary[("midx_rq", "adaptive")]["mean_ratio"] == ""


def test_targets_say_met_not_met_and_not_measured():
    default = lc.HEAD_DEFAULT_CONVENTION
    table = rows(full__x__0=0.5, full__x__1=0.5)
    table += rows(**{f"mixed__{default}__0": 0.49, f"mixed__{default}__1": 0.45})
    table += rows(**{f"mixed_midx__{default}__0": 0.49, f"uniform__{default}__1": 0.5})
    lc.add_ratios(table)
    uniform, midx = lc.targets(table, [0, 1])
    assert uniform.startswith("- NOT met: mixed: uniform") and "0.980, 0.900" in uniform
    assert midx.startswith("- not measured: mixed_midx: MIDX-rq")
    table += rows(**{f"mixed_midx__{default}__1": 0.48})
    lc.add_ratios(table)
    assert lc.targets(table, [0, 1])[1].startswith("- met: mixed_midx")


def test_reaching_lists_every_method_measured_on_every_seed():
    table = rows(full__x__0=0.5, full__x__1=0.5, in_batch__c__0=0.49, in_batch__c__1=0.48)
    table += rows(uniform__c__0=0.49, uniform__c__1=0.45, midx_rq__c__0=0.5)
    lc.add_ratios(table)
    lines = lc.reaching(table, [0, 1])
    assert lines == [
        "- in_batch, c: reaches 0.95x on every seed (ratios 0.980, 0.960)",
        "- uniform, c: does not reach 0.95x on every seed (ratios 0.980, 0.900)",
    ]


def test_main_at_tiny_sizes(tmp_path):
    argv = ["--out", str(tmp_path), "--seeds", "0", "1", "--classes", "2000", "--clusters", "20"]
    argv += ["--steps", "50", "--batch", "64", "--eval", "500", "--lr", "1e-2"]
    argv += ["--conventions", "exact_positive", "corrected_all", "--codebook-size", "8"]
    result = lc.main(argv)
    assert len(result) == 2 * (1 + 6 * 2)  # full, then the six sampled methods x 2 conventions
    with (tmp_path / "large_catalog.csv").open() as f:
        written = list(csv.DictReader(f))
    assert len(written) == len(result) and {"machine", "torch", "commit"} <= written[0].keys()
    for seed in (0, 1):
        mine = [r for r in result if r["seed"] == seed]
        full = next(r for r in mine if r["method"] == "full")
        for row in mine:
            assert row["ratio_to_full"] == pytest.approx(row["ndcg@10"] / full["ndcg@10"])
        midx = [r for r in mine if r["method"] in ("midx_rq", "mixed_midx")]
        assert [r["refreshes"] for r in midx] == [1] * 4  # before step 0; step 50 never comes
        assert {r["negatives"] for r in mine if r["method"] == "in_batch"} == {0}
    problem = lc.Problem(num_classes=2000, num_clusters=20)
    data = lc.make_data(problem, 0, 50, 64, 500)
    encoder = lc.make_encoder(problem.dim)
    encoder.load_state_dict(data.encoder_state)
    counts = torch.bincount(data.train_y.reshape(-1), minlength=2000)
    mixed = lc.make_head(lc.Run("mixed", "corrected_all", 10, 8, None), counts, 64, data.table, 0)
    assert mixed.in_batch_negatives and isinstance(mixed.sampler, lc.UniformSampler)
    run = lc.Run("frequency", "corrected_all", 10, 8, None)
    frequency = lc.make_head(run, counts, 64, data.table, 0).sampler
    seen = torch.tensor([int(counts.argmax()), int((counts == 0).nonzero()[0, 0])])
    # the most frequent target: its count's share of 95%, plus 5% / N; an unseen one 5% / N
    expected = lc.FREQUENCY_SHARE * counts[seen].double() / counts.sum() + 0.05 / 2000
    got = frequency.log_prob(torch.zeros(1, 64), seen).exp().double()
    assert torch.allclose(got, expected, rtol=1e-4)
    head = lc.make_head(lc.Run("full", "", 100, 8, None), counts, problem.dim, data.table, 0)
    untrained = lc.ndcg_at_10(encoder, head, data.eval_x, data.eval_y)
    full0 = next(r for r in result if r["seed"] == 0 and r["method"] == "full")
    assert full0["ndcg@10"] > max(3 * untrained, 0.1)
    text = (tmp_path / "large_catalog.md").read_text()
    assert "## Targets" in text and "| midx_rq | corrected_all |" in text
