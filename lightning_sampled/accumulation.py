"""Gradient accumulation normalised by the tokens of the whole window, as Hugging Face does.

Under gradient accumulation Hugging Face's ``Trainer`` (``transformers`` 4.46 and later) looks at
the ``accumulate_grad_batches`` micro-batches of an optimizer step before it runs them, counts the
tokens they score (``num_items_in_batch``: labels other than ``-100`` after the causal shift) and
divides each micro-batch's *summed* loss by that count, so that the step's gradient is that of the
mean over the window's tokens, however they are spread over the micro-batches. Lightning instead
divides each micro-batch's loss (a mean over its own tokens) by ``accumulate_grad_batches``,
which weighs a token of a short micro-batch more.

:class:`WindowTokenCounts` wraps a training loader and adds ``num_items_in_batch`` to each batch;
the training step then returns ``head(z, y, reduction="sum") * accumulate_grad_batches /
batch["num_items_in_batch"]`` (Lightning's division by ``accumulate_grad_batches`` cancels the
factor), and its accumulated gradients are Hugging Face's (``tests/test_hf_causal_lm.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from ._validation import check_int, check_positive_int


class WindowTokenCounts:
    """A training loader whose batches carry ``num_items_in_batch``: the number of tokens that
    the ``accumulate_grad_batches`` batches of their accumulation window score (module
    docstring).

    The windows are the loader's batches taken ``accumulate_grad_batches`` at a time from the
    start of each epoch, as Lightning steps the optimizer (the last window of an epoch may be
    shorter; Lightning steps after it too). A token is scored when its label, shifted as a causal
    LM shifts it (``labels[..., 1:]``, ``shift=True``) or as it is (``shift=False``), is not
    ``ignore_index``. The window's batches are read ahead, so it holds ``accumulate_grad_batches``
    batches at a time.

    Args:
        loader: an iterable of dict batches holding ``labels`` (long ``[B, L]``), e.g. a
            ``DataLoader``; its ``len`` is passed on when it has one.
        accumulate_grad_batches: the Trainer's ``accumulate_grad_batches``.
        labels: the key of the labels in each batch.
        ignore_index: the label of positions that are not scored.
        shift: count ``labels[..., 1:]`` (causal LM; position ``t`` predicts token ``t + 1``),
            else every label.
    """

    def __init__(
        self,
        loader: Iterable[Mapping[str, Any]],
        accumulate_grad_batches: int,
        *,
        labels: str = "labels",
        ignore_index: int = -100,
        shift: bool = True,
    ) -> None:
        self.loader = loader
        self.accumulate_grad_batches = check_positive_int(
            "accumulate_grad_batches", accumulate_grad_batches
        )
        self.labels = labels
        self.ignore_index = check_int("ignore_index", ignore_index)
        if not isinstance(shift, bool):
            raise ValueError(f"shift must be a bool, got {shift!r}")
        self.shift = shift

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        window: list[Mapping[str, Any]] = []
        for batch in self.loader:
            window.append(batch)
            if len(window) == self.accumulate_grad_batches:
                yield from self._stamped(window)
                window = []
        yield from self._stamped(window)

    def count(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The tokens ``batch`` scores, a long scalar."""
        if not isinstance(batch, Mapping) or self.labels not in batch:
            raise ValueError(f"each batch must be a dict holding {self.labels!r}")
        labels = batch[self.labels]
        if self.shift:
            labels = labels[..., 1:]
        return (labels != self.ignore_index).sum()

    def _stamped(self, window: list[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
        """The window's batches, each with the window's ``num_items_in_batch``."""
        if not window:
            return
        total = sum(self.count(batch) for batch in window)
        for batch in window:
            yield {**batch, "num_items_in_batch": total.clone()}
