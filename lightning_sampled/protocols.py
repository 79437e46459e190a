"""What callbacks need from the modules they drive, declared once.

Callbacks find their collaborators by these protocols (``isinstance`` on a
``runtime_checkable`` ``Protocol`` checks that the members exist), never by probing other
attribute names. A module of one's own takes part by implementing the members:

====================  ==========================================  ==============================
protocol              members                                     used by
====================  ==========================================  ==============================
:class:`Refreshable`  ``refresh_index()``                         ``IndexRefresh``
:class:`IndexStats`   ``index_stats() -> dict[str, float]``       ``IndexRefresh`` (logs them)
:class:`HasProposal`  ``sampler`` (a ``Sampler``), ``logits``,    ``SamplerDiagnostics`` (KL)
                      ``score_queries``
:class:`ReportsCoverage` ``last_coverage`` (0-dim tensor or None)  ``SamplerDiagnostics``
:class:`Schedulable`  ``schedulable`` (names of settable floats)  ``TemperatureSchedule``
:class:`DiagnosticQueries` ``diagnostic_queries() -> [B, D]``     ``SamplerDiagnostics``
:class:`SparseGradTable` ``sparse_grad``, ``weight`` ``[N, D]``      ``SparseGradSync``
:class:`ShardedTable` ``sharded``, ``is_split``, ``shard()``,      ``ShardedTables``,
                      ``shard_ids``, ``whole_table()``, ...       ``IndexRefresh``,
                                                                  ``SparseGradSync``
:class:`ExactLoss`    ``full_loss(z, target, ...)``,              ``ExactTrainingLoss``
                      ``ignore_index``
====================  ==========================================  ==============================

The heads implement them: every head is :class:`ExactLoss` and :class:`Schedulable`
(``temperature``; TAPAS also ``selection_temperature``), every
:class:`~lightning_sampled.heads.ProposalHead` is :class:`Refreshable` and :class:`HasProposal`,
``CaneHead`` :class:`ReportsCoverage`, every head that owns a table :class:`SparseGradTable` and
:class:`ShardedTable`, and ``MIDXSampler`` :class:`IndexStats`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from torch import Tensor

if TYPE_CHECKING:
    from .samplers import Sampler


@runtime_checkable
class Refreshable(Protocol):
    """Owns an index built from its parameters, rebuilt by ``refresh_index()``."""

    def refresh_index(self) -> None: ...


@runtime_checkable
class IndexStats(Protocol):
    """Reports numbers about its index (e.g. quantisation error) after a refresh."""

    def index_stats(self) -> dict[str, float]: ...


@runtime_checkable
class HasProposal(Protocol):
    """A head that draws from ``sampler``; ``logits`` and ``score_queries`` give the exact
    softmax the proposal stands in for and the queries the proposal sees."""

    sampler: Sampler

    def logits(self, z: Tensor) -> Tensor: ...

    def score_queries(self, z: Tensor) -> Tensor: ...


@runtime_checkable
class ReportsCoverage(Protocol):
    """Reports, after each training step, the share of targets among its candidates (``None``
    when the step scored no position)."""

    last_coverage: Tensor | None


@runtime_checkable
class Schedulable(Protocol):
    """Declares the float attributes that a callback may set during training."""

    schedulable: tuple[str, ...]


@runtime_checkable
class DiagnosticQueries(Protocol):
    """A LightningModule that gives a fixed batch of queries ``[B, D]`` for diagnostics."""

    def diagnostic_queries(self) -> Tensor | dict[str, Tensor]: ...


@runtime_checkable
class SparseGradTable(Protocol):
    """Owns a class table ``weight`` ``[N, D]`` whose gradient is row-sparse when
    ``sparse_grad`` is true."""

    sparse_grad: bool
    weight: Tensor


@runtime_checkable
class ShardedTable(Protocol):
    """Owns a class table ``weight`` (and ``bias``) of ``num_classes`` rows that may be split
    across the ranks of ``process_group``: ``sharded`` (asked for at construction), ``is_split``
    (this rank holds only the rows ``shard_ids``, placed by ``shard_map``, and any index built
    from them is its own), ``shard()`` (splits it, once ``torch.distributed`` is up) and
    ``whole_table()`` (the gathered ``{"weight", "bias"}``)."""

    sharded: bool
    num_classes: int
    weight: Tensor
    bias: Tensor | None
    shard_map: object
    process_group: object

    @property
    def is_split(self) -> bool: ...

    @property
    def shard_ids(self) -> Tensor: ...

    def shard(self) -> None: ...

    def whole_table(self) -> dict[str, Tensor]: ...


@runtime_checkable
class ExactLoss(Protocol):
    """Has an exact loss beside its training objective: ``full_loss(z, target, sample_weight,
    *, positives=None)``, the exact mean negative log-likelihood of the positions whose target is
    not ``ignore_index``."""

    ignore_index: int

    def full_loss(self, z: Tensor, target: Tensor, *args: object, **kwargs: object) -> Tensor: ...
