"""Trains ``test_exact_resume``'s classifier (uniform negatives, dropout, ``RNGCheckpoint``) on
two CPU processes under ``strategy="ddp"`` (gloo), optionally resumed from a checkpoint.

Run as a script (Lightning's DDP launcher re-runs it once per extra rank):
``python ddp_resume_train.py OUT_DIR [CKPT]``. Rank 0 writes ``OUT_DIR/final.pt``, the final
``state_dict``; the checkpoints of every ``EVERY`` steps go to ``OUT_DIR``. A failing rank
writes its traceback to ``rank<R>.err`` in the working directory.
"""

import os
import sys
import traceback
from pathlib import Path

import torch
from test_exact_resume import train

from lightning_sampled.callbacks import RNGCheckpoint


def main(out_dir: str, ckpt: str | None) -> None:
    state = train(Path(out_dir), "uniform", 0.5, [RNGCheckpoint()], ckpt, devices=2)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        torch.save(state, os.path.join(out_dir, "final.pt"))
    if torch.distributed.is_initialized():  # gloo's threads end here, not at interpreter exit
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
    except BaseException:
        Path(f"rank{os.environ.get('LOCAL_RANK', '0')}.err").write_text(traceback.format_exc())
        raise
