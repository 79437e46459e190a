"""The README's large-catalog example runs as written, on a small catalog."""

import re
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from lightning_sampled.heads.table_init import seeded_rows

README = Path(__file__).resolve().parents[1] / "README.md"


def quiet_trainer(tmp_path, callback, **options) -> L.Trainer:
    """A two-epoch CPU trainer with ``callback``, no logger, checkpoints or progress bar."""
    return L.Trainer(
        callbacks=[callback],
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
        **options,
    )


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
    trainer = quiet_trainer(tmp_path, namespace["IndexRefresh"](), gradient_clip_val=1.0)
    trainer.fit(model)
    assert model.head.sampler.is_built
    assert sparse_steps and all(sparse_steps)  # the tied table's gradient was row-sparse
    changed = (model.items.weight.detach() != before).any(dim=1)
    assert 0 < int(changed.sum()) <= 500
    assert isinstance(trainer.optimizers[0], namespace["LazyAdam"])


def sharded_example() -> str:
    """The Python block of the README's "More classes than one device holds" section."""
    section = README.read_text().split("## More classes than one device holds", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_sharded_example_trains_in_one_process_holding_every_row(tmp_path):
    code = sharded_example().replace('devices=2, strategy="ddp"', 'devices=1, accelerator="cpu"')
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 (the README's own code)
    torch.manual_seed(0)
    model = namespace["ShardedRecommender"](num_items=300, dim=8)
    assert model.head.sharded and model.head.table_deferred  # rows created at setup
    history = torch.randint(1, 300, (32, 6))
    batches = [{"history": h, "target": h.roll(-1, dims=1)} for h in history.split(16)]
    model.train_dataloader = lambda: DataLoader(batches, batch_size=None)
    head = model.head
    before = seeded_rows(head.table_seed, head.num_classes, head.dim, torch.arange(300))
    trainer = namespace["trainer"]
    assert isinstance(trainer.callbacks[0], namespace["ShardedTables"])
    quiet_trainer(tmp_path, namespace["ShardedTables"]()).fit(model)
    assert not head.is_split and head.weight.shape == (300, 8)  # one process: every row
    assert (head.weight.detach() != before).any()
