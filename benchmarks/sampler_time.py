"""Sampling time vs number of classes (the MIDX paper's Figure 6), refresh time, training step.

- Draw: time to draw M = 100 negatives (with their ``log_q``) for each of B = 256 queries, for
  N in {1e4, 1e5, 1e6, 1e7}, with the uniform, unigram (Zipfian counts, alpha = 0.75), log-uniform
  and MIDX (PQ and RQ, fast mode, K = 64) samplers, D = 64. All (sampler, N) pairs are built first
  and then timed round-robin (one draw of each per round, median over ``--repeats`` rounds after a
  warm-up round), so that load from other processes hits every size alike. As in the paper, index
  construction is not part of the draw time. Beside them, ``random_read``: one random 32-byte
  row of an ``[N, 4]`` table read per draw, the memory floor of any table-based draw at that N.
- Refresh: time of ``MIDXSampler.refresh`` (faiss k-means, 25 iterations per codebook, trained
  on a sample of 256 classes per codeword, then every class assigned; plus cells and CSR),
  median over ``min(repeats, 3)`` runs below 1e6 classes, one run
  from 1e6 on.
- Training step at ``--step-classes`` (1e6): forward + backward + SGD step of
  ``SampledSoftmaxHead(N, 64, sampler, 100)`` on B = 256 queries with the uniform sampler and with
  MIDX, timed side by side (round-robin, one step of each per round, median over rounds) so that
  load from other processes hits both alike.
- Sequence shape (by default a SASRec batch on MovieLens-1M; ``--seq-classes``,
  ``--seq-queries``): forward + backward of ``SampledSoftmaxHead(3707, 64, sampler, 100)`` on
  12,800 query positions, uniform vs MIDX-pq and MIDX-rq (fast) at K in ``--seq-codebook-sizes``,
  beside One-vs-Each (100 uniform negatives per query) and TAPAS (100 shared negatives of 200
  uniform presamples, the recipe's), round-robin (``--seq-methods`` picks among them); and one
  MIDX-rq draw of 20 negatives for 12,800 queries at N = 50,000 for the same K. Each with its
  peak memory beyond what was allocated before (peak RSS, reset first; on CUDA the growth of
  ``torch.cuda.max_memory_allocated``).

Device: ``--device cuda`` builds every table, sampler, head and query on the GPU (the MIDX
refresh then runs k-means in torch there) and synchronises around every timed call.

Targets (issue 3): MIDX draw time at N = 1e7 within 1.5x of its time at N = 1e4; a MIDX training
step at N = 1e6 within 2x of the uniform one. Targets (issue 14): the MIDX-rq head at the sequence
shape within 1.2x of the uniform head at K = 32; the 12,800 x 20 draw at K = 128 within 0.6 s and
0.7 GB; refresh at 1e7 within 20 s and at 1e6 within 3 s; a unigram draw at 1e7 within 2x of its
draw at 1e4.

Run: ``python -m benchmarks.sampler_time [--sizes 1e4 1e5] [--repeats 7] [--threads 1]
[--device cuda] [--name NAME]``; results in ``benchmarks/results/<name>.{csv,md,png}`` (default
``sampler_time``; ``--name`` may be an absolute path without suffix). Needs about 6 GB of memory
at N = 1e7 (the class table and its residuals during the RQ refresh). On a CPU shared with other
jobs, ``--threads 1`` avoids OpenMP threads spinning against them.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch

from benchmarks.common import (
    add_background_argument,
    add_threads_argument,
    log,
    make_parser,
    measured_load,
    median_time,
    peak_extra_bytes,
    peak_rss_bytes,
    pyplot,
    result_path,
    save_figure,
    set_threads,
    timed_rounds,
    write_results,
)
from lightning_sampled.heads import OneVsEachHead, ProposalHead, SampledSoftmaxHead, TapasHead
from lightning_sampled.samplers import MIDXSampler, Sampler, UniformSampler
from recipes.registry import entry

#: the proposals timed, by the recipe head configs that draw from them (``recipes.registry``)
SAMPLERS = ("uniform", "unigram", "log_uniform", "midx_pq", "midx_rq")
SEQ_METHODS = ("uniform", "ove_uniform", "tapas_uniform_r2", "midx_pq", "midx_rq")


def make_sampler(name: str, num_classes: int, dim: int, codebook_size: int) -> Sampler:
    """The proposal of the recipe head config ``name``, a MIDX one with ``codebook_size``
    codewords per codebook (still to be ``refresh``-ed), a unigram one over Zipf counts
    ``1e6 / (i + 1)``."""
    options = {"codebook_size": codebook_size} if name.startswith("midx") else {}
    counts = 1e6 / torch.arange(1, num_classes + 1, dtype=torch.float64)
    return entry(name).sampler(num_classes, dim, class_counts=counts, **options)


class RandomRead:
    """The memory floor of a table-based draw: one uniformly random 32-byte row of an ``[N, 4]``
    float64 table (on ``device``) read per draw (what an alias draw reads), timed beside the
    samplers."""

    def __init__(self, num_classes: int, device: str) -> None:
        self.num_classes = num_classes
        self.rows = torch.rand(num_classes, 4, dtype=torch.float64, device=device)

    def sample(self, z: torch.Tensor, num_samples: int, generator: torch.Generator) -> torch.Tensor:
        """Rows ``[B * num_samples, 4]`` read at uniformly random ids, for queries ``z [B, D]``."""
        size = (z.shape[0] * num_samples,)
        ids = torch.randint(self.num_classes, size, generator=generator, device=z.device)
        return self.rows.index_select(0, ids)


def build_samplers(args: argparse.Namespace, num_classes: int, rows: list[dict]) -> dict:
    """Builds every sampler for ``num_classes`` classes, timing MIDX refreshes into ``rows``.

    Returns:
        ``{(name, num_classes): sampler}``; the class table is freed on return.
    """
    table = class_table(num_classes, args)
    samplers = {}
    for name in SAMPLERS:
        sampler = make_sampler(name, num_classes, args.dim, args.codebook_size).to(args.device)
        if isinstance(sampler, MIDXSampler):
            runs = 1 if num_classes >= 1_000_000 else min(args.repeats, 3)
            seconds, _ = median_time(lambda s=sampler: s.refresh(table), repeats=runs, warmup=0)
            rows.append(
                _row("refresh", name, num_classes, seconds, runs, codebook_size=args.codebook_size)
            )
            log(f"N={num_classes:.0e} {name}: refresh {seconds:.2f} s")
        samplers[name, num_classes] = sampler
    samplers["random_read", num_classes] = RandomRead(num_classes, args.device)
    log(f"N={num_classes:.0e}: samplers ready; peak RSS {peak_rss_bytes() / 2**30:.2f} GiB")
    return samplers


def time_draws(args: argparse.Namespace, samplers: dict, rows: list[dict]) -> None:
    """Appends draw rows, timing every (sampler, N) round-robin so that load hits all alike."""
    z = torch.randn(args.batch, args.dim, generator=_generator(args, 1), device=args.device)
    generator = _generator(args, 2)
    draws = {
        key: (lambda s=sampler: s.sample(z, args.negatives, generator=generator))
        for key, sampler in samplers.items()
    }
    times = timed_rounds(draws, args.repeats, args.device)
    for (name, num_classes), samples in times.items():
        seconds = statistics.median(samples)
        k = args.codebook_size if name.startswith("midx") else ""
        rows.append(_row("draw", name, num_classes, seconds, args.repeats, codebook_size=k))
        log(f"N={num_classes:.0e} {name}: draw {1e3 * seconds:.2f} ms")


def time_train_steps(args: argparse.Namespace, rows: list[dict]) -> None:
    """Appends side-by-side training-step rows of the sampled head with uniform and MIDX."""
    n = args.step_classes
    steps: dict[str, Callable[[], None]] = {}
    for name in ("uniform", "midx_pq", "midx_rq"):
        gen = _generator(args, 0)
        sampler = make_sampler(name, n, args.dim, args.codebook_size)
        head = SampledSoftmaxHead(n, args.dim, sampler, 100, in_batch_negatives=False)
        head = head.to(args.device)
        with torch.no_grad():
            head.weight.normal_(0.0, args.dim**-0.5, generator=gen)
        head.refresh_index()
        optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
        z = torch.randn(args.batch, args.dim, generator=gen, device=args.device)
        y = torch.randint(n, (args.batch,), generator=gen, device=args.device)

        def step(head=head, optimizer=optimizer, z=z, y=y) -> None:
            optimizer.zero_grad(set_to_none=False)
            head(z, y).backward()
            optimizer.step()

        step()  # warm-up: allocates the gradient
        steps[name] = step
        log(f"train step N={n:.0e} {name}: ready")
    times = timed_rounds(steps, args.repeats, args.device, warmup=0)
    for name, samples in times.items():
        seconds = statistics.median(samples)
        rows.append(_row("train_step", name, n, seconds, args.repeats))
        log(f"train step N={n:.0e} {name}: {1e3 * seconds:.1f} ms")


def _row(
    measurement: str,
    sampler: str,
    num_classes: int,
    seconds: float,
    runs: int,
    *,
    codebook_size: int | str = "",
    peak_bytes: float | None = None,
) -> dict:
    return {
        "measurement": measurement,
        "sampler": sampler,
        "codebook_size": codebook_size,
        "num_classes": num_classes,
        "median_ms": 1e3 * seconds,
        "peak_mib": "" if peak_bytes is None else peak_bytes / 2**20,
        "runs": runs,
    }


SEQ_CLASSES, SEQ_QUERIES, SEQ_NEGATIVES = 3_707, 12_800, 100
DRAW_CLASSES, DRAW_NEGATIVES = 50_000, 20


def _generator(args: argparse.Namespace, seed: int) -> torch.Generator:
    """A generator on ``args.device`` seeded with ``seed``."""
    return torch.Generator(device=args.device).manual_seed(seed)


def class_table(num_classes: int, args: argparse.Namespace) -> torch.Tensor:
    """A class table ``[num_classes, args.dim]`` of ``N(0, 1 / D)`` entries on ``args.device``."""
    gen = _generator(args, 0)
    return torch.randn(num_classes, args.dim, generator=gen, device=args.device) * args.dim**-0.5


def _fitted_midx(num_classes: int, codebook_size: int, quantizer: str, table) -> MIDXSampler:
    """A fast-mode MIDX sampler on ``table``'s device, its index built from ``table``."""
    sampler = MIDXSampler(num_classes, codebook_size, quantizer, "fast").to(table.device)
    sampler.refresh(table)
    return sampler


def sequence_heads(args: argparse.Namespace) -> dict[tuple[str, int | str], ProposalHead]:
    """The heads of :func:`time_sequence_heads` that ``args.seq_methods`` names, keyed by
    ``(method, K)`` (K is ``""`` without an index), on ``args.device`` over one class table
    ``[args.seq_classes, args.dim]``, MIDX indexes built."""
    n, m = args.seq_classes, SEQ_NEGATIVES
    table = class_table(n, args)
    builders: dict[str, Callable[[], ProposalHead]] = {
        "uniform": lambda: SampledSoftmaxHead(
            n, args.dim, UniformSampler(n), m, in_batch_negatives=False
        ),
        "ove_uniform": lambda: OneVsEachHead(n, args.dim, UniformSampler(n), m),
        "tapas_uniform_r2": lambda: TapasHead(n, args.dim, None, m, presample_factor=2),
    }
    heads: dict[tuple[str, int | str], ProposalHead] = {}
    for method in args.seq_methods:
        if method in builders:
            heads[method, ""] = builders[method]().to(args.device)
            continue
        for k in args.seq_codebook_sizes:
            sampler = _fitted_midx(n, k, method.removeprefix("midx_"), table)
            head = SampledSoftmaxHead(n, args.dim, sampler, m, in_batch_negatives=False)
            heads[method, k] = head.to(args.device)
    for head in heads.values():
        with torch.no_grad():
            head.weight.copy_(table)
    return heads


def time_sequence_heads(args: argparse.Namespace, rows: list[dict]) -> None:
    """Appends ``seq_head`` rows: forward + backward of the sampled head at a sequence model's
    shape (``args.seq_queries`` queries ``[T, D]``, ``args.seq_classes`` classes), uniform vs
    MIDX-pq / -rq per codebook size, round-robin, with peak memory."""
    n = args.seq_classes
    gen = _generator(args, 1)
    z = torch.randn(args.seq_queries, args.dim, generator=gen, device=args.device)
    y = torch.randint(n, (args.seq_queries,), generator=gen, device=args.device)
    heads = sequence_heads(args)
    steps: dict[tuple[str, int | str], Callable[[], None]] = {}
    for key, head in heads.items():

        def step(head=head) -> None:
            head.zero_grad(set_to_none=True)
            head(z.clone().requires_grad_(), y).backward()

        steps[key] = step
    _round_robin(args, steps, rows, "seq_head", n)
    log("sequence-shape heads done")


def time_sequence_draws(args: argparse.Namespace, rows: list[dict]) -> None:
    """Appends ``seq_draw`` rows: one MIDX-rq draw of 20 negatives for 12,800 queries at
    N = 50,000 per codebook size, round-robin, with peak memory."""
    n = DRAW_CLASSES
    table = class_table(n, args)
    z = torch.randn(SEQ_QUERIES, args.dim, generator=_generator(args, 1), device=args.device)
    samplers = {k: _fitted_midx(n, k, "rq", table) for k in args.seq_codebook_sizes}
    steps = {
        ("midx_rq", k): lambda s=sampler: s.sample(z, DRAW_NEGATIVES)
        for k, sampler in samplers.items()
    }
    _round_robin(args, steps, rows, "seq_draw", n)


def _round_robin(
    args: argparse.Namespace,
    steps: dict[tuple[str, int | str], Callable[[], object]],
    rows: list[dict],
    measurement: str,
    num_classes: int,
) -> None:
    """Times ``steps`` one after another per round (a warm-up round first), then measures each
    one's peak memory alone, and appends one row per step."""
    times = timed_rounds(steps, args.repeats, args.device)
    for (name, k), fn in steps.items():
        seconds = statistics.median(times[name, k])
        peak = peak_extra_bytes(fn, args.device)
        rows.append(
            _row(
                measurement,
                name,
                num_classes,
                seconds,
                args.repeats,
                codebook_size=k,
                peak_bytes=peak,
            )
        )
        log(f"{measurement} {name} K={k}: {1e3 * seconds:.0f} ms, peak +{peak / 2**20:.0f} MiB")


def summary(rows: list[dict], args: argparse.Namespace) -> str:
    """Markdown notes: the targets and how the measurements were taken."""

    def find(measurement: str, sampler: str, n: int, k: int | str | None = None) -> dict | None:
        for row in rows:
            if (row["measurement"], row["sampler"], row["num_classes"]) == (
                measurement,
                sampler,
                n,
            ) and (k is None or row["codebook_size"] == k):
                return row
        return None

    def ms(measurement: str, sampler: str, n: int, k: int | str | None = None) -> float | None:
        row = find(measurement, sampler, n, k)
        return None if row is None else row["median_ms"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    sizes = sorted({row["num_classes"] for row in rows if row["measurement"] == "draw"})
    lines = ["Targets:", ""]
    for name in ("midx_pq", "midx_rq"):
        small, large = ms("draw", name, sizes[0]), ms("draw", name, sizes[-1])
        ratio = large / small
        lines.append(
            f"- {name} draw time at N = {sizes[-1]:.0e} / at N = {sizes[0]:.0e}: "
            f"{large:.2f} / {small:.2f} ms = {ratio:.2f}x (target <= 1.5x: {verdict(ratio <= 1.5)})"
        )
    step_rows = [row for row in rows if row["measurement"] == "train_step"]
    if step_rows:
        n = step_rows[0]["num_classes"]
        uniform = ms("train_step", "uniform", n)
        for name in ("midx_pq", "midx_rq"):
            ratio = ms("train_step", name, n) / uniform
            lines.append(
                f"- training step of SampledSoftmaxHead at N = {n:.0e}, {name} / uniform: "
                f"{ratio:.2f}x (target <= 2x: {verdict(ratio <= 2.0)})"
            )
    lines += _issue14_targets(rows, sizes, ms, find, verdict, args.seq_classes)
    lines += [
        "",
        "B = 256 queries, M = 100 negatives per query (per-query draws, with log_q), K = 64, "
        "D = 64. Draw and step times are medians after a warm-up, every (sampler, N) timed "
        f"round-robin, on {args.device}; refresh (k-means, through faiss on the CPU and in torch "
        "on CUDA, trained on 256 classes per codeword, 25 iterations per codebook, every class "
        "then assigned) is not part of the draw time, as in the paper's "
        "Figure 6. Train step: forward + backward + SGD step, the samplers timed round-robin. "
        f"seq_head: forward + backward of SampledSoftmaxHead(N = {args.seq_classes:,}, D = 64, "
        f"M = {SEQ_NEGATIVES}) on {args.seq_queries:,} queries; seq_draw: one MIDX-rq draw of "
        f"{DRAW_NEGATIVES} negatives for {SEQ_QUERIES:,} queries at N = {DRAW_CLASSES:,}; both "
        "timed round-robin over codebook sizes, peak_mib is the peak RSS (on CUDA: "
        "`max_memory_allocated`) beyond what was allocated before one more call (reset first). "
        "Reproduce: `python -m benchmarks.sampler_time`.",
    ]
    return "\n".join(lines)


def _issue14_targets(rows, sizes, ms, find, verdict, seq_classes: int) -> list[str]:
    """The issue-14 target lines for the measurements present in ``rows``."""
    lines = []
    if {1e4, 1e7} <= set(sizes):
        small, large = ms("draw", "unigram", 10_000), ms("draw", "unigram", 10_000_000)
        lines.append(
            f"- unigram draw at N = 1e7 / at N = 1e4: {large:.2f} / {small:.2f} ms = "
            f"{large / small:.2f}x (target <= 2x: {verdict(large <= 2 * small)})"
        )
        floor_small, floor_large = (
            ms("draw", "random_read", 10_000),
            ms("draw", "random_read", 10_000_000),
        )
        if floor_small is not None and floor_large is not None:
            lines.append(
                f"  - of its {large - small:.2f} ms increase, {floor_large - floor_small:.2f} ms "
                f"is one random 32-byte read per draw ({floor_small:.2f} ms at 1e4, "
                f"{floor_large:.2f} ms at 1e7: `random_read`), the floor of any table-based draw"
            )
    for n, limit_s in ((1_000_000, 3.0), (10_000_000, 20.0)):
        for name in ("midx_pq", "midx_rq"):
            refresh = ms("refresh", name, n)
            if refresh is not None:
                lines.append(
                    f"- {name} refresh at N = {n:.0e}: {refresh / 1e3:.1f} s (target <= "
                    f"{limit_s:g} s: {verdict(refresh <= 1e3 * limit_s)})"
                )
    uniform = ms("seq_head", "uniform", seq_classes)
    for name in ("ove_uniform", "tapas_uniform_r2"):
        other = ms("seq_head", name, seq_classes)
        if uniform is not None and other is not None:
            lines.append(
                f"- sequence-shape head, {name} / uniform: {other:.0f} / {uniform:.0f} ms = "
                f"{other / uniform:.2f}x (improve where > 1.3x: {verdict(other <= 1.3 * uniform)})"
            )
    rq32 = ms("seq_head", "midx_rq", seq_classes, 32)
    if uniform is not None and rq32 is not None:
        lines.append(
            f"- sequence-shape head, midx_rq K = 32 / uniform: {rq32:.0f} / {uniform:.0f} ms = "
            f"{rq32 / uniform:.2f}x (target <= 1.2x: {verdict(rq32 <= 1.2 * uniform)})"
        )
    draw = find("seq_draw", "midx_rq", DRAW_CLASSES, 128)
    if draw is not None:
        ok = draw["median_ms"] <= 600 and draw["peak_mib"] <= 0.7 * 1024
        lines.append(
            f"- MIDX-rq draw of {SEQ_QUERIES:,} x {DRAW_NEGATIVES} at K = 128: "
            f"{draw['median_ms']:.0f} ms, peak +{draw['peak_mib']:.0f} MiB (target <= 600 ms "
            f"and 0.7 GB: {verdict(ok)})"
        )
    return lines


def plot(rows: list[dict], args: argparse.Namespace) -> None:
    """Figure 6: draw time vs number of classes per sampler, MIDX refresh time, and the head at
    the sequence shape vs codebook size."""
    plt = pyplot()

    fig, (draw_ax, refresh_ax, seq_ax) = plt.subplots(1, 3, figsize=(15, 4))
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
    seq_rows = [row for row in rows if row["measurement"] == "seq_head"]
    for name in ("midx_pq", "midx_rq"):
        points = sorted(
            (r["codebook_size"], r["median_ms"]) for r in seq_rows if r["sampler"] == name
        )
        if points:
            color = f"C{SAMPLERS.index(name)}"
            seq_ax.plot(*zip(*points, strict=True), marker="o", label=name, color=color)
    for row in seq_rows:
        if row["sampler"] == "uniform":
            seq_ax.axhline(row["median_ms"], color="C0", linestyle="--", label="uniform")
            seq_ax.axhline(
                1.2 * row["median_ms"], color="grey", linestyle=":", label="1.2x uniform"
            )
    if seq_rows:
        seq_ax.set_xscale("log", base=2)
        seq_ax.set_xlabel("codebook size K")
        seq_ax.set_ylabel("ms per forward + backward")
        seq_ax.set_title(
            f"Head at {args.seq_queries:,} queries x {SEQ_NEGATIVES}, N = {args.seq_classes:,}"
        )
        seq_ax.legend()
    fig.tight_layout()
    save_figure(fig, result_path(args.name, ".png"), dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = make_parser(__doc__)
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
    add_threads_argument(parser, None, "torch and faiss threads (default: torch's)")
    parser.add_argument(
        "--seq-codebook-sizes",
        type=int,
        nargs="*",
        default=[32, 64, 128, 256],
        help="K of the sequence-shape head and draw measurements (none: skip them)",
    )
    parser.add_argument("--seq-classes", type=int, default=SEQ_CLASSES, help="N of seq_head")
    parser.add_argument("--seq-queries", type=int, default=SEQ_QUERIES, help="T of seq_head")
    parser.add_argument("--seq-methods", nargs="+", choices=SEQ_METHODS, default=list(SEQ_METHODS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--name",
        default="sampler_time",
        help="file stem under benchmarks/results/, or an absolute path without suffix",
    )
    add_background_argument(parser)
    args = parser.parse_args(argv)
    args.step_classes = int(args.step_classes)
    set_threads(args.threads, faiss=True)
    rows: list[dict] = []
    with measured_load(args.background) as load:
        samplers: dict = {}
        for size in args.sizes:
            samplers.update(build_samplers(args, int(size), rows))
        time_draws(args, samplers, rows)
        del samplers
        if args.step_classes:
            time_train_steps(args, rows)
        if args.seq_codebook_sizes:
            time_sequence_heads(args, rows)
            time_sequence_draws(args, rows)
    notes = summary(rows, args)
    path = write_results(
        args.name,
        rows,
        title="Sampler draw, refresh and step time",
        notes=notes,
        header=load.header,
    )
    plot(rows, args)
    log(f"wrote {path} and its .csv / .png\n{notes}")


if __name__ == "__main__":
    main()
