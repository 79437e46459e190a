"""GCIDE: word-level language modelling on the Collaborative International Dictionary of English.

The corpus is Debian's ``dict-gcide`` package (GPL), fetched at run time into the cache and never
committed: ``apt-get download dict-gcide`` then ``dpkg-deb -x``, which leaves a dictd database,
``usr/share/dictd/gcide.dict.dz`` (dictzip, readable with :mod:`gzip`) and ``gcide.index``
(``headword<TAB>base64 offset<TAB>base64 length`` per line, byte offsets into the uncompressed
text). One command does it: ``python -m recipes.data.gcide --fetch``.

Each dictionary entry (a distinct ``(offset, length)`` of the index; the ``00-database-*``
entries are skipped) is lower-cased and cut into words and punctuation (:data:`TOKEN`), followed by
``<eos>``. Entries go to train / validation / test (98 / 1 / 1) by a hash of their first headword,
and within a split they are ordered by another part of that hash, so that any prefix of a split
(a budget that ends mid-epoch, ``max_eval_tokens``) samples the whole alphabet. On the Debian
0.48.5 package: 126,236 entries, 9.7M tokens, 221k word types, 110k seen at least twice.

The vocabulary is every word seen at least ``min_count`` times in the training split, plus
``<unk>`` (every other word) and ``<eos>``, with ids sorted by decreasing training frequency
(``<unk>`` counted as the words it stands for), so that id 0 is the most frequent token, as
``LogUniformSampler`` assumes. The id streams are cached as ``.npy`` files (memory-mapped on load)
under ``$LIGHTNING_SAMPLED_CACHE/gcide-<source digest>-min<min_count>/``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .base import default_cache_dir
from .ptb import EOS, TokenStreams

UNK = "<unk>"
PACKAGE = "dict-gcide"
DICT_FILE = "gcide.dict.dz"
INDEX_FILE = "gcide.index"
FETCH_COMMAND = "python -m recipes.data.gcide --fetch"
SPLITS = ("train", "validation", "test")
#: Words (letters and digits, inner apostrophes kept: ``don't``) or single punctuation marks.
TOKEN = re.compile(r"[^\W_]+(?:'[^\W_]+)*|[^\w\s]|_")
_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64 = {c: i for i, c in enumerate(_DIGITS)}


def default_source_dir(cache_dir: Path | None = None) -> Path:
    """Where :func:`fetch` puts ``gcide.dict.dz`` and ``gcide.index``: ``<cache>/gcide-source``."""
    return (cache_dir or default_cache_dir()) / "gcide-source"


def _run(command: list[str], cwd: Path) -> None:
    try:
        subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as err:
        tail = (err.stderr or err.stdout or "").strip().splitlines()[-3:]
        raise RuntimeError(
            f"`{' '.join(command)}` failed ({'; '.join(tail)}); GCIDE comes from Debian's "
            f"{PACKAGE} package: run `apt-get update` and retry `{FETCH_COMMAND}`, or download "
            f"{PACKAGE}_*.deb by hand, run `dpkg-deb -x {PACKAGE}_*.deb DIR` and pass "
            "source_dir=DIR/usr/share/dictd"
        ) from None


def fetch(dest: Path | None = None) -> Path:
    """Downloads ``dict-gcide`` (about 15 MB, no install) and copies its dictd database to
    ``dest`` (default :func:`default_source_dir`). Returns ``dest``.

    Raises:
        FileNotFoundError: ``apt-get`` or ``dpkg-deb`` is missing (not a Debian system); the
            message says what to run instead.
        RuntimeError: a command failed (e.g. no package lists: run ``apt-get update``).
    """
    dest = dest or default_source_dir()
    missing = [tool for tool in ("apt-get", "dpkg-deb") if shutil.which(tool) is None]
    if missing:
        raise FileNotFoundError(
            f"GCIDE is fetched with `apt-get download {PACKAGE}` and `dpkg-deb -x`, but "
            f"{' and '.join(missing)} not found; on another system download {PACKAGE}_*.deb "
            "from a Debian mirror, extract it (`dpkg-deb -x FILE DIR` or `ar x FILE && tar xf "
            f"data.tar.*`) and pass source_dir=DIR/usr/share/dictd"
        )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        _run(["apt-get", "download", PACKAGE], work)
        (deb,) = work.glob(f"{PACKAGE}_*.deb")
        _run(["dpkg-deb", "-x", str(deb), str(work / "x")], work)
        dest.mkdir(parents=True, exist_ok=True)
        for name in (INDEX_FILE, DICT_FILE):  # the dict last: its presence marks a whole copy
            shutil.copyfile(work / "x/usr/share/dictd" / name, dest / f".{name}.part")
            os.replace(dest / f".{name}.part", dest / name)
    return dest


def _b64(text: str) -> int:
    value = 0
    for char in text:
        value = value * 64 + _B64[char]
    return value


def to_b64(value: int) -> str:
    """``value`` in dictd's base64 digits (the inverse of the index's offsets and lengths)."""
    digits = ""
    while True:
        value, rest = divmod(value, 64)
        digits = _DIGITS[rest] + digits
        if value == 0:
            return digits


def read_entries(source_dir: Path) -> Iterator[tuple[str, str]]:
    """``(headword, text)`` of each dictionary entry in file order: one per distinct
    ``(offset, length)`` of the index, named by its first headword, ``00-database-*`` skipped."""
    index = (source_dir / INDEX_FILE).read_bytes().decode("utf-8", errors="replace")
    entries: dict[tuple[int, int], str] = {}
    for line in index.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and not parts[0].startswith("00-database"):
            entries.setdefault((_b64(parts[1]), _b64(parts[2])), parts[0])
    with gzip.open(source_dir / DICT_FILE) as f:
        text = f.read()
    for (offset, length), headword in sorted(entries.items()):
        yield headword, text[offset : offset + length].decode("utf-8", errors="replace")


def tokenize(text: str) -> list[str]:
    """Lower-cased words and punctuation marks of ``text`` (:data:`TOKEN`)."""
    return TOKEN.findall(text.lower())


def entry_hash(headword: str) -> int:
    """A stable 64-bit hash of a headword (split and order of its entry)."""
    return int.from_bytes(hashlib.blake2b(headword.encode(), digest_size=8).digest(), "little")


def split_of(headword: str) -> str:
    """``validation`` for 1% of the entries, ``test`` for another 1%, ``train`` for the rest."""
    bucket = entry_hash(headword) % 100
    return SPLITS[1] if bucket == 0 else SPLITS[2] if bucket == 1 else SPLITS[0]


def split_entries(source_dir: Path) -> dict[str, list[str]]:
    """The entries' texts of each split (:func:`split_of`), ordered within a split by the
    rest of their headword's hash, so that any prefix samples the whole alphabet."""
    keyed: dict[str, list[tuple[int, str]]] = {name: [] for name in SPLITS}
    for headword, text in read_entries(source_dir):
        keyed[split_of(headword)].append((entry_hash(headword) // 100, text))
    return {
        name: [text for _, text in sorted(entries, key=lambda e: e[0])]
        for name, entries in keyed.items()
    }


def ensure_source(source_dir: Path, cache: Path) -> str:
    """Fetches GCIDE into ``source_dir`` when it is missing there and that is the cache's
    default place; returns the first 12 hex digits of the source files' SHA-1 (the cache key)."""
    if not (source_dir / DICT_FILE).is_file():
        if source_dir != default_source_dir(cache):
            raise FileNotFoundError(
                f"no {DICT_FILE} in {source_dir}; leave source_dir unset to fetch "
                f"GCIDE into the cache, or run `{FETCH_COMMAND}`"
            )
        fetch(source_dir)
    digest = hashlib.sha1()
    for name in (DICT_FILE, INDEX_FILE):
        digest.update((source_dir / name).read_bytes())
    return digest.hexdigest()[:12]


def save_atomically(cache: Path, path: Path, files: dict[str, np.ndarray | str]) -> None:
    """Writes ``files`` (arrays as ``.npy``, strings as text) into a fresh folder of ``cache``
    and renames it to ``path``, so that a reader sees all of them or none; a folder another
    process saved first is kept."""
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=f".{path.name}-"))
    for name, content in files.items():
        if isinstance(content, str):
            (tmp / name).write_text(content, encoding="utf-8")
        else:
            np.save(tmp / name, content)
    try:
        os.replace(tmp, path)
    except OSError:  # another process saved it first
        shutil.rmtree(tmp, ignore_errors=True)


def build(source_dir: Path, min_count: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """Tokenises the dictionary into the three id streams and the vocabulary (words by id)."""
    streams = {
        name: [w for text in texts for w in [*tokenize(text), EOS]]
        for name, texts in split_entries(source_dir).items()
    }
    freq = Counter(streams["train"])
    kept = {w: c for w, c in freq.items() if c >= min_count and w != UNK}
    kept[UNK] = sum(c for w, c in freq.items() if w not in kept)
    words = sorted(kept, key=lambda w: (-kept[w], w))
    index = {w: i for i, w in enumerate(words)}
    unk = index[UNK]
    ids = {
        name: np.fromiter((index.get(w, unk) for w in s), dtype=np.int32, count=len(s))
        for name, s in streams.items()
    }
    return ids, words


class GCIDE(TokenStreams):
    """GCIDE language modelling; exact perplexity over the whole vocabulary (>= 100k words).

    Batches are consecutive BPTT windows ``{"input", "target"}`` ``[batch_size, bptt]`` (as
    :class:`~recipes.data.PennTreebank`); hidden states are not carried across windows. The data
    are fetched (:func:`fetch`) and tokenised on first use, in ``__init__`` (the CLI reads
    ``num_classes`` right after construction) and in ``prepare_data``.

    Args:
        bptt: window length.
        batch_size: training rows.
        eval_batch_size: evaluation rows.
        min_count: words seen fewer times in the training split become ``<unk>``.
        max_tokens: keep only the first tokens of each split (small slices for tests).
        max_eval_tokens: keep only the first tokens of validation and test (about 97k each;
            exact perplexity costs ``N * D`` multiply-adds per token).
        source_dir: folder holding ``gcide.dict.dz`` and ``gcide.index``; default
            ``<cache>/gcide-source``, fetched with ``apt-get download dict-gcide`` when missing.
        cache_dir: where the tokenised id streams are saved.
    """

    def __init__(
        self,
        bptt: int = 35,
        batch_size: int = 32,
        eval_batch_size: int = 10,
        min_count: int = 2,
        max_tokens: int | None = None,
        max_eval_tokens: int | None = None,
        source_dir: str | None = None,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("bptt", bptt),
            ("batch_size", batch_size),
            ("eval_batch_size", eval_batch_size),
            ("min_count", min_count),
            ("max_tokens", max_tokens or 1),
            ("max_eval_tokens", max_eval_tokens or 1),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.bptt = bptt
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.min_count = min_count
        self.max_tokens = max_tokens
        self.max_eval_tokens = max_eval_tokens
        self.cache = Path(cache_dir) if cache_dir else default_cache_dir()
        self.source_dir = Path(source_dir) if source_dir else default_source_dir(self.cache)
        self.prepare_data()

    def prepare_data(self) -> None:
        """Fetches the source when missing, tokenises it on a cache miss, memory-maps the ids."""
        if getattr(self, "ids", None) is not None:
            return
        digest = ensure_source(self.source_dir, self.cache)
        path = self.cache / f"gcide-{digest}-min{self.min_count}"
        if not (path / "meta.json").is_file():
            ids, words = build(self.source_dir, self.min_count)
            meta = {"min_count": self.min_count, **{k: len(v) for k, v in ids.items()}}
            files = {f"{name}.npy": array for name, array in ids.items()}
            files["vocab.txt"] = "\n".join(words) + "\n"
            files["meta.json"] = json.dumps(meta) + "\n"
            save_atomically(self.cache, path, files)
        self.words: list[str] = (path / "vocab.txt").read_text(encoding="utf-8").splitlines()
        self.ids = {name: np.load(path / f"{name}.npy", mmap_mode="r") for name in SPLITS}

    def stream(self, split: str) -> Tensor:
        """The ``[T]`` token ids of ``split`` (truncated to ``max_tokens`` and, for validation
        and test, ``max_eval_tokens``)."""
        limits = [self.max_tokens] + ([self.max_eval_tokens] if split != "train" else [])
        limit = min((x for x in limits if x is not None), default=None)
        return torch.from_numpy(np.asarray(self.ids[split][:limit], dtype=np.int64))


def main(argv: list[str] | None = None) -> None:
    """``python -m recipes.data.gcide --fetch [--min-count 2]``: fetch and tokenise, print sizes."""
    parser = argparse.ArgumentParser(description="Fetch GCIDE (dict-gcide) and tokenise it.")
    parser.add_argument("--fetch", action="store_true", help="fetch the source if missing")
    parser.add_argument("--min-count", type=int, default=2)
    parser.add_argument("--cache-dir", help="default $LIGHTNING_SAMPLED_CACHE")
    args = parser.parse_args(argv)
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    if not args.fetch and not (default_source_dir(cache) / DICT_FILE).is_file():
        raise SystemExit(f"error: GCIDE is not in {cache}; run `{FETCH_COMMAND}`")
    try:
        data = GCIDE(min_count=args.min_count, cache_dir=args.cache_dir)
    except (FileNotFoundError, RuntimeError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    sizes = ", ".join(f"{name} {len(data.ids[name]):,}" for name in SPLITS)
    print(f"GCIDE in {data.source_dir}: {data.num_classes:,} classes; tokens: {sizes}")


if __name__ == "__main__":
    main()
