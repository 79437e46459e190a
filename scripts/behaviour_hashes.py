"""Hashes of the sampled heads' losses, gradients and draws over a grid of settings.

A restructuring that must not change behaviour (issue 48) runs this before and after and compares
the two outputs line by line: every line is ``setting sha256`` of the bytes of the losses, the
query / table / bias gradients and the next draws of two training steps, on the whole table in
this process and on a table split across two gloo processes. Bit-identical or not at all: a
re-association of one sum changes the hash.

Run::

    python scripts/behaviour_hashes.py > before.txt     # then change the code
    python scripts/behaviour_hashes.py > after.txt && diff before.txt after.txt

A change meant to re-associate sums (a fused kernel, another block order) changes hashes; it
must keep the values close instead. ``--values FILE`` also saves the tensors behind every
whole-table line, and ``--close BEFORE AFTER`` prints, per line, the largest difference between
two such files relative to each tensor's largest magnitude, and which exceed ``--rtol``
(default ``1e-5``)::

    python scripts/behaviour_hashes.py --values before.pt > before.txt   # then change the code
    python scripts/behaviour_hashes.py --values after.pt > after.txt
    python scripts/behaviour_hashes.py --close before.pt after.pt
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import math
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_sampled import functional
from lightning_sampled.heads import SampledSoftmaxHead, TapasHead
from lightning_sampled.samplers import (
    DrawStream,
    LogUniformSampler,
    MIDXSampler,
    UniformSampler,
    UnigramSampler,
)

N, D, T = 41, 8, 13  # classes, width, positions (two of them ignored)
M = 6  # draws per query


#: where :func:`digest` keeps the tensors it hashes (``--values``), ``None``: nowhere
RECORDED: list[torch.Tensor] | None = None


def digest(*tensors: torch.Tensor | None) -> str:
    """sha256 (first 16 hex digits) of the tensors' bytes, ``None`` included as a marker."""
    h = hashlib.sha256()
    for t in tensors:
        if t is None:
            h.update(b"none")
        else:
            if RECORDED is not None:
                RECORDED.append(t.detach().cpu().clone())
            h.update(str(tuple(t.shape)).encode())
            h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def batch(seed: int, rows: int = T) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries ``[rows, D]`` and targets ``[rows]`` (Zipf-like: repeats), two ignored."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, D, generator=g)
    y = (torch.rand(rows, generator=g) ** 3 * N).long().clamp(max=N - 1)
    y[y == 4] = 5  # class 4 is the padding class of some settings
    y[1] = -100
    y[-2] = -100
    return z, y


def sampler_of(name: str, padding_idx: int | None) -> object:
    if name == "uniform":
        return UniformSampler(N, padding_idx=padding_idx)
    if name == "unigram":
        counts = torch.arange(N).double() % 7 + 1
        return UnigramSampler(counts, alpha=0.75, padding_idx=padding_idx)
    if name == "log_uniform":
        return LogUniformSampler(N, padding_idx=padding_idx)
    return MIDXSampler(N, codebook_size=3, quantizer="rq", dim=D, padding_idx=padding_idx)


def fill(head: torch.nn.Module) -> None:
    """The same table (and bias) for every head, whatever rows it holds."""
    g = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(N, D, generator=g) * 0.7, torch.randn(N, generator=g) * 0.3
    with torch.no_grad():
        ids = head.shard_ids
        head.weight.copy_(weight[ids])
        if head.bias is not None:
            head.bias.copy_(bias[ids])
    if hasattr(head, "refresh_index"):
        head.refresh_index()


def steps(head: torch.nn.Module, call: Callable, seeds: tuple[int, ...] = (10, 11)) -> str:
    """Two training steps of ``call(head, z, y)``: losses and gradients of each, hashed."""
    torch.manual_seed(0)
    if hasattr(head, "sampler"):
        head.sampler.draw_stream = DrawStream(3)
    parts = []
    for seed in seeds:
        z, y = batch(seed)
        z.requires_grad_(True)
        head.zero_grad(set_to_none=True)
        loss = call(head, z, y)
        loss.sum().backward()
        grad_w = head.weight.grad
        grad_w = grad_w.to_dense() if grad_w is not None and grad_w.is_sparse else grad_w
        bias_grad = None if head.bias is None else head.bias.grad
        parts.append(digest(loss, z.grad, grad_w, bias_grad))
    return hashlib.sha256(" ".join(parts).encode()).hexdigest()[:16]


def sampled_settings() -> Iterator[tuple[str, dict]]:
    """The sampled head's settings: proposal x convention x negatives' sources x options."""
    conventions = ("corrected_all", "exact_positive", "tensorflow")
    for proposal, convention in itertools.product(
        ("uniform", "unigram", "log_uniform", "midx"), conventions
    ):
        base = dict(sampler=proposal, convention=convention)
        yield f"{proposal}/{convention}/plain", dict(base, in_batch_negatives=False)
        yield f"{proposal}/{convention}/default", dict(base)
        yield f"{proposal}/{convention}/limited", dict(base, max_in_batch_draws=4)
        yield (
            f"{proposal}/{convention}/sorted_bias_padding",
            dict(base, in_batch_candidates="sorted", bias=True, padding_idx=4),
        )
        if proposal != "midx":
            yield f"{proposal}/{convention}/shared", dict(base, shared_negatives=True)
            yield (
                f"{proposal}/{convention}/shared_plain_padding",
                dict(base, shared_negatives=True, in_batch_negatives=False, padding_idx=4),
            )
    for convention in conventions:
        yield (
            f"in_batch_only/{convention}",
            dict(sampler="uniform", convention=convention, num_negatives=0),
        )
        yield (
            f"in_batch_only_limited/{convention}",
            dict(sampler="uniform", convention=convention, num_negatives=0, max_in_batch_draws=3),
        )
        yield (
            f"fixed_counts/{convention}",
            dict(
                sampler="unigram", convention=convention, target_counts=torch.arange(N).float() % 3
            ),
        )


def sampled_head(options: dict, sharded: bool = False) -> SampledSoftmaxHead:
    options = dict(options)
    sampler = sampler_of(options.pop("sampler"), options.get("padding_idx"))
    head = SampledSoftmaxHead(
        N, D, sampler, options.pop("num_negatives", M), sharded=sharded, **options
    )
    fill(head)
    return head


def whole_table_lines() -> Iterator[str]:
    """Every setting on the whole table: forward, ``reduction="none"`` with weights, the
    static-shape path (a mask over stand-in targets), eval mode."""
    weights = torch.linspace(0.5, 1.5, T)
    for name, options in sampled_settings():
        head = sampled_head(options)
        yield f"{name}/forward {steps(head, lambda h, z, y: h(z, y))}"
        head = sampled_head(options)
        yield f"{name}/none_weighted " + steps(
            head, lambda h, z, y: h(z, y, weights, reduction="none")
        )
        head = sampled_head(options)

        def static(h, z, y):
            mask = y != -100
            return h.sampled_losses(h.score_queries(z), y.where(mask, 0), mask)

        yield f"{name}/static_mask {steps(head, static)}"
        head = sampled_head(options).eval()
        yield f"{name}/eval {steps(head, lambda h, z, y: h(z, y))}"
    yield from given_lines()
    yield from tapas_lines()
    yield from functional_lines()


def given_lines() -> Iterator[str]:
    """``negatives=`` (the caller's own) and ``positives=`` (several positives)."""
    g = torch.Generator().manual_seed(5)
    negatives = torch.randint(N, (T, 5), generator=g)
    log_q = torch.rand(T, 5, generator=g).log() - 3
    target_log_q = torch.rand(T, generator=g).log() - 3
    for convention, hard in itertools.product(
        ("corrected_all", "exact_positive", "tensorflow"), (None, 3)
    ):
        head = sampled_head(dict(sampler="uniform", convention=convention))
        tq = None if convention == "exact_positive" else target_log_q
        yield f"given/{convention}/hard{hard} " + steps(
            head,
            lambda h, z, y, tq=tq, hard=hard: h(
                z,
                y,
                negatives=negatives,
                negative_log_q=log_q,
                target_log_q=tq,
                num_hard_negatives=hard,
            ),  # fmt: skip
        )
    for convention, form in itertools.product(
        ("corrected_all", "exact_positive", "tensorflow"), ("each", "soft_labels")
    ):
        head = sampled_head(dict(sampler="unigram", convention=convention))

        def several(h, z, y, form=form):
            y2 = torch.stack([y, (y + 3) % N], dim=1).where(y[:, None] >= 0, -100)
            return h(z, y2, positives=form)

        yield f"positives/{convention}/{form} {steps(head, several)}"


def tapas_lines() -> Iterator[str]:
    for convention in ("uncorrected", "exact_positive", "corrected_all", "uncorrected_with_hits"):
        head = TapasHead(N, D, num_negatives=8, presample_factor=2.0, convention=convention)
        fill(head)
        yield f"tapas/{convention} {steps(head, lambda h, z, y: h(z, y))}"


def functional_lines() -> Iterator[str]:
    g = torch.Generator().manual_seed(6)
    weight = torch.randn(N, D, generator=g)
    z, y = batch(12)
    y = y.clamp(min=0)
    ids = torch.randint(N, (T, 5), generator=g)
    log_q = torch.full((T, 5), -math.log(N))
    for convention in ("corrected_all", "exact_positive", "tensorflow"):
        zz, ww = z.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        loss = functional.sampled_softmax_loss(
            zz, ww, y, ids, log_q, target_log_q=torch.full((T,), -math.log(N)),
            convention=convention, reduction="none",
        )  # fmt: skip
        loss.sum().backward()
        yield f"functional/{convention} {digest(loss, zz.grad, ww.grad)}"


def split_cases() -> Iterator[tuple[str, dict]]:
    for proposal, convention in itertools.product(
        ("uniform", "log_uniform", "midx"), ("corrected_all", "exact_positive", "tensorflow")
    ):
        base = dict(sampler=proposal, convention=convention, bias=True)
        yield f"split/{proposal}/{convention}/plain", dict(base, in_batch_negatives=False)
        yield f"split/{proposal}/{convention}/default", dict(base)
        yield f"split/{proposal}/{convention}/limited", dict(base, max_in_batch_draws=5)
        if proposal != "midx":
            yield (
                f"split/{proposal}/{convention}/shared_padding",
                dict(base, shared_negatives=True, padding_idx=4),
            )
    yield "split/in_batch_only", dict(sampler="uniform", num_negatives=0)


def split_worker(rank: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        lines = []
        for name, options in split_cases():
            head = sampled_head(options, sharded=True)
            seeds = (20 + rank, 30 + rank)
            lines.append(f"{name}/rank{rank} {steps(head, lambda h, z, y: h(z, y), seeds)}")
        Path(f"{out}{rank}.txt").write_text("\n".join(lines) + "\n")
    finally:
        dist.destroy_process_group()


def split_table_lines() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/rank"
        mp.spawn(split_worker, args=(f"{tmp}/init", out), nprocs=2, join=True)
        return [line for r in range(2) for line in Path(f"{out}{r}.txt").read_text().split("\n")]


def close(before: str, after: str, rtol: float) -> int:
    """Prints each line's largest difference between two ``--values`` files, relative to each
    tensor's largest magnitude; returns how many lines exceed ``rtol`` or differ in shape."""
    old, new = torch.load(before), torch.load(after)
    failed = 0
    for name in old.keys() | new.keys():
        pairs = list(zip(old.get(name, []), new.get(name, []), strict=False))
        same = name in old and name in new and len(old[name]) == len(new[name])
        worst = 0.0
        for a, b in pairs:
            same = same and a.shape == b.shape
            if same and a.numel():
                scale = max(a.abs().max().item(), 1e-30)
                worst = max(worst, ((a - b).abs().max() / scale).item())
        bad = not same or not worst <= rtol  # a NaN difference is bad too
        failed += bad
        print(f"{name} {'shape differs' if not same else f'{worst:.2e}'}{' FAIL' if bad else ''}")
    print(f"{failed} of {len(old.keys() | new.keys())} lines beyond rtol {rtol:g}")
    return failed


def main() -> None:
    global RECORDED
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--values", help="also save the whole-table lines' tensors here")
    parser.add_argument("--close", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--rtol", type=float, default=1e-5)
    args = parser.parse_args()
    if args.close:
        sys.exit(1 if close(*args.close, args.rtol) else 0)
    torch.set_num_threads(1)
    values = {}
    RECORDED = [] if args.values else None
    for line in whole_table_lines():
        print(line)
        if RECORDED is not None:
            values[line.split(" ")[0]], RECORDED = RECORDED, []
    if args.values:
        torch.save(values, args.values)
    sys.stdout.flush()
    for line in split_table_lines():
        if line:
            print(line)


if __name__ == "__main__":
    main()
