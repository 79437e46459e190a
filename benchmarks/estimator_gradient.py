"""Bias and spread of the sampled heads' gradient against the full softmax's, by brute force.

For one batch of ``T`` positions over ``N`` classes (``D`` dimensions) and one table, the exact
gradient ``g`` of the mean full-softmax loss with respect to the queries and the table is computed
once (``FullSoftmaxHead``); each sampled head then takes ``R`` steps' gradients ``g_r`` on the same
batch and table with fresh draws. Reported, relative to ``|g|``: the **bias** ``|mean_r g_r - g|``
(what more draws per step would not remove) and the **spread** ``sqrt(mean_r |g_r - mean g_r|^2)``
(what averaging over steps removes), and the mean cosine between ``g_r`` and ``g``.

The heads (:data:`HEADS`): the plain sampled softmax (``M`` uniform draws per query), the default
configuration (the batch's other targets beside the draws, ``corrected_all``), the bounded
default (``max_in_batch_draws=K``, ``--limits``; with ``--groups g ...`` also with groups of
``g`` rows sharing their draws, ``in_batch_group_size``), and ``M`` / ``M + K`` uniform draws
shared by the batch. ``q_b``, the in-batch proposal, is fixed to the targets' population law
(``target_counts``), as the streaming estimate converges to it.

Two kinds of batch (``--batches``):

- ``iid``: every position's target drawn independently from a Zipf law over the classes
  (``p(i) ∝ 1 / (i + 1)`` over a random permutation), the assumption under which the in-batch
  correction ``log(M q + n q_b)`` is unbiased;
- ``sessions``: ``T / L`` sessions of ``L`` positions, as a sequential recommender's batch
  (``--session-length``): the classes fall into ``C`` clusters, each session keeps to one
  cluster (drawn by the clusters' Zipf mass) for ``--stickiness`` of its targets and draws the
  rest from the population law, so the batch's targets are far from independent draws of it
  (the targets' population law is still the Zipf law).

The queries are ``2 v_y + noise`` (``v_y`` the target's row): a model that already ranks its
targets high, where a likely target is what tells the conventions apart. ``T``, ``N`` and ``M``
default to MovieLens-1M SASRec's recipe batch (25,600 positions, 3,706 items, 100 draws).

Run: ``python -m benchmarks.estimator_gradient [--positions 25600] [--classes 3706] [--dim 32]
[--negatives 100] [--limits 256 1024] [--groups 1 32] [--repeats 20] [--batches iid sessions]
[--session-length 200] [--clusters 50] [--stickiness 0.8] [--threads 1]``; results in
``benchmarks/results/estimator_gradient.{csv,md}``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import Tensor, nn

from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead
from lightning_sampled.samplers import DrawStream

from .common import (
    add_background_argument,
    add_threads_argument,
    log,
    make_parser,
    run_and_write,
)

#: the sampled heads by name: their options from ``(M, K, g)``; ``{k}`` heads take each
#: ``--limits`` value, ``{g}`` heads each ``--groups`` value
HEADS: dict[str, Callable[[int, int, int], dict]] = {
    "plain": lambda m, k, g: dict(num_negatives=m, in_batch_negatives=False),
    "default": lambda m, k, g: dict(num_negatives=m, in_batch_negatives=True),
    "default K={k}{g}": lambda m, k, g: dict(
        num_negatives=m, in_batch_negatives=True, max_in_batch_draws=k, in_batch_group_size=g
    ),
    "shared M": lambda m, k, g: dict(
        num_negatives=m, in_batch_negatives=False, shared_negatives=True
    ),
    "shared M+K={k}": lambda m, k, g: dict(
        num_negatives=m + k, in_batch_negatives=False, shared_negatives=True
    ),
}


def variants(name: str, args: argparse.Namespace) -> list[tuple[int, int]]:
    """The ``(K, g)`` that head ``name`` of :data:`HEADS` is measured at."""
    limits = args.limits if "{k}" in name else [0]
    groups = args.groups if "{g}" in name else [1]
    return [(k, g) for k in limits for g in groups]


def population(num_classes: int, generator: torch.Generator) -> Tensor:
    """The targets' law ``[N]`` (fp64): Zipf over a random permutation of the classes."""
    weights = 1.0 / torch.arange(1, num_classes + 1, dtype=torch.float64)
    perm = torch.randperm(num_classes, generator=generator)
    law = torch.empty(num_classes, dtype=torch.float64)
    law[perm] = weights / weights.sum()
    return law


def iid_targets(law: Tensor, positions: int, generator: torch.Generator) -> Tensor:
    """``positions`` independent draws of ``law``."""
    return torch.multinomial(law, positions, replacement=True, generator=generator)


def session_targets(
    law: Tensor,
    positions: int,
    session_length: int,
    clusters: int,
    stickiness: float,
    generator: torch.Generator,
) -> Tensor:
    """Targets of ``positions // session_length`` sessions (module docstring): class ``c`` is in
    cluster ``c mod clusters``; a session picks a cluster by its mass under ``law`` and draws a
    ``stickiness`` share of its targets from ``law`` restricted to it, the rest from ``law``."""
    sessions = positions // session_length
    member = torch.arange(law.numel()) % clusters
    mass = torch.zeros(clusters, dtype=torch.float64).index_add_(0, member, law)
    chosen = torch.multinomial(mass, sessions, replacement=True, generator=generator)
    rows = []
    for cluster in chosen.tolist():
        inside = law * (member == cluster)
        sticky = torch.rand(session_length, generator=generator) < stickiness
        own = torch.multinomial(inside, session_length, replacement=True, generator=generator)
        rest = torch.multinomial(law, session_length, replacement=True, generator=generator)
        rows.append(torch.where(sticky, own, rest))
    return torch.cat(rows)


def gradient(head: nn.Module, z: Tensor, target: Tensor) -> Tensor:
    """fp64 ``[T D + N D]``: the gradient of ``head(z, target)`` w.r.t. ``z`` and the table."""
    z = z.detach().clone().requires_grad_(True)
    head.zero_grad(set_to_none=True)
    head(z, target).backward()
    table = head.weight.grad
    table = table.to_dense() if table.is_sparse else table
    return torch.cat([z.grad.reshape(-1), table.reshape(-1)]).double()


def spread_of(grads: Tensor, exact: Tensor) -> dict[str, float]:
    """Bias, spread and mean cosine of gradients ``[R, P]`` against ``exact`` ``[P]``."""
    mean = grads.mean(0)
    norm = exact.norm()
    return {
        "bias": float((mean - exact).norm() / norm),
        "spread": float((grads - mean).pow(2).sum(1).mean().sqrt() / norm),
        "cosine": float(torch.nn.functional.cosine_similarity(grads, exact[None], dim=1).mean()),
    }


def measure(args: argparse.Namespace) -> list[dict]:
    generator = torch.Generator().manual_seed(args.seed)
    n, d = args.classes, args.dim
    law = population(n, generator)
    table = torch.randn(n, d, generator=generator) * 0.3
    counts = (law * 1e6).float()  # q_b: the population law
    rows = []
    for kind in args.batches:
        if kind == "iid":
            target = iid_targets(law, args.positions, generator)
        else:
            target = session_targets(
                law, args.positions, args.session_length, args.clusters, args.stickiness,
                generator,
            )  # fmt: skip
        z = 2 * table[target] + 0.5 * torch.randn(args.positions, d, generator=generator)
        full = FullSoftmaxHead(n, d)
        with torch.no_grad():
            full.weight.copy_(table)
        exact = gradient(full, z, target)
        distinct = int(target.unique().numel())
        for name, options_of in HEADS.items():
            for k, g in variants(name, args):
                options = options_of(args.negatives, k, g)
                if options.get("in_batch_negatives"):
                    options["target_counts"] = counts
                head = SampledSoftmaxHead(n, d, **options)
                with torch.no_grad():
                    head.weight.copy_(table)
                head.sampler.draw_stream = DrawStream(args.seed)
                grads = torch.stack([gradient(head, z, target) for _ in range(args.repeats)])
                label = name.format(k=k, g=f" g={g}" if g > 1 else "")
                stats = spread_of(grads, exact)
                log(f"{kind} {label}: " + ", ".join(f"{s} {v:.4f}" for s, v in stats.items()))
                rows.append(
                    {
                        "batch": kind,
                        "positions": args.positions,
                        "classes": n,
                        "distinct_targets": distinct,
                        "head": label,
                        "draws": options["num_negatives"],
                        "in_batch_limit": k or "",
                        "group_size": g,
                        **stats,
                    }
                )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser(__doc__)
    parser.add_argument("--positions", type=int, default=25_600)
    parser.add_argument("--classes", type=int, default=3_706)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--negatives", type=int, default=100)
    parser.add_argument("--limits", nargs="*", type=int, default=[256, 1024])
    parser.add_argument(
        "--groups", nargs="+", type=int, default=[1], help="in_batch_group_size of the limits"
    )
    parser.add_argument("--repeats", type=int, default=20, help="gradients per head (R)")
    parser.add_argument("--batches", nargs="+", default=["iid", "sessions"])
    parser.add_argument("--session-length", type=int, default=200)
    parser.add_argument("--clusters", type=int, default=50)
    parser.add_argument("--stickiness", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="estimator_gradient", help="results file stem")
    add_background_argument(parser)
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    if set(args.batches) - {"iid", "sessions"}:
        parser.error("--batches takes iid and sessions")
    if min(args.repeats, args.positions, args.classes, args.negatives, *args.groups) < 1:
        parser.error("--repeats, --positions, --classes, --negatives and --groups must be >= 1")
    if args.positions % args.session_length:
        parser.error("--positions must be a multiple of --session-length")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    notes = (
        "Relative to the exact gradient's norm (queries and table together), over "
        f"{args.repeats} gradients of each head on one batch and table (seed {args.seed}): bias "
        "= |mean - exact|, spread = root mean square deviation from the mean; cosine: mean "
        "cosine to the exact gradient. Queries 2 v_y + 0.5 noise; q_b fixed to the targets' "
        "population law. Command: `python -m benchmarks.estimator_gradient --positions "
        f"{args.positions} --classes {args.classes} --dim {args.dim} --negatives "
        f"{args.negatives} --limits {' '.join(map(str, args.limits))} --groups "
        f"{' '.join(map(str, args.groups))} --repeats {args.repeats} "
        f"--batches {' '.join(args.batches)} --session-length {args.session_length} "
        f"--clusters {args.clusters} --stickiness {args.stickiness}`."
    )
    return run_and_write(
        args,
        measure,
        title="Bias and spread of the sampled gradient against the full softmax's",
        notes=notes,
    )


if __name__ == "__main__":
    main()
