"""A toy LightningModule whose class table is split across the ranks, and a script that trains it.

``ShardedToyModel``: ids ``[B, 2]`` (the target and a distractor) are looked up in the head's own
table (``head.embed``, the tied input embedding of a sharded head), mixed by a ``Linear`` layer,
and scored by a ``sharded=True`` head: the exact ``FullSoftmaxHead`` (``head="full"``) or a
``SampledSoftmaxHead`` with a MIDX proposal and row-sparse gradients (``head="midx"``, its index
refreshed every epoch by ``IndexRefresh``, its table stepped by ``LazyAdam``'s row-wise Adagrad).
One ``LazyAdam`` steps everything; ``ShardedTables``
splits the head when Lightning has started the process group.

Run as a script (Lightning's DDP launcher re-runs it once per extra rank):
``python ddp_sharded_train.py OUT_CKPT DEVICES EPOCHS HEAD [RESUME_CKPT]`` fits and saves a
checkpoint (the whole table, gathered by ``ShardedTables``) to ``OUT_CKPT``; on failure each rank
writes its error next to it (``OUT_CKPT.error{R}.txt``).
"""

from __future__ import annotations

import os
import sys
import traceback

import lightning as L
import torch
from ddp_sparse_train import NUM_CLASSES, InOrder, copy_task
from torch import nn

from lightning_sampled.callbacks import IndexRefresh, ShardedTables
from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead
from lightning_sampled.optim import LazyAdam
from lightning_sampled.samplers import MIDXSampler

DIM = 8


class ShardedToyModel(L.LightningModule):
    def __init__(self, head: str = "full", lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        if head == "full":
            self.head = FullSoftmaxHead(NUM_CLASSES, DIM, bias=True, sharded=True)
        else:
            sampler = MIDXSampler(NUM_CLASSES, codebook_size=4, dim=DIM)
            self.head = SampledSoftmaxHead(
                NUM_CLASSES, DIM, sampler, 8, sharded=True, sparse_grad=True
            )
        self.mix = nn.Linear(2 * DIM, DIM)

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mix(self.head.embed(ids).flatten(1))

    def training_step(self, batch, batch_idx):
        ids, target = batch
        loss = self.head(self.encode(ids), target)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        # the sampled head's row-sparse table takes the row-wise option (one number per row)
        lean = {} if self.hparams.head == "full" else {"table_state": "row_wise_adagrad"}
        return LazyAdam(self.parameters(), lr=self.hparams.lr, **lean)

    @torch.no_grad()
    def exact_loss(self) -> float:
        ids, target = copy_task().tensors
        return float(self.head.full_loss(self.encode(ids), target))


def fit(devices: int, epochs: int, head: str, resume: str | None = None) -> L.Trainer:
    """Seeds, builds and fits the model on ``copy_task()`` in order, 32 rows per step over all
    ``devices``; returns the trainer (its model in ``trainer.lightning_module``)."""
    L.seed_everything(0, verbose=False)
    model = ShardedToyModel(head)
    callbacks = [ShardedTables()] + ([IndexRefresh(every_n_epochs=1)] if head != "full" else [])
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        use_distributed_sampler=False,
        callbacks=callbacks,
    )
    trainer.fit(model, InOrder(32 // devices), ckpt_path=resume)
    return trainer


def check_live_state_keeps_its_rows(trainer: L.Trainer) -> None:
    """Saving gathers the whole table's optimizer rows into the checkpoint, never into the
    optimizer's own state (which a later save or step would then misread)."""
    weight = trainer.lightning_module.head.weight
    for name, value in trainer.optimizers[0].state[weight].items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            if value.shape[0] != weight.shape[0]:
                raise AssertionError(
                    f"after a save the optimizer state {name} has {value.shape[0]} rows, its "
                    f"parameter {weight.shape[0]}"
                )


def main(out: str, devices: int, epochs: int, head: str, resume: str | None) -> None:
    rank = int(os.environ.get("LOCAL_RANK", 0))
    try:
        trainer = fit(devices, epochs, head, resume)
        trainer.save_checkpoint(out)
        check_live_state_keeps_its_rows(trainer)
    except Exception:
        with open(f"{out}.error{rank}.txt", "w") as f:
            f.write(traceback.format_exc())
        raise
    if torch.distributed.is_initialized():  # gloo's threads end here, not at interpreter exit
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4],
        sys.argv[5] if len(sys.argv) > 5 else None,
    )
