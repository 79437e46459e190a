"""``FullSoftmaxHead``: exact cross-entropy with O(batch x chunk) memory."""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops.fused import fused_nll
from .base import OutputHead
from .exact_backends import check_exact_backend, handoff_nll, resolve_backend
from .sharded import agreed


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

    Args:
        backend: how the exact cross-entropy (``forward``, :meth:`full_loss`, :meth:`log_prob`)
            is computed, one of
            :data:`~lightning_sampled.heads.exact_backends.EXACT_BACKENDS`: ``"auto"`` (the
            fused Triton kernel for CUDA queries when Triton is installed, the chunked torch
            path otherwise), ``"torch"``, ``"triton"``, or a hand-off to an installed peer,
            ``"cut_cross_entropy"`` or ``"linear_cross_entropy"``, which support fewer options
            (:mod:`~lightning_sampled.heads.exact_backends` lists them, and which of them
            filter small gradients). ``ValueError`` where the backend cannot run here or
            does not support the head's options.
        **options: those of :class:`OutputHead`.
    """

    supports_label_smoothing = True
    sharding_refusal = None

    def __init__(self, num_classes: int, dim: int, *, backend: str = "auto", **options) -> None:
        super().__init__(num_classes, dim, **options)
        self.backend = check_exact_backend(
            backend,
            bias=self.bias is not None,
            padding_idx=self.padding_idx,
            normalize=self.normalize,
            label_smoothing=self.label_smoothing,
            sharded=self.sharded,
        )
        self._shard_if_distributed()

    @agreed()
    def forward(
        self,
        z: Tensor,
        target: Tensor,
        sample_weight: Tensor | None = None,
        *,
        reduction: str = "mean",
        positives: str | None = None,
    ) -> Tensor:
        """Exact (label-smoothed) cross-entropy of ``target`` ``[...]`` given ``z``
        ``[..., D]``, weighted by ``sample_weight`` ``[...]`` when given, reduced as
        :meth:`~OutputHead.full_loss` says: the mean by default, a scalar. With ``positives``
        (``target`` ``[..., P]``), :meth:`~OutputHead.exact_several_positives_loss`, without
        label smoothing."""
        if positives is not None:
            if self.label_smoothing:
                raise ValueError("label_smoothing does not combine with several positives")
            return self.exact_several_positives_loss(
                z, target, sample_weight, reduction=reduction, positives=positives
            )
        return self._exact_loss(z, target, sample_weight, self.label_smoothing, reduction=reduction)

    def _exact_losses(
        self, queries: Tensor, target: Tensor, label_smoothing: float = 0.0
    ) -> Tensor:
        backend = resolve_backend(self.backend, queries)
        if backend == "torch" or self.is_split:
            return super()._exact_losses(queries, target, label_smoothing)
        if backend == "triton":
            return fused_nll(
                queries,
                self.class_table(),
                self.bias,
                target,
                self.chunk_size,
                self.padding_idx,
                normalize=self.normalize,
                label_smoothing=label_smoothing,
            )
        return handoff_nll(backend, queries, self.class_table(), self.bias, target)

    def extra_repr(self) -> str:
        device = self.table_device
        shown = f"backend={self.backend!r}"
        if self.backend == "auto":
            probe = torch.empty(0, device=device)
            shown += f" ({resolve_backend('auto', probe)} on {device.type})"
        return f"{super().extra_repr()}, {shown}"
