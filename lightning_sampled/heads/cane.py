"""``CaneHead``: Candidates vs. Noises Estimation with a beam-search class tree (Han et al., 2018).

For each query ``x`` (Algorithm 2 of the paper), a beam search over a class tree finds the
``N_c`` candidates ``C_x`` with the highest scores (Algorithm 3), and ``N_n`` noises ``T_x`` are
drawn outside ``C_x`` from ``q_x``, the noise proposal restricted to the complement. The loss of a
position with target ``y`` is

- ``y`` in ``C_x`` (Eq. 2, averaged over the noises as Eq. 7 does, one denominator per noise):
  ``mean_j [log(sum_{c in C_x} e^{s_c} + e^{s_j} / q_x(j))] - s_y``;
- ``y`` outside ``C_x`` (Eq. 3, the target plays the noise):
  ``log(sum_{c in C_x} e^{s_c} + e^{s_y} / q_x(y)) - s_y``.

Both are consistent estimators of the softmax (the paper's Theorems 1 and 2) for any ``q_x`` that
is the true distribution of the draws, and their variance approaches the full softmax's as the
candidates cover the targets (Corollary 1): :attr:`CaneHead.last_coverage` reports that coverage.

Two trees (``tree``):

- ``"kmeans"``: Algorithm 4, hierarchical k-means over the class vectors (or, with
  ``num_clusters``, flat clusters kept whole under a hierarchy), rebuilt by ``refresh_index``;
  the candidates are the ``N_c`` leaves a beam search finds.
- ``"frequency"``: Section 5's tree for language models, whose word vectors are not known before
  training: one layer of subsets under the root, the classes sorted by decreasing training count
  and cut into ``num_subsets`` consecutive subsets of about equal total count ("split by
  averaging over the word frequencies": a few frequent words, then ever longer tails;
  :func:`~lightning_sampled.index.tree.frequency_subsets`), fixed for the whole run. Each query
  is routed to the subset whose mean class vector scores highest, and its ``N_c`` candidates
  are drawn uniformly, without replacement, from that subset ("we uniformly sample the
  candidates when reaching any subset"); every subset holds more than ``N_c`` classes. The
  candidate set depends on ``x`` and on the draw, never on ``y``, so Eqs. (2)-(3) stay
  consistent. The beam search of :meth:`CaneHead.beam_topk` runs on a ``branching``-ary tree
  over the same frequency order, which groups classes by count, not by vector: its recall at
  small beams is low, so serve with ``topk`` or faiss.

Two parameterisations of the class scores ``s_k = z . v_k + b_k``:

- ``"flat"``: ``v_k`` is a row of the head's ``weight`` (tieable, e.g. to SASRec's item
  embedding); the beam search scores an internal node by the mean of its descendants' class
  vectors, kept in a buffer and recomputed when the tree is rebuilt.
- ``"path"`` (the Beam Tree model of Eq. 9): parameters live on the tree's edges and ``v_k`` is the
  sum of the edges on the root-to-``k`` path: the internal edges of levels ``1..L-1`` are the
  parameter ``edges``, the leaf edges are ``weight``. The beam search accumulates partial path
  sums, so a node's score is the exact score of its path so far.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._deprecation import renamed_attribute, take_renamed
from .._validation import check_int, check_positive_int
from ..index.tree import (
    ClassTree,
    beam_search,
    fit_node_vectors,
    frequency_subsets,
    parent_index,
    whole_level_start,
)
from ..samplers import Sampler, UniformSampler
from .proposal import ProposalHead

PARAMETERIZATIONS = ("flat", "path")
TREES = ("kmeans", "frequency")

#: rounds of rejection before a noise slot falls back to a uniform draw over the complement
REJECTION_ROUNDS = 4


class NoiseDraw(NamedTuple):
    """Noises drawn outside each query's candidates, and the restricted proposal ``q_x``.

    Attributes:
        ids: long ``[T, M]`` noise classes, never a candidate nor ``padding_idx``.
        log_q: fp32 ``[T, M]``, ``log q_x(j)`` of each noise.
        target_log_q: fp32 ``[T]``, ``log q_x(y)`` of each target (used when ``y`` is not a
            candidate; meaningless where it is).
    """

    ids: Tensor
    log_q: Tensor
    target_log_q: Tensor


def cane_loss(
    target_logits: Tensor,
    candidate_logits: Tensor,
    noise_logits: Tensor,
    noise_log_q: Tensor,
    target_log_q: Tensor,
    covered: Tensor,
) -> Tensor:
    """The CANE loss of each position: Eq. (2) averaged over the noises where the target is a
    candidate, Eq. (3) where it is not (module docstring).

    Args:
        target_logits: ``[T]`` ``s_y``.
        candidate_logits: ``[T, C]`` ``s_c`` of the candidates.
        noise_logits: ``[T, M]`` ``s_j`` of the noises.
        noise_log_q: ``[T, M]`` ``log q_x(j)``.
        target_log_q: ``[T]`` ``log q_x(y)``.
        covered: bool ``[T]``, whether ``y`` is among the candidates.

    Returns:
        fp32 ``[T]`` negative log of the approximated probabilities.
    """
    target_as_noise = (target_logits - target_log_q)[:, None]
    noise_terms = torch.where(covered[:, None], noise_logits - noise_log_q, target_as_noise)
    candidate_mass = torch.logsumexp(candidate_logits, dim=1, keepdim=True)
    return torch.logaddexp(candidate_mass, noise_terms).mean(dim=1) - target_logits


def draw_complement(
    excluded: Tensor, num_classes: int, num_samples: int, generator: torch.Generator | None
) -> Tensor:
    """Uniform draws over the classes of ``[0, num_classes)`` outside each row of ``excluded``.

    A rank ``r`` among the ``num_classes - E`` allowed classes maps to the class
    ``r + #{i : excluded[i] - i <= r}`` (``excluded`` sorted: ``excluded[i] - i`` counts the
    allowed classes below ``excluded[i]``), one ``searchsorted`` per row.

    Args:
        excluded: long ``[T, E]`` distinct class ids per row, sorted ascending.
        num_classes: ``N``.
        num_samples: ``M`` draws per row, with replacement.
        generator: for reproducible draws (``None``: torch's default).

    Returns:
        long ``[T, M]``.
    """
    rows, count = excluded.shape
    ranks = torch.randint(
        num_classes - count,
        (rows, num_samples),
        device=excluded.device,
        generator=generator,
    )
    allowed_below = excluded - torch.arange(count, device=excluded.device)
    return ranks + torch.searchsorted(allowed_below, ranks, right=True)


def descendant_means(tree: ClassTree, vectors: Tensor, weights: Tensor) -> list[Tensor]:
    """Weighted means of the class vectors under every internal node of levels ``1..L-1``.

    Args:
        tree: the class tree.
        vectors: ``[N, D]`` class vectors in class order.
        weights: ``[N]`` non-negative class weights (``0`` leaves a class out, e.g. padding);
            a node without weight gets the zero vector.

    Returns:
        ``L - 1`` tensors, the ``l``-th ``[n_l, D]`` in node order.
    """
    sizes = tree.level_sizes()
    sums = vectors[tree.leaf_order] * weights[tree.leaf_order, None].to(vectors.dtype)
    counts = weights[tree.leaf_order].to(vectors.dtype)
    means = []
    for level in range(len(sizes) - 2, 0, -1):
        parent = parent_index(sizes[level + 1], tree.branchings[level], vectors.device)
        sums = sums.new_zeros(sizes[level], vectors.shape[1]).index_add_(0, parent, sums)
        counts = counts.new_zeros(sizes[level]).index_add_(0, parent, counts)
        means.append(sums / counts.clamp(min=1.0)[:, None])
    return means[::-1]


class CaneHead(ProposalHead):
    """Candidates vs. noises: beam-search candidates against noises drawn outside them.

    See the module docstring for the loss, the two trees and the two parameterisations. The
    k-means tree is built at construction from the initial class vectors by hierarchical k-means
    (seeded), and rebuilt from the current ones by :meth:`refresh_index`
    (:class:`~lightning_sampled.callbacks.IndexRefresh` calls it each epoch); the frequency
    order and subsets are built from ``class_counts`` and kept, and a refresh recomputes the
    node and subset vectors. The tree, the subsets and their vectors are persistent buffers, so a
    checkpoint restores them. :meth:`beam_topk` predicts by beam search, ``O(J b log_b N)`` per
    query (``J`` the beam width, ``b`` the branching) from the root, at most twice that from the
    level scored whole where it starts by default, beside the exact :meth:`topk`.

    Noises come from ``sampler`` restricted to the complement of the candidates,
    ``q_x(j) = q(j) / (1 - q(C_x))``. For a :class:`UniformSampler` they are drawn directly over
    the complement (``q_x = 1 / (N' - N_c)`` with ``N'`` the classes other than padding). For any
    other sampler each noise takes the first of :data:`REJECTION_ROUNDS` draws that is not a
    candidate, or, if all of them are, a uniform draw over the complement; its exact probability
    is then ``q(j) (1 - a^R) / (1 - a) + a^R / (N' - N_c)`` with ``a = q(C_x)``, which is what the
    loss uses (it tends to ``q(j) / (1 - a)`` as ``R`` grows, and needs no host sync).

    Args:
        num_classes: ``N``.
        dim: ``D``.
        num_candidates: ``N_c``, candidates per query, at most ``N' - 1``.
        num_noise: ``N_n``, noises per query (with replacement).
        branching: ``b``, the tree's branching factor, at least 2.
        beam: ``J``, the beam width of the training search (``N_c`` when ``None``; at least
            ``N_c``). With ``padding_idx`` a width of at least 2 is used, which keeps the
            padding class (scored ``-inf``) out of the candidates.
        parameterization: ``"flat"`` or ``"path"`` (module docstring).
        sampler: the noise proposal ``q`` (:class:`ProposalHead`); uniform when ``None``.
            Rebuilt with the tree (``refresh``) from the class vectors.
        seed: seed of the tree's k-means.
        num_clusters: ``C``: build the tree around ``C`` flat k-means clusters, each kept whole
            in one subtree (:meth:`~lightning_sampled.index.tree.ClassTree.from_vectors`; better
            beam recall on clustered tables, at ``O(N C D)`` per refresh); ``None``: the
            paper's Algorithm 4 from the root. ``"kmeans"`` tree only.
        tree: ``"kmeans"`` or ``"frequency"`` (module docstring). With the frequency tree,
            ``beam`` serves :meth:`beam_topk` only and ``seed`` is unused.
        class_counts: ``[N]`` non-negative training counts of the classes, which order the
            frequency tree (required by it; ignored by the k-means tree, so a recipe may always
            pass its data's counts).
        num_subsets: the frequency tree's subsets (Section 5 uses 6), of about equal total
            count and at least ``num_candidates + 1`` classes each (the padding class is in
            none).
        **options: ``sparse_grad`` of :class:`ProposalHead` (``weight``'s gradient; the
            ``path`` edges stay dense); ``weight`` (``"flat"`` only), ``bias``, ``padding_idx``,
            ``ignore_index``, ``chunk_size``, ``temperature``, ``normalize`` (``False`` only)
            and ``label_smoothing`` (0 only) of :class:`OutputHead`. Old name, with a
            ``FutureWarning``: ``noise_sampler`` (``sampler``).
    """

    sharding_refusal = (
        "its candidates come from a beam search down a class tree that spans every rank's rows"
    )
    tower_refusal = "its tree and path vectors are built over a class table it owns"
    growth_refusal = (
        "its class tree (and, with parameterization='path', its class vectors) is built over a "
        "fixed set of classes; build a new CaneHead over the grown catalog"
    )

    # The coverage counts the scored positions: no stand-in positions under torch.compile.
    positions_apart = False
    noise_sampler = renamed_attribute("noise_sampler", "sampler")

    def __init__(
        self,
        num_classes: int,
        dim: int,
        num_candidates: int,
        num_noise: int,
        branching: int = 10,
        beam: int | None = None,
        parameterization: str = "flat",
        sampler: Sampler | None = None,
        *,
        seed: int = 0,
        num_clusters: int | None = None,
        tree: str = "kmeans",
        class_counts: Tensor | None = None,
        num_subsets: int = 6,
        **options: Any,
    ) -> None:
        sampler = take_renamed(options, "noise_sampler", "sampler", sampler, owner="CaneHead")
        if options.get("normalize", False) is not False:
            raise ValueError(
                f"normalize must be False for CaneHead, got {options['normalize']!r}: the beam "
                f"search scores raw node vectors and path sums, not cosines"
            )
        if parameterization not in PARAMETERIZATIONS:
            raise ValueError(
                f"parameterization must be one of {PARAMETERIZATIONS}, got {parameterization!r}"
            )
        if tree not in TREES:
            raise ValueError(f"tree must be one of {TREES}, got {tree!r}")
        if tree == "frequency" and num_clusters is not None:
            raise ValueError(
                f"num_clusters={num_clusters} builds a k-means tree; tree='frequency' orders the "
                f"classes by class_counts instead: drop one of them"
            )
        if tree == "frequency" and class_counts is None:
            raise ValueError("tree='frequency' needs class_counts, the [N] training counts")
        if parameterization == "path" and options.get("weight") is not None:
            raise ValueError(
                "weight cannot be tied with parameterization='path': its weight holds the leaf "
                "edges, not the class vectors; use parameterization='flat' to tie"
            )
        super().__init__(num_classes, dim, sampler, **options)
        self.parameterization = parameterization
        self.branching = check_int("branching", branching)
        if self.branching < 2:
            raise ValueError(f"branching must be >= 2, got {branching}")
        self.num_candidates = check_positive_int("num_candidates", num_candidates)
        if self.num_candidates >= self.num_drawable:
            raise ValueError(
                f"num_candidates must be < {self.num_drawable} (the classes other than "
                f"padding_idx), so that noises remain, got {num_candidates}"
            )
        self.num_noise = check_positive_int("num_noise", num_noise)
        self.beam = self.num_candidates if beam is None else check_positive_int("beam", beam)
        if self.beam < self.num_candidates:
            raise ValueError(f"beam must be >= num_candidates={num_candidates}, got {beam}")
        self.seed = check_int("seed", seed)
        # its range is checked by the tree's build, at the refresh below
        self.num_clusters = (
            None if num_clusters is None else check_int("num_clusters", num_clusters)
        )
        self.last_coverage: Tensor | None = None
        self.tree_kind = tree

        order = torch.arange(num_classes, device=self.weight.device)
        if tree == "frequency":
            order, starts = self._frequency_subsets(class_counts, num_subsets)
            self.register_buffer("subset_starts", starts, persistent=True)
            subset_vectors = self.weight.new_zeros(starts.numel() - 1, dim)
            self.register_buffer("subset_vectors", subset_vectors, persistent=True)
        tree = ClassTree.balanced(order, self.branching)
        branchings, leaf_order = tree.to_tensors()
        self.register_buffer("tree_branchings", branchings.to(leaf_order.device), persistent=True)
        self.register_buffer("tree_leaf_order", leaf_order.clone(), persistent=True)
        self.register_buffer("tree_leaf_position", tree.leaf_position.clone(), persistent=True)
        self._search_tree_cache: tuple[tuple, ClassTree] | None = None
        internal = sum(tree.level_sizes()[1:-1])
        vectors = self.weight.new_zeros(internal, dim)
        if parameterization == "flat":
            self.register_buffer("node_vectors", vectors, persistent=True)
        else:
            self.edges = nn.Parameter(vectors)
        # serving's node vectors, fitted to sample queries by fit_search (unset until then)
        self.register_buffer("search_vectors", vectors.detach().clone(), persistent=True)
        self.register_buffer("search_fitted", torch.zeros((), dtype=torch.bool), persistent=True)
        self.register_load_state_dict_pre_hook(_unfitted_search_of_older_checkpoints)
        self.refresh_index()

    # -- construction -----------------------------------------------------------------------------

    @property
    def num_drawable(self) -> int:
        """``N'``: the classes other than ``padding_idx``."""
        return self.num_classes - (self.padding_idx is not None)

    def _frequency_subsets(self, class_counts: Tensor, num_subsets: int) -> tuple[Tensor, Tensor]:
        """The frequency order and subset starts (:func:`frequency_subsets`) of
        ``class_counts``, on the table's device, each subset holding more than
        ``num_candidates`` classes so that noises remain outside the candidates."""
        counts = torch.as_tensor(class_counts, device=self.weight.device)
        if counts.shape != (self.num_classes,):
            raise ValueError(
                f"class_counts must hold the N={self.num_classes} class counts, got shape "
                f"{tuple(counts.shape)}"
            )
        num_subsets = check_positive_int("num_subsets", num_subsets)
        if num_subsets * (self.num_candidates + 1) > self.num_drawable:
            raise ValueError(
                f"num_subsets={num_subsets} subsets of more than num_candidates="
                f"{self.num_candidates} classes each need more than the {self.num_drawable} "
                f"classes other than padding_idx: use fewer candidates or fewer subsets"
            )
        return frequency_subsets(
            counts, num_subsets, self.num_candidates + 1, last=self.padding_idx
        )

    @property
    def tree(self) -> ClassTree:
        """The current class tree, built (and validated) from the buffers ``tree_branchings``
        and ``tree_leaf_order``."""
        return ClassTree.from_tensors(self.tree_branchings, self.tree_leaf_order)

    def _search_tree(self) -> ClassTree:
        """The tree the training step searches, built once per buffer tensor: its
        ``leaf_order`` *is* the buffer ``tree_leaf_order``, so it follows the buffer's in-place
        updates (a refresh, a loaded checkpoint, an ``IndexRefresh`` broadcast under DDP); its
        ``leaf_position`` is not read (the buffer ``tree_leaf_position`` is), nor its shape,
        which ``N`` and ``branching`` fix."""
        leaf_order = self.tree_leaf_order
        key = (leaf_order.data_ptr(), leaf_order.device)
        if self._search_tree_cache is None or self._search_tree_cache[0] != key:
            self._search_tree_cache = (
                key,
                ClassTree.from_tensors(self.tree_branchings, leaf_order),
            )
        return self._search_tree_cache[1]

    # -- the class vectors ------------------------------------------------------------------------

    def _internal_levels(self, tree: ClassTree) -> list[Tensor]:
        """The node vectors (``"flat"``) or edges (``"path"``) of levels ``1..L-1``, each
        ``[n_l, D]``."""
        table = self.node_vectors if self.parameterization == "flat" else self.edges
        return list(torch.split(table, tree.level_sizes()[1:-1]))

    def _last_internal_path_sums(self, tree: ClassTree) -> Tensor:
        """``"path"``: ``[n_{L-1}, D]``, the sum of the edges from the root to each node of level
        ``L - 1``, differentiable."""
        levels = self._internal_levels(tree)
        sizes = tree.level_sizes()
        total = levels[0]
        for level in range(2, len(sizes) - 1):
            parent = parent_index(sizes[level], tree.branchings[level - 1], total.device)
            total = levels[level - 1] + total.index_select(0, parent)
        return total

    def _leaf_parent(self, tree: ClassTree, ids: Tensor) -> Tensor:
        """The node of level ``L - 1`` above each class of ``ids`` (positions from the buffer
        ``tree_leaf_position``)."""
        return self.tree_leaf_position[ids] // tree.branchings[-1]

    def class_table(self) -> Tensor:
        """``[N, D]`` class vectors: ``weight`` (``"flat"``), or each class's path sum
        ``weight[k] + sum of its ancestors' edges`` (``"path"``), differentiable."""
        tree = self._search_tree()
        if self.parameterization == "flat" or len(tree.branchings) == 1:
            return self.weight
        ids = torch.arange(self.num_classes, device=self.weight.device)
        above = self._last_internal_path_sums(tree).index_select(0, self._leaf_parent(tree, ids))
        return self.weight + above

    def class_rows(self, ids: Tensor) -> tuple[Tensor, Tensor | None]:
        """Class vectors ``[*ids.shape, D]`` (path sums under ``"path"``) and biases, gathered
        as :meth:`OutputHead.class_rows` does."""
        rows, bias = super().class_rows(ids)
        tree = self._search_tree()
        if self.parameterization == "flat" or len(tree.branchings) == 1:
            return rows, bias
        above = F.embedding(self._leaf_parent(tree, ids), self._last_internal_path_sums(tree))
        return rows + above, bias

    # -- the index --------------------------------------------------------------------------------

    @torch.no_grad()
    def refresh_index(self) -> None:
        """Rebuilds the tree by hierarchical k-means on the current class vectors
        (:meth:`class_table`), recomputes the node vectors and rebuilds the noise sampler. The
        frequency order is kept; its node vectors and subset means are recomputed.

        ``"flat"``: every internal node's vector becomes the mean of its descendants' class
        vectors (the padding class left out). ``"path"``: the class vectors are re-decomposed on
        the new tree so that each class's path sum, hence every logit, is unchanged: with
        ``m_v`` the mean under node ``v`` (``m_root = 0``), edge ``(u, v)`` becomes
        ``m_v - m_u`` and leaf edge ``(u, k)`` becomes ``v_k - m_u``. The optimizer's moments of
        ``edges`` and ``weight`` (e.g. Adam's) then no longer match the edges they belong to.
        Under DDP, :class:`~lightning_sampled.callbacks.IndexRefresh` refreshes on rank 0 and
        broadcasts buffers only, so ``"path"``'s new parameters stay on rank 0: under DDP use
        ``"flat"``, or broadcast the head's parameters after each refresh.
        """
        table = self.class_table().detach()
        if self.tree_kind == "frequency":  # the frequency order is kept
            tree = self.tree
            self.subset_vectors.copy_(subset_means(table, self.tree_leaf_order, self.subset_starts))
        else:
            tree = ClassTree.from_vectors(
                table, self.branching, seed=self.seed, num_clusters=self.num_clusters
            )
        self.search_fitted.fill_(False)  # fitted to the old tree and vectors
        self.tree_leaf_order.copy_(tree.leaf_order)
        self.tree_leaf_position.copy_(tree.leaf_position)
        means = self._node_means(tree, table)
        if means and self.parameterization == "flat":
            self.node_vectors.copy_(torch.cat(means))
        elif means:
            self.edges.copy_(torch.cat(path_edges(tree, means)))
            ids = torch.arange(self.num_classes, device=table.device)
            self.weight.copy_(table - means[-1].index_select(0, self._leaf_parent(tree, ids)))
        super().refresh_index()

    def _node_means(self, tree: ClassTree, table: Tensor) -> list[Tensor]:
        """The internal nodes' means of ``table`` ``[N, D]`` (:func:`descendant_means`), the
        padding class left out."""
        weights = torch.ones(self.num_classes, device=table.device)
        if self.padding_idx is not None:
            weights[self.padding_idx] = 0.0
        return descendant_means(tree, table, weights)

    def _level_vectors(self, tree: ClassTree) -> list[Tensor]:
        """The beam search's per-level vectors: internal levels by node, leaves by class id."""
        return [v.detach() for v in self._internal_levels(tree)] + [self.weight.detach()]

    def _leaf_bias(self) -> Tensor | None:
        """``[N]`` added to leaf scores: the bias, and ``-inf`` for the padding class."""
        if self.bias is None and self.padding_idx is None:
            return None
        bias = torch.zeros(self.num_classes, device=self.weight.device)
        if self.bias is not None:
            bias = bias + self.bias.detach().float()
        if self.padding_idx is not None:
            bias[self.padding_idx] = -math.inf
        return bias

    @torch.no_grad()
    def search(
        self, z: Tensor, k: int, beam: int, start: int | str = "root", fitted: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Beam search (Algorithm 3) for the top ``k`` classes of queries ``z`` ``[T, D]`` (from
        :meth:`score_queries`).

        Args:
            start: where the search starts: ``"root"`` (Algorithm 3, the training candidates'
                search), ``"auto"`` (the level :func:`~lightning_sampled.index.tree.
                whole_level_start` picks, scored whole), or a level ``0..L-1``.
            fitted: score the internal nodes by the vectors :meth:`fit_search` fitted, and the
                leaves by :meth:`class_table` (both parameterisations); needs a fit.

        Returns:
            ``(scores [T, k] fp32, class_ids [T, k])``, sorted descending; the scores are the
            exact logits of the classes found.
        """
        tree = self._search_tree()
        if fitted:
            internal = torch.split(self.search_vectors, tree.level_sizes()[1:-1])
            levels = [*internal, self.class_table().detach()]
        else:
            levels = self._level_vectors(tree)
        return beam_search(
            tree,
            z.detach(),
            levels,
            beam,
            k,
            accumulate=self.parameterization == "path" and not fitted,
            leaf_bias=self._leaf_bias(),
            start_level=self._start_level(tree, beam, start),
        )

    @torch.no_grad()
    def fit_search(self, queries: Tensor, ridge: float = 1e-3) -> None:
        """Fits the node vectors :meth:`beam_topk` scores to sample queries, for serving.

        A node's mean ranks it by its average class, while a top-k search needs it ranked by
        its best class; on trained tables, whose classes have very different norms, the two
        part and the beam drops the nodes that hold a query's top classes.
        :func:`~lightning_sampled.index.tree.fit_node_vectors` moves each node's vector, from
        its descendants' mean, to the least-squares (ridge) predictor of its best descendant's
        logit over ``queries``. Training is unchanged (its candidates keep the node means);
        :meth:`refresh_index` discards the fit, so fit after training, on queries drawn like the
        ones to be served (e.g. the validation split's), and measure recall on others. At beam
        20 it raised recall@10 from 0.73 to 0.98 (GCIDE's LSTM) and 0.87 to 0.97 (SASRec on
        MovieLens-1M) on held-out queries (``benchmarks/results/cane_topk_trained.md``). The fit
        is a buffer, so a checkpoint keeps it.

        Args:
            queries: ``[..., D]`` head inputs (as :meth:`beam_topk` takes them), at least one.
            ridge: ``> 0``, the shrinkage toward the node means (relative to the queries'
                scale).
        """
        self._check_z(queries)
        tree = self._search_tree()
        table = self.class_table().detach()
        fitted = fit_node_vectors(
            tree,
            table,
            self.score_queries(queries.reshape(-1, self.dim)).detach(),
            self._node_means(tree, table.float()),
            leaf_bias=self._leaf_bias(),
            ridge=ridge,
        )
        if fitted:
            self.search_vectors.copy_(torch.cat(fitted))
        self.search_fitted.fill_(True)

    @staticmethod
    def _start_level(tree: ClassTree, beam: int, start: int | str) -> int:
        """The ``start_level`` of :func:`beam_search` that ``start`` names (see :meth:`search`)."""
        if start == "root":
            return 0
        if start == "auto":
            return whole_level_start(tree, beam)
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < tree.depth:
            raise ValueError(
                f"start must be 'root', 'auto' or a level in [0, {tree.depth - 1}], got {start!r}"
            )
        return start

    def candidates(self, z: Tensor) -> Tensor:
        """The candidates ``C_x`` of queries ``z`` ``[T, D]`` (from :meth:`score_queries`): long
        ``[T, num_candidates]``.

        The beam is at least 2 wide when there is a padding class: the padding leaf scores
        ``-inf`` and may be the only leaf under a node, so a beam of 1 could end there; with 2 or
        more, at least ``beam + 1`` leaves reach the last step and the padding is never kept.
        """
        if self.tree_kind == "frequency":
            return self.subset_candidates(z)
        width = max(self.beam, 2) if self.padding_idx is not None else self.beam
        return self.search(z, self.num_candidates, width)[1]

    @torch.no_grad()
    def subset_candidates(self, z: Tensor) -> Tensor:
        """The frequency tree's candidates (Section 5): each query of ``z`` ``[T, D]`` is routed
        to the subset whose mean class vector scores highest, and ``num_candidates`` of that
        subset's classes are drawn uniformly without replacement, from the sampler's draw
        stream. Long ``[T, num_candidates]``."""
        scores = z.detach().float() @ self.subset_vectors.float().T
        subset = scores.argmax(dim=1)
        start = self.subset_starts[subset]
        sizes = self.subset_starts[subset + 1] - start
        generator = self.sampler.draw_generator(z.device)
        offsets = distinct_uniform(sizes, self.num_candidates, generator)
        return self.tree_leaf_order[start[:, None] + offsets]

    @torch.no_grad()
    def beam_topk(
        self, z: Tensor, k: int, beam: int | None = None, start: int | str = "auto"
    ) -> tuple[Tensor, Tensor]:
        """Approximate top-``k`` classes by beam search, for fast prediction.

        By default the search starts at the level :func:`~lightning_sampled.index.tree.
        whole_level_start` picks, scored whole: the upper levels' node means, of many classes
        each, rank a query's best classes poorly, and skipping them costs at most as much as the
        search's own gathers (recall@10 at beam 20 on planted clusters: 0.92 instead of 0.88 at
        ``N = 1e5``, 0.83 instead of 0.64 at ``N = 1e6``, ``benchmarks/results/cane_topk.md``).
        ``start="root"`` is Algorithm 3 as training runs it. After :meth:`fit_search` (and
        until the next :meth:`refresh_index`) the internal nodes are scored by the fitted
        vectors instead of the means.

        Args:
            z: ``[..., D]`` queries.
            k: how many classes, ``1 <= k <= N``.
            beam: the beam width ``J >= k``; by default the larger of the head's ``beam`` and
                ``k``. With ``J >= N`` nothing is pruned and the result is the exact top-``k``.
            start: ``"auto"`` (default), ``"root"`` or a level ``0..L-1`` (:meth:`search`).

        Returns:
            ``(values, indices)`` as :meth:`topk`: fp32 logits ``[..., k]`` and long class ids
            ``[..., k]`` in decreasing order.
        """
        self._check_z(z)
        self._check_k(k)
        width = max(self.beam, k) if beam is None else check_positive_int("beam", beam)
        if width < k:
            raise ValueError(f"beam must be >= k={k}, got {beam}")
        queries = self.score_queries(z.reshape(-1, self.dim))
        if queries.shape[0] == 0:  # no query: empty results, as topk gives
            values = queries.new_empty(0, k, dtype=torch.float32)
            indices = torch.empty(0, k, dtype=torch.long, device=queries.device)
        else:
            fitted = bool(self.search_fitted)
            values, indices = self.search(queries, k, width, start, fitted)
        return values.reshape(*z.shape[:-1], k), indices.reshape(*z.shape[:-1], k)

    # -- training ---------------------------------------------------------------------------------

    @torch.no_grad()
    def draw_noise(self, z: Tensor, candidates: Tensor, target: Tensor) -> NoiseDraw:
        """``num_noise`` noises per query outside its candidates and ``padding_idx``, with
        ``log q_x`` of the noises and of the targets (class docstring).

        Args:
            z: ``[T, D]`` queries.
            candidates: long ``[T, C]`` distinct candidate classes per query (no padding).
            target: long ``[T]``.
        """
        excluded = candidates
        if self.padding_idx is not None:
            excluded = F.pad(candidates, (0, 1), value=self.padding_idx)
        excluded = excluded.sort(dim=1).values
        allowed = self.num_classes - excluded.shape[1]
        generator = self.sampler.draw_generator(z.device)
        uniform = draw_complement(excluded, self.num_classes, self.num_noise, generator)
        if isinstance(self.sampler, UniformSampler):
            log_q = torch.full(uniform.shape, -math.log(allowed), device=z.device)
            return NoiseDraw(uniform, log_q, log_q[:, 0])
        rounds = self.sampler.sample(z, self.num_noise * REJECTION_ROUNDS).ids
        rounds = rounds.reshape(z.shape[0], REJECTION_ROUNDS, self.num_noise)
        accepted = ~is_member(rounds.flatten(1).contiguous(), excluded).view_as(rounds)
        first = accepted.byte().argmax(dim=1, keepdim=True)
        chosen = rounds.gather(1, first).squeeze(1)
        ids = torch.where(accepted.any(dim=1), chosen, uniform)
        log_q = self.sampler.log_prob(z, torch.cat([target[:, None], candidates, ids], 1))
        log_q = log_q.expand(z.shape[0], -1).double()
        log_mass = torch.logsumexp(log_q[:, 1 : 1 + candidates.shape[1]], dim=1, keepdim=True)
        mass = log_mass.exp().clamp(max=1.0)
        powers = mass ** torch.arange(REJECTION_ROUNDS + 1, device=z.device, dtype=mass.dtype)
        accepted_share = powers[:, :-1].sum(dim=1, keepdim=True).log()
        fallback_share = powers[:, -1:].log() - math.log(allowed)
        restricted = torch.logaddexp(log_q + accepted_share, fallback_share).float()
        return NoiseDraw(ids, restricted[:, 1 + candidates.shape[1] :], restricted[:, 0])

    def forward(
        self,
        z: Tensor,
        target: Tensor,
        sample_weight: Tensor | None = None,
        *,
        reduction: str = "mean",
        positives: str | None = None,
    ) -> Tensor:
        """CANE loss of ``target`` ``[...]`` given ``z`` ``[..., D]``, weighted by
        ``sample_weight`` ``[...]`` when given and reduced as :meth:`ProposalHead.forward` says
        (the mean by default, a scalar).

        Sets :attr:`last_coverage` to the fraction of scored positions whose target was a
        candidate (unweighted; a 0-dim tensor, ``None`` when no position is scored).
        """
        self.last_coverage = None
        return super().forward(z, target, sample_weight, reduction=reduction, positives=positives)

    def sampled_losses(self, queries: Tensor, target: Tensor) -> Tensor:
        """The CANE loss ``[T]`` of each scored position (module docstring); sets
        :attr:`last_coverage`.

        Args:
            queries: ``[T, D]`` scored queries.
            target: long ``[T]`` their targets.
        """
        candidates = self.candidates(queries)
        noise = self.draw_noise(queries.detach(), candidates, target)
        covered = (candidates == target[:, None]).any(dim=1)
        ids = torch.cat([candidates, noise.ids], dim=1)
        target_logits, others = self.target_and_candidate_logits(queries, target, ids)
        candidate_logits, noise_logits = others.split([self.num_candidates, self.num_noise], dim=1)
        self.last_coverage = covered.float().mean()
        return cane_loss(
            target_logits, candidate_logits, noise_logits, noise.log_q, noise.target_log_q, covered
        )

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, num_candidates={self.num_candidates}, "
            f"num_noise={self.num_noise}, branching={self.branching}, beam={self.beam}, "
            f"parameterization={self.parameterization!r}, num_clusters={self.num_clusters}, "
            f"tree={self.tree_kind!r}"
        )


def _unfitted_search_of_older_checkpoints(
    module: CaneHead, state_dict: dict[str, Any], prefix: str, *_: Any
) -> None:
    """A checkpoint from before :meth:`CaneHead.fit_search` loads with no fit."""
    if prefix + "search_fitted" not in state_dict:
        state_dict[prefix + "search_vectors"] = module.search_vectors.clone()
        state_dict[prefix + "search_fitted"] = torch.zeros((), dtype=torch.bool)


def path_edges(tree: ClassTree, means: list[Tensor]) -> list[Tensor]:
    """Edges of levels ``1..L-1`` that give each internal node ``v`` the path sum ``m_v``:
    ``m_v`` below the root, ``m_v - m_parent`` further down.

    Args:
        tree: the class tree.
        means: from :func:`descendant_means`, one ``[n_l, D]`` per level ``1..L-1``.
    """
    edges = [means[0]]
    for level in range(2, len(means) + 1):
        parent = parent_index(
            means[level - 1].shape[0], tree.branchings[level - 1], means[0].device
        )
        edges.append(means[level - 1] - means[level - 2].index_select(0, parent))
    return edges


def subset_means(table: Tensor, order: Tensor, starts: Tensor) -> Tensor:
    """``[S, D]``: the mean of ``table`` ``[N, D]`` over each subset ``order[starts[s] :
    starts[s + 1]]`` (``order`` long ``[N]``, ``starts`` long ``[S + 1]``, no subset empty)."""
    sizes = starts.diff()
    members = order[: int(starts[-1])]
    subset = torch.repeat_interleave(torch.arange(sizes.numel(), device=table.device), sizes)
    sums = table.new_zeros(sizes.numel(), table.shape[1]).index_add_(0, subset, table[members])
    return sums / sizes[:, None].to(table.dtype)


def distinct_uniform(sizes: Tensor, k: int, generator: torch.Generator | None) -> Tensor:
    """``k`` distinct offsets per row, uniform over the ``k``-subsets of ``0..sizes[t]-1``:
    Floyd's algorithm, batched over the rows (``k`` steps, each comparing a draw with the
    offsets already taken; no host sync).

    Args:
        sizes: long ``[T]``, every size ``>= k``.
        k: offsets per row.
        generator: for reproducible draws (``None``: torch's default).

    Returns:
        long ``[T, k]``, in no particular order within a row.
    """
    chosen = torch.empty(sizes.shape[0], k, dtype=torch.long, device=sizes.device)
    for step in range(k):
        top = sizes - k + step  # draw from 0..top; take top itself if the draw is already taken
        uniform = torch.rand(
            sizes.shape, generator=generator, device=sizes.device, dtype=torch.float64
        )
        draw = torch.minimum((uniform * (top + 1)).long(), top)
        taken = (chosen[:, :step] == draw[:, None]).any(dim=1)
        chosen[:, step] = torch.where(taken, top, draw)
    return chosen


def is_member(ids: Tensor, sorted_sets: Tensor) -> Tensor:
    """Bool ``[T, K]``: whether each of ``ids`` ``[T, K]`` is in its row of ``sorted_sets``
    ``[T, E]`` (sorted ascending)."""
    pos = torch.searchsorted(sorted_sets, ids).clamp(max=sorted_sets.shape[1] - 1)
    return sorted_sets.gather(1, pos) == ids
