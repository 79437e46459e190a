"""The README's Hugging Face example ("Hugging Face causal LMs"), run as written on a GPT-2
built from a config (no weights downloaded): its loss and gradients are Hugging Face's own, in
fp32 and under bf16 autocast, and its gradient accumulation is Hugging Face's
``num_items_in_batch`` normalisation."""

import copy
import re
from pathlib import Path

import lightning as L
import pytest
import torch
import transformers
from torch.utils.data import DataLoader, Dataset

README = Path(__file__).resolve().parents[1] / "README.md"
VOCAB, WIDTH = 1000, 32


def example() -> dict:
    """The names the README's example defines (``CausalLM``, ``fit``)."""
    section = README.read_text().split("## Hugging Face causal LMs", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 (the README's own code)
    return namespace


def config():
    """A 2-layer GPT-2 without dropout, so that two forwards of the same batch agree."""
    return transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=WIDTH, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip


def batch(seed: int, ignored: int = 3, size: tuple[int, int] = (2, 16)) -> dict:
    """Token ids and labels (the ids, ``-100`` at ``ignored`` positions of the first row)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(VOCAB, size, generator=g)
    labels = ids.clone()
    labels[0, 1 : 1 + ignored] = -100
    return {"input_ids": ids, "labels": labels}


def ours_and_theirs(module, data: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The example's exact loss (its validation form) and Hugging Face's own on ``data``."""
    z = module.hidden(data)[:, :-1]
    ours = module.head.full_loss(z, data["labels"][:, 1:])
    theirs = module.model(input_ids=data["input_ids"], labels=data["labels"]).loss
    return ours, theirs


def grads(module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.model.named_parameters() if p.grad is not None}


def test_the_loss_and_gradients_are_hugging_faces_in_fp32():
    torch.manual_seed(0)
    module = example()["CausalLM"](config())
    assert module.head.weight is module.model.get_input_embeddings().weight  # tied, as GPT-2
    data = batch(1)
    ours, theirs = ours_and_theirs(module, data)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    ours.backward()
    want = grads(module)
    module.zero_grad()
    theirs.backward()
    got = grads(module)
    assert want.keys() == got.keys() and len(want) > 10
    for name in want:
        torch.testing.assert_close(want[name], got[name], rtol=1e-5, atol=1e-5, msg=name)
    # the training step's summed form, over the tokens scored, is the same mean
    z, labels = module.hidden(data)[:, :-1], data["labels"][:, 1:]
    summed = module.head(z, labels, reduction="sum") / (labels != -100).sum()
    torch.testing.assert_close(summed, theirs, rtol=1e-5, atol=1e-5)


def test_under_bf16_the_loss_is_no_further_from_fp32_than_hugging_faces():
    torch.manual_seed(0)
    module = example()["CausalLM"](config())
    data = batch(2, size=(4, 32))
    with torch.no_grad():
        reference, _ = ours_and_theirs(module, data)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours, theirs = ours_and_theirs(module, data)
    assert ours.dtype == torch.float32
    # both about 3.5e-5 from fp32 here; a bf16 log-sum-exp would be some 1e-2 away
    assert abs(float(ours) - float(reference)) <= 1.5 * abs(float(theirs) - float(reference)) + 1e-6


class Batches(Dataset):
    """Four micro-batches, each with another number of ignored tokens."""

    def __init__(self) -> None:
        self.batches = [batch(10 + i, ignored=i * 5) for i in range(4)]

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict:
        return self.batches[i]


class GradientsAtStep(L.Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads = grads(pl_module)


def test_accumulated_gradients_are_hugging_faces_num_items_in_batch_normalisation():
    """One optimizer step over 4 micro-batches with 0, 5, 10 and 15 ignored tokens through the
    example's ``fit``: the gradients equal Hugging Face's with ``num_items_in_batch`` (the
    window's 110 scored tokens), and differ from the mean of the micro-batches' means, which
    Lightning's own accumulation of a mean loss would give."""
    ns = example()
    torch.manual_seed(0)
    module = ns["CausalLM"](config())
    reference = copy.deepcopy(module.model)
    seen = GradientsAtStep()
    loader = DataLoader(Batches(), batch_size=None)
    ns["fit"](
        module, loader, accumulate=4, max_steps=1, accelerator="cpu", logger=False,
        callbacks=[seen], enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    window = Batches().batches
    total = sum((b["labels"][:, 1:] != -100).sum() for b in window)
    assert int(total) == 4 * 2 * 15 - (0 + 5 + 10 + 15)
    for b in window:
        reference(input_ids=b["input_ids"], labels=b["labels"], num_items_in_batch=total)[
            "loss"
        ].backward()
    want = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    assert seen.grads.keys() == want.keys()
    for name, grad in want.items():
        torch.testing.assert_close(seen.grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    reference.zero_grad()
    for b in window:  # Lightning's accumulation of each micro-batch's mean: not the same
        (reference(input_ids=b["input_ids"], labels=b["labels"]).loss / 4).backward()
    wte = "transformer.wte.weight"
    assert not torch.allclose(seen.grads[wte], reference.get_parameter(wte).grad, rtol=1e-3)


def test_window_token_counts_stamps_each_window_and_the_short_last_one():
    from lightning_sampled.accumulation import WindowTokenCounts

    batches = [batch(i, ignored=i) for i in range(5)]
    counts = [int((b["labels"][:, 1:] != -100).sum()) for b in batches]
    stamped = list(WindowTokenCounts(batches, 2))
    assert [int(b["num_items_in_batch"]) for b in stamped] == [
        counts[0] + counts[1], counts[0] + counts[1], counts[2] + counts[3],
        counts[2] + counts[3], counts[4],
    ]  # fmt: skip
    assert all(torch.equal(s["labels"], b["labels"]) for s, b in zip(stamped, batches, strict=True))
    unshifted = list(WindowTokenCounts(batches[:1], 1, shift=False))
    assert int(unshifted[0]["num_items_in_batch"]) == int((batches[0]["labels"] != -100).sum())
    assert len(WindowTokenCounts(batches, 3)) == 5
    with pytest.raises(ValueError, match="accumulate_grad_batches must be a positive integer"):
        WindowTokenCounts(batches, 0)
    with pytest.raises(ValueError, match="holding 'labels'"):
        list(WindowTokenCounts([{"input_ids": batches[0]["input_ids"]}], 1))
