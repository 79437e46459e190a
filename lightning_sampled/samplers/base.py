"""The sampler contract: a proposal ``q(i | z)`` over classes that draws ids and scores them.

A sampler decides *which* classes a sampled head looks at; it never knows which loss uses it.
``log_q`` is always the **normalised** log-probability of an id under one draw, so that a head can
apply the ``o_i - log(M * q_i)`` correction (``docs/architecture.md``) without knowing the sampler.

Under DDP every rank holds the same index (``IndexRefresh`` builds it on rank 0 and broadcasts it)
but draws its own negatives. Every sampler draws from a stream of its own
(:class:`~lightning_sampled._random.DrawStream`), saved in its ``state_dict``: a model resumed
from a checkpoint draws the uninterrupted run's negatives without any callback.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from .._random import DrawStream
from .._validation import check_class_ids, check_padding_idx, check_positive_int


def _keep_stream_of_older_checkpoints(
    module: Sampler, state_dict: dict[str, Any], prefix: str, *_: Any
) -> None:
    """A checkpoint from before samplers had their own stream loads, keeping the current one."""
    state_dict.setdefault(prefix + "_extra_state", module.get_extra_state())


class Sample(NamedTuple):
    """Draws from a proposal.

    Attributes:
        ids: long ``[B, M]`` per-query draws, or ``[M]`` when shared across the batch.
        log_q: float ``[B, M]`` or ``[M]``: the normalised log-probability of each id under one
            draw.
    """

    ids: Tensor
    log_q: Tensor


class Sampler(nn.Module):
    """Base class of all proposals.

    Subclasses implement :meth:`_sample` and :meth:`_log_prob`; this class validates the inputs.
    ``query_independent`` samplers (uniform, unigram, ...) ignore ``z`` and can share one set of
    draws across a batch; adaptive ones (MIDX, ...) cannot.

    **Random draws.** A sampler draws from its own :class:`~lightning_sampled._random.DrawStream`
    (seeded from torch's global generator when the sampler is made), not from torch's global
    generator: a data loader's shuffle or a dropout mask does not change the negatives, and the
    stream's state (two integers) is the ``_extra_state`` entry of the sampler's ``state_dict``,
    so a model loaded from a checkpoint continues the stream exactly. Under ``torch.distributed``
    each rank draws from its own part of the stream; set the attribute ``rank_offset = False`` on
    an instance for the same draws on every rank (with shared negatives, a DDP step then equals
    one process on the ranks' batches together). Either way the ranks must build their samplers
    after seeding alike (``seed_everything`` does), so that the streams share their seed.
    Compiled code (``torch.compile``) draws from torch's default generator instead, since dynamo
    cannot trace a ``torch.Generator``; set ``own_stream = False`` on an instance for eager code
    to do the same (every rank then draws alike, and only
    :class:`~lightning_sampled.callbacks.RNGCheckpoint` restores the draws).

    Args:
        num_classes: the number of classes ``N``.
        padding_idx: a class that is never drawn (its probability is zero).
    """

    query_independent: bool = False
    rank_offset: bool = True
    own_stream: bool = True

    def __init__(self, num_classes: int, *, padding_idx: int | None = None) -> None:
        super().__init__()
        self.num_classes = check_positive_int("num_classes", num_classes)
        self.padding_idx = check_padding_idx(padding_idx, num_classes)
        self.draw_stream = DrawStream()
        self.register_load_state_dict_pre_hook(_keep_stream_of_older_checkpoints)

    @property
    def num_drawable(self) -> int:
        """The number of classes with non-zero probability in the static support."""
        return self.num_classes - (self.padding_idx is not None)

    @property
    def learns(self) -> bool:
        """Whether the sampler has parameters of its own, trained by :meth:`auxiliary_loss`."""
        return any(True for _ in self.parameters())

    def restricted(self, ids: Tensor) -> Sampler:
        """This proposal over the classes ``ids`` only, renormalised: a new sampler over
        ``K = len(ids)`` classes in which class ``ids[k]`` is class ``k`` (the padding class, if
        among them, stays the padding class). A head whose table is split across ranks draws
        from the restriction to its rows. Samplers without one raise ``ValueError``.

        Args:
            ids: long ``[K]`` distinct class ids.
        """
        raise ValueError(
            f"{type(self).__name__} has no restriction to a shard of the classes: a sharded "
            f"head draws from UniformSampler, UnigramSampler, LogUniformSampler or MIDXSampler"
        )

    def local_padding(self, ids: Tensor) -> int | None:
        """The position of :attr:`padding_idx` in ``ids`` ``[K]``, or ``None`` where it is not
        there (the padding class of :meth:`restricted`)."""
        if self.padding_idx is None:
            return None
        at = (ids == self.padding_idx).nonzero()
        return int(at[0, 0]) if at.numel() else None

    def sample(
        self,
        z: Tensor,
        num_samples: int,
        *,
        shared: bool = False,
        generator: torch.Generator | None = None,
    ) -> Sample:
        """Draws ``num_samples`` ids with replacement for every query.

        Args:
            z: ``[B, D]`` queries (ignored by query-independent samplers except for batch size,
                device and dtype).
            num_samples: ``M``, draws per query (or per batch when ``shared``).
            shared: draw one set ``[M]`` for the whole batch; needs a query-independent proposal.
            generator: a ``torch.Generator`` on ``z``'s device to draw with. ``None``: the
                sampler's own stream (:meth:`draw_generator`), different on each rank (unless
                ``rank_offset`` is ``False``).

        Returns:
            ``Sample(ids, log_q)`` with shapes ``[B, M]`` (or ``[M]`` when ``shared``).
        """
        generator = self._check_draw(z, num_samples, shared, generator)
        return self._sample(z, num_samples, shared, generator)

    def log_prob(self, z: Tensor, ids: Tensor) -> Tensor:
        """Normalised log-probability of ``ids`` under one draw for each query.

        Args:
            z: ``[B, D]`` queries.
            ids: long ``[B, K]`` (ids per query) or ``[K]`` (the same ids for every query).

        Returns:
            float ``[B, K]``, or ``[K]`` when ``ids`` is ``[K]`` and the sampler is
            query-independent. The padding class gets ``-inf``.
        """
        check_query_batch(z)
        check_class_ids("ids", ids, self.num_classes)
        check_ids_per_query(z, ids)
        return self._log_prob(z, ids)

    def sample_and_score(
        self,
        z: Tensor,
        num_samples: int,
        ids: Tensor,
        *,
        shared: bool = False,
        generator: torch.Generator | None = None,
    ) -> tuple[Sample, Tensor]:
        """:meth:`sample` and :meth:`log_prob` of ``ids`` under the same proposal, in one pass.

        A head that corrects its positive calls this instead of both: an adaptive sampler
        computes its per-query proposal once (MIDX: the codeword logits) and scores the given
        ids from the same numbers it draws from.

        Args:
            z: ``[B, D]`` queries.
            num_samples: ``M``, draws per query (or per batch when ``shared``).
            ids: long ``[B, K]`` or ``[K]`` ids to score, as in :meth:`log_prob`.
            shared, generator: as in :meth:`sample`.

        Returns:
            ``(sample, log_q_of_ids)``: what :meth:`sample` and :meth:`log_prob` return.
        """
        generator = self._check_draw(z, num_samples, shared, generator)
        check_class_ids("ids", ids, self.num_classes)
        check_ids_per_query(z, ids)
        return self._sample_and_score(z, num_samples, ids, shared, generator)

    def _check_draw(
        self, z: Tensor, num_samples: int, shared: bool, generator: torch.Generator | None
    ) -> torch.Generator | None:
        """Validates a draw's arguments; returns the generator to draw with."""
        check_positive_int("num_samples", num_samples)
        check_query_batch(z)
        if shared and not self.query_independent:
            raise ValueError(
                f"shared negatives need a query-independent proposal; {type(self).__name__} "
                f"adapts to each query: use shared_negatives=False"
            )
        return self.draw_generator(z.device) if generator is None else generator

    def draw_generator(
        self, device: torch.device, per_rank: bool | None = None
    ) -> torch.Generator | None:
        """The generator of the next draw on ``device`` from the sampler's own stream (advances
        it); ``None`` (torch's default generator) under ``torch.compile`` or when
        ``own_stream`` is ``False``. Heads that draw ids themselves (CANE's noise, One-vs-Each's
        others, the in-batch positions of ``max_in_batch_draws``) take theirs from here too;
        ``per_rank=False`` gives every rank the same (``None``: as ``rank_offset`` says)."""
        if not self.own_stream:
            return None
        per_rank = self.rank_offset if per_rank is None else per_rank
        return self.draw_stream.generator(device, per_rank=per_rank)

    def get_extra_state(self) -> dict[str, int]:
        """The state of the sampler's draw stream, ``{"seed", "draws"}``."""
        return self.draw_stream.state()

    def set_extra_state(self, state: Any) -> None:
        """Continues the draw stream from :meth:`get_extra_state`'s state."""
        self.draw_stream.load(state)

    def add_classes(self, num_new: int) -> None:
        """Extends the support to ``num_new`` new classes, ids ``N .. N + num_new - 1``
        (:meth:`~lightning_sampled.heads.OutputHead.add_classes` calls it, then rebuilds any
        index).

        Raises:
            ValueError: for a sampler that cannot grow, saying why.
        """
        raise ValueError(
            f"{type(self).__name__} cannot add classes; the uniform, unigram, log-uniform, MIDX "
            "samplers and mixtures of them can"
        )

    def _grow_support(self, num_new: int) -> None:
        """``num_classes += num_new`` after checking ``num_new``."""
        self.num_classes += check_positive_int("num_new", num_new)

    def refresh(self, class_embeddings: Tensor) -> None:
        """Rebuilds index buffers from the ``[N, D]`` class table; a no-op for static samplers."""

    def check_class_rows(self, rows: Tensor) -> None:
        """Raises ``ValueError`` for class vectors ``[R, D]`` that :meth:`refresh` would refuse
        in a table (a head checks the rows it is about to add before anything grows); any rows
        for samplers without an index."""

    def auxiliary_loss(self, z: Tensor, class_embeddings: Tensor) -> Tensor:
        """A loss that trains the sampler's own parameters (e.g. MIDX-Learn's codewords).

        Sampled heads add it to their objective. ``0`` for samplers without parameters.

        Args:
            z: ``[T, D]`` the step's queries.
            class_embeddings: ``[N, D]`` the class table.
        """
        return z.new_zeros((), dtype=torch.float32)

    def _sample(
        self, z: Tensor, num_samples: int, shared: bool, generator: torch.Generator | None
    ) -> Sample:
        raise NotImplementedError

    def _log_prob(self, z: Tensor, ids: Tensor) -> Tensor:
        raise NotImplementedError

    def _sample_and_score(
        self,
        z: Tensor,
        num_samples: int,
        ids: Tensor,
        shared: bool,
        generator: torch.Generator | None,
    ) -> tuple[Sample, Tensor]:
        """Two calls by default; adaptive samplers override it to share their proposal."""
        return self._sample(z, num_samples, shared, generator), self._log_prob(z, ids)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, padding_idx={self.padding_idx}"


def lookup(table: Tensor, ids: Tensor) -> Tensor:
    """``table[ids]`` for a 1-D ``table`` and long ``ids`` of any shape, by ``index_select``:
    on CPU 2.5-6x faster than advanced indexing for a draw's ``[B, M]`` ids."""
    return table.index_select(0, ids.reshape(-1)).view(ids.shape)


def check_query_batch(z: Tensor) -> None:
    """``ValueError`` unless ``z`` is a floating-point ``[B, D]`` tensor of queries (also where a
    query-independent proposal reads only its batch size, device and dtype)."""
    if z.dim() != 2:
        raise ValueError(f"z must be [B, D], got shape {tuple(z.shape)}")
    if not z.is_floating_point():
        raise ValueError(f"z must be a floating-point [B, D] tensor of queries, got {z.dtype}")


def check_ids_per_query(z: Tensor, ids: Tensor) -> None:
    """``ValueError`` unless ``ids`` are per-query ``[B, K]`` with one row per query of ``z``
    ``[B, D]``, or shared ``[K]`` (which fit any batch)."""
    if ids.dim() not in (1, 2):
        raise ValueError(
            f"ids must be [B, K] (per query) or [K] (shared), got shape {tuple(ids.shape)}"
        )
    if ids.dim() == 2 and (z.dim() != 2 or ids.shape[0] != z.shape[0]):
        raise ValueError(
            f"ids [B, K] must have one row per query of z [B, D], got ids of shape "
            f"{tuple(ids.shape)} and z of shape {tuple(z.shape)}"
        )
