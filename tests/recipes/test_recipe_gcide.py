"""``recipes.GCIDE`` on a small hand-made dictd database: tokens, vocabulary, split, cache and
errors; the real corpus only when it is already in the cache."""

import gzip
import subprocess
from collections import Counter

import numpy as np
import pytest
import torch

from recipes.compare import CONFIGS
from recipes.data import GCIDE
from recipes.data import gcide as gcide_module
from recipes.data.base import default_cache_dir
from recipes.data.gcide import EOS, UNK, entry_hash, split_of, tokenize

REAL_CACHE = default_cache_dir()  # read at import, before the fixture points it at tmp_path
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def b64(value: int) -> str:
    digits = ""
    while True:
        value, rest = divmod(value, 64)
        digits = B64[rest] + digits
        if value == 0:
            return digits


def headwords_by_split(count: int) -> dict[str, list[str]]:
    """``count`` headwords of each split (found by trying names in order)."""
    found: dict[str, list[str]] = {"train": [], "validation": [], "test": []}
    i = 0
    while any(len(v) < count for v in found.values()):
        name = f"Word{i}"
        if len(found[split_of(name)]) < count:
            found[split_of(name)].append(name)
        i += 1
    return found


def entry_text(headword: str, i: int) -> str:
    # shared words (the, of, a ...) repeat across entries; "uniq<i>" is seen once
    return f"{headword} \\Word\"{i}\\, n. [1913 Webster]\n   The Part of a word; Don't uniq{i}.\n"


@pytest.fixture
def source(tmp_path):
    """A dictd database of 3 train + 2 validation + 2 test entries (and the database header),
    one entry named by two headwords; returns ``(folder, {headword: split})``."""
    names = headwords_by_split(3)
    heads = names["train"] + names["validation"][:2] + names["test"][:2]
    text, index = b"", ["00-database-info\tA\tK"]
    text += b"header: skip me\n"
    for i, head in enumerate(heads):
        body = entry_text(head, i).encode()
        index.append(f"{head}\t{b64(len(text))}\t{b64(len(body))}")
        if i == 0:  # a second headword of the same entry
            index.append(f"zz-alias\t{b64(len(text))}\t{b64(len(body))}")
        text += body + b"\n"
    folder = tmp_path / "dictd"
    folder.mkdir()
    (folder / "gcide.index").write_text("\n".join(sorted(index)) + "\n")
    with gzip.open(folder / "gcide.dict.dz", "wb") as f:
        f.write(text)
    return folder, {head: (split_of(head), i) for i, head in enumerate(heads)}


def make(source, tmp_path, **kwargs):
    return GCIDE(source_dir=str(source[0]), cache_dir=str(tmp_path / "cache"), **kwargs)


def test_tokenize_lowercases_words_and_punctuation():
    assert tokenize('Don\'t \\An*nel"i*dous\\, 1913 Webster]') == [
        "don't", "\\", "an", "*", "nel", '"', "i", "*", "dous", "\\", ",", "1913", "webster", "]"
    ]  # fmt: skip


def test_split_by_entry_and_vocabulary(source, tmp_path):
    data = make(source, tmp_path, min_count=1)
    words = data.words
    splits = {name: [words[i] for i in data.stream(name).tolist()] for name in data.ids}
    for name, tokens in splits.items():  # whole entries, each followed by <eos>, hash order
        entries = sorted(
            (entry_hash(head) // 100, head, i)
            for head, (split, i) in source[1].items()
            if split == name
        )
        expected = [w for _, h, i in entries for w in [*tokenize(entry_text(h, i)), EOS]]
        assert tokens == [w if w in words else UNK for w in expected]
        assert tokens.count(EOS) == len(entries) > 0
    assert "header" not in words and "zz" not in words
    train = Counter(splits["train"])
    counts = data.class_counts
    assert counts == sorted(counts, reverse=True) and counts[0] == max(train.values())
    assert counts == [train[w] for w in words]
    assert data.num_classes == len(train) + (UNK not in train)  # min_count=1: <unk> never used


def test_min_count_maps_rare_words_to_unk(source, tmp_path):
    data = make(source, tmp_path, min_count=2)
    train = [data.words[i] for i in data.stream("train").tolist()]
    assert not any(w.startswith("uniq") for w in data.words)  # each seen once
    # once-seen words of the 3 train entries: the headword "word<k>", the digits "<i>", "uniq<i>"
    assert train.count(UNK) == 3 * 3
    assert "the" in data.words and "don't" in data.words
    counts = data.class_counts
    assert counts == sorted(counts, reverse=True)  # <unk> sorted by the words it stands for
    valid = [data.words[i] for i in data.stream("validation").tolist()]
    assert valid.count(UNK) >= 2  # unseen words of other splits are <unk> too


def test_windows_and_token_limits(source, tmp_path):
    data = make(source, tmp_path, bptt=4, batch_size=2, eval_batch_size=1, max_eval_tokens=9)
    batch = next(iter(data.train_dataloader()))
    assert batch["input"].shape == (2, 4) and batch["input"].dtype == torch.long
    assert torch.equal(batch["input"][:, 1:], batch["target"][:, :-1])
    assert data.stream("validation").numel() == 9 and data.stream("train").numel() > 9
    assert make(source, tmp_path, max_tokens=5).stream("train").numel() == 5


def test_cache_is_reused_without_tokenising(source, tmp_path, monkeypatch):
    first = make(source, tmp_path)
    monkeypatch.setattr(gcide_module, "build", lambda *a: pytest.fail("tokenised again"))
    second = make(source, tmp_path)
    assert second.words == first.words
    assert np.array_equal(second.ids["train"], first.ids["train"])
    assert isinstance(second.ids["train"], np.memmap)
    with pytest.raises(pytest.fail.Exception):  # another min_count is another cache entry
        make(source, tmp_path, min_count=3)


def test_bad_arguments_are_clear(source, tmp_path):
    with pytest.raises(ValueError, match="min_count must be >= 1, got 0"):
        make(source, tmp_path, min_count=0)
    with pytest.raises(ValueError, match="bptt must be >= 1"):
        make(source, tmp_path, bptt=0)
    with pytest.raises(FileNotFoundError, match="recipes.data.gcide --fetch"):
        GCIDE(source_dir=str(tmp_path / "nowhere"), cache_dir=str(tmp_path / "cache"))


def test_missing_tools_name_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(gcide_module.shutil, "which", lambda tool: None)
    with pytest.raises(FileNotFoundError, match="apt-get download dict-gcide.*dpkg-deb -x"):
        GCIDE(cache_dir=str(tmp_path / "cache"))


def test_failed_download_says_what_to_run(tmp_path, monkeypatch):
    def fail(command, **kwargs):
        raise subprocess.CalledProcessError(100, command, stderr="E: Unable to locate package")

    monkeypatch.setattr(gcide_module.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(gcide_module.subprocess, "run", fail)
    with pytest.raises(RuntimeError, match="Unable to locate.*run `apt-get update`"):
        GCIDE(cache_dir=str(tmp_path / "cache"))


def test_lstm_recipe_fits_a_few_sparse_steps(source, tmp_path):
    from recipes.cli import main

    cli = main(
        [
            "--config",
            str(CONFIGS / "lstm_gcide.yaml"),
            "--config",
            str(CONFIGS / "heads" / "sparse_uniform.yaml"),
            f"--data.init_args.source_dir={source[0]}",
            f"--data.init_args.cache_dir={tmp_path / 'cache'}",
            "--data.init_args.min_count=1",
            "--data.init_args.bptt=5",
            "--data.init_args.batch_size=2",
            "--model.init_args.embedding_dim=8",
            "--model.init_args.hidden_dim=8",
            "--model.init_args.head.init_args.num_negatives=4",
            "--trainer.max_steps=2",
            "--trainer.val_check_interval=2",
            "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
        ],
        run=False,
    )
    assert cli.model.num_classes == cli.datamodule.num_classes
    assert cli.model.head.sparse_grad and cli.model.word_emb.sparse
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.trainer.global_step == 2
    assert 1 < float(cli.trainer.callback_metrics["val/ppl"]) < 10 * cli.model.num_classes


REAL = sorted(REAL_CACHE.glob("gcide-*-min2/meta.json"))


@pytest.mark.skipif(not REAL, reason="no GCIDE in the cache: python -m recipes.data.gcide --fetch")
def test_real_gcide_sizes():
    data = GCIDE(cache_dir=str(REAL_CACHE))
    sizes = {name: len(ids) for name, ids in data.ids.items()}
    assert 9_300_000 < sum(sizes.values()) < 10_100_000
    assert 0.97 < sizes["train"] / sum(sizes.values()) < 0.99
    assert 100_000 <= data.num_classes < 120_000
    assert data.words[0] == "." and UNK in data.words[:100]
