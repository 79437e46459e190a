"""Large catalogs at equal steps (issue 31, item 4): how close sampled heads get to the full
softmax's exact NDCG@10 after the same number of training steps on a synthetic 200,000-class
catalog.

The problem (:class:`Problem`, drawn by :func:`make_catalog` and :func:`draw_examples`):

- ``N = 200,000`` classes with ``D = 64``-dimensional vectors ``v_i`` in 500 Gaussian clusters:
  centres ``c ~ N(0, I)``, each class in a uniformly drawn cluster, ``v_i = c + 0.7 eps``,
  ``eps ~ N(0, I)``. A class lies about ``0.7 sqrt(D) = 5.6`` from its centre and a centre about
  8.7 from the nearest other one, so neighbouring clusters overlap (their radius exceeds half the
  distance between their centres), yet they are distinct: every class is nearer its own centre
  than any other (by a factor of 1.17 at least, 1.8 on average: :func:`cluster_separation`) and
  the 10 nearest classes of a class are in its own cluster (seed 0). With ``0.5`` (factor 2.4 on
  average, no overlap) seed 0 gave the full softmax an NDCG@10 of 0.52 instead of 0.55 and the
  uniform head a ratio of 0.82 instead of 0.80.
- Targets Zipf(1.0): popularity rank ``r`` (1-based) has probability ``proportional to 1 / r``
  and rank ``r`` is class ``perm[r - 1]`` of a random permutation, so popularity is unrelated
  to class id and to the clusters. The most popular class takes 7.8% of the examples; 300 steps of
  256 (76,800 examples) see about 24k distinct classes.
- Inputs ``x = A v_y + 1.0 eps`` with ``A`` a fixed ``[64, 64]`` matrix of ``N(0, 1 / 64)``
  entries (``||A v_y||`` is about 10, ``||1.0 eps||`` about 8). At this noise the full softmax
  reaches an NDCG@10 of about 0.55 in 300 steps, uniform negatives about 0.8 times that and
  MIDX-rq about 0.9 times (seed 0), the gaps the issue reports; ``--input-noise`` changes it.

Model: an MLP encoder ``64 -> 256 -> 256 -> 64`` (two ReLU hidden layers) feeding one head
whose ``[N, 64]`` class table is learned from scratch (the heads' default initialisation). A plain
PyTorch loop: ``--steps`` (300) steps of ``--batch`` (256) examples, ``torch.optim.Adam`` (lr
``--lr``, dense updates of every parameter for every head), the same batches and the same initial
encoder and table for every method of a seed. Quality: exact NDCG@10 over all ``N`` classes
(:func:`lightning_sampled.metrics.evaluate_ranking`, the head's chunked top-k) on ``--eval``
(5,000) fresh examples from the same generator. The seed drives the catalog, the data, the
initialisation and the draws of negatives (and MIDX's k-means).

Methods (``--methods``): ``full`` (``FullSoftmaxHead()``, default backend), ``uniform``
(``SampledSoftmaxHead`` with ``UniformSampler``), ``midx_rq`` (``MIDXSampler(codebook_size=K,
quantizer="rq")``) and ``mixed`` (mixed negative sampling: ``UniformSampler`` plus the batch's
other targets, ``in_batch_negatives=True``, whose streaming frequency is the Zipfian prior
these targets follow), the sampled ones with ``--negatives`` (100) per query under each of
``--conventions``. The levers that might close the gap to the full softmax: ``frequency`` (a
frequency prior in the proposal: ``MixtureSampler`` of ``UniformSampler`` and, for
:data:`FREQUENCY_SHARE` of the draws, ``UnigramSampler`` over the training targets' counts with
``alpha = 1``, the targets' own distribution), ``in_batch`` (the batch's other targets as the only
negatives, ``num_negatives=0``) and ``mixed_midx`` (MIDX-rq plus the batch's other targets); more
negatives by ``--negatives``. MIDX's index is rebuilt from the head's table by
``head.refresh_index()`` before the first step and then at steps 50, 100, 200 (``IndexRefresh``'s
default doubling schedule within one epoch) or, with ``--refresh-every R``, every ``R`` steps;
rebuilds count as training time. Knobs: ``--negatives``, ``--codebook-size`` (default 32, as
``recipes/configs/heads/midx_rq.yaml``), ``--refresh-every``.

Outputs in ``--out DIR``: ``large_catalog.csv`` (a row per method, convention and seed: NDCG@10,
its ratio to the same seed's full softmax, training seconds; provenance on every row) and
``large_catalog.md`` (setup, per-seed and mean ratios to the full softmax, and the issue's target
"met" / "NOT met"). A line per finished run goes to stderr.

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.large_catalog --out benchmarks/results --seeds 0 1
2`` (about 20 minutes on one core); ``--classes 2000 --steps 50 --eval 500`` for a quick look.
The levers (``benchmarks/results/large_catalog_levers*/``): ``--methods full uniform midx_rq mixed
frequency in_batch mixed_midx --conventions corrected_all``, and ``--negatives 355 --methods full
uniform frequency --conventions corrected_all`` (355: mixed's 100 draws plus 255 batch targets).
"""

from __future__ import annotations

import argparse
import csv
import inspect
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lightning_sampled.heads import FullSoftmaxHead, OutputHead, SampledSoftmaxHead
from lightning_sampled.metrics import evaluate_ranking
from lightning_sampled.ops.conventions import SAMPLED_CONVENTIONS as CONVENTIONS
from lightning_sampled.samplers import (
    MIDXSampler,
    MixtureSampler,
    Sampler,
    UniformSampler,
    UnigramSampler,
)

from .common import (
    Load,
    add_background_argument,
    add_threads_argument,
    log,
    make_parser,
    measured_load,
    provenance,
    set_threads,
)

METHODS = ("full", "uniform", "midx_rq", "mixed", "frequency", "in_batch", "mixed_midx")
#: the methods whose head also takes the batch's other targets as negatives
IN_BATCH_METHODS = ("mixed", "in_batch", "mixed_midx")
#: the proposal of each method that is ``SampledSoftmaxHead``'s default configuration (the
#: proposal's draws and the batch's other targets, ``in_batch_negatives="auto"``)
DEFAULT_CONFIGURATIONS = {"mixed": "uniform", "mixed_midx": "MIDX-rq"}
#: the methods that draw from MIDX-rq (its index rebuilt on the refresh schedule)
MIDX_METHODS = ("midx_rq", "mixed_midx")
#: the share of ``frequency``'s draws from the targets' counts (the rest uniform, so that every
#: class stays drawable)
FREQUENCY_SHARE = 0.95
#: the conventions compared by default: those of the issue that this library version offers
#: (``"adaptive"`` is under evaluation and may be absent)
DEFAULT_CONVENTIONS = tuple(
    c for c in ("exact_positive", "corrected_all", "adaptive") if c in CONVENTIONS
)
#: the convention ``SampledSoftmaxHead`` uses when none is given
HEAD_DEFAULT_CONVENTION = (
    inspect.signature(SampledSoftmaxHead.__init__).parameters["convention"].default
)
TARGET_RATIO = 0.95
DOUBLING_STEPS = 50
HIDDEN = 256


# ----------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Problem:
    """The synthetic catalog's sizes and noise levels (module docstring)."""

    num_classes: int = 200_000
    dim: int = 64
    num_clusters: int = 500
    cluster_noise: float = 0.7
    zipf_exponent: float = 1.0
    input_noise: float = 1.0


@dataclass(frozen=True)
class Catalog:
    """One drawn catalog.

    Attributes:
        centres: ``[C, D]`` cluster centres.
        cluster: long ``[N]``, each class's cluster.
        vectors: ``[N, D]`` class vectors ``v_i``.
        popularity: ``[N]`` each class's probability of being a target (sums to 1).
        order: long ``[N]``, the classes from the most to the least popular (the permutation).
        mixing: ``[D, D]`` the matrix ``A`` of the inputs ``x = A v_y + noise``.
    """

    centres: Tensor
    cluster: Tensor
    vectors: Tensor
    popularity: Tensor
    order: Tensor
    mixing: Tensor


def zipf_probabilities(num_classes: int, exponent: float) -> Tensor:
    """``[N]`` Zipf probabilities of the popularity ranks ``1..N``, ``proportional to
    r^-exponent``."""
    weights = torch.arange(1, num_classes + 1, dtype=torch.float64).pow(-exponent)
    return weights / weights.sum()


def make_catalog(problem: Problem, generator: torch.Generator) -> Catalog:
    """Draws the clusters, class vectors, popularity permutation and input matrix."""
    n, d = problem.num_classes, problem.dim
    centres = torch.randn(problem.num_clusters, d, generator=generator)
    cluster = torch.randint(problem.num_clusters, (n,), generator=generator)
    vectors = centres[cluster] + problem.cluster_noise * torch.randn(n, d, generator=generator)
    order = torch.randperm(n, generator=generator)
    popularity = torch.empty(n, dtype=torch.float64)
    popularity[order] = zipf_probabilities(n, problem.zipf_exponent)
    mixing = torch.randn(d, d, generator=generator) / math.sqrt(d)
    return Catalog(centres, cluster, vectors, popularity, order, mixing)


def draw_examples(
    catalog: Catalog, count: int, input_noise: float, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """``count`` examples: inputs ``x = A v_y + input_noise * eps`` ``[count, D]`` and their
    Zipf-drawn targets ``y`` long ``[count]``."""
    y = torch.multinomial(catalog.popularity, count, replacement=True, generator=generator)
    noise = torch.randn(count, catalog.mixing.shape[0], generator=generator)
    return catalog.vectors[y] @ catalog.mixing.T + input_noise * noise, y


def cluster_separation(catalog: Catalog) -> Tensor:
    """``[N]`` each class's distance to the nearest centre other than its own, divided by the
    distance to its own: above 1 the clusters are distinct, near 1 they overlap."""
    distances = torch.cdist(catalog.vectors, catalog.centres)
    own = distances.gather(1, catalog.cluster[:, None]).squeeze(1)
    others = distances.scatter(1, catalog.cluster[:, None], math.inf).min(dim=1).values
    return others / own


# ---------------------------------------------------------------------------------------- model
@dataclass(frozen=True)
class Run:
    """One training run: a method, its convention (``""`` for the full softmax) and the knobs."""

    method: str
    convention: str
    negatives: int
    codebook_size: int
    refresh_every: int | None

    @property
    def label(self) -> str:
        """``full``, ``uniform/exact_positive``, ..."""
        return f"{self.method}/{self.convention}" if self.convention else self.method


def make_encoder(dim: int) -> nn.Sequential:
    """The MLP ``[B, D] -> [B, D]``: two ReLU hidden layers of width :data:`HIDDEN`."""
    return nn.Sequential(
        nn.Linear(dim, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, dim),
    )


def make_sampler(run: Run, counts: Tensor, seed: int) -> Sampler:
    """The proposal of a sampled run over the ``N`` classes of ``counts`` (long ``[N]``, the
    training targets' counts); its draw stream (and MIDX's k-means) seeded by ``seed``."""
    torch.manual_seed(seed)
    num_classes = counts.numel()
    if run.method in ("uniform", "mixed", "in_batch"):
        return UniformSampler(num_classes)
    if run.method in MIDX_METHODS:
        return MIDXSampler(num_classes, codebook_size=run.codebook_size, quantizer="rq", seed=seed)
    if run.method == "frequency":
        # a floor far below one count: the uniform share alone keeps unseen classes drawable
        targets = UnigramSampler(counts, alpha=1.0, floor=1e-12)
        return MixtureSampler(
            [UniformSampler(num_classes), targets], [1 - FREQUENCY_SHARE, FREQUENCY_SHARE]
        )
    raise ValueError(f"unknown sampled method {run.method!r}; known: {', '.join(METHODS[1:])}")


def make_head(run: Run, counts: Tensor, dim: int, table: Tensor, seed: int) -> OutputHead:
    """The run's head over the ``N`` classes of ``counts`` (long ``[N]``, the training targets'
    counts, for ``frequency``'s proposal) with the class table ``table`` ``[N, D]`` (copied)."""
    num_classes = counts.numel()
    if run.method == "full":
        head: OutputHead = FullSoftmaxHead(num_classes, dim)
    else:
        head = SampledSoftmaxHead(
            num_classes,
            dim,
            make_sampler(run, counts, seed),
            negatives_of(run),
            convention=run.convention,
            in_batch_negatives=run.method in IN_BATCH_METHODS,
        )
    with torch.no_grad():
        head.weight.copy_(table)
    return head


def negatives_of(run: Run) -> int:
    """The head's drawn negatives per query: none for ``in_batch``, else ``run.negatives``."""
    return 0 if run.method == "in_batch" else run.negatives


def refresh_due(step: int, refresh_every: int | None) -> bool:
    """Whether the index is rebuilt before ``step`` (0-based): at step 0, then every
    ``refresh_every`` steps or, ``None``, at ``50 * 2^j`` (``IndexRefresh``'s default)."""
    if step == 0:
        return True
    if refresh_every is not None:
        return step % refresh_every == 0
    intervals, rest = divmod(step, DOUBLING_STEPS)
    return rest == 0 and intervals & (intervals - 1) == 0


# ------------------------------------------------------------------------------------- training
@dataclass(frozen=True)
class Data:
    """One seed's examples and initial model: training inputs ``[S, B, D]`` and targets long
    ``[S, B]`` (one batch per step), held-out inputs ``[E, D]`` and targets long ``[E]``, the
    encoder's initial ``state_dict`` and the initial class table ``[N, D]``."""

    train_x: Tensor
    train_y: Tensor
    eval_x: Tensor
    eval_y: Tensor
    encoder_state: dict[str, Tensor]
    table: Tensor


def make_data(problem: Problem, seed: int, steps: int, batch: int, num_eval: int) -> Data:
    """Draws seed ``seed``'s catalog, batches, held-out set and initial weights."""
    generator = torch.Generator().manual_seed(seed)
    catalog = make_catalog(problem, generator)
    x, y = draw_examples(catalog, steps * batch, problem.input_noise, generator)
    eval_x, eval_y = draw_examples(catalog, num_eval, problem.input_noise, generator)
    torch.manual_seed(seed)
    encoder = make_encoder(problem.dim)
    table = FullSoftmaxHead(problem.num_classes, problem.dim).weight.detach().clone()
    return Data(
        x.view(steps, batch, -1), y.view(steps, batch), eval_x, eval_y, encoder.state_dict(), table
    )


def ndcg_at_10(encoder: nn.Module, head: OutputHead, x: Tensor, y: Tensor) -> float:
    """Exact NDCG@10 over all classes of the queries ``encoder(x)`` (``x`` ``[E, D]``, targets
    ``y`` long ``[E]``), in batches of 1,000."""
    batches = list(zip(x.split(1000), y.split(1000), strict=True))
    with torch.no_grad():
        scores = evaluate_ranking(
            head, batches, lambda b: (encoder(b[0]), b[1]), ks=10, metrics=("ndcg",)
        )
    return scores["ndcg@10"]


def train(run: Run, data: Data, seed: int, lr: float) -> dict[str, Any]:
    """Trains the run's encoder and head on ``data``'s batches and scores them.

    Returns:
        ``{"ndcg@10", "train_s", "refresh_s", "refreshes"}``: the exact NDCG@10 on the held-out
        examples, training wall seconds (index rebuilds included), the seconds of the rebuilds
        and their number.
    """
    num_classes, dim = data.table.shape
    encoder = make_encoder(dim)
    encoder.load_state_dict(data.encoder_state)
    counts = torch.bincount(data.train_y.reshape(-1), minlength=num_classes)
    head = make_head(run, counts, dim, data.table, seed)
    optimizer = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=lr, fused=True)
    refresh_s, refreshes = 0.0, 0
    start = time.perf_counter()
    for step, (x, y) in enumerate(zip(data.train_x, data.train_y, strict=True)):
        if run.method in MIDX_METHODS and refresh_due(step, run.refresh_every):
            begin = time.perf_counter()
            head.refresh_index()
            refresh_s += time.perf_counter() - begin
            refreshes += 1
        loss = head(encoder(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    train_s = time.perf_counter() - start
    ndcg = ndcg_at_10(encoder, head, data.eval_x, data.eval_y)
    return {"ndcg@10": ndcg, "train_s": train_s, "refresh_s": refresh_s, "refreshes": refreshes}


def runs_of(args: argparse.Namespace) -> list[Run]:
    """Every run of one seed: the full softmax first (the ratios' reference), then each sampled
    method under each convention."""
    knobs = (args.negatives, args.codebook_size, args.refresh_every)
    runs = []
    for method in args.methods:
        conventions = [""] if method == "full" else args.conventions
        runs += [Run(method, convention, *knobs) for convention in conventions]
    return sorted(runs, key=lambda r: r.method != "full")


# -------------------------------------------------------------------------------------- results
def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Sets each row's ``ratio_to_full``: its NDCG@10 over the same seed's full softmax's
    (``""`` where that seed has no full row or it scored 0)."""
    full = {r["seed"]: r["ndcg@10"] for r in rows if r["method"] == "full"}
    for row in rows:
        reference = full.get(row["seed"])
        row["ratio_to_full"] = row["ndcg@10"] / reference if reference else ""


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method and convention: mean NDCG@10 and ratio to the full softmax over the
    seeds, and each seed's NDCG@10 and ratio (``ndcgs``, ``ratios``; ``seeds`` in order)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["method"], row["convention"]), []).append(row)
    table = []
    for (method, convention), group in groups.items():
        ratios = [r["ratio_to_full"] for r in group]
        known = [r for r in ratios if r != ""]
        table.append(
            {
                "method": method,
                "convention": convention,
                "mean_ndcg@10": statistics.mean(r["ndcg@10"] for r in group),
                "mean_ratio": statistics.mean(known) if known else "",
                "ndcgs": [r["ndcg@10"] for r in group],
                "ratios": ratios,
                "seeds": [r["seed"] for r in group],
                "mean_train_s": statistics.mean(r["train_s"] for r in group),
            }
        )
    return table


def targets(rows: list[dict[str, Any]], seeds: list[int]) -> list[str]:
    """The issue's target as Markdown list items, one per proposal in ``SampledSoftmaxHead``'s
    default configuration (:data:`DEFAULT_CONFIGURATIONS`: its default convention, 100
    negatives and the batch's targets; uniform and MIDX-rq): ``"- met: ..."`` when its NDCG@10
    is at least :data:`TARGET_RATIO` times the full softmax's on every seed, ``"- NOT met:
    ..."`` otherwise, ``"- not measured: ..."`` where a seed lacks that row or the full
    softmax's."""
    lines = []
    for method, proposal in DEFAULT_CONFIGURATIONS.items():
        text = (
            f"{method}: {proposal} in the head's default configuration ({HEAD_DEFAULT_CONVENTION}, "
            f"100 negatives and the batch's targets): NDCG@10 >= {TARGET_RATIO}x the full "
            "softmax's on every seed"
        )
        found = {
            r["seed"]: r["ratio_to_full"]
            for r in rows
            if r["method"] == method
            and r["convention"] == HEAD_DEFAULT_CONVENTION
            and r["negatives"] == 100
        }
        ratios = [found.get(seed, "") for seed in seeds]
        if "" in ratios:
            lines.append(f"- not measured: {text}")
            continue
        verdict = "met" if min(ratios) >= TARGET_RATIO else "NOT met"
        lines.append(f"- {verdict}: {text} (ratios {', '.join(f'{r:.3f}' for r in ratios)})")
    return lines


def reaching(rows: list[dict[str, Any]], seeds: list[int]) -> list[str]:
    """Markdown list items, one per sampled method and convention measured on every seed in
    ``seeds``: its ratios to the full softmax and whether each is at least
    :data:`TARGET_RATIO` (the levers' verdicts)."""
    lines = []
    for row in summary([r for r in rows if r["method"] != "full"]):
        ratios = dict(zip(row["seeds"], row["ratios"], strict=True))
        if any(ratios.get(seed, "") == "" for seed in seeds):
            continue
        mine = [ratios[seed] for seed in seeds]
        verdict = "reaches" if min(mine) >= TARGET_RATIO else "does not reach"
        lines.append(
            f"- {row['method']}, {row['convention']}: {verdict} {TARGET_RATIO}x on every seed "
            f"(ratios {', '.join(f'{r:.3f}' for r in mine)})"
        )
    return lines


def cell(value: Any) -> str:
    """Floats to 3 decimals, lists of them joined by " / "."""
    if isinstance(value, list):
        return " / ".join(cell(v) for v in value)
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def markdown(
    rows: list[dict[str, Any]], args: argparse.Namespace, problem: Problem, load: Load
) -> str:
    """``large_catalog.md``: setup, provenance, the table of ratios to the full softmax and the
    targets."""
    prov = provenance()
    seeds = " / ".join(map(str, args.seeds))
    refresh = (
        f"every {args.refresh_every} steps"
        if args.refresh_every
        else f"at steps 0, {DOUBLING_STEPS} x 2^j"
    )
    lines = [
        "# Large catalog at equal steps (issue 31, item 4)",
        "",
        f"- machine: {prov['machine']}; torch {prov['torch']}; commit {prov['commit']}",
        f"- {load.header}",
        f"- catalog: N = {problem.num_classes:,} classes, D = {problem.dim}, "
        f"{problem.num_clusters} Gaussian clusters (class = centre + {problem.cluster_noise} "
        f"N(0, I)), Zipf({problem.zipf_exponent}) targets over a random permutation, inputs "
        f"x = A v_y + {problem.input_noise} N(0, I)",
        f"- training: {args.steps} steps of {args.batch}, Adam lr {args.lr}, MLP encoder "
        f"{problem.dim}-{HIDDEN}-{HIDDEN}-{problem.dim}, same data and init for every method "
        f"of a seed; seeds {', '.join(map(str, args.seeds))}",
        f"- sampled heads: {args.negatives} negatives per query (in_batch: none; the batch's "
        f"other targets in in_batch, mixed and mixed_midx; frequency: {FREQUENCY_SHARE:.0%} of "
        "them from the training targets' counts); MIDX-rq codebook size "
        f"{args.codebook_size}, index rebuilt {refresh}; conventions "
        f"{', '.join(args.conventions)} (the head's default: {HEAD_DEFAULT_CONVENTION})",
        f"- quality: exact NDCG@10 over all {problem.num_classes:,} classes on {args.eval:,} "
        "held-out examples",
        "",
        f"| method | convention | mean NDCG@10 | NDCG@10 per seed ({seeds}) | mean ratio to full "
        f"| ratio per seed ({seeds}) | mean train s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in summary(rows):
        cells = [row[c] for c in ("method", "convention", "mean_ndcg@10", "ndcgs", "mean_ratio")]
        cells += [row["ratios"], row["mean_train_s"]]
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    lines += ["", "## Targets", "", *targets(rows, args.seeds), ""]
    lines += ["## Every configuration against the target", "", *reaching(rows, args.seeds), ""]
    return "\n".join(lines)


def write_outputs(
    out: Path,
    rows: list[dict[str, Any]],
    args: argparse.Namespace,
    problem: Problem,
    load: Load,
) -> None:
    """Writes ``large_catalog.csv`` (provenance on every row) and ``large_catalog.md``."""
    out.mkdir(parents=True, exist_ok=True)
    stamped = [{**row, **provenance()} for row in rows]
    with (out / "large_catalog.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(stamped[0]))
        writer.writeheader()
        writer.writerows(stamped)
    (out / "large_catalog.md").write_text(markdown(rows, args, problem, load))


# ------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser(__doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder of the two result files")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument(
        "--conventions", nargs="+", default=list(DEFAULT_CONVENTIONS), choices=CONVENTIONS
    )
    parser.add_argument("--negatives", type=int, default=100, help="negatives per query")
    parser.add_argument("--codebook-size", type=int, default=32, help="MIDX codewords per book")
    parser.add_argument(
        "--refresh-every",
        type=int,
        help="rebuild MIDX's index every this many steps (default: at 0, 50, 100, 200, ...)",
    )
    parser.add_argument("--classes", type=int, default=Problem.num_classes)
    parser.add_argument("--clusters", type=int, default=Problem.num_clusters)
    parser.add_argument("--input-noise", type=float, default=Problem.input_noise)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval", type=int, default=5000, help="held-out examples")
    add_threads_argument(parser)
    add_background_argument(parser)
    args = parser.parse_args(argv)
    if min(args.negatives, args.steps, args.batch, args.eval, args.threads) < 1:
        parser.error("--negatives, --steps, --batch, --eval and --threads must be >= 1")
    if args.refresh_every is not None and args.refresh_every < 1:
        parser.error("--refresh-every must be >= 1")
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Runs every method and convention on every seed; returns the CSV's rows (without
    provenance)."""
    args = parse_args(argv)
    set_threads(args.threads)
    problem = Problem(
        num_classes=args.classes, num_clusters=args.clusters, input_noise=args.input_noise
    )
    begin = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with measured_load(args.background) as load:
        for seed in args.seeds:
            data = make_data(problem, seed, args.steps, args.batch, args.eval)
            for run in runs_of(args):
                result = train(run, data, seed, args.lr)
                midx = run.method in MIDX_METHODS
                rows.append(
                    {
                        "method": run.method,
                        "convention": run.convention,
                        "seed": seed,
                        "negatives": negatives_of(run) if run.convention else "",
                        "codebook_size": run.codebook_size if run.method in MIDX_METHODS else "",
                        "refresh_every": (run.refresh_every or "") if midx else "",
                        **result,
                    }
                )
                log(
                    f"[{time.perf_counter() - begin:7.1f} s] seed {seed} {run.label}: "
                    f"NDCG@10 {result['ndcg@10']:.4f}, train {result['train_s']:.1f} s"
                )
    add_ratios(rows)
    write_outputs(args.out, rows, args, problem, load)
    log(f"large_catalog: {time.perf_counter() - begin:.0f} s in all; results in {args.out}")
    for line in targets(rows, args.seeds):
        log(line)
    return rows


if __name__ == "__main__":
    main()
