"""``OutputHead``: the class table and the exact methods every head shares."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import (
    check_class_ids,
    check_finite,
    check_int,
    check_padding_idx,
    check_positive_int,
)
from ..inference.adaptive_softmax import AdaptiveResult, AdaptiveSoftmax
from ..optim.sparse_checks import require_sparse_capable_optimizer, warn_if_dense
from .chunked import (
    chunk_logits,
    chunked_nll,
    chunked_topk,
    class_chunks,
    compute_dtype,
    in_compute_dtype,
    resolve_chunk_size,
)


class OutputHead(nn.Module):
    """Base of all heads: a class table ``[N, D]`` (owned or tied), an optional bias, and exact
    chunked scoring.

    Subclasses define ``forward(z, target)``, the scalar training objective (sampled for sampled
    heads). The exact methods below never hold more than ``[T, chunk_size]`` logits unless the
    caller asks for :meth:`logits`.

    Precision: ``z`` may come in any float dtype, under autocast or not, whatever the dtype of the
    class table. Every product of queries and class vectors runs in :func:`compute_dtype` of
    ``z``: the autocast dtype under autocast; otherwise fp32 for fp16 / bf16 ``z`` (both operands
    are cast up) and ``z``'s own dtype for fp32 / fp64. Logits, log-sum-exps and losses are fp32,
    and gradients reach ``z`` and the table in their own dtypes.

    Args:
        num_classes: ``N``.
        dim: ``D``, the size of the query vectors ``z``.
        weight: an existing ``[N, D]`` ``nn.Parameter`` to tie to (e.g. SASRec's item embedding);
            a new one is created when ``None``.
        bias: whether to learn a per-class bias.
        padding_idx: a class that is never sampled nor predicted (its logit is ``-inf``).
        ignore_index: target value of positions to skip.
        chunk_size: classes per chunk in the exact methods; by default as many as keep one
            ``[T, C]`` block of logits within 2^24 elements (64 MiB), at least 1024.
    """

    def __init__(
        self,
        num_classes: int,
        dim: int,
        *,
        weight: nn.Parameter | None = None,
        bias: bool = False,
        padding_idx: int | None = None,
        ignore_index: int = -100,
        chunk_size: int | None = None,
    ) -> None:
        super().__init__()
        self.num_classes = check_positive_int("num_classes", num_classes)
        self.dim = check_positive_int("dim", dim)
        self.padding_idx = check_padding_idx(padding_idx, num_classes)
        self.ignore_index = check_int("ignore_index", ignore_index)
        if 0 <= self.ignore_index < num_classes:
            raise ValueError(
                f"ignore_index must not be a valid class id in [0, {num_classes}), "
                f"got {ignore_index}; use padding_idx for a padding class"
            )
        self.chunk_size = (
            None if chunk_size is None else check_positive_int("chunk_size", chunk_size)
        )
        if weight is None:
            weight = nn.Parameter(torch.empty(num_classes, dim))
            nn.init.uniform_(weight, -1.0 / math.sqrt(dim), 1.0 / math.sqrt(dim))
        elif not isinstance(weight, nn.Parameter):
            raise ValueError(
                f"weight must be an nn.Parameter to tie to, got {type(weight).__name__}"
            )
        elif tuple(weight.shape) != (num_classes, dim):
            raise ValueError(
                f"weight must have shape ({num_classes}, {dim}), got {tuple(weight.shape)}"
            )
        self.weight = weight
        self.bias = nn.Parameter(torch.zeros(num_classes)) if bias else None
        self._sparse_grad = False

    @property
    def sparse_grad(self) -> bool:
        """Whether :meth:`class_rows` gives the class table a row-sparse gradient (sampled heads
        take it as an argument). Switching it on installs two checks: a warning naming the module
        when the table still receives a dense gradient (e.g. a tied ``nn.Embedding`` without
        ``sparse=True``), and an error at the first step of an optimizer that cannot take sparse
        gradients, naming :class:`~lightning_sampled.optim.LazyAdam`."""
        return self._sparse_grad

    @sparse_grad.setter
    def sparse_grad(self, value: bool) -> None:
        value = bool(value)
        if value and not self._sparse_grad:
            owner = type(self).__name__
            require_sparse_capable_optimizer(self.weight, owner)
            warn_if_dense(self.weight, owner)
        self._sparse_grad = value

    # -- input handling -------------------------------------------------------------------------

    def _check_z(self, z: Tensor) -> None:
        if not z.is_floating_point():
            raise ValueError(f"z must be a floating-point tensor, got dtype {z.dtype}")
        if z.dim() < 1 or z.shape[-1] != self.dim:
            raise ValueError(
                f"z must have shape [..., {self.dim}] to match the class table "
                f"[{self.num_classes}, {self.dim}], got {tuple(z.shape)}"
            )
        check_finite("z", z)

    def _check_k(self, k: int) -> None:
        check_positive_int("k", k)
        if k > self.num_classes:
            raise ValueError(f"k must be <= num_classes={self.num_classes}, got {k}")

    def _valid_rows(self, z: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Validates ``z`` ``[..., D]`` and ``target`` ``[...]`` and keeps the scored positions.

        Returns:
            ``(z_valid [T, D], target_valid [T], mask [...])`` where ``mask`` marks the positions
            whose target is not ``ignore_index``.
        """
        self._check_z(z)
        if tuple(target.shape) != tuple(z.shape[:-1]):
            raise ValueError(
                f"target must have shape {tuple(z.shape[:-1])} (z without its last dim), "
                f"got {tuple(target.shape)}"
            )
        check_class_ids(
            "target",
            target,
            self.num_classes,
            ignore_index=self.ignore_index,
            padding_idx=self.padding_idx,
        )
        mask = target != self.ignore_index
        return z[mask], target[mask].long(), mask

    def chunk_for(self, num_rows: int) -> int:
        """Classes per chunk when scoring ``num_rows`` queries (see ``chunk_size``)."""
        return resolve_chunk_size(self.chunk_size, num_rows, self.num_classes)

    def class_rows(self, ids: Tensor) -> tuple[Tensor, Tensor | None]:
        """Gathers class vectors ``[*ids.shape, D]`` and biases ``[*ids.shape]`` (or ``None``).

        The one place where heads read rows of the class table. ``F.embedding``'s backward
        accumulates the dense ``[N, D]`` gradient faster than indexing's ``index_put_``; with
        ``self.sparse_grad`` the table's gradient is a sparse COO tensor over the touched rows.
        """
        rows = F.embedding(ids, self.weight, sparse=self.sparse_grad)
        return rows, None if self.bias is None else self.bias[ids]

    def candidate_logits(self, z: Tensor, ids: Tensor) -> Tensor:
        """fp32 logits ``z . w_c + b_c`` of candidate classes, gathered through
        :meth:`class_rows`; the products run in :func:`compute_dtype` of ``z`` (class docstring).

        Args:
            z: ``[T, D]`` queries.
            ids: long ``[M]`` (the same candidates for every query) or ``[T, M]`` (per query).

        Returns:
            ``[T, M]`` fp32 logits.
        """
        rows, bias = self.class_rows(ids)
        z, rows = in_compute_dtype(z, rows)
        if ids.dim() == 1:
            logits = (z @ rows.T).float()
        else:
            logits = torch.bmm(rows, z[:, :, None]).squeeze(-1).float()
        return logits if bias is None else logits + bias.float()

    def target_and_candidate_logits(
        self, z: Tensor, target: Tensor, ids: Tensor
    ) -> tuple[Tensor, Tensor]:
        """fp32 logits of each query's target and of candidate classes, from one gather; the
        products run in :func:`compute_dtype` of ``z`` (class docstring).

        One :meth:`class_rows` call for both means one ``[N, D]`` gradient buffer in backward
        instead of two, which at large ``N`` is most of a sampled step's cost.

        Args:
            z: ``[T, D]`` queries.
            target: long ``[T]``.
            ids: long ``[M]`` (shared candidates) or ``[T, M]`` (per query).

        Returns:
            ``(target_logits [T], candidate_logits [T, M])``.
        """
        num_rows = target.shape[0]
        if ids.dim() == 1:
            rows, bias = self.class_rows(torch.cat([target, ids]))
            z, rows = in_compute_dtype(z, rows)
            pos = (z * rows[:num_rows]).sum(-1).float()
            neg = (z @ rows[num_rows:].T).float()
            if bias is not None:
                pos, neg = pos + bias[:num_rows].float(), neg + bias[num_rows:].float()
            return pos, neg
        both = self.candidate_logits(z, torch.cat([target[:, None], ids], dim=1))
        return both[:, 0], both[:, 1:]

    # -- exact methods ----------------------------------------------------------------------------

    def logits(self, z: Tensor) -> Tensor:
        """Exact fp32 logits ``[..., N]`` of queries ``z`` ``[..., D]`` (padding class ``-inf``).

        Materialises ``[..., N]``: prefer :meth:`topk` or :meth:`log_prob` at large ``N``.
        """
        self._check_z(z)
        flat = z.reshape(-1, self.dim)
        dtype = compute_dtype(flat)
        parts = [
            chunk_logits(flat, self.weight, self.bias, start, end, self.padding_idx, dtype)
            for start, end in class_chunks(self.num_classes, self.chunk_for(flat.shape[0]))
        ]
        return torch.cat(parts, dim=1).reshape(*z.shape[:-1], self.num_classes)

    def log_prob(self, z: Tensor, target: Tensor) -> Tensor:
        """Exact ``log softmax(z W^T + b)[target]``, fp32 ``[...]``, differentiable.

        Positions whose target is ``ignore_index`` get ``0``.
        """
        z_valid, y, mask = self._valid_rows(z, target)
        out = torch.zeros(target.shape, device=z.device, dtype=torch.float32)
        if y.numel():
            chunk = self.chunk_for(y.numel())
            nll = chunked_nll(z_valid, self.weight, self.bias, y, chunk, self.padding_idx)
            out = out.masked_scatter(mask, -nll)
        return out

    def full_loss(self, z: Tensor, target: Tensor) -> Tensor:
        """Mean exact negative log-likelihood over the positions not ``ignore_index``.

        Returns a differentiable scalar; ``0`` (still attached to the graph) if every position is
        ignored, where ``F.cross_entropy`` would return NaN.
        """
        z_valid, y, _ = self._valid_rows(z, target)
        if y.numel() == 0:
            return z.sum() * 0.0
        chunk = self.chunk_for(y.numel())
        nll = chunked_nll(z_valid, self.weight, self.bias, y, chunk, self.padding_idx)
        return nll.mean()

    @torch.no_grad()
    def topk(self, z: Tensor, k: int, exclude: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Exact top-``k`` classes of each query, in class chunks.

        Args:
            z: ``[..., D]`` queries.
            k: how many classes, ``1 <= k <= N``.
            exclude: optional long ``[..., E]`` class ids to skip for each query (e.g. a user's
                already-seen items); negative entries are padding and ignored.

        Returns:
            ``(values, indices)``: fp32 logits ``[..., k]`` and long class ids ``[..., k]`` in
            decreasing order. Fewer than ``k`` scorable classes leave ``-inf`` values at the end.
        """
        self._check_z(z)
        self._check_k(k)
        flat = z.reshape(-1, self.dim)
        if exclude is not None:
            if exclude.dim() < 1 or tuple(exclude.shape[:-1]) != tuple(z.shape[:-1]):
                raise ValueError(
                    f"exclude must have shape {tuple(z.shape[:-1])} + (E,), "
                    f"got {tuple(exclude.shape)}"
                )
            exclude = exclude.reshape(flat.shape[0], exclude.shape[-1])
            check_class_ids("exclude", exclude[exclude >= 0], self.num_classes)
            exclude = exclude.long()
        values, indices = chunked_topk(
            flat,
            self.weight,
            self.bias,
            k,
            self.chunk_for(flat.shape[0]),
            self.padding_idx,
            exclude,
        )
        return values.reshape(*z.shape[:-1], k), indices.reshape(*z.shape[:-1], k)

    @torch.no_grad()
    def adaptive_topk(
        self,
        z: Tensor,
        k: int = 1,
        *,
        eps: float = 0.3,
        delta: float = 0.1,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> AdaptiveResult:
        """Top-``k`` classes and probabilities by AdaptiveSoftmax, reading part of the table.

        With probability ``>= 1 - delta`` per query the classes are the exact top-``k`` of
        ``softmax((z W^T + b) / temperature)`` and each probability is within ``(1 +- eps)``.
        The bias is added exactly; ``padding_idx`` is never returned. The
        :class:`~lightning_sampled.inference.AdaptiveSoftmax` over this head's table is cached on
        the head (not in its state dict; it holds a transposed copy of the table, as much memory
        again) and rebuilt when the arguments or the table object change. For calibrated
        constants saved with the head, register an ``AdaptiveSoftmax`` (same ``weight``,
        ``bias``, ``padding_idx``) as a submodule, ``calibrate`` it and call its ``topk``.

        Args:
            z: ``[..., D]`` queries.
            k: how many classes, ``1 <= k <= N``.
            eps: multiplicative accuracy, in (0, 1).
            delta: failure probability per query, in (0, 1).
            temperature: softmax temperature, > 0.
            seed: seed of the Gumbel noise of this call (``None``: torch's global generator).

        Returns:
            ``AdaptiveResult(indices [..., k], probs [..., k], log_partition [...],
            samples_used [...])``.
        """
        self._check_z(z)
        self._check_k(k)
        key = (id(self.weight), id(self.bias), self.padding_idx, eps, delta, temperature)
        cached = self.__dict__.get("_adaptive_softmax")
        if cached is None or cached[0] != key:
            module = AdaptiveSoftmax(
                self.weight,
                temperature,
                eps,
                delta,
                bias=self.bias,
                padding_idx=self.padding_idx,
            )
            cached = self.__dict__["_adaptive_softmax"] = (key, module)
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.weight.device).manual_seed(seed)
        result = cached[1].topk(z.reshape(-1, self.dim), k, generator=generator)
        batch = z.shape[:-1]
        return AdaptiveResult(
            result.indices.reshape(*batch, k),
            result.probs.reshape(*batch, k),
            result.log_partition.reshape(batch),
            result.samples_used.reshape(batch),
        )

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, dim={self.dim}, bias={self.bias is not None}, "
            f"padding_idx={self.padding_idx}, ignore_index={self.ignore_index}"
        )
