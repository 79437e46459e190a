"""One-vs-Each, Section 4.1: doubly stochastic non-parametric estimation of K = 1e4 probabilities.

Data as in the paper: ``N = 1e6`` draws from ``p(k) ∝ u_k^2`` with ``u_k ~ U[0, 1]``, ``K = 1e4``.
The free scores ``f_k`` (a ``OneVsEachHead`` with ``dim = 1`` and ``z = 1``, so ``f_k`` is the
class table) maximise the bound of Eq. 9 by SGD: minibatches of ``b = 100`` instances and, per
instance, 10 classes drawn uniformly from the classes other than its label (the head's default,
the unbiased ``(K - 1) / M`` estimate of Eq. 15). Learning rate ``0.5 / b`` on the minibatch mean,
times 0.9 after each epoch, ``2e5`` iterations (20 epochs). By Proposition 2 the optimum is the
maximum-likelihood estimate, the empirical frequencies ``N_k / N``; the error curve is
``|| softmax(f) - N_k / N ||_1``.

    .venv/bin/python -m benchmarks.ove_nonparametric          # 2e5 iterations: ~8 min
    .venv/bin/python -m benchmarks.ove_nonparametric --quick  # 2e4 iterations
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import Tensor

from benchmarks import common
from lightning_sampled.heads import OneVsEachHead

NUM_CLASSES, NUM_DRAWS, BATCH, NEGATIVES = 10_000, 1_000_000, 100, 10


def make_data(seed: int) -> tuple[Tensor, Tensor]:
    """``(labels [N], empirical frequencies [K])`` drawn from ``p(k) ∝ u_k^2``."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(NUM_CLASSES, generator=g, dtype=torch.float64)
    labels = torch.multinomial(u**2 / (u**2).sum(), NUM_DRAWS, replacement=True, generator=g)
    return labels, torch.bincount(labels, minlength=NUM_CLASSES).double() / NUM_DRAWS


def estimate(head: OneVsEachHead) -> Tensor:
    """The estimated probabilities ``softmax(f)``, float64 ``[K]``."""
    return torch.softmax(head.weight.detach()[:, 0].double(), 0)


def train(labels: Tensor, freq: Tensor, args: argparse.Namespace):
    """Runs SGD on the doubly stochastic bound; returns the error curve, head and s/iteration."""
    torch.manual_seed(args.seed)
    head = OneVsEachHead(NUM_CLASSES, 1, num_negatives=NEGATIVES)
    with torch.no_grad():
        head.weight.zero_()
    opt = torch.optim.SGD(head.parameters(), lr=0.5 / BATCH)
    order = torch.Generator().manual_seed(args.seed)
    ones = torch.ones(BATCH, 1)
    per_epoch = NUM_DRAWS // BATCH
    curve = [(0, (estimate(head) - freq).abs().sum().item())]
    train_time = 0.0
    for it in range(args.iterations):
        if it % per_epoch == 0:
            perm = torch.randperm(NUM_DRAWS, generator=order)
            if it:
                for group in opt.param_groups:
                    group["lr"] *= 0.9
        idx = perm[(it % per_epoch) * BATCH : (it % per_epoch + 1) * BATCH]
        start = time.perf_counter()
        loss = head(ones, labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        train_time += time.perf_counter() - start
        if (it + 1) % args.eval_every == 0:
            curve.append((it + 1, (estimate(head) - freq).abs().sum().item()))
            if (it + 1) % (10 * args.eval_every) == 0:
                print(f"iteration {it + 1}: L1 error {curve[-1][1]:.4f}", flush=True)
    return curve, head, train_time / args.iterations


def plot(freq: Tensor, est: Tensor, curve: list[tuple[int, float]], path: str) -> None:
    """The paper's Figure 2: (a) optimum sorted, (b) the stochastic estimates, (c) the error."""
    order = freq.argsort(descending=True)
    fig, axes = common.pyplot().subplots(1, 3, figsize=(15, 4))
    axes[0].plot(freq[order].numpy())
    axes[0].set_title("(a) optimum: empirical frequencies N_k / N (sorted)")
    axes[1].plot(est[order].numpy(), lw=0.5, alpha=0.7, label="stochastic estimate")
    axes[1].plot(freq[order].numpy(), color="black", lw=1, label="optimum")
    axes[1].set_title("(b) estimated probabilities (same order)")
    axes[1].legend()
    for ax in axes[:2]:
        ax.set_xlabel("class (sorted by frequency)")
    steps, err = zip(*curve, strict=True)
    axes[2].plot(steps, err)
    axes[2].set_yscale("log")
    axes[2].ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    axes[2].set_xlabel("iteration")
    axes[2].set_title("(c) || estimate - optimum ||_1")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    common.save_figure(fig, path, dpi=120)


def main() -> None:
    parser = common.make_parser(__doc__, full=True)
    parser.add_argument("--iterations", type=int, default=200_000)
    parser.add_argument("--eval-every", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    common.add_threads_argument(parser)
    parser.add_argument("--quick", action="store_true", help="2e4 iterations, *_quick files")
    args = parser.parse_args()
    if args.quick:
        args.iterations = 20_000
    common.set_threads(args.threads)
    name = "ove_nonparametric_quick" if args.quick else "ove_nonparametric"

    started = time.perf_counter()
    labels, freq = make_data(args.seed)
    curve, head, sec_per_it = train(labels, freq, args)
    est = estimate(head)
    marks = [m for m in (1_000, 10_000, 20_000, 50_000, 100_000, 200_000) if m <= args.iterations]
    errors = dict(curve)
    frequent = freq >= 100 / NUM_DRAWS  # classes seen at least 100 times
    rows = [
        {
            "iteration": m,
            "epoch": m / (NUM_DRAWS // BATCH),
            "l1_error": errors[m],
            "l1_error_relative_to_start": errors[m] / curve[0][1],
        }
        for m in marks
        if m in errors
    ]
    max_err = (est - freq).abs().max().item()
    median_rel = ((est - freq).abs() / freq)[frequent].median().item()
    notes = f"""
Setup: One-vs-Each paper Section 4.1. K = {NUM_CLASSES} classes, N = {NUM_DRAWS} draws from
p(k) ∝ u_k^2 (u_k ~ U[0, 1], seed {args.seed}); free scores f_k = the class table of a
`OneVsEachHead(K, dim=1, num_negatives={NEGATIVES})` with z = 1; SGD, minibatch {BATCH}, {NEGATIVES}
classes per instance drawn uniformly from the classes other than its label (unbiased (K-1)/M
estimate of Eq. 15), lr 0.5/b = {0.5 / BATCH:g} on the minibatch mean of the estimate, x0.9 per
epoch, {args.iterations} iterations, zero init. The optimum of the bound is the empirical frequency
vector N_k/N (Proposition 2); the error is || softmax(f) - N_k/N ||_1 (the paper's Figure 2c), which
starts at {curve[0][1]:.3f} (uniform estimate). Final: max |error| {max_err:.2e}; median
relative error {median_rel:.3f} over the {int(frequent.sum())} classes seen >= 100 times.
{1e3 * sec_per_it:.2f} ms per iteration (forward + backward + SGD step, 1 CPU thread).
Plot: `{name}.png`.

Reproduce: `.venv/bin/python -m benchmarks.ove_nonparametric{" --quick" if args.quick else ""}`
(this run: {(time.perf_counter() - started) / 60:.1f} min wall time in all).
"""
    common.write_results(
        name, rows, title="One-vs-Each non-parametric estimation (Section 4.1)", notes=notes
    )
    plot(freq, est, curve, str(common.RESULTS_DIR / f"{name}.png"))
    print(f"wrote {common.RESULTS_DIR / name}.{{csv,md,png}}", flush=True)


if __name__ == "__main__":
    main()
