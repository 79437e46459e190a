"""A run resumed from any checkpoint, at an epoch boundary or mid-epoch, ends exactly as the
uninterrupted run: same weights, same metrics; the resumable training loader behind it."""

import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import RandomSampler

from recipes.cli import main
from recipes.data.resumable import EpochOrder, ResumableLoader

CONFIGS = Path(__file__).parents[2] / "recipes" / "configs"
EPOCHS = 2


def fit(
    root: Path, ckpt_path: str | None = None, max_steps: int = -1
) -> tuple[dict[str, float], dict[str, torch.Tensor], int]:
    """Fits the small SASRec recipe for ``EPOCHS`` epochs (or ``max_steps`` steps), saving a
    checkpoint under ``root / "steps"`` at step ``max_steps``.

    Returns:
        ``(metrics, weights, batches per epoch)``.
    """
    cli = main(
        [
            f"--config={CONFIGS / 'sasrec_ml-100k.yaml'}",
            f"--config={CONFIGS / 'heads' / 'uniform.yaml'}",
            "--data.init_args.max_users=30",
            "--data.init_args.max_len=20",
            "--data.init_args.batch_size=16",
            "--model.init_args.lr=0.01",  # some hits within two epochs: the metrics compare
            # the convention these hits come with: under the default, corrected_all, this small
            # run's val/recall@10 is still 0 after two epochs
            "--model.init_args.head.init_args.convention=exact_positive",
            f"--trainer.max_epochs={EPOCHS}",
            f"--trainer.max_steps={max_steps}",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={root}",
        ],
        run=False,
    )
    if max_steps > 0:
        cli.trainer.callbacks.append(
            ModelCheckpoint(dirpath=root / "steps", every_n_train_steps=max_steps, save_top_k=-1)
        )
    cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=ckpt_path)
    metrics = cli.trainer.callback_metrics
    metrics = {k: v.item() for k, v in metrics.items() if k.startswith(("train/", "val/"))}
    return metrics, cli.model.state_dict(), cli.trainer.num_training_batches


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run, on one thread as every test of this folder (conftest.py: module
    fixtures run before its function-scoped one, and the thread count changes float sums)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["recipes"])
        patch.setenv("LIGHTNING_SAMPLED_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        yield fit(tmp_path_factory.mktemp("straight"))
    torch.set_num_threads(threads)


def assert_same_run(resumed, straight):
    metrics, weights, _ = resumed
    assert {"train/loss", "val/ndcg@10", "val/recall@10", "val/item_coverage@10"} <= set(metrics)
    assert metrics["val/recall@10"] > 0
    assert metrics == straight[0]
    for name, value in straight[1].items():
        if torch.is_tensor(value):
            assert torch.equal(weights[name], value), name
        else:  # a sampler's draw stream, {"seed", "draws"}: as far along as uninterrupted
            assert weights[name] == value, name


def test_resume_at_epoch_boundary_equals_uninterrupted(tmp_path, straight):
    first = tmp_path / "first"
    fit(first, max_steps=straight[2])
    (before_validation,) = (first / "steps").glob("*.ckpt")
    (last,) = first.rglob("last.ckpt")  # the recipe's own, saved after validation
    for ckpt in (before_validation, last):
        assert_same_run(fit(tmp_path / ckpt.stem, str(ckpt)), straight)


def test_resume_mid_epoch_equals_uninterrupted(tmp_path, straight):
    batches = straight[2]
    assert batches >= 4
    killed = tmp_path / "killed"
    fit(killed, max_steps=batches + batches // 2)  # stopped in the middle of epoch 2
    (ckpt,) = (killed / "steps").glob("*.ckpt")
    assert torch.load(ckpt, weights_only=True)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert_same_run(fit(tmp_path / "resumed", str(ckpt)), straight)


def test_recipe_configs_keep_the_last_checkpoint():
    for config in CONFIGS.glob("*.yaml"):
        text = config.read_text()
        if "ModelCheckpoint" in text:
            assert "save_last: true" in text, config.name


def batches_of(loader, count=None) -> list[list[int]]:
    """The first ``count`` batches (all when ``None``) of a new pass over ``loader``."""
    out = []
    for batch in loader:
        out.append(batch.tolist())
        if len(out) == count:
            break
    return out


def test_epoch_order_shuffles_as_random_sampler():
    torch.manual_seed(5)
    expected = list(RandomSampler(range(50)))
    torch.manual_seed(5)
    assert list(EpochOrder(50, shuffle=True)) == expected
    assert list(EpochOrder(5, shuffle=False)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("shuffle", [True, False])
def test_loader_resumed_twice_in_an_epoch_replays_the_rest_of_it(shuffle):
    data = torch.arange(23)
    torch.manual_seed(0)
    straight = ResumableLoader(data, batch_size=4, shuffle=shuffle)
    expected = batches_of(straight) + batches_of(straight)
    torch.manual_seed(0)
    first = ResumableLoader(data, batch_size=4, shuffle=shuffle)
    seen = batches_of(first, 2)
    second = ResumableLoader(data, batch_size=4, shuffle=shuffle)
    second.load_state_dict(first.state_dict())
    seen += batches_of(second, 3)
    third = ResumableLoader(data, batch_size=4, shuffle=shuffle)
    third.load_state_dict(second.state_dict())
    assert third.state_dict()["batches"] == 5
    seen += batches_of(third)
    assert third.state_dict()["batches"] == len(third) == 6
    seen += batches_of(third)  # the state at an epoch's end starts the next epoch afresh
    assert seen == expected


def test_loader_resume_leaves_the_global_generator_alone():
    data = torch.arange(10)
    loader = ResumableLoader(data, batch_size=2, shuffle=True)
    batches_of(loader, 2)
    resumed = ResumableLoader(data, batch_size=2, shuffle=True)
    resumed.load_state_dict(loader.state_dict())
    before = torch.get_rng_state()
    batches_of(resumed)
    assert torch.equal(torch.get_rng_state(), before)


def test_loader_rejects_states_it_cannot_resume():
    loader = ResumableLoader(torch.arange(10), batch_size=2)
    with pytest.raises(ValueError, match="batch 9 of an epoch, but this loader has 5"):
        loader.load_state_dict({"seed": 1, "batches": 9})
    foreign = ResumableLoader(torch.arange(10), batch_size=2, sampler=RandomSampler(range(10)))
    foreign.load_state_dict({"seed": 1, "batches": 5})  # an epoch's end: nothing to replay
    with pytest.raises(ValueError, match="cannot resume mid-epoch .* RandomSampler"):
        foreign.load_state_dict({"seed": 1, "batches": 2})
