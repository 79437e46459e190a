"""TAPAS, Section 5.1.1: linear softmax on a 1000-class Gaussian mixture, precision@1 on test.

Data as in the paper: ``V = 1000`` centroids ``mu_j ~ N(0, c^2 / d I)`` in ``d = 50`` with
``c = 3``; a point draws its label uniformly and its position from ``N(mu_y, I)``; 1e5 training and
1e4 test points. Model: logits ``w_j . x + b_j`` (the Bayes posterior has this form), trained with
Adagrad, batch 16, l2 regularisation 0.001 (as weight decay), from zero weights. Runs: TAPAS with
(a) ``n = 16``, ``r`` in {1, 2, 4, 8} and (b) ``n r = 128``, ``n`` in {16, 32, 64, 128}; sampled
softmax (logQ-corrected, shared negatives) with ``n r`` samples; the full softmax. Both sampled
methods use the squashed unigram proposal of the training labels (``alpha = 0.75``).

    .venv/bin/python -m benchmarks.tapas_synthetic           # 3 epochs: ~16 min, loaded 2 cores
    .venv/bin/python -m benchmarks.tapas_synthetic --quick   # 2000 steps per run: ~2 min
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from benchmarks import common
from lightning_sampled.heads import (
    FullSoftmaxHead,
    OutputHead,
    SampledSoftmaxHead,
    TapasHead,
)
from lightning_sampled.samplers import UnigramSampler

NUM_CLASSES, DIM, C, NUM_TRAIN, NUM_TEST, BATCH = 1000, 50, 3.0, 100_000, 10_000, 16
TIMED_STEPS, TIMED_BLOCKS = 100, 9


@dataclass(frozen=True)
class Run:
    """One training run: ``method`` in {"tapas", "sampled", "full"}."""

    method: str
    n: int = 0
    r: int = 1

    @property
    def name(self) -> str:
        if self.method == "tapas":
            return f"TAPAS n={self.n} r={self.r}"
        if self.method == "sampled":
            return f"sampled softmax {self.n}"
        return "full softmax"


RUNS = [
    *(Run("tapas", 16, r) for r in (1, 2, 4, 8)),
    *(Run("tapas", n, 128 // n) for n in (32, 64, 128)),
    *(Run("sampled", m) for m in (16, 32, 64, 128)),
    Run("full"),
]


def make_data(seed: int) -> dict[str, Tensor]:
    """Centroids and train / test points of the Gaussian mixture, from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(NUM_CLASSES, DIM, generator=g) * (C / math.sqrt(DIM))
    y_train = torch.randint(NUM_CLASSES, (NUM_TRAIN,), generator=g)
    x_train = mu[y_train] + torch.randn(NUM_TRAIN, DIM, generator=g)
    y_test = torch.randint(NUM_CLASSES, (NUM_TEST,), generator=g)
    x_test = mu[y_test] + torch.randn(NUM_TEST, DIM, generator=g)
    return {"mu": mu, "x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


def precision_at_1(head: OutputHead, x: Tensor, y: Tensor) -> float:
    """Exact precision@1 over all classes."""
    return (head.topk(x, 1)[1][:, 0] == y).float().mean().item()


def make_head(run: Run, counts: Tensor, temperature: float) -> OutputHead:
    if run.method == "full":
        head = FullSoftmaxHead(NUM_CLASSES, DIM, bias=True)
    elif run.method == "sampled":
        head = SampledSoftmaxHead(
            NUM_CLASSES, DIM, UnigramSampler(counts), run.n, shared_negatives=True, bias=True,
            in_batch_negatives=False,
        )  # fmt: skip
    else:
        head = TapasHead(
            NUM_CLASSES,
            DIM,
            UnigramSampler(counts),
            run.n,
            presample_factor=run.r,
            selection_temperature=temperature,
            bias=True,
        )
    with torch.no_grad():
        head.weight.zero_()
    return head


def setup(
    run: Run, data: dict[str, Tensor], args: argparse.Namespace
) -> tuple[OutputHead, torch.optim.Optimizer]:
    """A fresh head (zero weights) and its Adagrad optimizer, after seeding."""
    torch.manual_seed(args.seed)
    counts = torch.bincount(data["y_train"], minlength=NUM_CLASSES).float()
    head = make_head(run, counts, args.temperature)
    return head, torch.optim.Adagrad(head.parameters(), lr=args.lr, weight_decay=1e-3)


def train_step(head: OutputHead, opt: torch.optim.Optimizer, x: Tensor, y: Tensor) -> None:
    loss = head(x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def train(run: Run, data: dict[str, Tensor], args: argparse.Namespace) -> list[tuple[int, float]]:
    """Trains one run; returns the test precision@1 curve ``[(step, p@1)]``."""
    head, opt = setup(run, data, args)
    order = torch.Generator().manual_seed(args.seed)
    steps_per_epoch = NUM_TRAIN // BATCH
    total = args.steps or args.epochs * steps_per_epoch
    curve, step = [], 0
    while step < total:
        perm = torch.randperm(NUM_TRAIN, generator=order)
        for i in range(min(steps_per_epoch, total - step)):
            idx = perm[i * BATCH : (i + 1) * BATCH]
            train_step(head, opt, data["x_train"][idx], data["y_train"][idx])
            step += 1
            if step % args.eval_every == 0 or step == total:
                curve.append((step, precision_at_1(head, data["x_test"], data["y_test"])))
        print(f"  {run.name}: step {step}/{total} p@1 {curve[-1][1]:.4f}", flush=True)
    return curve


def step_times(runs: list[Run], data: dict[str, Tensor], args: argparse.Namespace) -> list[float]:
    """Median CPU seconds per training step of each run, over ``TIMED_BLOCKS`` blocks of
    ``TIMED_STEPS`` steps taken round-robin after one warm-up block each.

    Process CPU time (one thread), not wall time: on a shared machine a process waits for a core
    for a varying share of its wall time, which says nothing about the method.
    """
    states = [setup(run, data, args) for run in runs]
    batches = torch.arange(TIMED_STEPS * BATCH).view(TIMED_STEPS, BATCH)
    x, y = data["x_train"], data["y_train"]
    times: list[list[float]] = [[] for _ in runs]
    for round_ in range(TIMED_BLOCKS + 1):
        for (head, opt), spent in zip(states, times, strict=True):
            start = time.process_time()
            for idx in batches:
                train_step(head, opt, x[idx], y[idx])
            if round_:
                spent.append(time.process_time() - start)
    return [statistics.median(spent) / TIMED_STEPS for spent in times]


def plot(curves: dict[Run, list[tuple[int, float]]], full_p1: float, path: str, skip: int) -> None:
    """Figure 1 of the paper: (a) n = 16, varying r; (b) n r = 128, varying (n, r)."""
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    panels = [
        ("(a) n = 16, varying r", [Run("tapas", 16, r) for r in (1, 2, 4, 8)]),
        ("(b) n r = 128, varying (n, r)", [Run("tapas", n, 128 // n) for n in (16, 32, 64, 128)]),
    ]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, runs) in zip(axes, panels, strict=True):
        for color, run in zip(colors, runs, strict=False):
            steps, p1 = zip(*[(s, p) for s, p in curves[run] if s > skip], strict=True)
            ax.plot(steps, common.smooth(list(p1), 5), color=color, label=run.name)
            ssm = Run("sampled", run.n * run.r)
            if ssm in curves and (title.startswith("(a)") or run.r == 8):
                steps, p1 = zip(*[(s, p) for s, p in curves[ssm] if s > skip], strict=True)
                ax.plot(steps, common.smooth(list(p1), 5), color=color, ls="--", label=ssm.name)
        steps, p1 = zip(*[(s, p) for s, p in curves[Run("full")] if s > skip], strict=True)
        ax.plot(steps, common.smooth(list(p1), 5), color="black", label="full softmax")
        ax.set_title(title)
        ax.set_xlabel("training step (batch 16)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("test precision@1")
    fig.suptitle(f"TAPAS Sec. 5.1.1 (V=1000, d=50, c=3); final full softmax p@1 = {full_p1:.3f}")
    fig.tight_layout()
    common.save_figure(fig, path, dpi=120)


def main() -> None:
    parser = common.make_parser(__doc__, full=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=0, help="steps per run (overrides --epochs)")
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    common.add_threads_argument(parser)
    parser.add_argument("--quick", action="store_true", help="2000 steps per run, *_quick files")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.eval_every = 2000, 100
    common.set_threads(args.threads)
    name = "tapas_synthetic_quick" if args.quick else "tapas_synthetic"

    started = time.perf_counter()
    data = make_data(args.seed)
    mu = data["mu"]
    bayes_logits = data["x_test"] @ mu.T - 0.5 * (mu**2).sum(1)
    bayes = (bayes_logits.argmax(1) == data["y_test"]).float().mean().item()
    print(f"Bayes-optimal precision@1 (true centroids): {bayes:.4f}", flush=True)

    curves, rows = {}, []
    for run in RUNS:
        print(f"{run.name} ...", flush=True)
        curves[run] = train(run, data, args)
    print("timing steps ...", flush=True)
    for run, sec_per_step in zip(RUNS, step_times(RUNS, data, args), strict=True):
        curve = curves[run]
        tail = [p for _, p in curve[-max(1, len(curve) // 10) :]]
        rows.append(
            {
                "method": run.name,
                "n": run.n if run.method != "full" else NUM_CLASSES,
                "r": run.r if run.method == "tapas" else "",
                "samples_n_r": run.n * run.r if run.method != "full" else NUM_CLASSES,
                "p@1_final": curve[-1][1],
                "p@1_last10pct_mean": sum(tail) / len(tail),
                "cpu_ms_per_step": 1e3 * sec_per_step,
                "steps": curve[-1][0],
                "epochs": curve[-1][0] / (NUM_TRAIN // BATCH),
                "seed": args.seed,
                "lr": args.lr,
                "temperature": args.temperature,
            }
        )
    rows.append({"method": "Bayes optimum (true centroids)", "p@1_final": bayes})
    total_steps = rows[0]["steps"]
    notes = f"""
Setup: TAPAS paper Section 5.1.1. V = 1000 centroids ~ N(0, c^2/d I), d = 50, c = 3; 1e5 train and
1e4 test points ~ N(mu_y, I) with uniform labels (data seed {args.seed}). Linear softmax model
(logits w_j . x + b_j, zero init), Adagrad lr {args.lr}, batch 16, weight decay 1e-3 (the paper's
l2 level 0.001), {total_steps} steps per run ({total_steps / (NUM_TRAIN // BATCH):g} epochs),
seed {args.seed} for every run (same data order). TAPAS: presampler = squashed unigram of the
training labels (alpha 0.75), temperature {args.temperature} (constant), no logQ correction.
Sampled softmax: same proposal, shared negatives, logQ-corrected. Precision@1 is exact (all 1000
classes, `head.topk`), evaluated every {args.eval_every} steps; `p@1_last10pct_mean` averages the
last tenth of the evaluations. `cpu_ms_per_step`: process CPU time of forward + backward +
Adagrad step on {args.threads} thread(s), the median of {TIMED_BLOCKS} blocks of {TIMED_STEPS}
steps per run, timed round-robin after training (CPU rather than wall time because the machine is
shared and loaded). The dense Adagrad update and weight decay of the whole 1000 x 50 table are
in every step, as in the paper's setup.
TAPAS n=16 r=1, r=2, ... in (a) pair with sampled softmax of n*r = 16, 32, 64, 128 samples (TAPAS
n=16 r=1 *is* sampled softmax with 16 samples drawn without replacement, uncorrected).
Plot: `{name}.png` (moving average of 5 evaluations, first 2500 steps cut as in the paper's
Figure 1; dashed = sampled softmax with n*r samples).

Reproduce: `.venv/bin/python -m benchmarks.tapas_synthetic{" --quick" if args.quick else ""}`
(this run: {(time.perf_counter() - started) / 60:.1f} min wall time in all).
"""
    common.write_results(
        name, rows, title="TAPAS synthetic (Section 5.1.1): test precision@1", notes=notes
    )
    skip = 2500 if total_steps > 10_000 else 0
    full_p1 = curves[Run("full")][-1][1]
    plot(curves, full_p1, str(common.RESULTS_DIR / f"{name}.png"), skip)
    print(f"wrote {common.RESULTS_DIR / name}.{{csv,md,png}}", flush=True)


if __name__ == "__main__":
    main()
