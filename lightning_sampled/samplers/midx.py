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
  :mod:`~lightning_sampled.samplers.conditional_draw`). Implemented in
  :mod:`~lightning_sampled.samplers.midx_fast`.
- ``mode="exact"`` (Theorem 1, Eqs. 2-5): the cell weights are ``omega = sum_{j in cell}
  exp(z . r_j)`` and the class is drawn from the residual softmax inside the cell; the proposal is
  then exactly the full softmax ``softmax(z . q)``. It costs ``O(N D)`` per query and exists to
  verify the decomposition and for diagnostics; it keeps a copy of the class table from the last
  refresh. Implemented in :mod:`~lightning_sampled.samplers.midx_exact`.
- ``learnable=True`` (MIDX-Learn, Section 6.2.3): the codewords are an ``nn.Parameter`` trained by
  :meth:`MIDXSampler.auxiliary_loss` (its terms: :mod:`~lightning_sampled.samplers.midx_learn`).

This module holds the sampler itself: its arguments, the index buffers and their refresh and
checkpointing, the codeword logits of a batch (through the ``backend`` the sampler names), and
the first stage's draw, which both modes share.

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

from .._class_ids import skip_padding
from .._random import rand
from .._validation import check_class_ids, check_positive_int
from ..index import Cells, Quantizer, build_cells, cell_of, check_norms, make_quantizer
from ..kernels.codeword_logits import CodewordLogits, check_backend, codeword_logits
from .base import Sample, Sampler
from .inverse_cdf import inverse_cdf
from .midx_exact import draw_exact, residual_terms, score_exact
from .midx_fast import draw_fast, log_cell_sizes, score_fast
from .midx_learn import ENCODERS, codeword_objective, pick_classes, pick_queries

_MODES = ("fast", "exact")
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
        backend: the implementation of the codeword logits (``s1``, ``s2``, ``log_psi``: see
            :mod:`lightning_sampled.kernels.codeword_logits`), one of ``"auto"``, ``"torch"``
            and ``"triton"``. ``"auto"`` (default): the Triton kernel when Triton is installed
            and the queries are on CUDA, else the plain-torch reference (the fallback: CPU
            tensors, no Triton, and exact mode, whose per-query cell weights the kernel does not
            take). ``"torch"``: always the reference. ``"triton"``: always the kernel (fast mode
            only); the first draw raises ``RuntimeError`` without Triton, or on CPU tensors
            unless this process imported Triton under ``TRITON_INTERPRET=1``. Both give the
            same proposal up to fp32 rounding.
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
        backend: str = "auto",
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
        if encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {list(ENCODERS)}, got {encoder!r}")
        self.encoder = encoder
        self.backend = check_backend(backend)
        if backend == "triton" and mode == "exact":
            raise ValueError(
                "backend='triton' needs mode='fast': the kernel takes one table of cell sizes, "
                "not the exact mode's per-query cell weights; use backend='auto' or 'torch'"
            )

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
        self._built = False  # num_refreshes > 0 once seen: is_built without a host sync
        if mode == "exact":
            self.register_buffer("class_embeddings", torch.zeros(num_classes, 0))

    # -- index --------------------------------------------------------------------------------

    def restricted(self, ids: Tensor) -> Sampler:
        """:meth:`Sampler.restricted`: a new, unbuilt MIDX sampler over the classes ``ids``,
        with this one's settings (``codebook_size`` capped at their drawable classes); its index
        is built from their rows only, by the head's ``refresh_index``. MIDX-Learn has none
        (``ValueError``): its codewords would be trained apart on every rank."""
        if self.learnable:
            raise ValueError(
                "MIDXSampler(learnable=True) cannot be restricted to a shard of the classes: "
                "every rank would learn codewords of its own from a replicated loss; use "
                "learnable=False with a sharded head"
            )
        check_class_ids("ids", ids, self.num_classes)
        padding = self.local_padding(ids)
        drawable = ids.numel() - (padding is not None)
        return MIDXSampler(
            ids.numel(),
            min(self.codebook_size, drawable),
            self.quantizer.name,
            self.mode,
            dim=self.dim,
            padding_idx=padding,
            kmeans_iters=self.kmeans_iters,
            seed=self.seed,
            backend=self.backend,
        )

    @property
    def is_built(self) -> bool:
        """Whether :meth:`refresh` has built an index (or a checkpoint or a broadcast from
        another rank restored one). Read from the buffer ``num_refreshes`` until it is true,
        then remembered, so that a draw does not sync the host for it."""
        if not self._built:
            self._built = bool(self.num_refreshes > 0)
        return self._built

    @torch.no_grad()
    def refresh(self, class_embeddings: Tensor) -> None:
        """Rebuilds the index from the class table.

        K-means (trained on a sample of at most 256 classes per codeword, warm-started from the
        current codewords, in torch on the table's device for a CUDA table, else through faiss:
        :func:`~lightning_sampled.index.kmeans.kmeans`; every class is then assigned) learns the
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
        self._built = True

    def add_classes(self, num_new: int) -> None:
        """:meth:`Sampler.add_classes`: the index's per-class buffers grow; the new classes are
        in no cell until :meth:`refresh`, which must follow before the next draw
        (:meth:`~lightning_sampled.heads.OutputHead.add_classes` calls it with the grown table;
        learned codewords are kept, as at any refresh)."""
        self._grow_support(num_new)
        device = self.class_cells.device
        self.class_cells = torch.cat(
            [self.class_cells, torch.full((num_new,), -1, dtype=torch.long, device=device)]
        )
        self.cell_members = torch.cat(
            [self.cell_members, torch.zeros(num_new, dtype=torch.long, device=device)]
        )

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
        self._check_rows("MIDXSampler.refresh: class_embeddings", x)
        return x.float()

    def check_class_rows(self, rows: Tensor) -> None:
        """:meth:`Sampler.check_class_rows`: the table's width and norms that :meth:`refresh`
        checks."""
        if rows.dim() != 2:
            raise ValueError(f"class rows must be [R, D], got shape {tuple(rows.shape)}")
        self._check_rows("MIDXSampler: new class rows", rows.detach())

    def _check_rows(self, name: str, x: Tensor) -> None:
        """``x`` ``[R, D]`` against the index's ``D`` and faiss' fp32 distances."""
        if self.dim is not None and x.shape[1] != self.dim:
            raise ValueError(f"class_embeddings must have D = dim = {self.dim}, got {x.shape[1]}")
        self.quantizer.check_dim(x.shape[1])
        check_norms(name, x)

    def _codewords_match(self, dim: int) -> bool:
        return self.is_built and self.codewords.shape[-1] == self.quantizer.codeword_dim(dim)

    def _set(self, name: str, value: Tensor) -> None:
        """Copies ``value`` into buffer (or parameter) ``name``, resizing a buffer if needed."""
        current = getattr(self, name)
        if current.shape == value.shape:
            current.data.copy_(value)
        else:
            self._buffers[name] = value.to(device=current.device, dtype=current.dtype).clone()

    def get_extra_state(self) -> dict[str, Any]:
        """:meth:`Sampler.get_extra_state` and what the index's buffers mean: the quantizer's
        name and the codebook size (a checkpoint of another quantizer fits the resizable buffers
        and would load, then fail at the first draw)."""
        return {
            **super().get_extra_state(),
            "quantizer": self.quantizer.name,
            "codebook_size": self.codebook_size,
        }

    def set_extra_state(self, state: Any) -> None:
        """Refuses an index built with another quantizer or codebook size (checkpoints from
        before they were saved carry neither and load as they did), then continues the draw
        stream."""
        own = self.get_extra_state()
        for key in ("quantizer", "codebook_size"):
            if isinstance(state, Mapping) and state.get(key, own[key]) != own[key]:
                raise ValueError(
                    f"the checkpoint's MIDX index was built with {key}={state[key]!r} and this "
                    f"MIDXSampler has {key}={own[key]!r}: build it with {key}={state[key]!r} "
                    f"to load this checkpoint"
                )
        super().set_extra_state(state)

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
        self._built = False  # the checkpoint may hold no index
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

    def _cells(self) -> Cells:
        """The index's classes per cell, from its buffers."""
        return Cells(self.cell_counts, self.cell_offsets, self.cell_members)

    def _stage_logits(self, z: Tensor) -> Stage:
        """Codeword logits and cell log-weights of queries ``z`` ``[B, D]``.

        Returns:
            ``(logits, log_weights, residual_logits)``: :class:`CodewordLogits` of P1 / P2,
            cell log-weights ``[K, K]`` (fast: ``log |Omega|``) or ``[B, K, K]`` (exact:
            ``log omega``), and, in exact mode, the residual logits ``[B, N]`` (``-inf`` for the
            padding class), else ``None``.
        """
        z1, z2 = self.quantizer.query_parts(z)
        codebooks = self.codewords.detach().float()
        with torch.autocast(z.device.type, enabled=False):
            if self.mode == "fast":
                log_weights = log_cell_sizes(self.cell_counts, self.codebook_size)
                residual_logits = None
            else:
                residual_logits, log_weights = residual_terms(
                    z, self.class_embeddings, self.class_cells, codebooks, self.quantizer
                )
            c1, c2 = codebooks
            logits = codeword_logits(z1, z2, c1, c2, log_weights, backend=self.backend)
        # Logits beyond fp32 are clamped, but a dot product whose terms overflow in both
        # directions is NaN: a clear error then (asynchronous on GPU), not a draw out of range.
        torch._assert_async(
            ~logits.log_p1.isnan().any(),
            "MIDXSampler: the proposal of some query is NaN: its logits z . c overflow fp32 "
            "(|z . c| beyond 3.4e38); scale the queries or the class table down",
        )
        return logits, log_weights, residual_logits

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
        """``num_samples`` draws per query ``z`` ``[B, D]`` from its :meth:`_stage_logits`: the
        first codeword from ``P1`` here, the rest by the mode's draw."""
        logits, log_weights, residual_logits = stage
        batch = z.shape[0]
        u = rand((2, batch, num_samples), z.device, generator)
        u_cell = rand((batch, num_samples), z.device, generator, torch.float64)
        k1 = inverse_cdf(logits.log_p1.exp(), u[0])
        if residual_logits is None:
            return draw_fast(logits, self._cells(), k1, u[1], u_cell)
        return draw_exact(
            logits, log_weights, residual_logits, self._cells(), self.class_cells, k1, u[1], u_cell
        )

    def _score(self, stage: Stage, z: Tensor, ids: Tensor) -> Tensor:
        """``log Q`` ``[B, K]`` of ids ``[B, K]`` or ``[K]`` from the queries' stage logits."""
        ids = (ids.expand(z.shape[0], -1) if ids.dim() == 1 else ids).long()
        logits, log_weights, residual_logits = stage
        if residual_logits is None:
            return score_fast(logits, self.class_cells, ids)
        return score_exact(logits, log_weights, residual_logits, self.class_cells, ids)

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
        queries = pick_queries(z, self.kl_num_queries, generator)
        ids = pick_classes(
            self.num_drawable, self.kl_num_classes, self.padding_idx, z.device, generator
        )
        reconstruction, divergence = codeword_objective(
            queries,
            class_embeddings.detach(),
            ids,
            self.codewords,
            self.quantizer,
            encoder=self.encoder,
            chunk_size=self.kl_chunk_size,
        )
        return self.reconstruction_weight * reconstruction + self.kl_weight * divergence

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, codebook_size={self.codebook_size}, "
            f"quantizer={self.quantizer.name!r}, mode={self.mode!r}, learnable={self.learnable}, "
            f"backend={self.backend!r}"
        )
