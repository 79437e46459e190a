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
below what it once held): the model and the batch are built; the loss alone on fixed hidden
states is warmed up and its peak RSS growth measured (``loss_peak_mb``), then the whole step's
(``peak_mb``) (:func:`benchmarks.common.peak_extra_bytes`, over what the process held before
each), and the median time of ``--repeats`` whole steps, on ``--threads`` threads. Ratios are to
``hf`` at the same vocabulary.

Run: ``python -m benchmarks.hf_causal_lm [--vocab 50257 256000] [--methods hf exact sampled
sampled_shared] [--threads 1] [--repeats 3] [--background TEXT]``; results in
``benchmarks/results/hf_causal_lm.{csv,md}``.
"""

from __future__ import annotations

import argparse

import torch

from .common import (
    add_background_argument,
    add_threads_argument,
    in_fresh_process,
    make_parser,
    measured_load,
    median_time,
    peak_extra_bytes,
    set_threads,
    write_results,
)

METHODS = ("hf", "exact", "sampled", "sampled_shared")


def step_fns(method: str, vocab: int, args: argparse.Namespace):
    """Two training steps of ``method`` on a fixed batch (each zeroing the gradients): the whole
    model's, and the loss alone on fixed hidden states (a leaf ``[B, L, D]`` that takes a
    gradient: Hugging Face's ``lm_head`` and ``loss_function``, or our head)."""
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
    with torch.no_grad():
        fixed = model.base_model(input_ids=ids).last_hidden_state
    fixed.requires_grad_(True)

    def loss_of(hidden: torch.Tensor) -> torch.Tensor:
        if head is None:
            return model.loss_function(out(hidden), ids, vocab_size=vocab)
        return head(hidden[:, :-1], ids[:, 1:])

    def step() -> None:
        if head is None:
            loss = model(input_ids=ids, labels=ids).loss
        else:
            loss = loss_of(model.base_model(input_ids=ids).last_hidden_state)
        loss.backward()
        model.zero_grad(set_to_none=True)

    def loss_step() -> None:
        loss_of(fixed).backward()
        model.zero_grad(set_to_none=True)
        fixed.grad = None

    return step, loss_step


def measure_one(method: str, vocab: int, args: argparse.Namespace) -> dict[str, float]:
    """This process' measurement of one (method, vocabulary): the loss alone, then the whole
    step (each peak measured from a reset of the process' peak resident set)."""
    set_threads(args.threads)
    step, loss_step = step_fns(method, vocab, args)
    loss_step()  # warm-up: allocator pools, lazy module state
    loss_peak = peak_extra_bytes(loss_step, "cpu")
    step()
    peak = peak_extra_bytes(step, "cpu")
    seconds, _ = median_time(step, repeats=args.repeats, warmup=0)
    return {"peak_mb": peak / 2**20, "loss_peak_mb": loss_peak / 2**20, "seconds": seconds}


def run_in_fresh_process(method: str, vocab: int, args: argparse.Namespace) -> dict[str, float]:
    """:func:`measure_one` in a new interpreter (:func:`benchmarks.common.in_fresh_process`: its
    own peak resident set), glibc's mmap threshold lowered so that large frees go back to the
    kernel, and the Hugging Face hub offline."""
    env = {"MALLOC_MMAP_THRESHOLD_": "131072", "HF_HUB_OFFLINE": "1"}
    return in_fresh_process("benchmarks.hf_causal_lm", "measure_one", method, vocab, args, env=env)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser(__doc__)
    parser.add_argument("--vocab", type=int, nargs="+", default=[50_257, 256_000])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    add_threads_argument(parser)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default="hf_causal_lm")
    add_background_argument(parser)
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> list[dict]:
    """One row per (vocabulary, method): peak memory and step time, each measured in a fresh
    process, and their ratios to Hugging Face's own loss."""
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
                    "loss_peak_mb": m["loss_peak_mb"],
                    "seconds": m["seconds"],
                    "memory_vs_hf": m["peak_mb"] / base["peak_mb"] if base else "",
                    "loss_memory_vs_hf": m["loss_peak_mb"] / base["loss_peak_mb"] if base else "",
                    "time_vs_hf": m["seconds"] / base["seconds"] if base else "",
                }
            )
            print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    with measured_load(args.background) as load:
        rows = measure(args)
    shape = (
        f"GPT-2 from a config, {args.layers} layers, D = {args.dim}, {args.batch} x {args.length} "
        f"tokens, {args.threads} thread(s), median of {args.repeats} steps"
    )
    write_results(
        args.name,
        rows,
        title="Hugging Face causal LM: its own loss against our heads on its hidden states",
        header=f"{shape}.\n\n{load.header}",
        notes=(
            "peak_mb: peak resident-set growth of one training step (forward and backward of the "
            "whole model and the loss) over what the process held before it; loss_peak_mb: the "
            "same of the loss alone (forward and backward) on fixed hidden states that take a "
            "gradient (Hugging Face's lm_head and loss_function, or our head); each (vocab, "
            "method) in a fresh process. Command: `python -m benchmarks.hf_causal_lm "
            f"--vocab {' '.join(map(str, args.vocab))} --threads {args.threads} --repeats "
            f"{args.repeats}`."
        ),
    )
    return rows


if __name__ == "__main__":
    main()
