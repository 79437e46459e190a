"""The README's large-catalog example runs as written, on a small catalog."""

import re
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

README = Path(__file__).resolve().parents[1] / "README.md"


def large_catalog_example() -> str:
    """The Python block of the README's "Large catalogs" section."""
    section = README.read_text().split("## Large catalogs", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_large_catalog_example_trains_on_the_sparse_path(tmp_path):
    namespace: dict = {}
    exec(large_catalog_example(), namespace)  # noqa: S102 (the README's own code)
    torch.manual_seed(0)
    model = namespace["LargeCatalogRecommender"](num_items=500, dim=8)
    history = torch.randint(0, 500, (64, 6))
    batches = [{"history": h, "target": h.roll(-1, dims=1)} for h in history.split(16)]
    model.train_dataloader = lambda: DataLoader(batches, batch_size=None)
    before = model.items.weight.detach().clone()
    sparse_steps = []
    model.items.weight.register_post_accumulate_grad_hook(
        lambda p: sparse_steps.append(p.grad.is_sparse)
    )
    assert isinstance(namespace["trainer"].callbacks[0], namespace["IndexRefresh"])
    trainer = L.Trainer(
        callbacks=[namespace["IndexRefresh"]()],
        gradient_clip_val=1.0,
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model)
    assert model.head.sampler.is_built
    assert sparse_steps and all(sparse_steps)  # the tied table's gradient was row-sparse
    changed = (model.items.weight.detach() != before).any(dim=1)
    assert 0 < int(changed.sum()) <= 500
    assert isinstance(trainer.optimizers[0], namespace["LazyAdam"])
