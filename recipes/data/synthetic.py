"""Synthetic next-item sequences with planted structure, at any catalogue size (1M items by
default): clustered item vectors, Zipf popularity, and users whose next item depends on their
recent items.

The generative process (vectorised over users; one NumPy step per position, none per item):

1. ``num_clusters`` centres ``mu_c ~ N(0, I / d)`` in ``R^d``; each item ``i`` (ids ``1..N``, 0 is
   padding) belongs to a uniformly drawn cluster ``c_i`` and has the vector
   ``v_i = mu_{c_i} + noise * N(0, I / d)``.
2. Popularity ``p_i ~ rank_i^-zipf`` over a random ranking of the items; a cluster's popularity is
   the sum of its items'. Each cluster has ``num_neighbors`` successor clusters drawn by cluster
   popularity: a sparse Markov transition graph.
3. The first item of a user is drawn by popularity. Each next item: pick one of the last
   ``window`` items (uniformly) and its cluster ``c``; with probability ``stay`` the next cluster
   is ``c``, with probability ``jump`` a cluster drawn by popularity, otherwise a uniformly chosen
   successor of ``c``. Within that cluster, ``num_candidates`` items are drawn by popularity and
   one of them is kept with probability ``softmax(<v_i, mean of the last window items' vectors>
   / temperature)`` (sampling-importance-resampling of ``p_i * exp(sim / temperature)``).
   Items the user has already seen are never drawn again (such a draw is replaced by a uniform
   unseen item), as in MovieLens where each movie is rated once.

:class:`SyntheticSequences` splits the sequences exactly like :class:`~recipes.data.MovieLens`
(SASRec's leave-one-out split, same batches, seen items excluded from the ranking) and caches the
splits as Arrow, keyed by every generation argument.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import lightning as L
import numpy as np
import pyarrow.compute as pc
import torch
from datasets import DatasetDict

from ..towers import ItemFeatures
from .base import cached, default_cache_dir
from .movielens import MovieLens, leave_one_out


@dataclass(frozen=True)
class SyntheticSpec:
    """Every argument of the generative process (see the module docstring); it keys the cache."""

    num_items: int = 1_000_000
    num_users: int = 50_000
    seq_len: int = 50
    num_clusters: int = 1_000
    zipf: float = 1.0
    seed: int = 0
    latent_dim: int = 16
    noise: float = 0.5
    temperature: float = 0.1
    window: int = 3
    stay: float = 0.5
    jump: float = 0.05
    num_neighbors: int = 4
    num_candidates: int = 32

    def __post_init__(self) -> None:
        for name in ("num_items", "num_users", "num_clusters", "latent_dim", "window"):
            check_int(name, getattr(self, name), 1)
        for name in ("num_neighbors", "num_candidates"):
            check_int(name, getattr(self, name), 1)
        check_int("seq_len", self.seq_len, 3)  # leave-one-out needs 3 items per user
        check_int("seed", self.seed, 0)
        if self.num_items < 2 * self.seq_len:
            raise ValueError(
                f"num_items must be >= 2 * seq_len = {2 * self.seq_len} (users never repeat an "
                f"item), got {self.num_items}"
            )
        if self.num_clusters > self.num_items:
            raise ValueError(
                f"num_clusters must be <= num_items={self.num_items}, got {self.num_clusters}"
            )
        for name in ("zipf", "noise"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not np.isfinite(self.temperature) or self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
        for name in ("stay", "jump"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if self.stay + self.jump > 1:
            raise ValueError(f"stay + jump must be <= 1, got {self.stay} + {self.jump}")

    @property
    def key(self) -> str:
        """A file name naming every argument."""
        return "synthetic-" + "-".join(f"{k}{v:g}" for k, v in asdict(self).items())


def check_int(name: str, value: object, low: int) -> None:
    """``value`` is an int (not a bool) ``>= low``, else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


@dataclass
class World:
    """The planted structure: ``vectors`` ``[N + 1, d]`` (row 0, padding, is zero), ``cluster``
    ``[N + 1]`` (``-1`` for padding), ``popularity`` ``[N + 1]`` (sums to 1; 0 for padding),
    ``neighbors`` ``[C, K]`` successor clusters."""

    vectors: np.ndarray
    cluster: np.ndarray
    popularity: np.ndarray
    neighbors: np.ndarray


def draw_world(spec: SyntheticSpec, rng: np.random.Generator) -> World:
    """Steps 1 and 2 of the module docstring: item vectors, clusters, popularity and the cluster
    graph, drawn from ``rng`` (which :func:`generate` then goes on drawing the users from)."""
    n, c, d = spec.num_items, spec.num_clusters, spec.latent_dim
    centres = rng.standard_normal((c, d), dtype=np.float32) / np.sqrt(d)
    cluster = np.concatenate([[-1], rng.integers(c, size=n)])
    vectors = np.zeros((n + 1, d), dtype=np.float32)
    vectors[1:] = centres[cluster[1:]]
    vectors[1:] += (spec.noise / np.sqrt(d)) * rng.standard_normal((n, d), dtype=np.float32)
    popularity = np.zeros(n + 1)
    popularity[1:] = (1.0 + rng.permutation(n)) ** -spec.zipf
    popularity /= popularity.sum()
    layout = ClusterLayout.of(cluster, popularity, c)
    neighbors = draw_clusters(rng, layout.cdf, (c, spec.num_neighbors))
    return World(vectors, cluster, popularity, neighbors)


@dataclass
class ClusterLayout:
    """The items sorted by cluster, to draw within a cluster by popularity: ``order`` ``[N]`` item
    ids, cluster ``k``'s at ``order[offsets[k]:offsets[k + 1]]``; ``cum`` ``[N + 1]`` their
    cumulative popularity; ``mass`` ``[C]`` each cluster's popularity and ``cdf`` ``[C]`` its
    cumulative share."""

    order: np.ndarray
    offsets: np.ndarray
    cum: np.ndarray
    mass: np.ndarray
    cdf: np.ndarray

    @classmethod
    def of(cls, cluster: np.ndarray, popularity: np.ndarray, num_clusters: int) -> ClusterLayout:
        """From :class:`World`'s ``cluster`` and ``popularity`` ``[N + 1]`` (row 0 padding)."""
        order = np.argsort(cluster[1:], kind="stable") + 1
        offsets = np.searchsorted(cluster[order], np.arange(num_clusters + 1))
        cum = np.concatenate([[0.0], np.cumsum(popularity[order])])
        mass = cum[offsets[1:]] - cum[offsets[:-1]]
        return cls(order, offsets, cum, mass, np.cumsum(mass) / mass.sum())

    def draw(self, rng: np.random.Generator, clusters: np.ndarray, size: int) -> np.ndarray:
        """``[U, size]`` items of each of the ``[U]`` ``clusters``, drawn by popularity."""
        lo, mass = self.cum[self.offsets[clusters]], self.mass[clusters]
        u = lo[:, None] + rng.random((len(clusters), size)) * mass[:, None]
        pos = np.searchsorted(self.cum, u, side="right") - 1
        low, high = self.offsets[clusters][:, None], self.offsets[clusters + 1][:, None] - 1
        return self.order[np.clip(pos, low, high)]


def generate(spec: SyntheticSpec) -> tuple[np.ndarray, World]:
    """Draws the world and every user's sequence (deterministic in ``spec.seed``).

    Returns:
        ``(sequences, world)``: ``sequences`` int64 ``[num_users, seq_len]`` item ids in
        ``1..num_items``, distinct within a row, in time order.
    """
    rng = np.random.default_rng(spec.seed)
    world = draw_world(spec, rng)
    n, cluster, vectors, neighbors = spec.num_items, world.cluster, world.vectors, world.neighbors
    layout = ClusterLayout.of(cluster, world.popularity, spec.num_clusters)
    users, length = spec.num_users, spec.seq_len
    seqs = np.zeros((users, length), dtype=np.int64)
    rows = np.arange(users)
    seqs[:, 0] = layout.draw(rng, draw_clusters(rng, layout.cdf, (users,)), 1)[:, 0]
    for t in range(1, length):
        recent = seqs[:, max(0, t - spec.window) : t]
        ref = recent[rows, rng.integers(recent.shape[1], size=users)]
        nxt = cluster[ref]
        r = rng.random(users)
        jump = (r >= spec.stay) & (r < spec.stay + spec.jump)
        move = r >= spec.stay + spec.jump
        nxt[jump] = draw_clusters(rng, layout.cdf, (int(jump.sum()),))
        nxt[move] = neighbors[nxt[move], rng.integers(spec.num_neighbors, size=int(move.sum()))]
        cand = layout.draw(rng, nxt, spec.num_candidates)  # [U, M]
        query = vectors[recent].mean(axis=1)  # [U, d]
        score = np.einsum("umd,ud->um", vectors[cand], query) / spec.temperature
        score += rng.gumbel(size=score.shape)
        seqs[:, t] = pick_unseen(rng, cand, score, seqs[:, :t], n)
    return seqs, world


def pick_unseen(
    rng: np.random.Generator, cand: np.ndarray, score: np.ndarray, history: np.ndarray, n: int
) -> np.ndarray:
    """Each row's best-scoring candidate not in its ``history``; a uniformly drawn unseen item
    where every candidate was seen.

    Args:
        cand: ``[U, M]`` candidate items; ``score``: ``[U, M]`` (modified in place).
        history: ``[U, t]`` the items each user has seen.
        n: the number of items (ids ``1..n``).

    Returns:
        ``[U]`` items.
    """
    rows = np.arange(len(cand))
    best = score.argmax(axis=1)
    chosen = cand[rows, best]
    repeat = (chosen[:, None] == history).any(axis=1)
    (idx,) = np.nonzero(repeat)
    while len(idx):  # only the rows whose best candidate was seen; at most M rounds
        score[idx, best[idx]] = -np.inf
        best[idx] = score[idx].argmax(axis=1)
        exhausted = np.isneginf(score[idx, best[idx]])
        chosen[idx] = np.where(
            exhausted, rng.integers(1, n + 1, size=len(idx)), cand[idx, best[idx]]
        )
        repeat = (chosen[idx, None] == history[idx]).any(axis=1)
        idx = idx[repeat]
    return chosen


def draw_clusters(rng: np.random.Generator, cdf: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Clusters drawn by popularity (``cdf`` ``[C]``, cumulative, ending at 1)."""
    return np.minimum(np.searchsorted(cdf, rng.random(shape), side="right"), len(cdf) - 1)


class SyntheticSequences(MovieLens):
    """Synthetic next-item data with planted structure, split and batched as
    :class:`~recipes.data.MovieLens` (leave-one-out; the same training and evaluation batches).

    Every user has ``seq_len`` distinct items: the last is the test target, the second last the
    validation target. Evaluation ranks all ``num_items`` items exactly, the user's history
    excluded (``exclude_seen``).

    Args:
        num_items: ``N`` items (ids ``1..N``; 0 is padding, so the head has ``N + 1`` classes).
        num_users: users generated (all train; see ``max_eval_users``).
        seq_len: items per user (>= 3).
        num_clusters: item clusters.
        zipf: popularity exponent (``p ~ rank^-zipf``; 0 is uniform).
        seed: the generator's seed (the data is a deterministic function of the arguments).
        max_len: the input length (the latest ``max_len`` items of a history).
        batch_size: training batch size.
        eval_batch_size: evaluation batch size.
        max_eval_users: validate and test on the first users only (each of them costs a full
            ranking of ``N`` items); ``None`` for all.
        exclude_seen: leave each user's history out of the ranking.
        cache_dir: where the Arrow splits are saved (default
            :func:`~recipes.data.base.default_cache_dir`).
        num_workers: DataLoader workers.
        feature_noise: the noise of the items' observed features (:attr:`item_features`): each
            item's latent vector plus ``feature_noise * N(0, I / latent_dim)``.
        **world: further generation arguments of :class:`SyntheticSpec` (``latent_dim``,
            ``noise``, ``temperature``, ``window``, ``stay``, ``jump``, ``num_neighbors``,
            ``num_candidates``), for Python callers (a YAML config sets only the named ones).
    """

    def __init__(
        self,
        num_items: int = 1_000_000,
        num_users: int = 50_000,
        seq_len: int = 50,
        num_clusters: int = 1_000,
        zipf: float = 1.0,
        seed: int = 0,
        max_len: int = 50,
        batch_size: int = 128,
        eval_batch_size: int = 256,
        max_eval_users: int | None = 2_000,
        exclude_seen: bool = True,
        cache_dir: str | None = None,
        num_workers: int = 0,
        feature_noise: float = 0.5,
        **world: float,
    ) -> None:
        L.LightningDataModule.__init__(self)  # MovieLens's loading is replaced, its loaders kept
        try:
            self.spec = SyntheticSpec(
                num_items, num_users, seq_len, num_clusters, zipf, seed, **world
            )
        except TypeError as err:  # an unknown keyword in **world
            raise ValueError(f"unknown generation argument: {err}") from None
        for name, value in (
            ("max_len", max_len),
            ("batch_size", batch_size),
            ("eval_batch_size", eval_batch_size),
        ):
            check_int(name, value, 1)
        if max_eval_users is not None:
            check_int("max_eval_users", max_eval_users, 1)
        if not np.isfinite(feature_noise) or feature_noise < 0:
            raise ValueError(f"feature_noise must be a finite number >= 0, got {feature_noise!r}")
        self.feature_noise = feature_noise
        self.max_len = max_len
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.exclude_seen = exclude_seen
        self.num_workers = num_workers
        cache = Path(cache_dir) if cache_dir else default_cache_dir()

        def build() -> DatasetDict:
            sequences, _ = generate(self.spec)
            return leave_one_out(sequences.tolist(), self.spec.num_items)

        self.splits = cached(cache / self.spec.key, build)
        if max_eval_users is not None:
            for split in ("validation", "test"):
                rows = min(max_eval_users, len(self.splits[split]))
                self.splits[split] = self.splits[split].select(range(rows))
        self._num_items = int(self.splits["train"].info.description)

    @cached_property
    def item_features(self) -> ItemFeatures:
        """What a candidate tower may know of each item (:class:`~recipes.towers.ItemTower`):
        ``dense`` ``[N + 1, latent_dim]``, the item's latent vector observed with
        ``feature_noise`` (drawn from its own stream, ``seed`` and 1), and ``category``
        ``[N + 1]``, its cluster (padding: zeros, category 0). Neither says how popular an item
        is nor which clusters follow which: those are learnt from the sequences."""
        world = draw_world(self.spec, np.random.default_rng(self.spec.seed))
        rng = np.random.default_rng([self.spec.seed, 1])
        d = self.spec.latent_dim
        noise = rng.standard_normal(world.vectors.shape, dtype=np.float32)
        dense = (world.vectors + np.float32(self.feature_noise / np.sqrt(d)) * noise).astype(
            np.float32
        )
        dense[0] = 0
        category = np.maximum(world.cluster, 0)
        return ItemFeatures(torch.from_numpy(dense), torch.from_numpy(category).long())

    @property
    def class_counts(self) -> list[int]:
        """``[N + 1]`` training counts, in one ``bincount`` (MovieLens's per-user loop is
        ``O(users x N)``)."""
        flat = pc.list_flatten(self.splits["train"].data.column("items")).to_numpy()
        return torch.bincount(torch.from_numpy(flat), minlength=self.num_classes).tolist()
