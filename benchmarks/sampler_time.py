"""Sampling time vs number of classes (the MIDX paper's Figure 6), refresh time, training step.

- Draw: time to draw M = 100 negatives (with their ``log_q``) for each of B = 256 queries, for
  N in {1e4, 1e5, 1e6, 1e7}, with the uniform, unigram (Zipfian counts, alpha = 0.75), log-uniform
  and MIDX (PQ and RQ, fast mode, K = 64) samplers, D = 64. All (sampler, N) pairs are built first
  and then timed round-robin (one draw of each per round, median over ``--repeats`` rounds after a
  warm-up round), so that load from other processes hits every size alike. As in the paper, index
  construction is not part of the draw time.
- Refresh: time of ``MIDXSampler.refresh`` (faiss k-means over all N classes, 25 iterations per
  codebook, plus cells and CSR), median over ``min(repeats, 3)`` runs below 1e6 classes, one run
  from 1e6 on.
- Training step at ``--step-classes`` (1e6): forward + backward + SGD step of
  ``SampledSoftmaxHead(N, 64, sampler, 100)`` on B = 256 queries with the uniform sampler and with
  MIDX, timed side by side (round-robin, one step of each per round, median over rounds) so that
  load from other processes hits both alike.

Targets (issue 3): MIDX draw time at N = 1e7 within 1.5x of its time at N = 1e4; a MIDX training
step at N = 1e6 within 2x of the uniform one.

Run: ``python -m benchmarks.sampler_time [--sizes 1e4 1e5] [--repeats 7] [--threads 1]``; results in
``benchmarks/results/sampler_time.{csv,md,png}``. Needs about 6 GB of memory at N = 1e7 (the class
table and its residuals during the RQ refresh). On a CPU shared with other jobs, ``--threads 1``
avoids OpenMP threads spinning against them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import faiss
import torch

from benchmarks.common import RESULTS_DIR, median_time, peak_rss_bytes, write_results
from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.samplers import (
    LogUniformSampler,
    MIDXSampler,
    Sampler,
    UniformSampler,
    UnigramSampler,
)

SAMPLERS = ("uniform", "unigram", "log_uniform", "midx_pq", "midx_rq")


def log(message: str) -> None:
    print(f"[sampler_time {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def make_sampler(name: str, num_classes: int, codebook_size: int) -> Sampler:
    """A sampler by benchmark name (MIDX ones still need ``refresh``)."""
    if name == "uniform":
        return UniformSampler(num_classes)
    if name == "log_uniform":
        return LogUniformSampler(num_classes)
    if name == "unigram":
        counts = 1e6 / torch.arange(1, num_classes + 1, dtype=torch.float64)
        return UnigramSampler(counts, alpha=0.75)
    return MIDXSampler(num_classes, codebook_size, name.removeprefix("midx_"), "fast")


def build_samplers(args: argparse.Namespace, num_classes: int, rows: list[dict]) -> dict:
    """Builds every sampler for ``num_classes`` classes, timing MIDX refreshes into ``rows``.

    Returns:
        ``{(name, num_classes): sampler}``; the class table is freed on return.
    """
    table = torch.randn(num_classes, args.dim, generator=torch.Generator().manual_seed(0))
    table /= args.dim**0.5
    samplers = {}
    for name in SAMPLERS:
        sampler = make_sampler(name, num_classes, args.codebook_size)
        if isinstance(sampler, MIDXSampler):
            runs = 1 if num_classes >= 1_000_000 else min(args.repeats, 3)
            seconds, _ = median_time(lambda s=sampler: s.refresh(table), repeats=runs, warmup=0)
            rows.append(_row("refresh", name, num_classes, seconds, runs))
            log(f"N={num_classes:.0e} {name}: refresh {seconds:.2f} s")
        samplers[name, num_classes] = sampler
    log(f"N={num_classes:.0e}: samplers ready; peak RSS {peak_rss_bytes() / 2**30:.2f} GiB")
    return samplers


def time_draws(args: argparse.Namespace, samplers: dict, rows: list[dict]) -> None:
    """Appends draw rows, timing every (sampler, N) round-robin so that load hits all alike."""
    z = torch.randn(args.batch, args.dim, generator=torch.Generator().manual_seed(1))
    generator = torch.Generator().manual_seed(2)
    times: dict = {key: [] for key in samplers}
    for round_index in range(args.repeats + 1):
        for key, sampler in samplers.items():
            start = time.perf_counter()
            sampler.sample(z, args.negatives, generator=generator)
            if round_index:  # round 0 is the warm-up
                times[key].append(time.perf_counter() - start)
    for (name, num_classes), samples in times.items():
        seconds = statistics.median(samples)
        rows.append(_row("draw", name, num_classes, seconds, args.repeats))
        log(f"N={num_classes:.0e} {name}: draw {1e3 * seconds:.2f} ms")


def time_train_steps(args: argparse.Namespace, rows: list[dict]) -> None:
    """Appends side-by-side training-step rows of the sampled head with uniform and MIDX."""
    n = args.step_classes
    steps: dict[str, Callable[[], None]] = {}
    for name in ("uniform", "midx_pq", "midx_rq"):
        gen = torch.Generator().manual_seed(0)
        head = SampledSoftmaxHead(n, args.dim, make_sampler(name, n, args.codebook_size), 100)
        with torch.no_grad():
            head.weight.normal_(0.0, args.dim**-0.5, generator=gen)
        head.refresh_index()
        optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
        z = torch.randn(args.batch, args.dim, generator=gen)
        y = torch.randint(n, (args.batch,), generator=gen)

        def step(head=head, optimizer=optimizer, z=z, y=y) -> None:
            optimizer.zero_grad(set_to_none=False)
            head(z, y).backward()
            optimizer.step()

        step()  # warm-up: allocates the gradient
        steps[name] = step
        log(f"train step N={n:.0e} {name}: ready")
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    for name, samples in times.items():
        seconds = statistics.median(samples)
        rows.append(_row("train_step", name, n, seconds, args.repeats))
        log(f"train step N={n:.0e} {name}: {1e3 * seconds:.1f} ms")


def _row(measurement: str, sampler: str, num_classes: int, seconds: float, runs: int) -> dict:
    return {
        "measurement": measurement,
        "sampler": sampler,
        "num_classes": num_classes,
        "median_ms": 1e3 * seconds,
        "runs": runs,
    }


def summary(rows: list[dict]) -> str:
    """Markdown notes: the two targets and how the measurements were taken."""

    def ms(measurement: str, sampler: str, n: int) -> float | None:
        for row in rows:
            if (row["measurement"], row["sampler"], row["num_classes"]) == (
                measurement,
                sampler,
                n,
            ):
                return row["median_ms"]
        return None

    sizes = sorted({row["num_classes"] for row in rows if row["measurement"] == "draw"})
    lines = ["Targets:", ""]
    for name in ("midx_pq", "midx_rq"):
        small, large = ms("draw", name, sizes[0]), ms("draw", name, sizes[-1])
        ratio = large / small
        verdict = "met" if ratio <= 1.5 else "NOT met"
        lines.append(
            f"- {name} draw time at N = {sizes[-1]:.0e} / at N = {sizes[0]:.0e}: "
            f"{large:.2f} / {small:.2f} ms = {ratio:.2f}x (target <= 1.5x: {verdict})"
        )
    step_rows = [row for row in rows if row["measurement"] == "train_step"]
    if step_rows:
        n = step_rows[0]["num_classes"]
        uniform = ms("train_step", "uniform", n)
        for name in ("midx_pq", "midx_rq"):
            ratio = ms("train_step", name, n) / uniform
            verdict = "met" if ratio <= 2.0 else "NOT met"
            lines.append(
                f"- training step of SampledSoftmaxHead at N = {n:.0e}, {name} / uniform: "
                f"{ratio:.2f}x (target <= 2x: {verdict})"
            )
    lines += [
        "",
        "B = 256 queries, M = 100 negatives per query (per-query draws, with log_q), K = 64, "
        "D = 64. Draw and step times are medians after a warm-up, every (sampler, N) timed "
        "round-robin; refresh (faiss k-means on all "
        "classes, 25 iterations per codebook) is not part of the draw time, as in the paper's "
        "Figure 6. Train step: forward + backward + SGD step, the samplers timed round-robin. "
        "Reproduce: `python -m benchmarks.sampler_time`.",
    ]
    return "\n".join(lines)


def plot(rows: list[dict]) -> None:
    """Figure 6: draw time vs number of classes per sampler, and MIDX refresh time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (draw_ax, refresh_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for measurement, ax in (("draw", draw_ax), ("refresh", refresh_ax)):
        for name in SAMPLERS:
            points = sorted(
                (row["num_classes"], row["median_ms"])
                for row in rows
                if row["measurement"] == measurement and row["sampler"] == name
            )
            if points:
                color = f"C{SAMPLERS.index(name)}"
                ax.plot(*zip(*points, strict=True), marker="o", label=name, color=color)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("number of classes N")
        ax.legend()
    draw_ax.set_ylabel("ms to draw 100 negatives for 256 queries")
    draw_ax.set_title("Sampling time vs #classes (Figure 6)")
    refresh_ax.set_ylabel("ms per MIDX refresh (k-means + cells)")
    refresh_ax.set_title("MIDX index refresh")
    fig.tight_layout()
    fig.savefig(RESULTS_DIR / "sampler_time.png", dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", type=float, nargs="+", default=[1e4, 1e5, 1e6, 1e7], help="numbers of classes"
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per measurement")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--negatives", type=int, default=100)
    parser.add_argument("--codebook-size", type=int, default=64)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument(
        "--step-classes",
        type=float,
        default=1e6,
        help="N of the training-step comparison (0: skip)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch and faiss threads (default: torch's)"
    )
    args = parser.parse_args()
    args.step_classes = int(args.step_classes)
    if args.threads:
        torch.set_num_threads(args.threads)
        faiss.omp_set_num_threads(args.threads)
    rows: list[dict] = []
    samplers: dict = {}
    for size in args.sizes:
        samplers.update(build_samplers(args, int(size), rows))
    time_draws(args, samplers, rows)
    del samplers
    if args.step_classes:
        time_train_steps(args, rows)
    notes = summary(rows)
    path = write_results(
        "sampler_time", rows, title="Sampler draw, refresh and step time", notes=notes
    )
    plot(rows)
    log(f"wrote {path} and sampler_time.csv / .png\n{notes}")


if __name__ == "__main__":
    main()
