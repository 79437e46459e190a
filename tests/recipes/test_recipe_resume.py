"""Training two epochs equals training one, then resuming from its checkpoint for one more."""

from pathlib import Path

from recipes.cli import main

CONFIGS = Path(__file__).parents[2] / "recipes" / "configs"


def fit(root: Path, epochs: int, ckpt_path: str | None = None) -> dict[str, float]:
    cli = main(
        [
            f"--config={CONFIGS / 'sasrec_ml-100k.yaml'}",
            f"--config={CONFIGS / 'heads' / 'uniform.yaml'}",
            "--data.init_args.max_users=30",
            "--data.init_args.max_len=20",
            "--data.init_args.batch_size=64",
            f"--trainer.max_epochs={epochs}",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={root}",
        ],
        run=False,
    )
    cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=ckpt_path)
    metrics = cli.trainer.callback_metrics
    return {k: v.item() for k, v in metrics.items() if k.startswith(("train/", "val/"))}


def test_resume_equals_uninterrupted(tmp_path):
    straight = fit(tmp_path / "straight", 2)
    fit(tmp_path / "first", 1)
    (ckpt,) = (tmp_path / "first").rglob("*.ckpt")
    resumed = fit(tmp_path / "resumed", 2, str(ckpt))
    assert set(straight) == {"train/loss", "val/ndcg@10", "val/recall@10"}
    assert resumed == straight
