"""GCIDE in byte-level BPE tokens, for the GPT recipe (``configs/gpt_gcide.yaml``).

The text is :mod:`recipes.data.gcide`'s: the entries of Debian's ``dict-gcide`` (fetched at run
time into the cache, never committed), split train / validation / test (98 / 1 / 1) by a hash of
their headword, in hash order within a split. Here an entry keeps its case and layout and is
followed by the special token ``<|endoftext|>``. The tokenizer is a byte-level BPE (GPT-2's
pre-tokenizer and byte alphabet, so any text encodes and decodes back exactly), trained locally
with Hugging Face ``tokenizers`` on the **training split only**, to ``vocab_size`` tokens (the
256 bytes and ``<|endoftext|>`` included); nothing comes from the hub.

The tokenizer (``tokenizer.json``) and the three id streams (``.npy``, memory-mapped on load) are
cached under ``$LIGHTNING_SAMPLED_CACHE/gcide-bpe-<source digest>-v<vocab_size>-f<min_frequency>``
(``-e<max_entries>`` for a slice), so a later run with the same settings reuses them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from lightning.pytorch.utilities import rank_zero_info

from .base import default_cache_dir
from .gcide import GCIDE, SPLITS, default_source_dir, ensure_source, save_atomically, split_entries
from .ptb import TokenStreams

EOT = "<|endoftext|>"


def train_tokenizer(texts: list[str], vocab_size: int, min_frequency: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts`` to at most ``vocab_size``
    tokens (fewer only when the texts hold too few pairs seen ``min_frequency`` times)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer, length=len(texts))
    return tokenizer


def encode_split(tokenizer, texts: list[str]) -> np.ndarray:
    """The ids of ``texts``, each entry followed by ``<|endoftext|>``, as one int32 stream."""
    eot = tokenizer.token_to_id(EOT)
    ids = [x for encoding in tokenizer.encode_batch(texts) for x in [*encoding.ids, eot]]
    return np.asarray(ids, dtype=np.int32)


class GCIDEBPE(TokenStreams):
    """GCIDE language modelling over a byte-level BPE vocabulary trained on its training split;
    exact perplexity over every token (per BPE token, not per word: not comparable with
    :class:`~recipes.data.GCIDE`'s word-level perplexity).

    Batches are consecutive windows ``{"input", "target"}`` ``[batch_size, seq_len]`` (target =
    input shifted by one token), as :class:`~recipes.data.PennTreebank`'s.

    Args:
        seq_len: window length (at most the model's positions).
        batch_size: training rows.
        eval_batch_size: evaluation rows.
        vocab_size: tokens of the BPE vocabulary (>= 258: the 256 bytes, ``<|endoftext|>`` and a
            merge).
        min_frequency: a pair is merged only when seen at least this often.
        max_entries: keep only the first entries of each split (hash order) before training
            and encoding: small slices for tests; part of the cache key.
        max_tokens: keep only the first tokens of each split.
        max_eval_tokens: keep only the first tokens of validation and test.
        source_dir: folder holding ``gcide.dict.dz`` and ``gcide.index``; default
            ``<cache>/gcide-source``, fetched with ``apt-get download dict-gcide`` when missing.
        cache_dir: where the tokenizer and the id streams are saved.
    """

    def __init__(
        self,
        seq_len: int = 64,
        batch_size: int = 8,
        eval_batch_size: int = 8,
        vocab_size: int = 32_000,
        min_frequency: int = 2,
        max_entries: int | None = None,
        max_tokens: int | None = None,
        max_eval_tokens: int | None = None,
        source_dir: str | None = None,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        for name, value, least in (
            ("seq_len", seq_len, 1),
            ("batch_size", batch_size, 1),
            ("eval_batch_size", eval_batch_size, 1),
            ("vocab_size", vocab_size, 258),
            ("min_frequency", min_frequency, 1),
            ("max_entries", max_entries or 1, 1),
            ("max_tokens", max_tokens or 1, 1),
            ("max_eval_tokens", max_eval_tokens or 1, 1),
        ):
            if value < least:
                raise ValueError(f"{name} must be >= {least}, got {value}")
        self.bptt = self.seq_len = seq_len
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.vocab_size = vocab_size
        self.min_frequency = min_frequency
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self.max_eval_tokens = max_eval_tokens
        self.cache = Path(cache_dir) if cache_dir else default_cache_dir()
        self.source_dir = Path(source_dir) if source_dir else default_source_dir(self.cache)
        self.prepare_data()

    def cache_path(self, digest: str) -> Path:
        """The cache folder of these settings for a source of SHA-1 prefix ``digest``."""
        name = f"gcide-bpe-{digest}-v{self.vocab_size}-f{self.min_frequency}"
        return self.cache / (name + (f"-e{self.max_entries}" if self.max_entries else ""))

    def build(self) -> dict[str, np.ndarray | str]:
        """Trains the tokenizer on the training split and encodes the three splits: the files
        of a cache folder."""
        start = time.perf_counter()
        texts = {k: v[: self.max_entries] for k, v in split_entries(self.source_dir).items()}
        chars = sum(map(len, texts["train"]))
        rank_zero_info(
            f"GCIDE BPE: training a {self.vocab_size:,}-token byte-level BPE on the training "
            f"split ({len(texts['train']):,} entries, {chars:,} characters)"
        )
        tokenizer = train_tokenizer(texts["train"], self.vocab_size, self.min_frequency)
        trained = time.perf_counter() - start
        rank_zero_info(
            f"GCIDE BPE: {tokenizer.get_vocab_size():,} tokens in {trained:.1f} s; encoding"
        )
        files: dict[str, np.ndarray | str] = {}
        for name in SPLITS:
            files[f"{name}.npy"] = encode_split(tokenizer, texts[name])
            rank_zero_info(f"GCIDE BPE: {name} {len(files[f'{name}.npy']):,} tokens")
        meta = {
            "vocab_size": tokenizer.get_vocab_size(),
            "min_frequency": self.min_frequency,
            "max_entries": self.max_entries,
            "train_seconds": round(trained, 1),
            "build_seconds": round(time.perf_counter() - start, 1),
            **{name: len(files[f"{name}.npy"]) for name in SPLITS},
        }
        files["tokenizer.json"] = tokenizer.to_str()
        files["meta.json"] = json.dumps(meta) + "\n"
        return files

    def prepare_data(self) -> None:
        """Fetches the source when missing, trains and encodes on a cache miss, memory-maps the
        ids and loads the tokenizer."""
        if getattr(self, "ids", None) is not None:
            return
        from tokenizers import Tokenizer

        path = self.cache_path(ensure_source(self.source_dir, self.cache))
        if not (path / "meta.json").is_file():
            save_atomically(self.cache, path, self.build())
        else:
            rank_zero_info(f"GCIDE BPE: reusing {path}")
        self.meta = json.loads((path / "meta.json").read_text())
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.ids = {name: np.load(path / f"{name}.npy", mmap_mode="r") for name in SPLITS}

    @property
    def num_classes(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def words(self) -> list[str]:  # type: ignore[override]
        """The tokens by id (byte-level strings: ``Ġ`` stands for a space)."""
        return [self.tokenizer.id_to_token(i) for i in range(self.num_classes)]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        return self.tokenizer.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids`` (``<|endoftext|>`` left out)."""
        return self.tokenizer.decode(ids)

    #: the ``[T]`` token ids of a split, truncated as ``GCIDE.stream`` does
    stream = GCIDE.stream
