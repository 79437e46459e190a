"""A toy LightningModule whose class table gets row-sparse gradients, and a script that trains it.

``SparseToyModel``: ids ``[B, 2]`` (the target and a distractor) are looked up in an
``nn.Embedding(sparse=True)`` tied to a ``SampledSoftmaxHead(sparse_grad=True)``, so both uses of
the table give it sparse COO gradients; a ``Linear`` layer gives the dense ones. One ``LazyAdam``
steps both, and ``configure_gradient_clipping`` clips with ``lightning_sampled.optim``'s
``clip_grad_norm_`` (``clip_override=False`` leaves Lightning's default, which cannot).

Run as a script (Lightning's DDP launcher re-runs it once per extra rank):
``python ddp_sparse_train.py OUT_DIR [DEVICES] [sparse|dense]``: ``sparse`` (default) lets DDP
reduce the table's gradient (gloo's sparse all-reduce), ``dense`` adds ``SparseGradSync`` (the
table out of DDP, its gradient averaged by dense collectives, as on NCCL). Every rank writes its
final weights to ``OUT_DIR/rank{R}.pt`` and, on failure, the error to ``OUT_DIR/error{R}.txt``.
"""

from __future__ import annotations

import os
import sys
import traceback

os.environ.setdefault("TRITON_INTERPRET", "1")

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

from lightning_sampled.callbacks import SparseGradSync  # noqa: E402
from lightning_sampled.heads import SampledSoftmaxHead  # noqa: E402
from lightning_sampled.optim import LazyAdam, clip_grad_norm_  # noqa: E402
from lightning_sampled.samplers import UniformSampler  # noqa: E402

NUM_CLASSES = 64
DIM = 8


def copy_task(num_rows: int = 256, seed: int = 1) -> TensorDataset:
    """``(ids [num_rows, 2], target [num_rows])``: ``ids[:, 0]`` is the target, ``ids[:, 1]`` a
    random distractor; targets are drawn from the first half of the classes only, so the table
    rows of the second half are touched by negatives and distractors alone."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(NUM_CLASSES // 2, (num_rows,), generator=g)
    distractor = torch.randint(NUM_CLASSES, (num_rows,), generator=g)
    return TensorDataset(torch.stack([target, distractor], dim=1), target)


class InOrder(L.LightningDataModule):
    """``copy_task()`` in order, rank ``r`` of ``W`` taking rows ``r, r + W, ...`` (Lightning's own
    distributed sampler always shuffles training data), so that batch ``k`` of all ranks together
    holds the rows of batch ``k`` of one process with a ``W`` times larger batch."""

    def __init__(self, batch_size: int):
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        sampler = DistributedSampler(
            copy_task(), self.trainer.world_size, self.trainer.global_rank, shuffle=False
        )
        return DataLoader(copy_task(), batch_size=self.batch_size, sampler=sampler)


class SparseToyModel(L.LightningModule):
    """Tied sparse embedding + ``Linear`` + sparse sampled head, trained by one ``LazyAdam``.

    Args:
        lr: LazyAdam's learning rate.
        num_negatives: ``M``.
        shared_negatives: one set of negatives per batch (makes a DDP run equal to one process
            on the concatenated batch, since every rank draws the same negatives: the sampler's
            ``rank_offset`` is off).
        clip_override: clip with ``lightning_sampled.optim.clip_grad_norm_`` (else Lightning's
            default ``torch.nn.utils.clip_grad_norm_``).
        weight_decay: LazyAdam's decoupled weight decay.
    """

    def __init__(
        self,
        lr: float = 0.05,
        num_negatives: int = 8,
        shared_negatives: bool = False,
        clip_override: bool = True,
        weight_decay: float = 0.0,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.embedding = nn.Embedding(NUM_CLASSES, DIM, sparse=True)
        self.mix = nn.Linear(2 * DIM, DIM)
        self.head = SampledSoftmaxHead(
            NUM_CLASSES,
            DIM,
            UniformSampler(NUM_CLASSES),
            num_negatives,
            shared_negatives=shared_negatives,
            sparse_grad=True,
            weight=self.embedding.weight,
            # two ranks' in-batch negatives would be two half batches, not the one process's
            # whole batch that the two-process tests compare with
            in_batch_negatives=False,
        )
        # every rank draws the shared negatives one process would (not its own stream)
        self.head.sampler.rank_offset = False
        self.grad_layouts: list[torch.layout] = []  # the table's grad layout at each step
        self.clip_norms: list[tuple[float, float]] = []  # (before, after) our clipping

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mix(self.embedding(ids).flatten(1))

    def training_step(self, batch, batch_idx):
        ids, target = batch
        loss = self.head(self.encode(ids), target)
        self.log("train/loss", loss)
        return loss

    def on_before_optimizer_step(self, optimizer):
        self.grad_layouts.append(self.head.weight.grad.layout)

    def configure_optimizers(self):
        return LazyAdam(
            self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay
        )

    def configure_gradient_clipping(
        self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ):
        if not self.hparams.clip_override:
            return super().configure_gradient_clipping(
                optimizer, gradient_clip_val, gradient_clip_algorithm
            )
        before = clip_grad_norm_(self.parameters(), gradient_clip_val)
        after = clip_grad_norm_(self.parameters(), 1e30)  # measures, clips nothing
        self.clip_norms.append((float(before), float(after)))

    @torch.no_grad()
    def exact_loss(self, data: TensorDataset) -> float:
        """Mean exact NLL over ``data`` (the head's full softmax, not sampled)."""
        ids, target = data.tensors
        return float(self.head.full_loss(self.encode(ids), target))


def make_trainer(max_epochs: int, devices: int = 1, **kwargs) -> L.Trainer:
    """A quiet CPU trainer stepping every 2 batches with norm clipping at 0.5."""
    return L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=max_epochs,
        accumulate_grad_batches=2,
        gradient_clip_val=0.5,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **{"enable_checkpointing": False, **kwargs},
    )


def fit(
    devices: int, batch_size: int, max_epochs: int = 2, dense_collectives: bool = False
) -> SparseToyModel:
    """Seeds, builds and fits the model with shared negatives (from the sampler's own draw
    stream, seeded when the model is built, so that they do not depend on what else consumed
    torch's global generator) on ``copy_task()`` in order (``devices`` processes,
    ``batch_size`` rows each), with ``SparseGradSync`` where ``dense_collectives``."""
    L.seed_everything(0, verbose=False)
    model = SparseToyModel(shared_negatives=True)
    callbacks = [SparseGradSync()] if dense_collectives else []
    trainer = make_trainer(max_epochs, devices, use_distributed_sampler=False, callbacks=callbacks)
    trainer.fit(model, InOrder(batch_size))
    return model


def main(out_dir: str, devices: int, reduction: str = "sparse") -> None:
    rank = int(os.environ.get("LOCAL_RANK", 0))
    try:
        model = fit(devices, batch_size=32 // devices, dense_collectives=reduction == "dense")
    except Exception:
        with open(os.path.join(out_dir, f"error{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    ignored = list(getattr(model, "_ddp_params_and_buffers_to_ignore", []))
    torch.save(
        {
            "state_dict": model.state_dict(),
            "layouts": [str(x) for x in model.grad_layouts],
            "ignored_by_ddp": ignored,
        },
        os.path.join(out_dir, f"rank{rank}.pt"),
    )
    if torch.distributed.is_initialized():  # gloo's threads end here, not at interpreter exit
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(
        sys.argv[1],
        int(sys.argv[2]) if len(sys.argv) > 2 else 2,
        sys.argv[3] if len(sys.argv) > 3 else "sparse",
    )
