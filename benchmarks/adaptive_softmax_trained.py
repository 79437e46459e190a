"""AdaptiveSoftmax on the trained output layer of the PTB LSTM recipe (the paper's Tables 1 and 2).

The PTB LSTM recipe (``recipes/configs/lstm_ptb.yaml`` with the full softmax head) is trained for
``--epochs`` epochs with seed 0, or loaded from a checkpoint of that recipe (``--checkpoint``).
Its head is ``A = [10000, d]`` (the tied word embedding, ``d = 200`` in the recipe; ``--dims 1024``
adds a wider variant, trained the same way with ``--model.init_args.embedding_dim=1024``, as the
paper warns that the gain is small at small ``d``). The queries ``x`` are the head's inputs (the
projected LSTM states) at every position of the evaluation windows, in eval mode.

AdaptiveSoftmax (``eps = 0.3``, ``k = 1``) is calibrated (Appendix C.4) on ``--calibration``
held-out queries drawn from the validation split and evaluated on ``--test`` disjoint queries drawn
from the test split, for ``delta`` in {0.1, 0.05, 0.01}; the uncalibrated numbers (factors 1) on
the same test queries are reported beside. Gain is ``n d / samples_used`` per query, averaged;
success is the exact top-1 with its probability within ``1 +- eps``. The dense fall-back is off
(``fallback_gain=None``): the gains are the paper's algorithm's, as in its tables.

Run from the repository root::

    .venv/bin/python -m benchmarks.adaptive_softmax_trained              # train d = 200, evaluate
    .venv/bin/python -m benchmarks.adaptive_softmax_trained --checkpoint PATH.ckpt
    .venv/bin/python -m benchmarks.adaptive_softmax_trained --dims 200 1024 \\
        --checkpoint D200.ckpt D1024.ckpt
    .venv/bin/python -m benchmarks.adaptive_softmax_trained --quick      # smoke run (minutes)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from benchmarks.common import add_threads_argument, log, make_parser, set_threads, write_results
from lightning_sampled.inference import AdaptiveSoftmax, adaptive_success, exact_topk_softmax

EPS = 0.3
DELTAS = (0.1, 0.05, 0.01)
PAPER_TABLE_2_PTB = "GPT-2 8.10x (81.68%), 7.50x (90.73%), 6.66x (96.79%)"
CONFIGS = [
    "--config",
    "recipes/configs/lstm_ptb.yaml",
    "--config",
    "recipes/configs/heads/full.yaml",
]


def recipe_args(dim: int, seed: int) -> list[str]:
    """The recipe's arguments for the full-softmax PTB LSTM of embedding width ``dim``."""
    return [*CONFIGS, f"--seed_everything={seed}", f"--model.init_args.embedding_dim={dim}"]


def train(
    dim: int, seed: int, epochs: int, limit_train_batches: float, out_dir: Path
) -> tuple[Path, list[str]]:
    """Fits the recipe with the recipe's own CLI; returns the checkpoint path and the arguments."""
    from recipes.cli import main as recipe_main

    args = [
        "fit",
        *recipe_args(dim, seed),
        f"--trainer.max_epochs={epochs}",
        f"--trainer.limit_train_batches={limit_train_batches}",
        f"--trainer.logger.init_args.save_dir={out_dir / f'd{dim}'}",
        "--trainer.enable_progress_bar=false",
    ]
    log(f"training d={dim}: python -m recipes {' '.join(args)}")
    started = time.perf_counter()
    cli = recipe_main(args=args)
    path = Path(cli.trainer.checkpoint_callback.best_model_path)
    log(f"trained d={dim} in {time.perf_counter() - started:.0f} s: {path}")
    return path, args


def load_model_state(checkpoint: Path) -> dict[str, Tensor]:
    """The model's ``state_dict`` from a Lightning checkpoint, read with ``weights_only=True``:
    tensors and plain containers only, so that loading a checkpoint cannot run code.

    Raises:
        pickle.UnpicklingError: the checkpoint holds other objects.
    """
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]


@torch.no_grad()
def load_queries(
    dim: int, seed: int, checkpoint: Path, calibration: int, test: int
) -> tuple[Any, Tensor, Tensor, float]:
    """The trained head and ``(calibration [m, d] from validation, test [q, d] from test)``.

    Also returns the validation perplexity of the loaded model on the whole validation split.
    """
    from recipes.cli import main as recipe_main

    cli = recipe_main(args=[*recipe_args(dim, seed), "--trainer.logger=false"], run=False)
    model, data = cli.model, cli.datamodule
    model.load_state_dict(load_model_state(checkpoint))
    model.eval()
    generator = torch.Generator().manual_seed(seed)

    def queries(loader: Any, count: int) -> tuple[Tensor, float]:
        parts, nll, tokens = [], 0.0, 0
        for batch in loader:
            z = model.eval_queries(batch)
            nll -= float(model.head.log_prob(z, batch["target"]).sum())
            tokens += batch["target"].numel()
            parts.append(z.reshape(-1, z.shape[-1]))
        every = torch.cat(parts)
        pick = torch.randperm(every.shape[0], generator=generator)[:count]
        return every[pick].contiguous(), float(torch.exp(torch.tensor(nll / tokens)))

    x_cal, val_ppl = queries(data.val_dataloader(), calibration)
    x_test, test_ppl = queries(data.test_dataloader(), test)
    log(f"d={dim}: validation ppl {val_ppl:.1f}, test ppl {test_ppl:.1f} (loaded {checkpoint})")
    return model.head, x_cal, x_test, test_ppl


def evaluate(module: AdaptiveSoftmax, x: Tensor, exact: Any, batch_size: int) -> dict[str, float]:
    """Mean gain, success and identification rate of ``module.topk`` on ``x``."""
    indices, probs, samples = [], [], []
    for chunk in x.split(batch_size):
        result = module.topk(chunk)
        indices.append(result.indices)
        probs.append(result.probs)
        samples.append(result.samples_used)
    identified, success = adaptive_success(torch.cat(indices), torch.cat(probs), exact, EPS)
    samples_used = torch.cat(samples).double()
    dense = module.num_classes * module.dim
    return {
        "mean_gain": float((dense / samples_used).mean()),
        "gain_of_mean": dense / float(samples_used.mean()),
        "success_rate": float(success.double().mean()),
        "identified_rate": float(identified.double().mean()),
    }


def run_head(
    head: Any,
    x_cal: Tensor,
    x_test: Tensor,
    *,
    seed: int,
    tolerance: float,
    batch_size: int,
    extra: dict[str, Any],
) -> list[dict[str, Any]]:
    """Uncalibrated and calibrated rows for every ``delta`` on one trained head."""
    weight = head.weight.detach()
    bias = None if head.bias is None else head.bias.detach()
    exact = exact_topk_softmax(weight, x_test, 1, bias=bias, padding_idx=head.padding_idx)
    log(
        f"d={weight.shape[1]}: exact top-1 probability on the test queries: median "
        f"{float(exact.probs.median()):.3f}"
    )
    rows = []

    def fresh(delta: float) -> AdaptiveSoftmax:
        return AdaptiveSoftmax(
            weight,
            eps=EPS,
            delta=delta,
            seed=seed,
            bias=bias,
            padding_idx=head.padding_idx,
            fallback_gain=None,
        )

    for delta in DELTAS:
        module = fresh(delta)
        started = time.perf_counter()
        found = module.calibrate(x_cal, k=1, seed=seed, tolerance=tolerance, batch_size=batch_size)
        calibration_seconds = time.perf_counter() - started
        calibrated = evaluate(module, x_test, exact, batch_size)
        uncalibrated = evaluate(fresh(delta), x_test, exact, batch_size)
        row = {
            **extra,
            "n": weight.shape[0],
            "d": weight.shape[1],
            "delta": delta,
            "calibration_queries": x_cal.shape[0],
            "test_queries": x_test.shape[0],
            **{f"cal_{key}": value for key, value in calibrated.items()},
            **{f"uncal_{key}": value for key, value in uncalibrated.items()},
            "bandit_scale": found.bandit_scale,
            "norm_scale": found.norm_scale,
            "cal_success_on_calibration": found.success_rate,
            "calibration_seconds": calibration_seconds,
        }
        rows.append(row)
        log(
            f"d={row['d']} delta={delta}: calibrated gain {row['cal_mean_gain']:.2f}x success "
            f"{row['cal_success_rate']:.3f} (factors {found.bandit_scale:.3g}, "
            f"{found.norm_scale:.3g}; {calibration_seconds:.0f} s); uncalibrated gain "
            f"{row['uncal_mean_gain']:.2f}x success {row['uncal_success_rate']:.3f}"
        )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = make_parser(__doc__)
    parser.add_argument("--dims", type=int, nargs="+", default=[200], help="embedding widths")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        nargs="*",
        default=[],
        help="checkpoints of the recipe, one per --dims entry (trained here when absent)",
    )
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument(
        "--limit-train-batches",
        type=float,
        nargs="+",
        default=[1.0],
        help="fraction of the training epoch, one per --dims entry or one for all",
    )
    parser.add_argument("--train-dir", type=Path, default=Path("logs/adaptive_softmax_trained"))
    parser.add_argument("--calibration", type=int, default=100, help="validation queries")
    parser.add_argument("--test", type=int, default=500, help="test queries")
    parser.add_argument("--tolerance", type=float, default=0.05, help="log10 bisection width")
    parser.add_argument("--batch-size", type=int, default=50, help="queries per topk call")
    add_threads_argument(parser, 2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--note", default="", help="provenance of --checkpoint (e.g. its training command)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="1%% of an epoch, 30 + 60 queries, tolerance 0.2"
    )
    args = parser.parse_args(argv)
    if args.checkpoint and len(args.checkpoint) != len(args.dims):
        parser.error("give one --checkpoint per --dims entry")
    if args.quick:
        args.limit_train_batches = [0.01]
        args.calibration, args.test, args.tolerance = 30, 60, 0.2
    limits = args.limit_train_batches
    if len(limits) == 1:
        limits = limits * len(args.dims)
    set_threads(args.threads)
    started = time.perf_counter()
    rows, provenance = [], []
    for position, dim in enumerate(args.dims):
        if args.checkpoint:
            checkpoint = args.checkpoint[position]
            provenance.append(f"d = {dim}: loaded `{checkpoint}`")
        else:
            checkpoint, train_args = train(
                dim, args.seed, args.epochs, limits[position], args.train_dir
            )
            provenance.append(f"d = {dim}: trained with `python -m recipes {' '.join(train_args)}`")
        head, x_cal, x_test, test_ppl = load_queries(
            dim, args.seed, checkpoint, args.calibration, args.test
        )
        rows += run_head(
            head,
            x_cal,
            x_test,
            seed=args.seed,
            tolerance=args.tolerance,
            batch_size=args.batch_size,
            extra={"test_ppl": test_ppl, "train_fraction": limits[position]},
        )
    seconds = time.perf_counter() - started
    summary = [
        f"- d = {r['d']}, delta = {r['delta']}: calibrated {r['cal_mean_gain']:.2f}x "
        f"({100 * r['cal_success_rate']:.1f}%), uncalibrated {r['uncal_mean_gain']:.2f}x "
        f"({100 * r['uncal_success_rate']:.1f}%)"
        for r in rows
    ]
    flags = sys.argv[1:] if argv is None else list(argv)
    if "--note" in flags:  # the note is quoted in full below; keep the command readable
        at = flags.index("--note")
        flags = flags[:at] + flags[at + 2 :]
    command = "benchmarks.adaptive_softmax_trained " + " ".join(map(str, flags))
    notes = "\n".join(
        [
            "The PTB LSTM recipe (lstm_ptb.yaml + heads/full.yaml: embedding d tied to the head "
            f"through a 128 -> d projection, n = 10000 words), {args.epochs} epoch(s), seed "
            f"{args.seed}, full softmax. Queries x: the head's inputs in eval mode; "
            f"{args.calibration} calibration queries drawn at random from the validation split, "
            f"{args.test} test queries from the test split (disjoint by construction). "
            f"AdaptiveSoftmax eps = {EPS}, k = 1; calibrated = Appendix C.4 bisection "
            f"(tolerance {args.tolerance} in log10) on the calibration queries; uncalibrated = "
            "factors 1 (the theoretical constants). Gain = n d / samples_used per query, "
            "averaged (mean_gain; gain_of_mean = n d / mean samples). Success = exact top-1 "
            "and its probability within 1 +- eps. The paper's Table 2, PTB, delta = 0.1 / 0.05 "
            f"/ 0.01: {PAPER_TABLE_2_PTB} (d = 768).",
            "",
            *summary,
            "",
            *[f"- {line}" for line in provenance],
            *([f"- {args.note}"] if args.note else []),
            f"- Reproduce: `.venv/bin/python -m {command.strip()}`; torch threads "
            f"{args.threads}; this evaluation took {seconds:.0f} s.",
        ]
    )
    write_results(
        "adaptive_softmax_trained" + ("_quick" if args.quick else ""),
        rows,
        title="AdaptiveSoftmax on the trained PTB LSTM head (Tables 1 and 2 of the paper)",
        notes=notes,
        columns=[
            "d",
            "delta",
            "cal_mean_gain",
            "cal_success_rate",
            "uncal_mean_gain",
            "uncal_success_rate",
            "cal_identified_rate",
            "bandit_scale",
            "norm_scale",
            "test_ppl",
            "train_fraction",
        ],
    )
    log(f"done in {seconds:.0f} s")


if __name__ == "__main__":
    main()
