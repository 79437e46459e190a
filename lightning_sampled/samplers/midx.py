"""``MIDXSampler``: the inverted multi-index proposal of the MIDX paper (Sections 4.1-4.3, 6.2.3).

The class table ``[N, D]`` is quantised with two codebooks of ``K`` codewords (PQ or RQ, see
:mod:`lightning_sampled.index.quantizers`); every class falls in a cell ``(k1, k2)`` of the
``K x K`` grid and ``q_i = c1[k1] (+) c2[k2] + r_i`` with a residual ``r_i``. Writing
``s1 = z1 . c1`` and ``s2 = z2 . c2`` for the codeword logits of a query:

- ``mode="fast"`` (Theorem 2, Eq. 6): draw ``k1 ~ P1``, ``k2 ~ P2(. | k1)`` with cell weights
  ``|Omega_{k1,k2}|``, then a class uniformly from the cell. The proposal is
  ``Q(i | z) = exp(o_i - r~_i) / sum_j exp(o_j - r~_j)`` with ``r~_i = z . r_i``; ``M`` draws
  cost ``O(K D + K^2 + min(M, K) K + M log K)`` per query, independent of ``N`` (the second
  stage builds only the rows ``P2(. | k1)`` of the first codewords drawn:
  :mod:`~lightning_sampled.samplers.conditional_draw`).
- ``mode="exact"`` (Theorem 1, Eqs. 2-5): the cell weights are ``omega = sum_{j in cell}
  exp(z . r_j)`` and the class is drawn from the residual softmax inside the cell; the proposal is
  then exactly the full softmax ``softmax(z . q)``. It costs ``O(N D)`` per query and exists to
  verify the decomposition and for diagnostics; it keeps a copy of the class table from the last
  refresh.
- ``learnable=True`` (MIDX-Learn, Section 6.2.3): the codewords are an ``nn.Parameter`` trained by
  :meth:`MIDXSampler.auxiliary_loss`; see there.

Both modes report the normalised ``log_q`` of any id through :meth:`Sampler.log_prob`. The padding
class is left out of the index (probability 0); empty cells, and codewords without any class, have
weight 0, so they are never drawn, on any class table (an all-zero one included). ``log_q`` is
formed from per-query shifted codeword logits (:class:`CodewordLogits`), so it stays normalised
for queries of any finite size; one whose logits overflow fp32 in both directions is an error.

The index is built by :meth:`MIDXSampler.refresh` (``SampledSoftmaxHead.refresh_index()``, which
the ``IndexRefresh`` callback calls before the first training batch and then on schedule). Using
the sampler before its first refresh raises ``RuntimeError``: it never builds an index on its own,
since it has no access to the class table. All index state is in registered buffers (whose sizes
are set at the first refresh and restored from checkpoints), so a checkpoint restores sampling
bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .._validation import check_positive_int
from ..index import Quantizer, build_cells, cell_of, check_norms, make_quantizer
from ..kernels.codeword_logits import (
    CodewordLogits,
    codeword_logits,
    codeword_logits_reference,
    codeword_weights,
)
from .base import Sample, Sampler, lookup, skip_padding
from .conditional_draw import draw_from_used_rows

_MODES = ("fast", "exact")
_ENCODERS = ("soft", "hard")
_RESIZABLE = ("codewords", "class_embeddings")
_MSE_ROWS = 1 << 12  # the logged quantisation error is measured on about this many classes

# A batch's proposal: codeword logits, cell log-weights and (exact mode) residual logits.
Stage = tuple[CodewordLogits, Tensor, Tensor | None]


class MIDXSampler(Sampler):
    """Adaptive proposal from a two-codebook inverted multi-index (MIDX).

    Args:
        num_classes: ``N``.
        codebook_size: ``K``, codewords per codebook, ``2 <= K <= N`` (``N - 1`` with padding).
        quantizer: ``"rq"`` (residual) or ``"pq"`` (product; the embedding size must be even).
        mode: ``"fast"`` (Eq. 6, uniform inside a cell) or ``"exact"`` (Eqs. 2-5, full softmax).
        learnable: MIDX-Learn: the codewords are a parameter trained by :meth:`auxiliary_loss`,
            initialised by k-means at the first refresh; later refreshes only reassign classes
            to cells with the learned codewords. The codewords move at every optimizer step, so
            refresh every step or every few (``IndexRefresh(every_n_train_steps=...)``; it warns
            without a step interval).
        dim: ``D``, the embedding size; required when ``learnable`` (the codewords are created
            here so that an optimizer can hold them), optional otherwise (checked at refresh).
        padding_idx: a class that is never drawn.
        kmeans_iters: Lloyd iterations per codebook at each refresh.
        seed: seed of k-means; the ``r``-th refresh uses ``seed + 2 r`` and ``seed + 2 r + 1``.
        kl_num_classes: MIDX-Learn: classes drawn uniformly (with replacement) per step for the
            auxiliary loss; ``None`` uses all ``N`` classes (the paper's choice, ``O(N D)`` per
            step).
        kl_chunk_size: MIDX-Learn: classes per chunk of the auxiliary loss (memory
            ``O(queries x kl_chunk_size)``, chunks recomputed in backward).
        reconstruction_weight: MIDX-Learn: weight of the reconstruction loss.
        kl_weight: MIDX-Learn: weight of the KL loss.
        kl_num_queries: MIDX-Learn: queries of the step drawn (without replacement) for the
            auxiliary loss; ``None`` uses them all.
        encoder: MIDX-Learn: how the auxiliary loss encodes a class (see :meth:`auxiliary_loss`):
            ``"hard"``, its codes (so ``p'`` is the proposal the sampler draws from), or
            ``"soft"``, the codeword weights ``softmax(q . c)`` of the paper's text.
    """

    query_independent = False

    def __init__(
        self,
        num_classes: int,
        codebook_size: int = 64,
        quantizer: str = "rq",
        mode: str = "fast",
        learnable: bool = False,
        *,
        dim: int | None = None,
        padding_idx: int | None = None,
        kmeans_iters: int = 25,
        seed: int = 0,
        kl_num_classes: int | None = 4096,
        kl_chunk_size: int = 8192,
        reconstruction_weight: float = 1.0,
        kl_weight: float = 1.0,
        kl_num_queries: int | None = 128,
        encoder: str = "hard",
    ) -> None:
        super().__init__(num_classes, padding_idx=padding_idx)
        check_positive_int("codebook_size", codebook_size)
        if not 2 <= codebook_size <= self.num_drawable:
            raise ValueError(
                f"codebook_size must be in [2, {self.num_drawable}] (the number of drawable "
                f"classes), got {codebook_size}"
            )
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {list(_MODES)}, got {mode!r}")
        if not isinstance(learnable, bool):
            raise ValueError(f"learnable must be a bool, got {learnable!r}")
        if dim is not None:
            check_positive_int("dim", dim)
        if learnable and dim is None:
            raise ValueError("learnable=True needs dim (the embedding size) to create codewords")
        if kl_num_classes is not None:
            check_positive_int("kl_num_classes", kl_num_classes)
        for name, weight in (
            ("reconstruction_weight", reconstruction_weight),
            ("kl_weight", kl_weight),
        ):
            if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {weight!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.quantizer: Quantizer = make_quantizer(quantizer, codebook_size)
        if dim is not None:
            self.quantizer.check_dim(dim)
        self.codebook_size = codebook_size
        self.mode = mode
        self.learnable = learnable
        self.dim = dim
        self.kmeans_iters = check_positive_int("kmeans_iters", kmeans_iters)
        self.seed = seed
        self.kl_num_classes = kl_num_classes
        self.kl_chunk_size = check_positive_int("kl_chunk_size", kl_chunk_size)
        self.reconstruction_weight = float(reconstruction_weight)
        self.kl_weight = float(kl_weight)
        if kl_num_queries is not None:
            check_positive_int("kl_num_queries", kl_num_queries)
        self.kl_num_queries = kl_num_queries
        if encoder not in _ENCODERS:
            raise ValueError(f"encoder must be one of {list(_ENCODERS)}, got {encoder!r}")
        self.encoder = encoder

        k, num_cells = codebook_size, codebook_size * codebook_size
        codeword_dim = 0 if dim is None else self.quantizer.codeword_dim(dim)
        codewords = torch.zeros(2, k, codeword_dim)
        if learnable:
            self.codewords = nn.Parameter(codewords)
        else:
            self.register_buffer("codewords", codewords)
        self.register_buffer("class_cells", torch.full((num_classes,), -1, dtype=torch.long))
        self.register_buffer("cell_counts", torch.zeros(num_cells, dtype=torch.long))
        self.register_buffer("cell_offsets", torch.zeros(num_cells + 1, dtype=torch.long))
        self.register_buffer("cell_members", torch.zeros(self.num_drawable, dtype=torch.long))
        self.register_buffer("quantization_mse", torch.tensor(math.nan))
        self.register_buffer("num_refreshes", torch.zeros((), dtype=torch.long))
        if mode == "exact":
            self.register_buffer("class_embeddings", torch.zeros(num_classes, 0))

    # -- index --------------------------------------------------------------------------------

    @property
    def is_built(self) -> bool:
        """Whether :meth:`refresh` has built an index (or a checkpoint restored one)."""
        return bool(self.num_refreshes > 0)

    @torch.no_grad()
    def refresh(self, class_embeddings: Tensor) -> None:
        """Rebuilds the index from the class table.

        K-means (through faiss, trained on a sample of at most 256 classes per codeword,
        warm-started from the current codewords; every class is then assigned) learns the
        codebooks, except in learnable mode after the first refresh, where the learned
        codewords are kept and classes are only reassigned to their nearest codewords; a
        learned codeword that no class takes (a dead codeword) is then moved onto the class
        its codebook reconstructs worst (:meth:`Quantizer.reassign`), so that MIDX-Learn's
        codebooks do not collapse. Then the ``K x K`` cell counts and the CSR layout of classes
        per cell are rebuilt.

        Args:
            class_embeddings: ``[N, D]`` class table (detached; any device and float dtype).

        Raises:
            ValueError: wrong shape, an odd ``D`` under PQ, NaN / infinite entries, or a row
                whose norm would overflow faiss' fp32 distances (beyond about 9.2e18).
        """
        x = self._check_class_table(class_embeddings)
        drawable = skip_padding(torch.arange(self.num_drawable, device=x.device), self.padding_idx)
        rows = x if self.padding_idx is None else x[drawable]
        if self.learnable and self.is_built:
            codebooks, codes = self.quantizer.reassign(rows, self.codewords)
        else:
            refresh = int(self.num_refreshes)
            init = self.codewords.detach() if self._codewords_match(x.shape[1]) else None
            codebooks, codes = self.quantizer.fit(
                rows, init=init, niter=self.kmeans_iters, seed=self.seed + 2 * refresh
            )
        self._set("codewords", codebooks)
        class_cells = torch.full((self.num_classes,), -1, dtype=torch.long, device=x.device)
        class_cells[drawable] = cell_of(codes, self.codebook_size)
        cells = build_cells(class_cells, self.codebook_size**2)
        self.class_cells.copy_(class_cells)
        self.cell_counts.copy_(cells.counts)
        self.cell_offsets.copy_(cells.offsets)
        self.cell_members.copy_(cells.members)
        every = max(1, rows.shape[0] // _MSE_ROWS)  # a diagnostic: evenly spaced rows suffice
        mse = self.quantizer.squared_error(rows[::every], codes[::every], codebooks)
        self.quantization_mse.fill_(mse.item())
        if self.mode == "exact":
            self._set("class_embeddings", x)
        self.num_refreshes += 1

    def index_stats(self) -> dict[str, float]:
        """Scalars worth logging after a refresh: ``quantization_mse`` (mean of
        ``||q_i - reconstruction_i||^2`` over about 4,096 evenly spaced indexed classes),
        ``nonempty_cells`` and ``max_cell_size``."""
        return {
            "quantization_mse": float(self.quantization_mse),
            "nonempty_cells": float((self.cell_counts > 0).sum()),
            "max_cell_size": float(self.cell_counts.max()),
        }

    def _check_class_table(self, class_embeddings: Tensor) -> Tensor:
        x = class_embeddings.detach()
        if x.dim() != 2 or x.shape[0] != self.num_classes or x.shape[1] == 0:
            raise ValueError(
                f"class_embeddings must have shape [num_classes={self.num_classes}, D], "
                f"got {tuple(x.shape)}"
            )
        if self.dim is not None and x.shape[1] != self.dim:
            raise ValueError(f"class_embeddings must have D = dim = {self.dim}, got {x.shape[1]}")
        self.quantizer.check_dim(x.shape[1])
        check_norms("MIDXSampler.refresh: class_embeddings", x)
        return x.float()

    def _codewords_match(self, dim: int) -> bool:
        return self.is_built and self.codewords.shape[-1] == self.quantizer.codeword_dim(dim)

    def _set(self, name: str, value: Tensor) -> None:
        """Copies ``value`` into buffer (or parameter) ``name``, resizing a buffer if needed."""
        current = getattr(self, name)
        if current.shape == value.shape:
            current.data.copy_(value)
        else:
            self._buffers[name] = value.to(device=current.device, dtype=current.dtype).clone()

    def _load_from_state_dict(
        self,
        state_dict: Mapping[str, Any],
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list,
        unexpected_keys: list,
        error_msgs: list,
    ) -> None:
        # Buffers sized at the first refresh take the checkpoint's size before loading.
        for name in _RESIZABLE:
            key = prefix + name
            current = self._buffers.get(name)
            if current is not None and key in state_dict and state_dict[key].shape != current.shape:
                self._buffers[name] = torch.empty(
                    state_dict[key].shape, dtype=current.dtype, device=current.device
                )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    # -- proposal -----------------------------------------------------------------------------

    def _check_ready(self, z: Tensor) -> None:
        if not self.is_built:
            raise RuntimeError(
                "MIDXSampler has no index yet: call refresh(class_embeddings) first (the "
                "IndexRefresh callback does it before the first training batch, or call "
                "SampledSoftmaxHead.refresh_index())"
            )
        dim = self.codewords.shape[-1] * (2 if self.quantizer.name == "pq" else 1)
        if z.shape[-1] != dim:
            raise ValueError(f"z must have {dim} features to match the index, got {z.shape[-1]}")

    def _log_counts(self) -> Tensor:
        """``log |Omega|`` ``[K, K]`` fp32, ``-inf`` for empty cells."""
        k = self.codebook_size
        return self.cell_counts.view(k, k).float().log()

    def _stage_logits(self, z: Tensor) -> Stage:
        """Codeword logits and cell log-weights of queries ``z`` ``[B, D]``.

        Returns:
            ``(logits, log_weights, residual_logits)``: :class:`CodewordLogits` of P1 / P2,
            cell log-weights ``[K, K]`` (fast: ``log |Omega|``) or ``[B, K, K]`` (exact:
            ``log omega``), and, in exact mode, the residual logits ``[B, N]`` (``-inf`` for the
            padding class), else ``None``.
        """
        z1, z2 = self.quantizer.query_parts(z)
        c1, c2 = self.codewords.detach().float()
        with torch.autocast(z.device.type, enabled=False):
            if self.mode == "fast":
                log_weights, residual_logits = self._log_counts(), None
                logits = codeword_logits(z1, z2, c1, c2, log_weights)
            else:
                residual_logits, log_weights = self._residual_terms(z)
                logits = codeword_logits_reference(z1, z2, c1, c2, log_weights)
        # Logits beyond fp32 are clamped, but a dot product whose terms overflow in both
        # directions is NaN: a clear error then (asynchronous on GPU), not a draw out of range.
        torch._assert_async(
            ~logits.log_p1.isnan().any(),
            "MIDXSampler: the proposal of some query is NaN: its logits z . c overflow fp32 "
            "(|z . c| beyond 3.4e38); scale the queries or the class table down",
        )
        return logits, log_weights, residual_logits

    def _residual_terms(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """Exact mode: residual logits ``[B, N]`` and ``log omega`` ``[B, K, K]`` (Eq. 5)."""
        k = self.codebook_size
        indexed = self.class_cells >= 0
        codes = torch.stack([self.class_cells // k, self.class_cells % k], dim=1).clamp(min=0)
        codebooks = self.codewords.detach().float()
        residuals = self.class_embeddings.float() - self.quantizer.decode(codes, codebooks)
        residual_logits = (z.float() @ residuals.T).masked_fill(~indexed, -math.inf)
        cells = self.class_cells.clamp(min=0).expand(z.shape[0], -1)
        cell_max = torch.full((z.shape[0], k * k), -math.inf, device=z.device)
        cell_max = cell_max.scatter_reduce(1, cells, residual_logits, "amax")
        safe_max = cell_max.nan_to_num(neginf=0.0)
        shifted = (residual_logits - safe_max.gather(1, cells)).exp()
        sums = torch.zeros_like(cell_max).scatter_add(1, cells, shifted)
        log_omega = sums.log() + safe_max
        return residual_logits, log_omega.view(-1, k, k)

    def _sample(
        self, z: Tensor, num_samples: int, shared: bool, generator: torch.Generator | None
    ) -> Sample:
        self._check_ready(z)
        return self._draw(self._stage_logits(z), z, num_samples, generator)

    def _log_prob(self, z: Tensor, ids: Tensor) -> Tensor:
        self._check_ready(z)
        return self._score(self._stage_logits(z), z, ids)

    def _sample_and_score(
        self,
        z: Tensor,
        num_samples: int,
        ids: Tensor,
        shared: bool,
        generator: torch.Generator | None,
    ) -> tuple[Sample, Tensor]:
        """The draw and the ids' ``log Q`` from one computation of the codeword logits."""
        self._check_ready(z)
        stage = self._stage_logits(z)
        return self._draw(stage, z, num_samples, generator), self._score(stage, z, ids)

    def _draw(
        self, stage: Stage, z: Tensor, num_samples: int, generator: torch.Generator | None
    ) -> Sample:
        """``num_samples`` draws per query ``z`` ``[B, D]`` from its :meth:`_stage_logits`."""
        logits, log_weights, residual_logits = stage
        batch, k = z.shape[0], self.codebook_size
        u = torch.rand(2, batch, num_samples, device=z.device, generator=generator)
        u_cell = torch.rand(
            batch, num_samples, device=z.device, generator=generator, dtype=torch.float64
        )
        k1 = _inverse_cdf(logits.log_p1.exp(), u[0])
        if residual_logits is None:
            # P2(k2 | k1) ∝ |Omega[k1, k2]| exp(s2[k2]): the fp64 weights of log_psi, so a row
            # whose weights all underflow has P1 = 0 and is never drawn
            weights = codeword_weights(logits.s2)
            k2 = draw_from_used_rows(self.cell_counts.view(k, k), weights, k1, u[1])
            ids = self._uniform_in_cell(k1 * k + k2, u_cell)
            log_q = _fast_log_q(logits, k1, k2)
        else:
            # P2(. | k1) up to its normaliser (the draw normalises each row); rows without a
            # class (log_psi = -inf) stay all zero instead of -inf - -inf = NaN.
            log_psi = logits.log_psi.nan_to_num(neginf=0.0)
            p2 = (log_weights + logits.s2[:, None, :] - log_psi[:, :, None]).exp()
            k2 = _inverse_cdf_in_row(p2, k1, u[1])
            ids = self._residual_softmax_in_cell(k1 * k + k2, u_cell, residual_logits, log_weights)
            log_q = self._log_prob_from(logits, log_weights, residual_logits, ids)
        return Sample(ids, log_q)

    def _uniform_in_cell(self, cell: Tensor, u: Tensor) -> Tensor:
        """A class drawn uniformly from each ``cell`` ``[B, M]`` with uniforms ``u`` (fp64)."""
        start = lookup(self.cell_offsets, cell)
        count = lookup(self.cell_counts, cell)
        offset = torch.minimum((u * count).long(), count - 1)
        return lookup(self.cell_members, start + offset)

    def _residual_softmax_in_cell(
        self, cell: Tensor, u: Tensor, residual_logits: Tensor, log_weights: Tensor
    ) -> Tensor:
        """Exact mode: a class drawn from ``P3(. | cell)`` (Eq. 5) for every draw ``[B, M]``."""
        batch = cell.shape[0]
        members = self.cell_members
        member_cells = self.class_cells[members].expand(batch, -1)
        log_p3 = (
            residual_logits[:, members].double()
            - log_weights.reshape(batch, -1).gather(1, member_cells).double()
        )
        # Each non-empty cell's P3 sums to one, so the running sum reaches (cells so far) at each
        # cell's end: fp64 keeps every cell's share exact enough for 4096 cells.
        cdf = torch.cumsum(log_p3.exp(), dim=1)
        start, end = self.cell_offsets[cell], self.cell_offsets[cell + 1]
        before = torch.where(start > 0, cdf.gather(1, (start - 1).clamp(min=0)), 0.0)
        mass = cdf.gather(1, end - 1) - before
        position = torch.searchsorted(cdf, before + u * mass, right=True)
        return members[torch.minimum(torch.maximum(position, start), end - 1)]

    def _score(self, stage: Stage, z: Tensor, ids: Tensor) -> Tensor:
        """``log Q`` ``[B, K]`` of ids ``[B, K]`` or ``[K]`` from the queries' stage logits."""
        ids = (ids.expand(z.shape[0], -1) if ids.dim() == 1 else ids).long()
        logits, log_weights, residual_logits = stage
        if residual_logits is None:
            k = self.codebook_size
            cells = self.class_cells[ids]
            k1, k2 = cells.clamp(min=0) // k, cells.clamp(min=0) % k
            return _fast_log_q(logits, k1, k2).masked_fill(cells < 0, -math.inf)
        return self._log_prob_from(logits, log_weights, residual_logits, ids)

    def _log_prob_from(
        self, logits: CodewordLogits, log_weights: Tensor, residual_logits: Tensor, ids: Tensor
    ) -> Tensor:
        """Exact mode: ``log P1(k1) + log P2(k2 | k1) + log P3(i | k1, k2)`` for ids ``[B, M]``."""
        k = self.codebook_size
        batch = ids.shape[0]
        cells = self.class_cells[ids]
        safe = cells.clamp(min=0)
        k1, k2 = safe // k, safe % k
        log_omega = log_weights.expand(batch, k, k).reshape(batch, -1).gather(1, safe)
        log_p1 = logits.log_p1.gather(1, k1)
        log_p2 = log_omega + logits.s2.gather(1, k2) - logits.log_psi.gather(1, k1)
        log_p3 = residual_logits.gather(1, ids) - log_omega
        return (log_p1 + log_p2 + log_p3).masked_fill(cells < 0, -math.inf)

    # -- MIDX-Learn -----------------------------------------------------------------------------

    def auxiliary_loss(
        self, z: Tensor, class_embeddings: Tensor, *, generator: torch.Generator | None = None
    ) -> Tensor:
        """MIDX-Learn's codeword objective: ``reconstruction_weight * L_recon + kl_weight * L_KL``.

        Add it to the training loss (e.g. ``loss = head(z, y) +
        head.sampler.auxiliary_loss(z, head.weight)``); only the codewords get gradients (``z``
        and the class table are detached). With ``learnable=False`` it is a constant ``0``, so
        the same line works for every sampler.

        Following Section 6.2.3, ``L_recon`` is the mean over classes of ``||q^_i - q_i||^2``
        (the paper sums over classes; a mean keeps the weight independent of ``N``) and ``L_KL =
        log sum_i p_i^2 / p'_i`` with ``p = softmax(z . q)`` and ``p' = softmax(z . q^)``, as the
        paper writes it (an order-2 Renyi divergence, an upper bound of ``KL(p || p')``),
        averaged over queries. The encoding ``q^_i`` of a class:

        - ``encoder="hard"`` (default): ``q^_i`` is the reconstruction of the class's codes under
          the current codewords (nearest codewords, as a refresh assigns them), differentiable in
          the codewords through that reconstruction. After a refresh with these codewords,
          ``p'`` is exactly the fast-mode proposal ``Q(. | z)`` (Eq. 6), so ``L_KL`` is the
          divergence of the proposal the sampler draws from.
        - ``encoder="soft"``: the paper's text, ``q^_i = sum_k w_k c_k`` with ``w =
          softmax(q_i . c)`` per codebook (RQ: the second codebook encodes ``q_i`` minus the
          first soft codeword). It trains a smoothed stand-in for the proposal, which the hard
          codes of the sampler then do not follow: on PTB (Table 4 setting, classes reassigned
          every step) it reached a validation perplexity of 255.8 after one epoch where the hard
          encoder reached 232.0 and k-means codebooks 229.2 (``recipes/RESULTS.md``).

        Cost: the paper computes both terms over all ``N`` classes and all queries every step
        (``O(B N D)``, as much as the full softmax). Here they are computed over
        ``kl_num_queries`` queries of the step and ``kl_num_classes`` classes drawn uniformly
        with replacement (``p`` and ``p'`` renormalised over that subset), ``O(S (Q + K) D)``
        per step; ``None`` for either uses them all. Classes go in chunks of ``kl_chunk_size``
        that are recomputed in backward, so memory stays ``O(Q x kl_chunk_size)``.

        Args:
            z: ``[..., D]`` queries of this step.
            class_embeddings: ``[N, D]`` class table (e.g. the head's ``weight``).
            generator: for the subsets of queries and classes.

        Returns:
            fp32 scalar.
        """
        if not self.learnable:
            return torch.zeros((), device=z.device)
        self._check_ready(z)
        queries = z.detach().reshape(-1, z.shape[-1]).float()
        if self.kl_num_queries is not None and self.kl_num_queries < queries.shape[0]:
            picked = torch.randperm(queries.shape[0], device=z.device, generator=generator)
            queries = queries[picked[: self.kl_num_queries]]
        table = class_embeddings.detach()
        if self.kl_num_classes is None or self.kl_num_classes >= self.num_drawable:
            ids = skip_padding(torch.arange(self.num_drawable, device=z.device), self.padding_idx)
        else:
            ranks = torch.randint(
                self.num_drawable, (self.kl_num_classes,), device=z.device, generator=generator
            )
            ids = skip_padding(ranks, self.padding_idx)
        partials = [
            checkpoint(
                self._auxiliary_chunk,
                queries,
                table[ids[start : start + self.kl_chunk_size]].float(),
                self.codewords,
                use_reentrant=False,
            )
            for start in range(0, ids.numel(), self.kl_chunk_size)
        ]
        sums = torch.stack([p[0] for p in partials]).sum(0)
        lse = torch.logsumexp(torch.stack([p[1] for p in partials]), dim=0)
        reconstruction = sums / ids.numel()
        # lse[:, 0] = lse(2 o - o^), lse[:, 1] = lse(o), lse[:, 2] = lse(o^)
        divergence = (lse[:, 0] - 2.0 * lse[:, 1] + lse[:, 2]).mean()
        return self.reconstruction_weight * reconstruction + self.kl_weight * divergence

    def _auxiliary_chunk(
        self, queries: Tensor, rows: Tensor, codewords: Tensor
    ) -> tuple[Tensor, Tensor]:
        """One class chunk: summed reconstruction error and per-query log-sum-exps ``[B, 3]``."""
        if self.encoder == "soft":
            decoded = self.quantizer.soft_decode(rows, codewords)
        else:
            codes = self.quantizer.encode(rows, codewords.detach())
            decoded = self.quantizer.decode(codes, codewords)
        reconstruction = ((decoded - rows) ** 2).sum()
        o = queries @ rows.T
        o_hat = queries @ decoded.T
        lse = torch.stack(
            [
                torch.logsumexp(2.0 * o - o_hat, dim=1),
                torch.logsumexp(o, dim=1),
                torch.logsumexp(o_hat, dim=1),
            ],
            dim=1,
        )
        return reconstruction, lse

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, codebook_size={self.codebook_size}, "
            f"quantizer={self.quantizer.name!r}, mode={self.mode!r}, learnable={self.learnable}"
        )


def _fast_log_q(logits: CodewordLogits, k1: Tensor, k2: Tensor) -> Tensor:
    """Fast mode's ``log Q`` of a class in cell ``(k1, k2)`` (ids ``[B, M]``):
    ``log P1(k1) + log P2(k2 | k1) - log|Omega[k1, k2]| = log_p1[k1] + s2[k2] - log_psi[k1]``, in
    the shifted units of :class:`CodewordLogits` (no term of the size of the raw logits, which
    would leave ``log Q`` unnormalised in fp32 for huge queries), ``-inf`` in rows ``k1`` of
    probability ``0``."""
    log_psi = logits.log_psi.gather(1, k1)
    log_q = logits.log_p1.gather(1, k1) + logits.s2.gather(1, k2) - log_psi
    return log_q.masked_fill(log_psi == -math.inf, -math.inf)


def _cdf(probs: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Running sums of the rows ``probs`` ``[..., K]`` divided by their last entry, in ``dtype``.

    Each row then ends at exactly ``1.0`` (``x / x``), and rounding keeps the sums monotone, so
    ``searchsorted(cdf, u, right=True)`` with ``u`` in ``[0, 1)`` always lands on a positive
    entry: no draw falls past the table nor onto a zero-probability entry (an empty cell), which a
    table ending slightly below 1 in fp32 would allow without a clamp. All-zero rows (never
    searched) stay all zeros, which keeps shifted tables sorted.
    """
    cdf = torch.cumsum(probs, dim=-1, dtype=dtype)
    return cdf.div_(cdf[..., -1:].clamp_min(torch.finfo(dtype).tiny))


def _inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """Draws from the unnormalised rows ``probs`` ``[B, K]`` with uniforms ``u`` ``[B, S]``.

    Returns:
        long ``[B, S]`` indices in ``[0, K)`` with positive probability.
    """
    return torch.searchsorted(_cdf(probs), u, right=True)


def _inverse_cdf_in_row(probs: Tensor, rows: Tensor, u: Tensor) -> Tensor:
    """Draws a column of row ``rows`` of each query's table ``probs`` ``[B, K, K]`` (unnormalised).

    One search per draw without gathering a ``[B, S, K]`` table: the rows' normalised running
    sums, shifted by the row index, form one sorted fp64 sequence ``[B, K * K]`` per query (row
    ``r`` spans ``(r, r + 1]``), searched for ``rows + u``.

    Args:
        probs: ``[B, K, K]`` non-negative rows; the rows drawn must have positive sums.
        rows: long ``[B, S]`` the row of each draw.
        u: ``[B, S]`` uniforms in ``[0, 1)`` (fp32, so ``rows + u < rows + 1`` exactly in fp64).

    Returns:
        long ``[B, S]`` columns in ``[0, K)`` with positive probability.
    """
    batch, k, _ = probs.shape
    shift = torch.arange(k, device=probs.device, dtype=torch.float64)[:, None]
    table = _cdf(probs, torch.float64).add_(shift).reshape(batch, k * k)
    index = torch.searchsorted(table, rows.double() + u.double(), right=True)
    return index - rows * k
