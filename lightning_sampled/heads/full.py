"""``FullSoftmaxHead``: exact cross-entropy with O(batch x chunk) memory."""

from __future__ import annotations

from torch import Tensor

from .base import OutputHead


class FullSoftmaxHead(OutputHead):
    """Exact softmax cross-entropy over all ``N`` classes, computed in class chunks.

    Equal to ``F.cross_entropy(z @ W.T + b, target, ignore_index=...)`` in value and gradients, but
    neither its forward nor its backward holds the ``[T, N]`` logits: peak extra memory is
    ``[T, chunk_size]``. It costs one more ``[T, D] x [D, N]`` matmul than the plain version (the
    backward recomputes the logits). Arguments are those of :class:`OutputHead`.
    """

    def forward(self, z: Tensor, target: Tensor) -> Tensor:
        """Mean exact NLL of ``target`` ``[...]`` given ``z`` ``[..., D]``; a scalar."""
        return self.full_loss(z, target)
