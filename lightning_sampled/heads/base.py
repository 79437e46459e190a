"""``OutputHead``: the class table and the exact methods every head shares."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .._deprecation import renamed_attribute
from .._validation import (
    check_class_ids,
    check_finite_number,
    check_int,
    check_label_smoothing,
    check_padding_idx,
    check_positive_int,
)
from ..inference.adaptive_softmax import AdaptiveResult, AdaptiveSoftmax
from ..ops import chunked
from ..ops.chunked import (
    chunk_logits,
    chunked_nll,
    chunked_topk,
    class_chunks,
    compute_dtype,
    gathered_logits,
    grouped_logits,
    in_compute_dtype,
    resolve_chunk_size,
    scored_rows,
    unit_rows,
    widened,
)
from ..ops.inputs import (
    ScoredPositives,
    check_k,
    check_queries,
    check_reduction,
    nothing_scored,
    position_weights,
    reduce_losses,
    scored_positions,
    scored_positives,
)
from ..ops.losses import check_positive_form, exact_multi_positive_losses
from ..ops.row_gradients import RowGradientSink
from ..optim.growth import grow_state_rows
from ..optim.sparse_checks import require_sparse_capable_optimizer, warn_if_dense
from ..sharding import ShardMap, whole_rows, whole_rows_on_first_rank
from ..sharding.collectives import (
    all_reduce_sum,
    as_process_group,
    check_same_on_every_rank,
    is_distributed,
    one_outcome,
    world_and_rank,
)
from .sharded import agreed, sharded_embed, sharded_nll, sharded_topk, shared_settings
from .table_init import fill_new_rows, new_table, new_table_seed, seeded_rows


class OutputHead(nn.Module):
    """Base of all heads: a class table ``[N, D]`` (owned or tied), an optional bias, and exact
    chunked scoring.

    Subclasses define ``forward(z, target, sample_weight=None)``, the scalar training objective
    (sampled for sampled heads). The exact methods below never hold more than ``[T, chunk_size]``
    logits unless the caller asks for :meth:`logits`.

    Scores: the logit of class ``c`` for a query ``z`` is ``q . v_c + b_c`` with
    ``q = normalize(z) / temperature`` (:meth:`score_queries`) and ``v_c = normalize(w_c)``
    (:func:`~lightning_sampled.ops.chunked.scored_rows`), where ``normalize`` divides by the L2
    norm only when ``normalize=True``; the bias is not scaled. Every path uses these two
    transforms: the training losses (through :meth:`class_rows` and the exact chunked
    cross-entropy), :meth:`logits`, :meth:`log_prob`, :meth:`full_loss` and :meth:`topk`. The
    class vectors are normalised one chunk (or one gathered batch of rows) at a time, never as an
    ``[N, D]`` copy.

    Sample weights: ``forward`` and :meth:`full_loss` take ``sample_weight`` ``[...]`` (the shape
    of ``target``), non-negative; the loss is then ``sum(w * loss) / sum(w)`` over the scored
    positions (those whose target is not ``ignore_index``), which must not all have weight 0.

    ``torch.compile``: the training losses of :class:`~lightning_sampled.heads.FullSoftmaxHead`,
    of :class:`~lightning_sampled.heads.SampledSoftmaxHead` with the uniform, unigram or
    log-uniform sampler (in-batch negatives included) and of
    :class:`~lightning_sampled.heads.OneVsEachHead` compile without graph breaks, and keep
    compiling when the batch shape changes (a smaller last batch, another sequence length:
    dynamo's automatic dynamic shapes); MIDX, TAPAS, CANE and ``normalize=True`` on the full
    softmax compile with graph breaks (``tests/heads/test_compile.py``,
    ``tests/heads/test_contract.py``). There the input checks are ``torch._assert_async`` calls
    (bad input raises ``RuntimeError`` without a host sync, see
    :mod:`lightning_sampled._validation`) and ignored positions are weighted 0 instead of
    dropped, so that no shape depends on the data; eager steps keep the ``ValueError`` /
    ``IndexError`` checks.

    NaN or inf in the class table or the bias: the methods that return numbers (``forward``
    whenever such a class is scored, :meth:`full_loss`, :meth:`log_prob`, :meth:`logits`)
    return NaN, as ``F.cross_entropy`` does, with no host sync on the training path, so the
    loss shows it; :meth:`topk`, whose indices would hide it (such a class ranks first, or
    anywhere), refuses with a ``ValueError`` naming up to five such classes.

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
        bias: ``True`` to learn a new per-class bias, ``False`` for none, or an existing ``[N]``
            ``nn.Parameter`` to tie to (e.g. ``nn.Linear(D, N).bias``).
        padding_idx: a class that is never sampled nor predicted (its logit is ``-inf``).
        ignore_index: target value of positions to skip, outside ``[0, N)`` (a class id
            cannot be both scored and skipped; :mod:`lightning_sampled.functional` accepts any
            int, as ``F.cross_entropy``).
        chunk_size: classes per chunk in the exact methods; by default as many as keep one
            ``[T, C]`` block of logits within 2^24 elements (64 MiB), at least 1024.
        temperature: ``> 0``; the query is divided by it (so are the logits, but not the bias).
            Settable later as :attr:`temperature` (e.g. by ``TemperatureSchedule``).
        normalize: score the cosine of the query and the class vector (both L2-normalised).
        label_smoothing: in ``[0, 1)``; only heads whose objective is the full softmax
            (:class:`~lightning_sampled.heads.FullSoftmaxHead`) accept a value other than 0.
        sharded: split the class table (and bias) across the ranks of ``process_group``
            (:mod:`lightning_sampled.heads.sharded`): now when ``torch.distributed`` is
            initialised (at the end of the head's ``__init__``, which creates only this rank's
            rows), else at :meth:`shard` (which the
            :class:`~lightning_sampled.callbacks.ShardedTables` callback calls at setup; until
            then the table is deferred on the ``meta`` device, holding no memory:
            :mod:`lightning_sampled.heads.table_init`); in one process :meth:`shard` creates
            every row. The rows are the same at any world size for the same seed. Only heads
            whose :attr:`sharding_refusal` is ``None`` accept it; a sharded head owns its table
            (``weight`` must be ``None``; tied inputs read it through :meth:`embed`).
        process_group: the group a sharded table is split over (default: the world), or a
            one-dimensional ``DeviceMesh`` (``mesh["dp"]``), whose group it is.
        candidate_encoder: a candidate tower instead of a table: a module that maps long class
            ids (any shape) to their vectors ``[*ids.shape, D]``, e.g. from item features.
            The training losses call it on the ids a step scores only; the exact methods and
            an index refresh on every class, in chunks of ``chunk_size`` (default 65,536)
            ids (:meth:`class_table`), so an exact loss through it holds its activations for
            every class. Gradients reach its parameters; ``weight``, ``sharded``,
            ``sparse_grad`` and :meth:`add_classes` do not apply.
        init_std: a new table's rows (and :meth:`add_classes`' by default) are
            ``N(0, init_std^2)``; ``None``: ``U(-1 / sqrt(D), 1 / sqrt(D))``.
    """

    #: whether the training objective implements ``label_smoothing`` (only the full softmax does)
    supports_label_smoothing: bool = False
    #: the attributes that a callback may set during training (``TemperatureSchedule``)
    schedulable: ClassVar[tuple[str, ...]] = ("temperature",)
    #: why the head's objective cannot run over a sharded table, or ``None`` where it can
    sharding_refusal: ClassVar[str | None] = "its training objective has no sharded form"
    #: why the head cannot score a candidate tower's vectors, or ``None`` where it can
    tower_refusal: ClassVar[str | None] = None
    #: where :meth:`class_rows` gathers the table's rows while scoring in blocks
    #: (:meth:`gathering_into`); ``None``: ``F.embedding`` of the table
    _row_sink: RowGradientSink | None = None

    def __init__(
        self,
        num_classes: int,
        dim: int,
        *,
        weight: nn.Parameter | None = None,
        bias: bool | nn.Parameter = False,
        padding_idx: int | None = None,
        ignore_index: int = -100,
        chunk_size: int | None = None,
        temperature: float = 1.0,
        normalize: bool = False,
        label_smoothing: float = 0.0,
        sharded: bool = False,
        process_group=None,
        candidate_encoder: nn.Module | None = None,
        init_std: float | None = None,
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
        if not isinstance(sharded, bool):
            raise ValueError(f"sharded must be a bool, got {sharded!r}")
        if sharded and self.sharding_refusal is not None:
            raise ValueError(
                f"{type(self).__name__} cannot be sharded: {self.sharding_refusal}; use "
                f"FullSoftmaxHead or SampledSoftmaxHead with sharded=True"
            )
        if sharded and weight is not None:
            raise ValueError(
                "sharded=True needs weight=None: a sharded head owns its table, which each rank "
                "holds only part of; look the inputs up with head.embed(ids) instead of tying "
                "an nn.Embedding"
            )
        self.sharded = sharded
        self.process_group = as_process_group(process_group)
        #: which rank holds which rows; ``None`` while the head holds every row
        self.shard_map: ShardMap | None = None
        self.init_std = (
            None if init_std is None else check_finite_number("init_std", init_std, minimum=0.0)
        )
        if candidate_encoder is not None:  # no table: the tower's outputs are the vectors
            self._check_tower(candidate_encoder, weight, sharded)
        elif weight is None:
            weight = new_table(num_classes, dim, sharded, self.init_std)
        elif not isinstance(weight, nn.Parameter):
            raise ValueError(
                f"weight must be an nn.Parameter to tie to, got {type(weight).__name__}"
            )
        elif tuple(weight.shape) != (num_classes, dim):
            raise ValueError(
                f"weight must have shape ({num_classes}, {dim}), got {tuple(weight.shape)}"
            )
        #: the candidate tower that gives the class vectors, or ``None`` (a table, ``weight``)
        self.candidate_encoder = candidate_encoder
        self.weight = weight  # None with a candidate tower
        self.bias = make_bias(bias, num_classes, deferred=sharded)
        #: the seed of a sharded head's table, created by :meth:`shard` (``table_init``)
        self.table_seed = new_table_seed() if sharded else None
        if sharded:  # (N, W, r): N classes split over W ranks, this head holding rank r's rows
            self.register_buffer("shard_layout", torch.tensor([num_classes, 1, 0]))
            self.register_load_state_dict_pre_hook(load_shard)
        self.temperature = temperature
        if not isinstance(normalize, bool):
            raise ValueError(f"normalize must be a bool, got {normalize!r}")
        self.normalize = normalize
        self.label_smoothing = check_label_smoothing(label_smoothing)
        if self.label_smoothing and not self.supports_label_smoothing:
            raise ValueError(
                f"label_smoothing is not supported by {type(self).__name__}, got "
                f"{label_smoothing!r}: a sampled objective scores the target and a few sampled "
                f"classes only, so the uniform share over all N classes has no sampled "
                f"counterpart; use FullSoftmaxHead for label smoothing"
            )
        self._sparse_grad = False

    @property
    def temperature(self) -> float:
        """The temperature of the logits, ``> 0`` and finite (see the class docstring)."""
        return self._temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        self._temperature = check_finite_number("temperature", value, minimum=0.0, strict=True)

    logit_temperature = renamed_attribute("logit_temperature", "temperature")

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
        if value and self.candidate_encoder is not None:
            raise ValueError(
                "sparse_grad=True needs a class table; a candidate tower's vectors come from its "
                "module, whose parameters get the gradient"
            )
        if value and not self._sparse_grad:
            owner = type(self).__name__
            require_sparse_capable_optimizer(self.weight, owner)
            warn_if_dense(self.weight, owner)
        self._sparse_grad = value

    # -- sharding ---------------------------------------------------------------------------------

    @property
    def is_split(self) -> bool:
        """Whether this rank holds only part of the table (``sharded=True`` over several ranks)."""
        return self.shard_map is not None

    @property
    def shard_ids(self) -> Tensor:
        """long ``[N_r]``: the global class ids of the rows this rank holds, in the order of
        ``weight``'s rows (every id, ``arange(N)``, while the head holds the whole table)."""
        if self.shard_map is None:
            return torch.arange(self.num_classes, device=self.table_device)
        return self.shard_map.shard_ids(self.table_device)

    def shard(self) -> None:
        """Creates the table of a sharded head: under ``torch.distributed``, splits it across
        the ranks of ``process_group``, each rank creating (or keeping) only its rows; in one
        process, creates the whole table. A no-op once done. What
        :class:`~lightning_sampled.callbacks.ShardedTables` calls at setup, after Lightning has
        started the process group and before the optimizer sees the parameters; a head built
        under ``torch.distributed`` calls it itself. A collective.

        Until then the table is on the ``meta`` device (:mod:`.table_init`): a head built before
        the process group holds no rows, and using it raises an error that names this method.

        Raises:
            ValueError: the head was built with ``sharded=False``; the ranks disagree on the
                head (its type, ``num_classes``, ``dim`` or ``padding_idx``): on every rank.
        """
        if not self.sharded:
            raise ValueError(f"{type(self).__name__} was built with sharded=False")
        if self.shard_map is None and is_distributed(self.process_group):
            self._split()
        elif self.table_deferred:
            self._create_rows(torch.arange(self.num_classes))

    def _shard_if_distributed(self) -> None:
        """The end of a sharded head's construction: under ``torch.distributed`` it creates its
        rows now (:meth:`shard`); before, its table stays deferred until :meth:`shard`."""
        if self.sharded and is_distributed(self.process_group):
            self.shard()

    @property
    def table_deferred(self) -> bool:
        """Whether the table of a sharded head is still to be created by :meth:`shard`."""
        return self.weight is not None and self.weight.is_meta

    def _require_table(self) -> None:
        """``RuntimeError`` naming :meth:`shard` while the table is deferred."""
        if self.table_deferred:
            raise RuntimeError(
                f"{type(self).__name__}(sharded=True) creates its table in shard(): call "
                f"head.shard() once torch.distributed is initialised (each rank then creates "
                f"only its rows; in one process, the whole table), before moving the head or "
                f"building the optimizer; in Lightning, build the head in the LightningModule's "
                f"__init__ (not in configure_model) and add the ShardedTables callback, which "
                f"calls it at setup"
            )

    def _apply(self, fn, recurse: bool = True):
        """``nn.Module._apply`` (``.to()``, ``.double()``, ...), refused while the table is
        deferred (:meth:`_require_table`): a ``meta`` table cannot be moved or cast."""
        self._require_table()
        return super()._apply(fn, recurse)

    def _create_rows(self, ids: Tensor) -> None:
        """Creates the deferred table's rows of the ascending class ``ids`` ``[K]``
        (:func:`~lightning_sampled.heads.table_init.seeded_rows`) and zero biases."""
        self.weight = nn.Parameter(
            seeded_rows(self.table_seed, self.num_classes, self.dim, ids, self.init_std),
            requires_grad=self.weight.requires_grad,
        )
        if self.bias is not None:
            self.bias = nn.Parameter(
                self.weight.new_zeros(ids.numel()), requires_grad=self.bias.requires_grad
            )

    def _split(self) -> None:
        """Creates this rank's rows of a deferred table, or keeps them of a whole one (a head
        that created its whole table in one process), and of the bias, and divides their
        gradients by the group's size."""
        check_same_on_every_rank(
            {
                **shared_settings(self),  # the sampler's kind, the negatives, ... as text
                "head": type(self).__name__,
                "num_classes": self.num_classes,
                "dim": self.dim,
                "padding_idx": self.padding_idx,
            },
            "the sharded head",
            self.process_group,
        )
        world, rank = world_and_rank(self.process_group)
        shard_map = ShardMap(self.num_classes, world, rank)
        if self.table_deferred:
            self._create_rows(shard_map.shard_ids())
        else:
            ids = shard_map.shard_ids(self.weight.device)
            self.weight = rows_of(self.weight, ids)
            if self.bias is not None:
                self.bias = rows_of(self.bias, ids)
        for param in (self.weight, self.bias):
            if param is not None:
                param.register_hook(MeanOverRanks(world))
        self.shard_map = shard_map
        self.shard_layout.copy_(torch.tensor([self.num_classes, world, rank]))
        # e.g. a rank holding no class its proposal draws: every rank raises, none waits
        with one_outcome(f"{type(self).__name__}.shard", self.process_group):
            self._after_split()

    def whole_table(self, first_rank_only: bool = False) -> dict[str, Tensor]:
        """``{"weight": [N, D], "bias": [N]}`` (no ``"bias"`` without one): the whole table, in
        class order (the head's own tensors where it is not split). For checkpoints that load
        at any world size and for a one-file export of the table for serving.

        Where the table is split this is a collective, ``O(N D)`` once: by default an
        all-gather that leaves the whole table on every rank, on the table's device; with
        ``first_rank_only`` a gather, block by block, to the CPU of the group's first rank,
        where a checkpoint is written (the other ranks get ``{}`` and hold no more than a block
        beyond their rows; :func:`~lightning_sampled.sharding.whole_rows_on_first_rank`).
        """
        with torch.no_grad():
            tables = {"weight": self.class_table(), "bias": self.bias}
        tables = {name: x.detach() for name, x in tables.items() if x is not None}
        if not self.is_split:
            return tables
        if not first_rank_only:
            return {
                name: whole_rows(x, self.shard_map, self.process_group)
                for name, x in tables.items()
            }
        gathered = {
            name: whole_rows_on_first_rank(x, self.shard_map, self.process_group)
            for name, x in tables.items()
        }
        return {name: x for name, x in gathered.items() if x is not None}

    def _after_split(self) -> None:
        """Called once the table is split: subclasses split what else they hold per class."""

    @agreed()
    def embed(self, ids: Tensor) -> Tensor:
        """The class table's rows of ``ids`` (any shape): ``[*ids.shape, D]``, as an input
        embedding tied to the table reads them (e.g. SASRec's item embedding); row-sparse
        gradients with :attr:`sparse_grad`. On a split table the rows are looked up where they
        live (:func:`~lightning_sampled.heads.sharded.sharded_embed`, a collective) and the
        padding class gives zeros."""
        check_class_ids("ids", ids, self.num_classes)
        if self.is_split:
            return sharded_embed(self, ids)
        rows = self._rows_of(ids)
        if self.padding_idx is not None:
            rows = rows * (ids != self.padding_idx)[..., None].to(rows.dtype)
        return rows

    # -- input handling -------------------------------------------------------------------------

    def _check_z(self, z: Tensor) -> None:
        check_queries(z, self.num_classes, self.dim)

    def _check_k(self, k: int) -> None:
        check_k(k, self.num_classes)

    def _valid_rows(
        self, z: Tensor, target: Tensor, *, static: bool = False
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Validates ``z`` ``[..., D]`` and ``target`` ``[...]`` and keeps the scored positions
        (all of them, ignored ones with a stand-in target, with ``static`` under
        ``torch.compile``: :func:`~lightning_sampled.ops.inputs.scored_positions`).

        Returns:
            ``(queries [T, D], target_valid [T], mask [...])`` where ``mask`` marks the positions
            whose target is not ``ignore_index`` and ``queries`` are those positions' ``z`` as
            the head scores them (:meth:`score_queries`).
        """
        kept = scored_positions(
            z,
            target,
            self.num_classes,
            self.dim,
            ignore_index=self.ignore_index,
            padding_idx=self.padding_idx,
            static=static,
        )
        return self.score_queries(kept.z), kept.target, kept.mask

    def _valid_weights(
        self,
        sample_weight: Tensor | None,
        target: Tensor,
        mask: Tensor,
        *,
        static: bool = False,
        reduction: str = "mean",
    ) -> Tensor | None:
        """``sample_weight`` ``[...]`` of the positions ``mask`` kept by :meth:`_valid_rows`:
        fp32 ``[T]`` or ``None`` (:func:`~lightning_sampled.ops.inputs.position_weights`;
        weights 0 everywhere are refused under the ``"mean"`` reduction only)."""
        return position_weights(
            sample_weight,
            target,
            mask,
            ignore_index=self.ignore_index,
            static=static,
            mean=reduction == "mean",
        )

    def score_queries(self, z: Tensor) -> Tensor:
        """Queries ``[..., D]`` as this head scores them: ``normalize(z) / temperature``.

        Logits are ``score_queries(z) . scored_rows(w) + b``; sampled heads give their sampler
        these queries (detached), so a query-dependent proposal (MIDX) scores what the head does.
        Returns ``z`` itself with the defaults, else fp32 (fp64 for fp64 ``z``), differentiable.
        """
        if self.normalize:
            z = unit_rows(z)
        if self.temperature != 1.0:
            z = widened(z) / self.temperature
        return z

    def chunk_for(self, num_rows: int) -> int:
        """Classes per chunk when scoring ``num_rows`` queries (see ``chunk_size``)."""
        return resolve_chunk_size(self.chunk_size, num_rows, self.num_classes)

    def class_rows(self, ids: Tensor) -> tuple[Tensor, Tensor | None]:
        """Gathers class vectors ``[*ids.shape, D]`` (unit vectors when ``normalize``) and biases
        ``[*ids.shape]`` (or ``None``).

        The one place where heads read rows of the class table. ``F.embedding``'s backward
        accumulates the dense ``[N, D]`` gradient faster than indexing's ``index_put_``; with
        ``self.sparse_grad`` the table's gradient is a sparse COO tensor over the touched rows.
        """
        rows = scored_rows(self._rows_of(ids), self.normalize)
        return rows, None if self.bias is None else self.bias[ids]

    def _rows_of(self, ids: Tensor) -> Tensor:
        """The raw class vectors ``[*ids.shape, D]`` of ``ids``: rows of the table, or the
        candidate tower's output (checked for its shape)."""
        if self.candidate_encoder is None:
            self._require_table()
            if self._row_sink is not None:
                return self._row_sink.gather(ids)
            return F.embedding(ids, self.weight, sparse=self.sparse_grad)
        rows = self.candidate_encoder(ids)
        if not isinstance(rows, Tensor) or tuple(rows.shape) != (*ids.shape, self.dim):
            got = tuple(rows.shape) if isinstance(rows, Tensor) else type(rows).__name__
            raise ValueError(
                f"candidate_encoder must map ids {tuple(ids.shape)} to vectors "
                f"{(*ids.shape, self.dim)}, got {got}"
            )
        if not rows.is_floating_point():
            # integer vectors would score, but no gradient could ever reach the tower
            raise ValueError(
                f"candidate_encoder must return floating-point vectors, got {rows.dtype}"
            )
        return rows

    def row_sink(self) -> RowGradientSink | None:
        """One gradient for the gathers of a forward that scores in blocks
        (:mod:`~lightning_sampled.ops.row_gradients`: dense, or row-sparse with
        ``sparse_grad``); ``None`` (each gather its own gradient) with a candidate tower, no
        gradient, or under ``torch.compile``."""
        table = self.candidate_encoder is None and self.weight.requires_grad
        if not (table and torch.is_grad_enabled()) or torch.compiler.is_compiling():
            return None
        return RowGradientSink.of(self.weight, self.sparse_grad)

    @contextmanager
    def gathering_into(self, sink: RowGradientSink | None) -> Iterator[None]:
        """:meth:`class_rows` gathers through ``sink`` (if not ``None``) inside the block."""
        previous, self._row_sink = self._row_sink, sink
        try:
            yield
        finally:
            self._row_sink = previous

    @property
    def table_device(self) -> torch.device:
        """The device of the class vectors: the table's (the CPU while a sharded head's table
        is deferred, :meth:`shard`), or the candidate tower's."""
        if self.candidate_encoder is None:
            return torch.device("cpu") if self.table_deferred else self.weight.device
        tensors = [*self.candidate_encoder.parameters(), *self.candidate_encoder.buffers()]
        return tensors[0].device if tensors else torch.device("cpu")

    def candidate_logits(self, z: Tensor, ids: Tensor, group_size: int = 1) -> Tensor:
        """fp32 logits ``z . v_c + b_c`` of candidate classes, gathered through
        :meth:`class_rows`; the products run in :func:`compute_dtype` of ``z`` (class docstring).

        Args:
            z: ``[T, D]`` queries from :meth:`score_queries` (as :meth:`_valid_rows` returns).
            ids: long ``[M]`` (the same candidates for every query), ``[T, M]`` (per query) or,
                with ``group_size`` ``g`` > 1, ``[ceil(T / g), M]``: those of each group of
                ``g`` consecutive queries (:func:`~lightning_sampled.ops.chunked.grouped_logits`).

        Returns:
            ``[T, M]`` fp32 logits.

        Per-query candidates are gathered a block of positions at a time
        (:func:`~lightning_sampled.ops.chunked.positions_per_gather`: at most
        ``MAX_BLOCK_ELEMENTS`` gathered entries), each block under activation checkpointing when
        gradients are on, so that the ``[T, M, D]`` vectors (418 MB at a language model's 4,088
        positions, 100 draws and D = 256) and their gradient are never held whole: the block is
        gathered again in backward (:meth:`in_blocks`); a group's candidates are gathered once
        for its rows. Under ``torch.compile`` the gather is one block.
        """
        if ids.dim() == 1 or torch.compiler.is_compiling():
            return self._gathered_logits(z, ids, group_size)
        step = chunked.positions_per_gather(-(-ids.shape[1] // group_size), z.shape[-1])
        if z.shape[0] <= step:
            return self._gathered_logits(z, ids, group_size)
        blocks = [
            (z[rows], ids[chunked.groups_of(rows, group_size)], group_size)
            for rows in chunked.row_blocks(z.shape[0], step, align=group_size)
        ]
        return self.in_blocks(self._gathered_logits, blocks)

    def in_blocks(self, fn: Callable[..., Tensor], blocks: Iterable[tuple]) -> Tensor:
        """``fn(*args)`` for each block's ``args``, concatenated along the rows. With gradients
        every block but the last runs under activation checkpointing (it keeps its inputs only
        and runs again in backward; the last keeps what it saves, one block, which backward
        frees before it runs the others again), and the gathers from the table add into one
        gradient (:meth:`row_sink`)."""
        blocks = list(blocks)
        if not torch.is_grad_enabled():
            return torch.cat([fn(*args) for args in blocks])
        sink = self._row_sink or self.row_sink()
        *earlier, last = blocks
        return torch.cat(
            [
                *(checkpoint(self._in_sink, fn, sink, *a, use_reentrant=False) for a in earlier),
                self._in_sink(fn, sink, *last),
            ]
        )

    def _in_sink(self, fn: Callable[..., Tensor], sink: RowGradientSink | None, *args) -> Tensor:
        """``fn(*args)`` gathering the table's rows through ``sink``."""
        with self.gathering_into(sink):
            return fn(*args)

    def _gathered_logits(self, z: Tensor, ids: Tensor, group_size: int = 1) -> Tensor:
        """:meth:`candidate_logits` of one gather."""
        if group_size == 1:
            return gathered_logits(z, *self.class_rows(ids))
        rows, bias = self.class_rows(ids.reshape(-1))
        rows = rows.view(*ids.shape, rows.shape[-1])
        return grouped_logits(z, rows, None if bias is None else bias.view(ids.shape), group_size)

    def target_and_candidate_logits(
        self, z: Tensor, target: Tensor, ids: Tensor
    ) -> tuple[Tensor, Tensor]:
        """fp32 logits of each query's target and of candidate classes, from one gather; the
        products run in :func:`compute_dtype` of ``z`` (class docstring).

        One :meth:`class_rows` call for both means one ``[N, D]`` gradient buffer in backward
        instead of two, which at large ``N`` is most of a sampled step's cost.

        Args:
            z: ``[T, D]`` queries from :meth:`score_queries` (as :meth:`_valid_rows` returns).
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

    def class_table(self) -> Tensor:
        """The ``[N, D]`` class vectors that every exact method scores: ``self.weight`` here, or
        the candidate tower's output for every class, computed in chunks of ids.

        Heads whose class vectors are derived from their parameters (e.g. CANE's path sums)
        override it, differentiably, so that the exact methods score the model they train.
        """
        if self.candidate_encoder is None:
            self._require_table()
            return self.weight
        ids = torch.arange(self.num_classes, device=self.table_device)
        return torch.cat([self._rows_of(part) for part in ids.split(self.chunk_size or 65_536)])

    def logits(self, z: Tensor) -> Tensor:
        """Exact fp32 logits ``[..., N]`` of queries ``z`` ``[..., D]`` (padding class ``-inf``).

        Materialises ``[..., N]``: prefer :meth:`topk` or :meth:`log_prob` at large ``N``.

        Raises:
            ValueError: the table is split across ranks (the logits of every class would
                gather ``O(N)`` numbers per query on each rank).
        """
        self.refuse_split("logits", "use log_prob, full_loss or topk, which stay exact")
        self._check_z(z)
        flat = self.score_queries(z.reshape(-1, self.dim))
        dtype = compute_dtype(flat)
        table = self.class_table()
        parts = [
            chunk_logits(
                flat,
                table,
                self.bias,
                start,
                end,
                self.padding_idx,
                dtype,
                normalize=self.normalize,
            )
            for start, end in class_chunks(self.num_classes, self.chunk_for(flat.shape[0]))
        ]
        return torch.cat(parts, dim=1).reshape(*z.shape[:-1], self.num_classes)

    @agreed()
    def log_prob(self, z: Tensor, target: Tensor) -> Tensor:
        """Exact ``log softmax(logits)[target]``, fp32 ``[...]``, differentiable.

        Positions whose target is ``ignore_index`` get ``0``.
        """
        queries, y, mask = self._valid_rows(z, target)
        out = torch.zeros(target.shape, device=z.device, dtype=torch.float32)
        if y.numel() or self.is_split:
            out = out.masked_scatter(mask, -self._exact_losses(queries, y))
        return out

    @agreed()
    def full_loss(
        self,
        z: Tensor,
        target: Tensor,
        sample_weight: Tensor | None = None,
        *,
        reduction: str = "mean",
        positives: str | None = None,
    ) -> Tensor:
        """Exact negative log-likelihood of the positions not ``ignore_index``, weighted by
        ``sample_weight`` ``[...]`` when given (class docstring); never label-smoothed.

        ``reduction``: ``"mean"`` (the weighted mean, a scalar), ``"sum"`` (the weighted sum, a
        scalar) or ``"none"`` (the weighted losses in the shape of ``target``, 0 where ignored;
        :func:`~lightning_sampled.ops.inputs.reduce_losses`). Differentiable; ``0`` (still
        attached to the graph) if every position is ignored, where ``F.cross_entropy`` would
        return NaN.

        ``positives``: ``"each"`` or ``"soft_labels"`` for several positives per position,
        ``target`` ``[..., P]`` (:meth:`several_positives`).
        """
        if positives is not None:
            return self.exact_several_positives_loss(
                z, target, sample_weight, reduction=reduction, positives=positives
            )
        return self._exact_loss(z, target, sample_weight, reduction=reduction)

    def several_positives(
        self,
        z: Tensor,
        target: Tensor,
        sample_weight: Tensor | None,
        reduction: str,
        positives: str,
    ) -> tuple[ScoredPositives, Tensor, Tensor | None]:
        """Checks a call with several positives per position (``target`` ``[..., P]``, distinct
        class ids or ``ignore_index``; ``positives`` one of
        :data:`~lightning_sampled.ops.losses.POSITIVE_FORMS`) and keeps the positions with a
        positive: ``(positions, their queries [T, D] as scored, their weights [T] or None)``.

        Raises:
            ValueError: the table is split across ranks, or the checks of
                :func:`~lightning_sampled.ops.inputs.scored_positives`.
        """
        check_reduction(reduction)
        check_positive_form(positives)
        self.refuse_split("positives=", "several positives per position are not built there")
        kept = scored_positives(
            z,
            target,
            self.num_classes,
            self.dim,
            ignore_index=self.ignore_index,
            padding_idx=self.padding_idx,
        )
        weights = self._valid_weights(sample_weight, kept.mask, kept.mask, reduction=reduction)
        return kept, self.score_queries(kept.z), weights

    def exact_several_positives_loss(
        self,
        z: Tensor,
        target: Tensor,
        sample_weight: Tensor | None = None,
        *,
        reduction: str = "mean",
        positives: str,
    ) -> Tensor:
        """The exact loss of several positives per position (``target`` ``[..., P]``):
        :func:`~lightning_sampled.ops.losses.exact_multi_positive_losses` with ``log Z`` from
        the chunked cross-entropy of each position's first positive, reduced as
        :meth:`full_loss` says."""
        kept, queries, weights = self.several_positives(
            z, target, sample_weight, reduction, positives
        )
        if queries.shape[0] == 0:
            return nothing_scored(kept.mask, reduction, z)
        target_logits = self.candidate_logits(queries, kept.targets)
        first_nll = self._exact_losses(queries, kept.targets[:, 0])
        losses = exact_multi_positive_losses(first_nll, target_logits, kept.present, positives)
        return reduce_losses(losses, weights, kept.mask, reduction, z)

    def _exact_losses(
        self, queries: Tensor, target: Tensor, label_smoothing: float = 0.0
    ) -> Tensor:
        """Exact per-row cross-entropy ``[T]`` (fp32) of scored queries ``[T, D]`` and targets
        ``[T]``, label-smoothed over the classes other than ``padding_idx`` when asked."""
        if self.is_split:
            return sharded_nll(self, queries, target, label_smoothing)
        return chunked_nll(
            queries,
            self.class_table(),
            self.bias,
            target,
            self.chunk_for(target.numel()),
            self.padding_idx,
            normalize=self.normalize,
            label_smoothing=label_smoothing,
        )

    def _exact_loss(
        self,
        z: Tensor,
        target: Tensor,
        sample_weight: Tensor | None,
        label_smoothing: float = 0.0,
        *,
        reduction: str = "mean",
    ) -> Tensor:
        """:meth:`_exact_losses` of the scored positions, (weighted and) reduced as
        ``reduction`` says (:meth:`full_loss`)."""
        check_reduction(reduction)
        queries, y, mask = self._valid_rows(z, target, static=True)
        weights = self._valid_weights(sample_weight, target, mask, static=True, reduction=reduction)
        if y.numel() == 0 and not self.is_split:
            return nothing_scored(mask, reduction, z)
        return reduce_losses(
            self._exact_losses(queries, y, label_smoothing), weights, mask, reduction, z
        )

    @torch.no_grad()
    @agreed()
    def topk(self, z: Tensor, k: int, exclude: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Exact top-``k`` classes of each query, in class chunks.

        Args:
            z: ``[..., D]`` queries.
            k: how many classes, ``1 <= k <= N``.
            exclude: optional long ``[..., E]`` class ids to skip for each query (e.g. a user's
                already-seen items); negative entries are padding and ignored.

        Returns:
            ``(values, indices)``: fp32 logits ``[..., k]`` and long class ids ``[..., k]`` in
            decreasing order. Fewer than ``k`` scorable classes (after ``exclude`` and
            ``padding_idx``) leave ``-inf`` values and index ``-1`` at the end: no class at those
            ranks, which the ranking metrics count as a miss (an excluded or padding id there
            would count as a hit where it is the target).

        Raises:
            ValueError: the class table or the bias holds NaN or inf (such a class would be
                ranked first, or anywhere, for every query).
        """
        self._check_z(z)
        self._check_k(k)
        flat = self.score_queries(z.reshape(-1, self.dim))
        if exclude is not None:
            if exclude.dim() < 1 or tuple(exclude.shape[:-1]) != tuple(z.shape[:-1]):
                raise ValueError(
                    f"exclude must have shape {tuple(z.shape[:-1])} + (E,), "
                    f"got {tuple(exclude.shape)}"
                )
            exclude = exclude.reshape(flat.shape[0], exclude.shape[-1])
            check_class_ids("exclude", exclude[exclude >= 0], self.num_classes)
            exclude = exclude.long()
        table = self.class_table()
        for name, x in (("class table", table), ("bias", self.bias)):
            check_no_nan_rows(name, x, self.shard_map, self.process_group)
        if self.is_split:
            values, indices = sharded_topk(self, flat, k, exclude)
        else:
            values, indices = chunked_topk(
                flat,
                table,
                self.bias,
                k,
                self.chunk_for(flat.shape[0]),
                self.padding_idx,
                exclude,
                normalize=self.normalize,
            )
        indices = indices.masked_fill(values == -math.inf, -1)
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
        ``softmax(logits / temperature)`` and each probability is within ``(1 +- eps)``, where
        ``logits`` are the head's (so ``z`` is divided by :attr:`temperature` first, and
        ``temperature`` here is a further one of this call). Not available with
        ``normalize=True`` (``ValueError``): AdaptiveSoftmax reads the raw class table.
        The bias is added exactly; ``padding_idx`` is never returned. A query whose first
        products predict little gain (a flat softmax) gets the dense answer, exactly
        (``AdaptiveSoftmax``'s default ``fallback_gain``). The
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
        self.refuse_split("adaptive_topk", "use topk, which merges each rank's exact top-k")
        self._check_z(z)
        self._check_k(k)
        if self.normalize:
            raise ValueError(
                "adaptive_topk does not support normalize=True: AdaptiveSoftmax samples products "
                "with the raw class table, not its unit rows; use topk (exact) instead"
            )
        table = self.class_table()
        key = (id(table), id(self.bias), self.padding_idx, eps, delta, temperature)
        cached = self.__dict__.get("_adaptive_softmax")
        if cached is None or cached[0] != key:
            module = AdaptiveSoftmax(
                table,
                temperature,
                eps,
                delta,
                bias=self.bias,
                padding_idx=self.padding_idx,
            )
            cached = self.__dict__["_adaptive_softmax"] = (key, module)
        generator = None
        if seed is not None:
            generator = torch.Generator(device=table.device).manual_seed(seed)
        queries = self.score_queries(z.reshape(-1, self.dim))
        result = cached[1].topk(queries, k, generator=generator)
        batch = z.shape[:-1]
        return AdaptiveResult(
            result.indices.reshape(*batch, k),
            result.probs.reshape(*batch, k),
            result.log_partition.reshape(batch),
            result.samples_used.reshape(batch),
        )

    #: why the head's catalog cannot grow (:meth:`add_classes`); ``None``: it can
    growth_refusal: str | None = None

    @torch.no_grad()
    def add_classes(
        self,
        num_new: int,
        init: Tensor | Callable[[Tensor], Any] | None = None,
        *,
        optimizers: Iterable[torch.optim.Optimizer] = (),
    ) -> None:
        """Adds ``num_new`` classes, ids ``N .. N + num_new - 1``: the class table (and bias)
        gains rows, in place on the same ``nn.Parameter`` (so a tied ``nn.Embedding`` or
        ``nn.Linear`` sees them and optimizers keep holding it), each optimizer in
        ``optimizers`` extends its state of them
        (:func:`~lightning_sampled.optim.grow_state_rows`), and the proposal's support and
        index follow (:meth:`_after_growth`). The old classes' rows, biases and optimizer state
        are kept exactly.

        On a table split across ranks every rank calls it with the same ``num_new`` and
        ``init`` and gains the rows of the new classes it holds by the layout's rule (class
        ``c`` on rank ``c mod W``, :class:`~lightning_sampled.sharding.ShardMap`); its proposal
        grows by those rows and the layout (``shard_layout``) by the classes, so that its
        checkpoints load into a head of ``N + num_new`` classes. Each rank makes (or is given)
        the whole ``[num_new, D]`` block of new rows and keeps its own: with ``init=None`` the
        grown table is one process's where torch's global generator is seeded alike on every
        rank (``seed_everything``). An error on one rank is raised on every rank
        (:class:`~lightning_sampled.sharding.collectives.RankInputError`, naming it), before
        anything grows.

        Args:
            num_new: how many classes, ``>= 1``.
            init: the new rows: ``None`` draws them as the table was drawn (``init_std``),
                from torch's global generator; a ``[num_new, D]`` tensor gives them; a
                function fills a ``[num_new, D]`` tensor in place (e.g.
                ``torch.nn.init.normal_``). New biases are 0.
            optimizers: the optimizers that hold the table (in Lightning,
                ``trainer.optimizers``).

        Raises:
            ValueError: a head whose class vectors are derived from a tree
                (:attr:`growth_refusal`) or come from a candidate tower, an ``ignore_index``
                that would become a class id, an ``init`` of the wrong shape, with NaN or
                infinite entries, or rows the proposal's index cannot hold
                (:meth:`Sampler.check_class_rows`); ranks that disagree on ``num_new``. Nothing
                has changed when it raises.
        """
        with one_outcome(
            f"{type(self).__name__}.add_classes",
            self.process_group,
            shared={"num_new": num_new, "num_classes": self.num_classes},
            enabled=self.is_split,
        ):
            num_new = check_positive_int("num_new", num_new)
            rows = self._new_rows(num_new, init)
        # everything that can refuse the rows has run on every rank: all or nothing
        old, old_rows = self.num_classes, self.weight.shape[0]
        grown = [self.weight] if self.bias is None else [self.weight, self.bias]
        self.weight.data = torch.cat([self.weight.data, rows])
        if self.bias is not None:
            self.bias.data = torch.cat([self.bias.data, self.bias.new_zeros(rows.shape[0])])
        for param in grown:  # an accumulated gradient keeps its values, 0 on the new rows
            if param.grad is not None:
                param.grad = grown_rows(param.grad, param.shape[0])
        self.num_classes = old + num_new
        if self.is_split:
            self.shard_map = self.shard_map.grown(self.num_classes)
        if self.sharded:  # (N, W, r), as _split sets it; W = 1 where one process holds it all
            self.shard_layout[0] = self.num_classes
        for optimizer in optimizers:
            for param in grown:
                grow_state_rows(optimizer, param, old_rows)
        self._after_growth(num_new)

    def _new_rows(self, num_new: int, init: Tensor | Callable[[Tensor], Any] | None) -> Tensor:
        """The rows ``[K, D]`` that :meth:`add_classes` appends to this rank's table: the
        ``num_new`` new classes' (``K = num_new``), or on a split table those of them it holds;
        checked, so that nothing grows unless every check passed."""
        self._require_table()
        if self.candidate_encoder is not None:
            raise ValueError(
                "a candidate tower has no table to grow: give its module the new classes' "
                "features and build the head with the new num_classes"
            )
        if self.growth_refusal is not None:
            raise ValueError(f"{type(self).__name__} cannot add classes: {self.growth_refusal}")
        old = self.num_classes
        if old <= self.ignore_index < old + num_new:
            raise ValueError(
                f"ignore_index={self.ignore_index} would become a class id in [0, "
                f"{old + num_new}); use a negative ignore_index"
            )
        rows = self.weight.new_empty((num_new, self.dim))
        if init is None:
            fill_new_rows(rows, self.init_std)
        elif isinstance(init, Tensor):
            if tuple(init.shape) != (num_new, self.dim):
                raise ValueError(
                    f"init must have shape ({num_new}, {self.dim}), got {tuple(init.shape)}"
                )
            rows.copy_(init)
        else:
            init(rows)
        if not bool(torch.isfinite(rows).all()):  # a host check: add_classes is never hot
            raise ValueError(
                f"init gave new rows with NaN or infinite entries; nothing was added "
                f"(the head still has {old} classes)"
            )
        if self.is_split:
            # the new classes this rank holds come after its old rows, in class order
            ids = self.shard_map.grown(old + num_new).shard_ids(rows.device)
            rows = rows[ids[self.shard_map.num_local() :] - old]
        self._check_new_rows(rows)
        return rows

    def _check_tower(self, encoder: nn.Module, weight: nn.Parameter | None, sharded: bool) -> None:
        """Checks a ``candidate_encoder`` against the head and the other options."""
        if not isinstance(encoder, nn.Module):
            raise ValueError(
                f"candidate_encoder must be an nn.Module, got {type(encoder).__name__}"
            )
        if self.tower_refusal is not None:
            raise ValueError(
                f"{type(self).__name__} cannot take a candidate_encoder: {self.tower_refusal}"
            )
        if weight is not None or sharded:
            raise ValueError(
                "candidate_encoder gives the class vectors: it takes neither weight= nor "
                "sharded=True"
            )

    def _check_new_rows(self, rows: Tensor) -> None:
        """Raises ``ValueError`` for new class vectors ``[num_new, D]`` that :meth:`add_classes`
        could not complete with (called before anything grows): nothing here; heads with a
        proposal ask it (:class:`~lightning_sampled.heads.ProposalHead`)."""

    def _after_growth(self, num_new: int) -> None:
        """What follows the table's growth by ``num_new`` rows: nothing here; heads with a
        proposal grow it (:class:`~lightning_sampled.heads.ProposalHead`)."""

    def refuse_split(self, method: str, instead: str) -> None:
        """``ValueError`` naming ``method`` and what to use ``instead`` when the table is split."""
        if self.is_split:
            raise ValueError(
                f"{type(self).__name__}.{method} is not available on a table split across "
                f"{self.shard_map.world_size} ranks: {instead}"
            )

    def extra_repr(self) -> str:
        shards = "" if self.shard_map is None else f", shards={self.shard_map.world_size}"
        return (
            f"num_classes={self.num_classes}, dim={self.dim}, bias={self.bias is not None}, "
            f"padding_idx={self.padding_idx}, ignore_index={self.ignore_index}, "
            f"temperature={self.temperature:g}, normalize={self.normalize}, "
            f"label_smoothing={self.label_smoothing:g}{shards}"
        )


def check_no_nan_rows(
    name: str, x: Tensor | None, shard_map: ShardMap | None = None, group=None
) -> None:
    """``ValueError`` naming up to five classes whose row (or bias) in ``x`` ``[N, ...]`` holds NaN
    or inf; reads the tensor back to the host (an evaluation-time check). With ``shard_map``
    ``x`` holds this rank's rows of a split table: the count is summed over the ranks (a
    collective) so that every rank raises, each naming its own bad classes."""
    if x is None:
        return
    bad = ~torch.isfinite(x.detach()).reshape(x.shape[0], -1).all(dim=1)
    count = bad.sum()
    if shard_map is not None:
        count = all_reduce_sum(count.reshape(1), group)
    if bool(count > 0):
        ids = bad.nonzero()[:5, 0]
        ids = (ids if shard_map is None else shard_map.global_ids(ids)).tolist()
        raise ValueError(
            f"the {name} holds NaN or inf values at classes {ids} ({int(count)} in all): "
            f"topk would rank them first for every query; the training diverged or the table "
            f"was loaded wrongly"
        )


def load_shard(head: OutputHead, state_dict: dict, prefix: str, *_) -> None:
    """Load pre-hook of a sharded head: a checkpoint of the whole table (an unsharded head's, one
    saved in one process, or one that :class:`~lightning_sampled.callbacks.ShardedTables` wrote)
    is cut to this rank's rows, the rest of the head's state (its proposal, restricted to the
    rows) kept as the split made it; a checkpoint of another split raises. A head's state left
    out of the checkpoint (its proposal's index, which ``ShardedTables`` does not save) is kept
    as it is. A head whose table is still deferred creates it first (:meth:`OutputHead.shard`),
    so that the loaded values land in real rows."""
    if head.table_deferred:
        head.shard()
    key = prefix + "shard_layout"
    whole = (head.num_classes, 1, 0)
    saved = tuple(state_dict[key].tolist()) if key in state_dict else whole
    own = tuple(head.shard_layout.tolist())
    if saved not in (own, whole):
        raise ValueError(
            f"the checkpoint holds the rows of rank {saved[2]} of a table of {saved[0]} classes "
            f"split over {saved[1]} ranks, and this head holds those of rank {own[2]} of "
            f"{own[1]} over {own[0]} classes: load it with the world size it was saved with, or "
            f"save the whole table for another world size"
        )
    cut = saved != own  # a whole table into a split head
    if cut:
        for name in ("weight", "bias"):
            if state_dict.get(prefix + name) is not None:
                state_dict[prefix + name] = state_dict[prefix + name][head.shard_ids.cpu()]
    # the proposal, restricted to a split head's rows, follows from the split: kept as it is
    # where the checkpoint leaves it out (ShardedTables does) or holds another split's; the
    # rest (the in-batch q_b, alike on every rank) loads, or stays where it is left out
    for name, value in head.state_dict().items():
        per_rank = name.startswith("sampler.") or name == "shard_layout"
        missing = prefix + name not in state_dict
        if name not in ("weight", "bias") and ((cut and per_rank) or missing):
            state_dict[prefix + name] = value


class MeanOverRanks:
    """A gradient hook on the rows of a split table: divides by the group's size ``W``, so that
    the sum over ranks of their losses' gradients becomes the mean DDP gives replicated
    parameters."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def __call__(self, grad: Tensor) -> Tensor:
        return grad / self.world_size


def grown_rows(grad: Tensor, num_rows: int) -> Tensor:
    """``grad`` (dense or sparse COO, ``[N, ...]``) with ``num_rows >= N`` rows, zeros on the
    new ones."""
    if grad.is_sparse:
        grad = grad.coalesce()
        size = (num_rows, *grad.shape[1:])
        return torch.sparse_coo_tensor(
            grad.indices(), grad.values(), size, is_coalesced=True, check_invariants=False
        )
    return torch.cat([grad, grad.new_zeros((num_rows - grad.shape[0], *grad.shape[1:]))])


def rows_of(param: nn.Parameter, ids: Tensor) -> nn.Parameter:
    """A new parameter holding the rows ``ids`` of ``param``, ``requires_grad`` kept."""
    return nn.Parameter(param.detach()[ids].clone(), requires_grad=param.requires_grad)


def make_bias(
    bias: bool | nn.Parameter, num_classes: int, deferred: bool = False
) -> nn.Parameter | None:
    """The head's bias: a new zero ``[N]`` parameter for ``True`` (on the ``meta`` device when
    ``deferred``, as a sharded head's table), none for ``False``, or the given ``[N]``
    ``nn.Parameter`` itself (tied, like ``weight``)."""
    if isinstance(bias, nn.Parameter):
        if tuple(bias.shape) != (num_classes,):
            raise ValueError(f"bias must have shape ({num_classes},), got {tuple(bias.shape)}")
        return bias
    if isinstance(bias, bool):
        device = "meta" if deferred else None
        return nn.Parameter(torch.zeros(num_classes, device=device)) if bias else None
    raise ValueError(
        f"bias must be a bool or an nn.Parameter of shape ({num_classes},) to tie to, "
        f"got {type(bias).__name__}"
    )
