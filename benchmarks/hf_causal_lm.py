"""A Hugging Face causal LM's own loss against our heads on its hidden states: peak memory and
time of one training step (forward and backward of the whole model and the loss).

The model is GPT-2 built from a config (``--layers`` layers, ``--dim`` wide, no weights
downloaded), fed ``--batch`` x ``--length`` tokens, at each vocabulary of ``--vocab``. Methods:

- ``hf``: ``model(input_ids, labels=labels).loss``: Hugging Face builds the ``[B, L, V]`` logits
  and their cross-entropy (fp32 upcast included);
- ``exact``: the README's "Hugging Face causal LMs" way: ``model.base_model``'s hidden states and
  ``FullSoftmaxHead`` tied to the output embeddings, chunked over the classes;
- ``sampled``: ``SampledSoftmaxHead`` with its defaults (100 uniform draws per position beside
  the batch's other targets) on the same hidden states;
- ``sampled_shared``: the same with ``shared_negatives=True`` (one draw of 100 for the batch).

Each (vocabulary, method) runs in a fresh process (a process' peak resident set cannot be reset
below what it once held): the model and the batch are built, one step warms up, then the peak
RSS growth of one step over what the process held before it is measured
(:func:`benchmarks.common.peak_extra_bytes`) and the median time of ``--repeats`` steps, on
``--threads`` threads. Ratios are to ``hf`` at the same vocabulary.

Run: ``python -m benchmarks.hf_causal_lm [--vocab 50257 256000] [--methods hf exact sampled
sampled_shared] [--threads 1] [--repeats 3] [--background TEXT]``; results in
``benchmarks/results/hf_causal_lm.{csv,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from .common import (
    add_background_argument,
    load_average,
    load_header,
    median_time,
    peak_extra_bytes,
    write_results,
)

METHODS = ("hf", "exact", "sampled", "sampled_shared")
ROOT = Path(__file__).resolve().parents[1]


def step_fn(method: str, vocab: int, args: argparse.Namespace):
    """The model, and one training step of ``method`` on a fixed batch (zeroing the gradients)."""
    import transformers

    from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=args.length, n_embd=args.dim, n_layer=args.layers,
        n_head=max(1, args.dim // 64),
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.randint(vocab, (args.batch, args.length))
    out = model.get_output_embeddings()
    heads = {
        "exact": lambda: FullSoftmaxHead(vocab, args.dim, weight=out.weight),
        "sampled": lambda: SampledSoftmaxHead(vocab, args.dim, weight=out.weight),
        "sampled_shared": lambda: SampledSoftmaxHead(
            vocab, args.dim, weight=out.weight, shared_negatives=True
        ),
    }
    head = heads[method]() if method in heads else None

    def step() -> None:
        if head is None:
            loss = model(input_ids=ids, labels=ids).loss
        else:
            hidden = model.base_model(input_ids=ids).last_hidden_state
            loss = head(hidden[:, :-1], ids[:, 1:])
        loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def measure_one(method: str, vocab: int, args: argparse.Namespace) -> dict[str, float]:
    """This process' measurement of one (method, vocabulary)."""
    torch.set_num_threads(args.threads)
    step = step_fn(method, vocab, args)
    step()  # warm-up: allocator pools, lazy module state
    peak = peak_extra_bytes(step, "cpu")
    seconds, _ = median_time(step, repeats=args.repeats, warmup=0)
    return {"peak_mb": peak / 2**20, "seconds": seconds}


def run_in_fresh_process(method: str, vocab: int, args: argparse.Namespace) -> dict[str, float]:
    """:func:`measure_one` in a new interpreter (its own peak resident set)."""
    argv = [sys.executable, "-m", "benchmarks.hf_causal_lm", "--one", method, str(vocab)]
    argv += ["--threads", str(args.threads), "--repeats", str(args.repeats)]
    argv += ["--batch", str(args.batch), "--length", str(args.length)]
    argv += ["--dim", str(args.dim), "--layers", str(args.layers)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{method} at V = {vocab} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[50_257, 256_000])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default="hf_causal_lm")
    parser.add_argument("--one", nargs=2, metavar=("METHOD", "VOCAB"), help=argparse.SUPPRESS)
    add_background_argument(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), args)))
        return []
    load_start = load_average()
    rows = []
    for vocab in args.vocab:
        measured = {m: run_in_fresh_process(m, vocab, args) for m in args.methods}
        for method, m in measured.items():
            base = measured.get("hf")
            rows.append(
                {
                    "vocab": vocab,
                    "method": method,
                    "peak_mb": m["peak_mb"],
                    "seconds": m["seconds"],
                    "memory_vs_hf": m["peak_mb"] / base["peak_mb"] if base else "",
                    "time_vs_hf": m["seconds"] / base["seconds"] if base else "",
                }
            )
            print(rows[-1], flush=True)
    shape = (
        f"GPT-2 from a config, {args.layers} layers, D = {args.dim}, {args.batch} x {args.length} "
        f"tokens, {args.threads} thread(s), median of {args.repeats} steps"
    )
    write_results(
        args.name,
        rows,
        title="Hugging Face causal LM: its own loss against our heads on its hidden states",
        header=f"{shape}.\n\n{load_header(load_start, load_average(), args.background)}",
        notes=(
            "peak_mb: peak resident-set growth of one training step (forward and backward of the "
            "whole model and the loss) over what the process held before it, each (vocab, "
            "method) in a fresh process. Command: `python -m benchmarks.hf_causal_lm "
            f"--vocab {' '.join(map(str, args.vocab))} --threads {args.threads} --repeats "
            f"{args.repeats}`."
        ),
    )
    return rows


if __name__ == "__main__":
    main()
