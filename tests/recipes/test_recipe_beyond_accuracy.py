"""The sequential recipes log item coverage, Gini index and average popularity beside NDCG and
Recall, equal to RecBole's definitions over the model's own top-k lists."""

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from recipes.cli import main
from recipes.models import SASRec

CONFIGS = Path(__file__).parents[2] / "recipes" / "configs"
NAMES = ("ndcg", "recall", "item_coverage", "gini_index", "average_popularity")


def top_k_lists(model, loader, k: int) -> np.ndarray:
    """``[U, k]``: the model's top-k of every evaluation row, the recipe's exclusions applied."""
    model.eval()
    with torch.no_grad():
        tops = [
            model.head.topk(model.eval_queries(batch), k, exclude=batch.get("exclude"))[1]
            for batch in loader
        ]
    return torch.cat(tops).numpy()


def recbole_values(lists: np.ndarray, phi: list[int]) -> dict[str, float]:
    """Coverage, Gini and average popularity of full lists ``[U, k]`` over ``len(phi)`` items."""
    n = len(phi)
    counts = np.sort(np.bincount(lists.ravel(), minlength=n)).astype(np.float64)
    ranks = np.arange(1, n + 1)
    return {
        "item_coverage": len(Counter(lists.ravel().tolist())) / n,
        "gini_index": float(((2 * ranks - n - 1) * counts).sum() / (n * counts.sum())),
        "average_popularity": float(np.mean(np.asarray(phi)[lists].mean(axis=1))),
    }


def tiny_sasrec(tmp_path: Path, *extra: str):
    """The SASRec recipe with the uniform head on 30 MovieLens-100k users, fitted one epoch."""
    cli = main(
        [
            f"--config={CONFIGS / 'sasrec_ml-100k.yaml'}",
            f"--config={CONFIGS / 'heads' / 'uniform.yaml'}",
            "--data.init_args.max_users=30",
            "--data.init_args.max_len=20",
            "--trainer.max_epochs=1",
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.callbacks=[]",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={tmp_path}",
            *extra,
        ],
        run=False,
    )
    cli.trainer.fit(cli.model, cli.datamodule)
    return cli


def test_sasrec_logs_beyond_accuracy_metrics_at_validation_and_test(tmp_path: Path) -> None:
    cli = tiny_sasrec(tmp_path)
    val = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("val/")}
    assert set(val) == {f"val/{name}@10" for name in NAMES}
    cli.trainer.test(cli.model, cli.datamodule, verbose=False)
    test = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("test/")}
    assert set(test) == {f"test/{name}@10" for name in NAMES}

    phi = cli.datamodule.class_counts
    lists = top_k_lists(cli.model, cli.datamodule.test_dataloader(), 10)
    assert lists.shape == (30, 10)
    expected = recbole_values(lists, phi)
    for name, value in expected.items():
        assert test[f"test/{name}@10"] == pytest.approx(value, rel=1e-5), name
    assert 0 < expected["item_coverage"] < 1 and 0 < expected["gini_index"] < 1


def test_average_popularity_needs_class_counts() -> None:
    model = SASRec(num_classes=12, dim=8, num_blocks=1, max_len=5, top_k=3)
    assert sorted(model.metrics) == sorted(
        f"{stage}_{name}@3" for stage in ("val", "test") for name in NAMES[:4]
    )
    model = SASRec(num_classes=12, dim=8, num_blocks=1, max_len=5, top_k=3, class_counts=[1] * 12)
    assert "val_average_popularity@3" in model.metrics


def test_several_cutoffs_are_each_the_metrics_of_their_own_top_k(tmp_path: Path) -> None:
    cli = tiny_sasrec(tmp_path, "--model.init_args.top_k=[500,50]")  # 1,682 items: some hits
    assert cli.model.cutoffs == [50, 500] and cli.model.top_k == 500
    cli.trainer.test(cli.model, cli.datamodule, verbose=False)
    test = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("test/")}
    assert set(test) == {f"test/{name}@{k}" for name in NAMES for k in (50, 500)}
    loader = cli.datamodule.test_dataloader()
    targets = torch.cat([batch["target"] for batch in loader]).numpy()
    for k in (50, 500):
        lists = top_k_lists(cli.model, loader, k)
        hit_rank = [
            list(row).index(t) if t in row else None for row, t in zip(lists, targets, strict=True)
        ]
        recall = np.mean([rank is not None for rank in hit_rank])
        ndcg = np.mean([0.0 if rank is None else 1 / np.log2(rank + 2) for rank in hit_rank])
        assert test[f"test/recall@{k}"] == pytest.approx(recall, rel=1e-6)
        assert test[f"test/ndcg@{k}"] == pytest.approx(ndcg, rel=1e-6)
        for name, value in recbole_values(lists, cli.datamodule.class_counts).items():
            assert test[f"test/{name}@{k}"] == pytest.approx(value, rel=1e-5), (name, k)
    assert 0 < test["test/recall@50"] < test["test/recall@500"] < 1


@pytest.mark.parametrize("top_k", [[], [0, 10], [10, 5000], 2.5])
def test_bad_cutoffs_are_refused(top_k) -> None:
    with pytest.raises(ValueError, match="top_k"):
        SASRec(num_classes=12, dim=8, num_blocks=1, max_len=5, top_k=top_k)
