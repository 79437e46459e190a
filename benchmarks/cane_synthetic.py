"""CANE vs sampled softmax on the 10,000-class synthetic task of TAPAS, Section 5.1.2.

Data as in the TAPAS paper: ``V = 10,000`` centroids ``mu_j ~ N(0, c^2 / d_c I)`` in ``d_c = 10``
(``c = 3`` as in its Section 5.1.1); a point draws its label uniformly, forms
``[mu_y, e]`` with noise ``e ~ N(0, I)`` in ``d_n = 10``, and passes it through a fixed random
2-layer net (``d_h = 50`` ReLU units, then linear to ``d = 25``; He-scaled Gaussian weights).
Classifier as in the paper: one 50-unit hidden layer (ReLU) and a head over the 10,000 classes
(with bias), batch 32, Adam. Runs, every one for the same number of steps: the full softmax,
sampled softmax with 100 uniform negatives per query, and ``CaneHead`` (flat, branching 10,
uniform noises) with ``(N_c, N_n)`` in {(10, 90), (50, 50), (90, 10)}: the CANE paper's
CANE-(N_c vs N_n) configurations, 100 scored classes besides the target like the sampled softmax,
plus CANE-(5 vs 5) with 10. The CANE tree is rebuilt (``head.refresh_index()``, what
``IndexRefresh`` calls) at the start and every ``--refresh-every`` steps.

    .venv/bin/python -m benchmarks.cane_synthetic           # 20,000 steps per run: ~20 min
    .venv/bin/python -m benchmarks.cane_synthetic --quick   # 300 steps per run: ~1 min
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from benchmarks import common
from lightning_sampled.heads import (
    CaneHead,
    FullSoftmaxHead,
    OutputHead,
    SampledSoftmaxHead,
)
from lightning_sampled.samplers import UniformSampler

NUM_CLASSES, CENTROID_DIM, NOISE_DIM, GEN_HIDDEN, DIM = 10_000, 10, 10, 50, 25
C, HIDDEN, BATCH, NUM_TEST, BRANCHING = 3.0, 50, 32, 10_000, 10
EVAL_CHUNK = 2000


@dataclass(frozen=True)
class Run:
    """One training run: ``method`` in {"full", "sampled", "cane"}; ``scored`` negatives for
    sampled softmax, ``(candidates, noise)`` for CANE."""

    method: str
    candidates: int = 0
    noise: int = 0

    @property
    def name(self) -> str:
        if self.method == "cane":
            return f"CANE-({self.candidates} vs {self.noise})"
        if self.method == "sampled":
            return f"sampled softmax {self.noise}"
        return "full softmax"

    @property
    def scored(self) -> int:
        """Classes scored per query besides the target."""
        return NUM_CLASSES if self.method == "full" else self.candidates + self.noise


RUNS = [
    Run("full"),
    Run("sampled", noise=100),
    Run("cane", 10, 90),
    Run("cane", 50, 50),
    Run("cane", 90, 10),
    Run("cane", 5, 5),
]


def generator_net(g: torch.Generator) -> nn.Sequential:
    """The fixed random generative net ``[d_c + d_n] -> d_h (ReLU) -> d``, He-scaled weights."""
    net = nn.Sequential(
        nn.Linear(CENTROID_DIM + NOISE_DIM, GEN_HIDDEN), nn.ReLU(), nn.Linear(GEN_HIDDEN, DIM)
    )
    with torch.no_grad():
        for layer in (net[0], net[2]):
            fan_in = layer.weight.shape[1]
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=g) * math.sqrt(2 / fan_in))
            layer.bias.zero_()
    return net


def make_data(seed: int, num_train: int) -> dict[str, Tensor]:
    """Train and test points of TAPAS 5.1.2 from ``seed``: ``x_*`` ``[n, 25]``, ``y_*`` ``[n]``."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(NUM_CLASSES, CENTROID_DIM, generator=g) * (C / math.sqrt(CENTROID_DIM))
    net = generator_net(g)

    def points(n: int) -> tuple[Tensor, Tensor]:
        y = torch.randint(NUM_CLASSES, (n,), generator=g)
        noise = torch.randn(n, NOISE_DIM, generator=g)
        with torch.no_grad():
            return net(torch.cat([mu[y], noise], dim=1)), y

    x_train, y_train = points(num_train)
    x_test, y_test = points(NUM_TEST)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


def make_head(run: Run) -> OutputHead:
    if run.method == "full":
        return FullSoftmaxHead(NUM_CLASSES, HIDDEN, bias=True)
    if run.method == "sampled":
        return SampledSoftmaxHead(
            NUM_CLASSES,
            HIDDEN,
            UniformSampler(NUM_CLASSES),
            run.noise,
            bias=True,
            convention="exact_positive",  # the library's default when the results were made
            in_batch_negatives=False,
        )
    return CaneHead(NUM_CLASSES, HIDDEN, run.candidates, run.noise, BRANCHING, bias=True)


class Classifier(nn.Module):
    """The paper's classifier: ``x [T, 25] -> Linear -> ReLU -> [T, 50]``, then the head."""

    def __init__(self, head: OutputHead) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU())
        self.head = head

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.head(self.encoder(x), y)


@torch.no_grad()
def predict(model: Classifier, x: Tensor, beam: int | None) -> Tensor:
    """Top-1 class ``[n]`` of ``x`` ``[n, 25]``: exact ``topk``, or ``beam_topk`` with ``beam``."""
    out = []
    for chunk in x.split(EVAL_CHUNK):
        z = model.encoder(chunk)
        top = model.head.topk(z, 1) if beam is None else model.head.beam_topk(z, 1, beam)
        out.append(top[1][:, 0])
    return torch.cat(out)


def precision_at_1(model: Classifier, data: dict[str, Tensor], beam: int | None = None) -> float:
    return (predict(model, data["x_test"], beam) == data["y_test"]).float().mean().item()


@torch.no_grad()
def test_coverage(model: Classifier, data: dict[str, Tensor]) -> float:
    """Share of test targets among the CANE candidates (the CANE paper's Table 3)."""
    head = model.head
    hits = []
    for x, y in zip(
        data["x_test"].split(EVAL_CHUNK), data["y_test"].split(EVAL_CHUNK), strict=True
    ):
        candidates = head.candidates(head.score_queries(model.encoder(x)))
        hits.append((candidates == y[:, None]).any(dim=1))
    return torch.cat(hits).float().mean().item()


def timed_eval(model: Classifier, data: dict[str, Tensor], beam: int | None) -> tuple[float, float]:
    """``(precision@1, wall seconds)`` of one prediction pass over the test set."""
    start = time.perf_counter()
    p1 = precision_at_1(model, data, beam)
    return p1, time.perf_counter() - start


def train(run: Run, data: dict[str, Tensor], args: argparse.Namespace) -> dict:
    """Trains one run; returns its curve ``[(step, p@1)]``, per-step coverage (CANE), step and
    refresh times and the final model."""
    torch.manual_seed(args.seed)
    model = Classifier(make_head(run))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    order = torch.Generator().manual_seed(args.seed)
    num_train = data["y_train"].numel()
    is_cane = run.method == "cane"
    curve, coverage, step_wall, step_cpu, refresh_wall = [], [], 0.0, 0.0, 0.0
    step = 0
    while step < args.steps:
        perm = torch.randperm(num_train, generator=order)
        for idx in perm[: (num_train // BATCH) * BATCH].view(-1, BATCH):
            if is_cane and step % args.refresh_every == 0:
                start = time.perf_counter()
                model.head.refresh_index()
                refresh_wall += time.perf_counter() - start
            wall, cpu = time.perf_counter(), time.process_time()
            loss = model(data["x_train"][idx], data["y_train"][idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step_wall += time.perf_counter() - wall
            step_cpu += time.process_time() - cpu
            step += 1
            if is_cane:
                coverage.append(model.head.last_coverage.item())
            if step % args.eval_every == 0 or step == args.steps:
                curve.append((step, precision_at_1(model, data)))
                print(f"  {run.name}: step {step} p@1 {curve[-1][1]:.4f}", flush=True)
            if step == args.steps:
                break
    return {
        "curve": curve,
        "coverage": coverage,
        "step_wall": step_wall / step,
        "step_cpu": step_cpu / step,
        "refresh_wall": refresh_wall,
        "refreshes": math.ceil(step / args.refresh_every) if is_cane else 0,
        "model": model,
    }


def result_row(run: Run, out: dict, data: dict[str, Tensor], args: argparse.Namespace) -> dict:
    model = out["model"]
    p1, exact_s = timed_eval(model, data, None)
    row = {
        "method": run.name,
        "scored_classes": run.scored,
        "p@1_exact": p1,
        "p@1_beam10": "",
        "p@1_beam50": "",
        "train_coverage_last10pct": "",
        "test_coverage": "",
        "wall_ms_per_step": 1e3 * out["step_wall"],
        "cpu_ms_per_step": 1e3 * out["step_cpu"],
        "refresh_s_each": "",
        "test_exact_topk_s": exact_s,
        "test_beam50_s": "",
        "steps": out["curve"][-1][0],
        "epochs": out["curve"][-1][0] * BATCH / data["y_train"].numel(),
        "lr": args.lr,
        "seed": args.seed,
    }
    if run.method == "cane":
        tail = out["coverage"][-max(1, len(out["coverage"]) // 10) :]
        row["p@1_beam10"] = precision_at_1(model, data, 10)
        row["p@1_beam50"], row["test_beam50_s"] = timed_eval(model, data, 50)
        row["train_coverage_last10pct"] = sum(tail) / len(tail)
        row["test_coverage"] = test_coverage(model, data)
        row["refresh_s_each"] = out["refresh_wall"] / out["refreshes"]
    return row


def plot(results: dict[Run, dict], path: str, refresh_every: int) -> None:
    """The CANE paper's Figure 2 (test precision@1 against steps) and the training coverage."""
    fig, (ax_p1, ax_cov) = common.pyplot().subplots(1, 2, figsize=(12, 4.5))
    for run, out in results.items():
        steps, p1 = zip(*out["curve"], strict=True)
        style = "-" if run.method == "cane" else "--"
        ax_p1.plot(steps, p1, style, label=run.name, marker=".")
        if run.method == "cane":
            window = max(1, refresh_every // 5)
            ax_cov.plot(
                range(1, len(out["coverage"]) + 1),
                common.smooth(out["coverage"], window),
                label=run.name,
            )
    ax_p1.set_xlabel(f"training step (batch {BATCH})")
    ax_p1.set_ylabel("test precision@1 (exact top-1)")
    ax_p1.set_title("test precision@1")
    ax_cov.set_xlabel(f"training step (batch {BATCH})")
    ax_cov.set_ylabel("share of targets among the candidates")
    ax_cov.set_title(f"CANE training coverage (tree rebuilt every {refresh_every} steps)")
    for ax in (ax_p1, ax_cov):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("TAPAS Sec. 5.1.2 synthetic task (V=10,000, d=25, 50-unit hidden layer)")
    fig.tight_layout()
    common.save_figure(fig, path, dpi=120)


def main() -> None:
    parser = common.make_parser(__doc__, full=True)
    parser.add_argument("--steps", type=int, default=20_000, help="training steps per run")
    parser.add_argument("--train-size", type=int, default=1_000_000)
    parser.add_argument("--eval-every", type=int, default=1000)
    parser.add_argument("--refresh-every", type=int, default=500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    common.add_threads_argument(parser)
    parser.add_argument("--quick", action="store_true", help="300 steps per run, *_quick files")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.eval_every, args.refresh_every = 300, 100, 100
    common.set_threads(args.threads)
    name = "cane_synthetic_quick" if args.quick else "cane_synthetic"

    started = time.perf_counter()
    data = make_data(args.seed, args.train_size)
    results, rows = {}, []
    for run in RUNS:
        print(f"{run.name} ...", flush=True)
        results[run] = train(run, data, args)
        rows.append(result_row(run, results[run], data, args))
        print(f"  {rows[-1]}", flush=True)
    epochs = args.steps * BATCH / args.train_size
    flags = " --quick" if args.quick else f" --steps {args.steps} --eval-every {args.eval_every}"
    notes = f"""
Setup: TAPAS paper Section 5.1.2. V = 10,000 centroids ~ N(0, c^2/d_c I) in d_c = 10 (c = 3, as in
its 5.1.1; the paper gives no c for 5.1.2), a point = [mu_y, e], e ~ N(0, I) in d_n = 10, through a
fixed random net (d_h = 50 ReLU units, then linear to d = 25; He-scaled Gaussian weights, zero
biases); uniform labels; {args.train_size:,} training points (the paper: 1e6) and {NUM_TEST:,}
test points (the paper: 1e5, fewer here for the evaluation time), data seed {args.seed}.
Classifier: Linear(25, 50) + ReLU, then the head (50-dim class vectors with bias, default init),
Adam lr {args.lr}, batch {BATCH}, {args.steps} steps per run ({epochs:.2g} epochs), seed {args.seed}
for every run (same initial encoder, same data order).
Sampled softmax: 100 uniform negatives per query (with replacement, logQ-corrected, the
"exact_positive" convention, the library's default until issue 31). CANE: `CaneHead`, flat,
branching {BRANCHING}, beam = N_c, uniform noises outside the candidates; `head.refresh_index()`
(what `IndexRefresh` calls) before the first step and every {args.refresh_every} steps, called by
this script.
`p@1_exact`: `head.topk` over all classes; `p@1_beam10` / `p@1_beam50`: `head.beam_topk(z, 1,
beam)`. `train_coverage_last10pct`: `head.last_coverage` averaged over the last tenth of the
steps; `test_coverage`: the share of test targets among the N_c candidates of the final model
(the CANE paper's Table 3). `wall_ms_per_step` / `cpu_ms_per_step`: forward + backward + Adam
step, averaged over the whole run ({args.threads} thread, `nice -n 5`, on a shared 2-core machine:
wall time includes waiting for a core); the tree rebuilds are timed apart (`refresh_s_each`).
`test_exact_topk_s` / `test_beam50_s`: wall seconds to predict the {NUM_TEST:,} test points.
Plot: `{name}.png` (left: test precision@1 every {args.eval_every} steps; right: CANE training
coverage, moving average).

Reproduce: `nice -n 5 .venv/bin/python -m benchmarks.cane_synthetic{flags}`
(this run: {(time.perf_counter() - started) / 60:.1f} min wall time in all).
"""
    common.write_results(
        name, rows, title="CANE on the TAPAS 5.1.2 synthetic task: test precision@1", notes=notes
    )
    plot(results, str(common.RESULTS_DIR / f"{name}.png"), args.refresh_every)
    print(f"wrote {common.RESULTS_DIR / name}.{{csv,md,png}}", flush=True)


if __name__ == "__main__":
    main()
