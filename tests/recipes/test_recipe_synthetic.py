"""Synthetic sequences: deterministic, split like MovieLens, Zipf popularity, learnable structure,
clear errors."""

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_configs import synthetic_cli

from recipes import SyntheticSequences
from recipes.data.synthetic import SyntheticSpec, generate

CONFIGS = Path(__file__).parents[2] / "recipes" / "configs"

SMALL = {"num_items": 1_000, "num_users": 400, "seq_len": 20, "num_clusters": 20}


@pytest.fixture
def synthetic(tmp_path):
    def make(**kwargs):
        return SyntheticSequences(**{**SMALL, "cache_dir": str(tmp_path / "cache"), **kwargs})

    return make


def test_deterministic_by_seed():
    first, world = generate(SyntheticSpec(**SMALL))
    again, _ = generate(SyntheticSpec(**SMALL))
    other, _ = generate(SyntheticSpec(**SMALL, seed=1))
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)
    assert first.shape == (400, 20)
    assert first.min() >= 1 and first.max() <= 1_000
    assert all(len(set(row)) == len(row) for row in first.tolist())  # no repeated item
    assert world.vectors.shape == (1_001, 16) and not world.vectors[0].any()


def test_leave_one_out_split_and_batches(synthetic, tmp_path):
    data = synthetic(max_len=8, batch_size=16, eval_batch_size=32, max_eval_users=50)
    sequences, _ = generate(SyntheticSpec(**SMALL))
    assert data.num_classes == 1_001
    assert data.splits["train"]["items"][0] == sequences[0, :-2].tolist()
    assert len(data.splits["train"]) == 400
    assert len(data.splits["validation"]) == len(data.splits["test"]) == 50  # capped
    assert data.splits["validation"]["target"] == sequences[:50, -2].tolist()
    assert data.splits["test"]["target"] == sequences[:50, -1].tolist()
    assert data.splits["test"]["history"][3] == sequences[3, :-1].tolist()
    counts = torch.tensor(data.class_counts)
    assert counts.shape == (1_001,) and counts[0] == 0
    assert counts.sum() == 400 * 18
    assert (
        counts.tolist()
        == torch.bincount(torch.from_numpy(sequences[:, :-2]).flatten(), minlength=1_001).tolist()
    )

    train = next(iter(data.train_dataloader()))
    assert train["input"].shape == train["target"].shape == (16, 8)
    batch = next(iter(data.test_dataloader()))
    assert batch["history"].shape == (32, 8) and batch["target"].shape == (32,)
    assert batch["history"][0].tolist() == sequences[0, -9:-1].tolist()
    assert batch["exclude"].shape == (32, 19)  # the whole history, never recommended
    assert "exclude" not in next(iter(synthetic(exclude_seen=False).val_dataloader()))

    assert any((tmp_path / "cache").iterdir())  # cached, keyed by the arguments
    assert synthetic().splits["train"]["items"] == data.splits["train"]["items"]
    assert synthetic(seed=3).splits["train"]["items"] != data.splits["train"]["items"]


def test_popularity_is_zipf_like():
    sequences, world = generate(SyntheticSpec(**{**SMALL, "num_users": 2_000}, zipf=1.0))
    freq = np.sort(np.bincount(sequences.ravel(), minlength=1_001)[1:])[::-1]
    ranks = np.arange(1, 201)  # the head of the rank-frequency curve, where counts are large
    slope = np.polyfit(np.log(ranks), np.log(freq[:200]), 1)[0]
    assert -1.4 < slope < -0.6, slope
    flat, _ = generate(SyntheticSpec(**{**SMALL, "num_users": 2_000}, zipf=0.0))
    freq = np.sort(np.bincount(flat.ravel(), minlength=1_001)[1:])[::-1]
    assert np.polyfit(np.log(ranks), np.log(freq[:200]), 1)[0] > -0.4  # no popularity: flat
    assert np.isclose(world.popularity.sum(), 1) and world.popularity[0] == 0


def test_next_cluster_follows_recent_items():
    """The next item's cluster is a recent item's cluster (or one of its planted successors)
    far more often than chance: the structure a sequence model can learn."""
    spec = SyntheticSpec(**{**SMALL, "num_users": 1_000})
    sequences, world = generate(spec)
    clusters = world.cluster[sequences]  # [U, T]
    cluster_mass = np.bincount(world.cluster[1:], weights=world.popularity[1:])
    hits, chance, successor = [], [], []
    for t in range(spec.window, spec.seq_len):
        recent = clusters[:, t - spec.window : t]
        hits.append((clusters[:, t, None] == recent).any(axis=1))
        chance.append(np.array([cluster_mass[np.unique(r)].sum() for r in recent]))
        successors = world.neighbors[recent].reshape(len(recent), -1)
        successor.append((clusters[:, t, None] == np.concatenate([recent, successors], 1)).any(1))
    hit, base = np.mean(hits), np.mean(chance)
    assert hit > 0.5 and hit > 2.5 * base, (hit, base)
    assert np.mean(successor) > 0.9  # only the 5% jumps leave the recent clusters' successors
    # within the cluster, items close to the recent items' mean vector are preferred
    query = world.vectors[sequences[:, -4:-1]].mean(axis=1)
    chosen = np.einsum("ud,ud->u", world.vectors[sequences[:, -1]], query)
    random = np.einsum("ud,ud->u", world.vectors[np.roll(sequences[:, -1], 1)], query)
    assert chosen.mean() > random.mean() + 0.1


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_items": 0}, "num_items"),
        ({"num_users": 0}, "num_users"),
        ({"seq_len": 2}, "seq_len"),
        ({"num_items": 30}, "num_items"),  # fewer than 2 * seq_len
        ({"num_clusters": 2_000}, "num_clusters"),
        ({"num_clusters": 0}, "num_clusters"),
        ({"zipf": -1.0}, "zipf"),
        ({"zipf": float("nan")}, "zipf"),
        ({"seed": -1}, "seed"),
        ({"temperature": 0.0}, "temperature"),
        ({"stay": 0.9, "jump": 0.2}, "stay \\+ jump"),
        ({"max_len": 0}, "max_len"),
        ({"batch_size": 0}, "batch_size"),
        ({"max_eval_users": 0}, "max_eval_users"),
        ({"num_users": 1.5}, "num_users"),
        ({"colour": 1}, "colour"),
    ],
)
def test_bad_arguments_name_the_argument(synthetic, kwargs, name):
    with pytest.raises(ValueError, match=name):
        synthetic(**kwargs)


@pytest.mark.parametrize("head", ["full", "sparse_uniform", "sparse_midx_rq"])
def test_config_fits_a_few_steps_on_a_small_catalogue(head, tmp_path):
    """``sasrec_synthetic-1m.yaml`` with its heads, shrunk to 1,000 items."""
    cli = synthetic_cli("sasrec_synthetic-1m.yaml", head, tmp_path, {**SMALL, "num_users": 40})
    assert cli.model.head.num_classes == 1_001
    assert cli.model.head.weight is cli.model.item_emb.weight
    assert cli.model.item_emb.sparse == (head != "full")
    cli.trainer.fit(cli.model, cli.datamodule)
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])
    assert torch.isfinite(cli.trainer.callback_metrics["val/ndcg@10"])
