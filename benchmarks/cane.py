"""CANE's beam top-k against the exact top-k of the same head (issue 12).

For N in ``--sizes`` (1e4, 1e5, 1e6) classes of dimension D = 64, a clustered random class table:
``N / 100`` centres drawn from ``N(0, I)``, each class a centre plus ``N(0, 0.5^2 I)`` noise. A
``CaneHead(parameterization="flat", branching=10)`` tied to that table builds its tree by
hierarchical k-means (``ClassTree.from_vectors``, timed once: the tree build). Queries are 1,024
random centres plus ``N(0, I)`` noise. For each beam width J in ``--beams``, ``beam_topk(z, 10,
beam=J)`` is timed against the exact ``topk(z, 10)`` (a chunked full scoring), round-robin (one
call of each per round, median over ``--repeats`` rounds after a warm-up round) so that load from
other processes hits both alike; recall is the fraction of the exact top-10 that the beam returns.

Target (issue 12): ``beam_topk`` at least 10x faster than ``topk`` at N = 1e6.

Run: ``python -m benchmarks.cane [--sizes 1e4 1e5 1e6] [--beams 10 20 50 100] [--repeats 5]
[--threads 1]``; results in ``benchmarks/results/cane_beam.{csv,md,png}``. About 2 GB of memory at
N = 1e6.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from benchmarks._shapes import DIM, clustered_table, recall
from benchmarks.common import (
    RESULTS_DIR,
    add_threads_argument,
    load_average,
    log,
    make_parser,
    measured_load,
    pyplot,
    save_figure,
    set_threads,
    timed_rounds,
    write_results,
)
from lightning_sampled.heads.cane import CaneHead


def measure(num_classes: int, args: argparse.Namespace) -> list[dict]:
    """The rows of one class count: the exact top-k, then one row per beam width."""
    generator = torch.Generator().manual_seed(args.seed)
    table, centres = clustered_table(num_classes, generator)
    z = centres[torch.randint(0, centres.shape[0], (args.queries,), generator=generator)]
    z = z + torch.randn(args.queries, DIM, generator=generator)
    start = time.perf_counter()
    head = CaneHead(
        num_classes,
        DIM,
        num_candidates=args.k,
        num_noise=1,
        branching=args.branching,
        beam=max(args.beams),
        parameterization="flat",
        weight=nn.Parameter(table),
        seed=args.seed,
    )
    build = time.perf_counter() - start
    log(f"N={num_classes:.0e}: head with tree built in {build:.1f} s; load {load_average()}")
    calls = {"exact": lambda: head.topk(z, args.k)}
    calls |= {
        f"beam {beam}": (lambda b=beam: head.beam_topk(z, args.k, beam=b)) for beam in args.beams
    }
    with torch.no_grad():
        exact = head.topk(z, args.k)[1]
        found = {beam: head.beam_topk(z, args.k, beam=beam)[1] for beam in args.beams}
        times = timed_rounds(calls, args.repeats)
    exact_time = float(torch.tensor(times["exact"]).median())
    rows = [row(num_classes, "exact topk", None, times["exact"], exact_time, 1.0, build, args)]
    for beam in args.beams:
        beam_times = times[f"beam {beam}"]
        rows.append(
            row(
                num_classes,
                "beam_topk",
                beam,
                beam_times,
                exact_time,
                recall(found[beam], exact),
                build,
                args,
            )
        )
        log(
            f"  beam {beam}: {rows[-1]['median_s']:.4f} s, x{rows[-1]['speedup']:.1f}, "
            f"recall {rows[-1]['recall_at_10']:.3f}"
        )
    log(f"  exact: {exact_time:.3f} s; load {load_average()}")
    return rows


def row(
    num_classes: int,
    method: str,
    beam: int | None,
    times: list[float],
    exact_time: float,
    recall_at_k: float,
    build: float,
    args: argparse.Namespace,
) -> dict:
    median = float(torch.tensor(times).median())
    return {
        "num_classes": num_classes,
        "method": method,
        "beam": "" if beam is None else beam,
        "median_s": median,
        "min_s": min(times),
        "max_s": max(times),
        "speedup": exact_time / median,
        "recall_at_10": recall_at_k,
        "tree_build_s": build,
        "queries": args.queries,
        "dim": DIM,
        "branching": args.branching,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
    }


def plot(rows: list[dict]) -> None:
    fig, (time_ax, recall_ax) = pyplot().subplots(1, 2, figsize=(11, 4))
    labels = sorted({(r["method"], r["beam"]) for r in rows}, key=lambda m: m[1] or 0)
    for color, label in enumerate(labels):
        picked = [r for r in rows if (r["method"], r["beam"]) == label]
        name = label[0] if label[1] == "" else f"beam J={label[1]}"
        sizes = [r["num_classes"] for r in picked]
        style = {"marker": "o", "label": name, "color": f"C{color}"}
        time_ax.plot(sizes, [r["median_s"] for r in picked], **style)
        if label[1] != "":
            recall_ax.plot(sizes, [r["recall_at_10"] for r in picked], **style)
    time_ax.set(xscale="log", yscale="log", xlabel="classes N", ylabel="seconds per 1,024 queries")
    time_ax.set_title("top-10: beam search vs exact (1 thread)")
    recall_ax.set(xscale="log", xlabel="classes N", ylabel="recall of the exact top-10")
    recall_ax.set_ylim(0, 1.02)
    for ax in (time_ax, recall_ax):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    save_figure(fig, RESULTS_DIR / "cane_beam.png", dpi=110)


def main() -> None:
    parser = make_parser(__doc__, full=True)
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e4, 1e5, 1e6])
    parser.add_argument("--beams", type=int, nargs="+", default=[10, 20, 50, 100])
    parser.add_argument("--queries", type=int, default=1024)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--branching", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    add_threads_argument(parser)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    set_threads(args.threads)
    with measured_load() as load:
        rows = [r for size in args.sizes for r in measure(int(size), args)]
    notes = f"""
Clustered random table: N / 100 centres from N(0, I), each class a centre plus N(0, 0.25 I)
noise, D = {DIM}; {args.queries} queries, each a random centre plus N(0, I) noise.
`CaneHead(parameterization="flat", branching={args.branching})` tied to the table; its tree comes
from `ClassTree.from_vectors` (hierarchical k-means, 5 Lloyd steps per split on at most 1,024
random points per centroid), built once
(`tree_build_s`, the head's construction, one run). `exact topk` is the head's chunked
`topk(z, 10)`; `beam_topk` is `beam_topk(z, 10, beam=J)`; timed round-robin, median of
{args.repeats} rounds after a warm-up round, {torch.get_num_threads()} thread(s). `recall_at_10`:
the fraction of the exact top-10 the beam returns. `speedup`: exact median / beam median.

Load average (1, 5, 15 min) before: {load.start}; after: {load.end} (2 cores shared with
other jobs).

Run: `python -m benchmarks.cane --threads {args.threads} --repeats {args.repeats}`.
"""
    path = write_results(
        "cane_beam",
        rows,
        title="CANE: beam_topk vs exact topk (top-10)",
        notes=notes,
        columns=[
            "num_classes",
            "method",
            "beam",
            "median_s",
            "speedup",
            "recall_at_10",
            "tree_build_s",
        ],
    )
    plot(rows)
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
