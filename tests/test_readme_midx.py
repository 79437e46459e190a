"""The README's MIDX + ``IndexRefresh`` example runs as written, and what its text claims holds."""

import re
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
SECTION = "### Adaptive negatives: MIDX and `IndexRefresh`"


def midx_example() -> dict:
    """Runs the Python block of the README's MIDX section; returns its namespace."""
    section = (ROOT / "README.md").read_text().split(SECTION, 1)[1]
    namespace: dict = {}
    exec(re.search(r"```python\n(.*?)```", section, re.S).group(1), namespace)  # noqa: S102
    return namespace


def fit(model: L.LightningModule, callbacks: list, tmp_path: Path) -> L.Trainer:
    history = torch.randint(0, 300, (48, 6), generator=torch.Generator().manual_seed(0))
    batches = [{"history": h, "target": h.roll(-1, dims=1)} for h in history.split(16)]
    model.train_dataloader = lambda: DataLoader(batches, batch_size=None)
    trainer = L.Trainer(
        max_epochs=2,
        callbacks=callbacks,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model)
    return trainer


def test_example_trains_with_the_index_refreshed(tmp_path: Path) -> None:
    example = midx_example()
    assert any(isinstance(c, example["IndexRefresh"]) for c in example["trainer"].callbacks)
    torch.manual_seed(0)
    model = example["MIDXRecommender"](num_items=300, dim=8)
    assert not model.head.sampler.is_built and model.head.weight is model.items.weight
    callback = example["IndexRefresh"]()
    fit(model, [callback], tmp_path)
    assert model.head.sampler.is_built
    assert callback.num_refreshes == 2  # before the first batch, then at the second epoch

    # a checkpoint's state restores the index: a fresh model samples without a refresh
    restored = example["MIDXRecommender"](num_items=300, dim=8)
    restored.load_state_dict(model.state_dict())
    assert restored.head.sampler.is_built
    z = torch.randn(4, 8)
    assert torch.isfinite(restored.head(z, torch.tensor([1, 2, 3, 4])))


def test_without_the_callback_training_stops_naming_it(tmp_path: Path) -> None:
    example = midx_example()
    model = example["MIDXRecommender"](num_items=300, dim=8)
    z = torch.randn(3, 8)
    model.head.topk(z, 5)  # evaluation is exact: no index needed
    with pytest.raises(RuntimeError, match="MIDXSampler has no index yet.*IndexRefresh"):
        fit(model, [], tmp_path)
    model.head.refresh_index()  # outside a Trainer
    assert torch.isfinite(model.head(z, torch.tensor([1, 2, 3])))


def test_recipe_midx_head_configs_append_the_callback() -> None:
    configs = sorted((ROOT / "recipes" / "configs" / "heads").glob("*midx_*.yaml"))
    assert len(configs) >= 3
    for path in configs:
        callbacks = yaml.safe_load(path.read_text())["trainer"]["callbacks+"]
        paths = [c["class_path"] for c in callbacks]
        assert paths == ["lightning_sampled.callbacks.IndexRefresh"], path.name
        # MIDX-Learn's codewords move every step, so its classes are reassigned every step
        schedule = callbacks[0].get("init_args", {})
        learnable = yaml.safe_load(path.read_text())["model"]["init_args"]["sampler"]
        if learnable["init_args"].get("learnable"):
            assert schedule == {
                "every_n_train_steps": 1,
                "every_n_epochs": None,
                "doubling_steps": None,
            }, path.name
        else:
            assert schedule == {}, path.name
