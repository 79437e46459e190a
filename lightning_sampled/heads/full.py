"""``FullSoftmaxHead``: exact cross-entropy with O(batch x chunk) memory."""

from __future__ import annotations

from torch import Tensor

from .base import OutputHead


class FullSoftmaxHead(OutputHead):
    """Exact softmax cross-entropy over all ``N`` classes, computed in class chunks.

    Equal to ``F.cross_entropy(z @ W.T + b, target, ignore_index=..., label_smoothing=...)`` in
    value and gradients, but neither its forward nor its backward holds the ``[T, N]`` logits:
    peak extra memory is ``[T, chunk_size]``. It costs one more ``[T, D] x [D, N]`` matmul than
    the plain version (the backward recomputes the logits). Arguments are those of
    :class:`OutputHead`.

    ``label_smoothing = eps`` puts ``1 - eps`` on the target and spreads ``eps`` uniformly over the
    classes *other than* ``padding_idx`` (``N - 1`` of them with a padding class, else ``N``):
    ``F.cross_entropy`` would spread it over all ``N`` columns, and the padding column's ``-inf``
    logit would make the loss infinite. With a padding class the loss thus equals
    ``F.cross_entropy`` on the logits without the padding column. Only the training objective
    (``forward``) is smoothed; :meth:`full_loss` and :meth:`log_prob` stay the exact NLL.
    """

    supports_label_smoothing = True

    def forward(self, z: Tensor, target: Tensor, sample_weight: Tensor | None = None) -> Tensor:
        """Mean exact (label-smoothed) cross-entropy of ``target`` ``[...]`` given ``z``
        ``[..., D]``, weighted by ``sample_weight`` ``[...]`` when given; a scalar."""
        return self._exact_loss(z, target, sample_weight, self.label_smoothing)
