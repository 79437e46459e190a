"""The item tower: its closed form, the synthetic items' features, and the tower recipe scoring
exactly what the tower computes."""

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_configs import synthetic_cli

from recipes import GRU4Rec, SASRec, SyntheticSequences
from recipes.data.synthetic import SyntheticSpec, draw_world, generate
from recipes.towers import ItemFeatures, ItemTower, TowerSpec, popularity_buckets

CONFIGS = Path(__file__).parents[2] / "recipes" / "configs"
SMALL = {"num_items": 1_000, "num_users": 60, "seq_len": 20, "num_clusters": 20}


def features(n=7, f=3, c=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ItemFeatures(torch.randn(n, f, generator=g), torch.randint(c, (n,), generator=g))


def test_popularity_buckets_double():
    counts = torch.tensor([0, 1, 2, 3, 6, 7, 1_000, 10**9])
    assert popularity_buckets(counts, 12).tolist() == [0, 1, 1, 2, 2, 3, 9, 11]


def test_tower_is_the_sum_of_its_three_parts():
    tower = ItemTower(7, 5, 3, 4, class_counts=torch.tensor([0, 1, 3, 7, 0, 2, 100]))
    data = features()
    tower.load(data)
    ids = torch.tensor([[1, 6], [3, 3]])
    buckets = torch.tensor([0, 1, 2, 3, 0, 1, 6])
    expected = (
        data.dense[ids] @ tower.dense.weight.T
        + tower.category.weight[data.category[ids]]
        + tower.popularity.weight[buckets[ids]]
    )
    torch.testing.assert_close(tower(ids), expected)
    tower(ids).sum().backward()
    for p in tower.parameters():  # every part is trained
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_tower_refuses_missing_or_mismatched_features():
    tower = ItemTower(7, 5, 3, 4)
    with pytest.raises(RuntimeError, match="load"):
        tower(torch.tensor([1]))
    with pytest.raises(ValueError, match="dense features"):
        tower.load(features(f=2))
    with pytest.raises(ValueError, match="categories"):
        tower.load(features(c=5, seed=3))
    with pytest.raises(ValueError, match="class_counts"):
        ItemTower(7, 5, 3, 4, class_counts=torch.ones(6))
    with pytest.raises(ValueError, match="long"):
        ItemFeatures(torch.zeros(3, 2), torch.zeros(3))


def test_features_observe_the_world_with_the_stated_noise(tmp_path):
    spec = {**SMALL, "num_items": 20_000, "cache_dir": str(tmp_path)}
    data = SyntheticSequences(**spec, feature_noise=0.5)
    world = draw_world(SyntheticSpec(**SMALL | {"num_items": 20_000}), np.random.default_rng(0))
    got = data.item_features
    assert got.dense.shape == (20_001, 16) and got.dense.dtype == torch.float32
    assert not got.dense[0].any()
    assert got.category[1:].tolist() == world.cluster[1:].tolist() and got.category[0] == 0
    # the noise is 0.5 * N(0, I / 16): its squared norm averages 0.25 (sd of the mean ~0.0006)
    noise = got.dense[1:].numpy() - world.vectors[1:]
    assert abs((noise**2).sum(axis=1).mean() - 0.25) < 0.005
    exact = SyntheticSequences(**spec, feature_noise=0.0).item_features
    assert np.array_equal(exact.dense.numpy(), world.vectors)
    # the features come from their own random stream: the sequences are generate()'s
    sequences, _ = generate(SyntheticSpec(**SMALL | {"num_items": 20_000}))
    assert data.splits["train"]["items"] == sequences[:, :-2].tolist()


@pytest.mark.parametrize("head", ["full", "mixed", "uniform", "midx_rq"])
def test_tower_recipe_fits_and_ranks_by_the_towers_vectors(head, tmp_path):
    """``sasrec_synthetic-1m-tower.yaml`` shrunk to 1,000 items: the head's candidates and the
    inputs are the tower's vectors, and the exact top-k is brute force over them."""
    cli = synthetic_cli(
        "sasrec_synthetic-1m-tower.yaml",
        head,
        tmp_path,
        SMALL,
        "--model.init_args.item_tower.num_categories=20",
    )
    model = cli.model
    assert model.item_emb is None and model.head.candidate_encoder is model.item_tower
    before = model.item_tower.dense.weight.detach().clone()
    cli.trainer.fit(model, cli.datamodule)
    assert torch.isfinite(cli.trainer.callback_metrics["val/ndcg@10"])
    assert not torch.equal(model.item_tower.dense.weight, before)  # the head trained the tower

    batch = next(iter(cli.datamodule.val_dataloader()))
    model.eval()
    with torch.no_grad():
        queries = model.eval_queries(batch)
        vectors = model.item_tower(torch.arange(1_001))
        logits = queries @ vectors.T
        logits[:, 0] = -torch.inf
        logits.scatter_(1, batch["exclude"].clamp(min=0), -torch.inf)
        excluded = batch["exclude"] >= 0
        assert excluded.any()
        got = model.evaluation_collectives(batch)
    want = logits.topk(model.top_k).indices
    assert torch.equal(got, want)


def test_tower_refusals(tmp_path):
    spec = TowerSpec(num_categories=20)
    with pytest.raises(ValueError, match="tie_weights"):
        GRU4Rec(num_classes=1_001, item_tower=spec, tie_weights=False)
    sharded = {
        "class_path": "lightning_sampled.heads.FullSoftmaxHead",
        "init_args": {"sharded": True},
    }
    with pytest.raises(ValueError, match="sharded"):
        SASRec(num_classes=1_001, item_tower=spec, head=sharded, max_len=10)
    model = SASRec(num_classes=1_001, item_tower=spec, max_len=10)
    model.trainer = type("T", (), {"datamodule": object()})()
    with pytest.raises(ValueError, match="item_features"):
        model.setup("fit")
