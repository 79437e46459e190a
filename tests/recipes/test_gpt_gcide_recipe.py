"""The GPT recipe on GCIDE in byte-level BPE tokens (``recipes.GCIDEBPE``,
``recipes.GPTLanguageModel``, ``configs/gpt_gcide.yaml``) on a small hand-made dictd database:
the tokenizer sees the training split only and reaches its vocabulary, encodes losslessly, is
cached; the model's exact loss is a plain tied GPT-2's; the recipe fits with both heads."""

import gzip
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from recipes.compare import CONFIGS
from recipes.data import GCIDEBPE
from recipes.data import gcide_bpe as bpe_module
from recipes.data.gcide import split_entries, split_of, to_b64
from recipes.data.gcide_bpe import EOT
from recipes.models import GPTLanguageModel

VOCAB = 300
#: written only into validation / test entries: no merge of the tokenizer may hold them
HELD_OUT = {"validation": "QXQXQXQX", "test": "JKJKJKJK"}


@pytest.fixture
def source(tmp_path):
    """A dictd database of 60 training entries (lower-case words of a 200-word pool) and 4
    validation and 4 test entries, each repeating its split's held-out marker."""
    rng = random.Random(0)
    pool = ["".join(rng.choices("abcdefghijklmnop", k=rng.randint(3, 9))) for _ in range(200)]
    counts = {"train": 60, "validation": 4, "test": 4}
    text, index, i = b"header: skip me\n", ["00-database-info\tA\tK"], 0
    while any(counts.values()):
        head, i = f"Word{i}", i + 1
        split = split_of(head)
        if not counts[split]:
            continue
        counts[split] -= 1
        words = rng.choices(pool, k=40)
        if split != "train":
            words = [HELD_OUT[split]] * 10 + words
        body = f'{head} \\Word"{i}\\, n. [1913 Webster]\n   {" ".join(words)}.\n'.encode()
        index.append(f"{head}\t{to_b64(len(text))}\t{to_b64(len(body))}")
        text += body + b"\n"
    folder = tmp_path / "dictd"
    folder.mkdir()
    (folder / "gcide.index").write_text("\n".join(sorted(index)) + "\n")
    with gzip.open(folder / "gcide.dict.dz", "wb") as f:
        f.write(text)
    return folder


def make(source, tmp_path, **kwargs) -> GCIDEBPE:
    kwargs.setdefault("vocab_size", VOCAB)
    return GCIDEBPE(source_dir=str(source), cache_dir=str(tmp_path / "cache"), **kwargs)


def test_tokenizer_is_trained_on_the_training_split_to_its_vocabulary(source, tmp_path):
    data = make(source, tmp_path)
    assert data.num_classes == VOCAB == len(data.words)
    vocab = data.tokenizer.get_vocab()
    for marker in HELD_OUT.values():  # 10 times in each held-out entry: merged if seen
        assert not any(marker[:2] in token for token in vocab), marker
        assert len(data.encode(marker)) == len(marker)
    assert any(len(token) > 4 for token in vocab)  # the training words were merged
    texts = split_entries(source)
    eot = data.tokenizer.token_to_id(EOT)
    for split in ("train", "validation", "test"):  # whole entries in hash order, <eot> after each
        want = [x for text in texts[split] for x in [*data.encode(text), eot]]
        assert data.stream(split).tolist() == want
    # the slice: max_entries keeps the first entries of each split, before training
    small = make(source, tmp_path, max_entries=2)
    eot = small.tokenizer.token_to_id(EOT)
    for split in ("train", "validation"):
        want = [x for text in texts[split][:2] for x in [*small.encode(text), eot]]
        assert small.stream(split).tolist() == want


def test_encoding_round_trips_any_text(source, tmp_path):
    data = make(source, tmp_path)
    for text in ["Don't \\An*nel\"i*dous\\, 1913 Webster]\n  x", "ünïcödé — ☃ naïve\ttabs"]:
        ids = data.encode(text)
        assert max(ids) < data.num_classes
        assert data.decode(ids) == text


def test_cache_is_reused_without_training_again(source, tmp_path, monkeypatch):
    first = make(source, tmp_path)
    monkeypatch.setattr(bpe_module, "train_tokenizer", lambda *a: pytest.fail("trained again"))
    second = make(source, tmp_path)
    assert second.tokenizer.to_str() == first.tokenizer.to_str()
    assert np.array_equal(second.ids["train"], first.ids["train"])
    assert isinstance(second.ids["train"], np.memmap)
    with pytest.raises(pytest.fail.Exception):  # another vocabulary is another cache entry
        make(source, tmp_path, vocab_size=VOCAB + 10)


def test_bad_arguments_are_clear(source, tmp_path):
    with pytest.raises(ValueError, match="vocab_size must be >= 258, got 100"):
        make(source, tmp_path, vocab_size=100)
    with pytest.raises(ValueError, match="seq_len must be >= 1"):
        make(source, tmp_path, seq_len=0)


def test_exact_loss_is_a_plain_tied_gpt2s(source, tmp_path):
    data = make(source, tmp_path, seq_len=16, batch_size=3)
    torch.manual_seed(0)
    model = GPTLanguageModel(data.num_classes, n_embd=32, n_head=2, n_positions=16)
    wte = model.transformer.wte.weight
    assert model.head.weight is wte
    batch = next(iter(data.train_dataloader()))
    assert batch["input"].shape == (3, 16)
    hidden = model.transformer(input_ids=batch["input"]).last_hidden_state
    reference = F.cross_entropy((hidden @ wte.T).flatten(0, 1), batch["target"].flatten())
    loss = model.head(model.encode(batch["input"]), batch["target"])  # the training loss
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-5)
    log_prob = model.evaluation_collectives(batch)  # what validation's perplexity averages
    torch.testing.assert_close(-log_prob.mean(), reference, rtol=1e-5, atol=1e-5)
    (grad,) = torch.autograd.grad(loss, wte)
    (want,) = torch.autograd.grad(reference, wte)
    torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="exceeds n_positions=16"):
        model.encode(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("head", ["full", "mixed"])
def test_recipe_fits_a_few_steps(source, tmp_path, head):
    from recipes.cli import main

    args = [
        "--config", str(CONFIGS / "gpt_gcide.yaml"),
        "--config", str(CONFIGS / "heads" / f"{head}.yaml"),
        f"--data.init_args.source_dir={source}",
        f"--data.init_args.cache_dir={tmp_path / 'cache'}",
        f"--data.init_args.vocab_size={VOCAB}",
        "--data.init_args.seq_len=8",
        "--data.init_args.batch_size=2",
        "--data.init_args.eval_batch_size=2",
        "--model.init_args.n_embd=16",
        "--model.init_args.n_head=2",
        "--model.init_args.n_positions=8",
        "--trainer.max_steps=3",
        "--trainer.val_check_interval=3",
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    ]  # fmt: skip
    if head != "full":
        args.append("--model.init_args.head.init_args.num_negatives=4")
    cli = main(args, run=False)
    assert cli.model.num_classes == VOCAB
    assert type(cli.model.head).__name__ == {"full": "FullSoftmaxHead"}.get(
        head, "SampledSoftmaxHead"
    )
    assert cli.model.head.weight is cli.model.transformer.wte.weight
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.trainer.global_step == 3
    assert 1 < float(cli.trainer.callback_metrics["val/ppl"]) < 10 * VOCAB
