"""``evaluate_ranking`` against a brute-force evaluation on the full logits matrix."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from lightning_sampled.heads import FullSoftmaxHead
from lightning_sampled.metrics import evaluate_ranking

N, D, Q, E = 97, 8, 45, 12


def brute_force(logits: Tensor, relevant: list[set[int]], ks: tuple[int, ...]) -> dict[str, float]:
    """Plain-Python metrics from full logits ``[Q, N]`` (``-inf`` = never retrieved).

    Queries without a relevant class count as 0 (torchmetrics' default ``"neg"``).
    """
    sums: dict[str, float] = {}
    for q, rel in enumerate(relevant):
        order = [i for i in logits[q].argsort(descending=True).tolist() if logits[q, i] > -math.inf]
        for k in ks:
            hits = [1 if i in rel else 0 for i in order[:k]]
            found = sum(hits)
            values = dict.fromkeys(("ndcg", "recall", "precision", "mrr", "map"), 0.0)
            if rel:
                dcg = sum(h / math.log2(r + 2) for r, h in enumerate(hits))
                ideal = sum(1 / math.log2(r + 2) for r in range(min(len(rel), k)))
                values["ndcg"] = dcg / ideal
                values["recall"] = found / len(rel)
                values["precision"] = found / k
                values["mrr"] = 1 / (hits.index(1) + 1) if found else 0.0
                precisions = [sum(hits[: r + 1]) / (r + 1) for r, h in enumerate(hits) if h]
                values["map"] = sum(precisions) / found if found else 0.0
            for name, value in values.items():
                sums[f"{name}@{k}"] = sums.get(f"{name}@{k}", 0.0) + value
    return {key: value / len(relevant) for key, value in sums.items()}


def make_problem(seed: int, num_classes: int = N) -> tuple[FullSoftmaxHead, Tensor, Tensor, Tensor]:
    torch.manual_seed(seed)
    head = FullSoftmaxHead(num_classes, D, chunk_size=16)
    target = torch.randint(0, num_classes, (Q,))
    # queries near their target's class vector, so that ranks are informative
    z = 4 * head.weight.detach()[target] + torch.randn(Q, D)
    exclude = torch.randint(0, num_classes, (Q, E))
    exclude[torch.rand(Q, E) < 0.4] = -1  # ragged: padding
    return head, z, target, exclude


def masked_logits(head: FullSoftmaxHead, z: Tensor, exclude: Tensor | None) -> Tensor:
    logits = z @ head.weight.detach().T
    if head.padding_idx is not None:
        logits[:, head.padding_idx] = -math.inf
    if exclude is not None:
        rows = torch.arange(z.shape[0])[:, None].expand_as(exclude)
        keep = exclude >= 0
        logits[rows[keep], exclude[keep]] = -math.inf
    return logits


def loader(*tensors: Tensor) -> DataLoader:
    return DataLoader(TensorDataset(*tensors), batch_size=8)  # 45 = 5 x 8 + 5


def assert_close(got: dict[str, float], expected: dict[str, float]) -> None:
    assert set(got) == set(expected)
    for key in expected:
        assert got[key] == pytest.approx(expected[key], abs=1e-6), key


@pytest.mark.parametrize("seed", [0, 1])
def test_with_and_without_exclusion_equals_brute_force(seed: int) -> None:
    head, z, target, exclude = make_problem(seed)
    relevant = [{int(t)} for t in target]
    ks = (1, 5, 10)
    with_exclusion = evaluate_ranking(head, loader(z, target, exclude), lambda b: tuple(b), ks=ks)
    assert_close(with_exclusion, brute_force(masked_logits(head, z, exclude), relevant, ks))
    without = evaluate_ranking(
        head, loader(z, target, exclude), lambda b: tuple(b), ks=ks, exclude_seen=False
    )
    assert_close(without, brute_force(masked_logits(head, z, None), relevant, ks))
    # excluding seen items changes the numbers here, so both paths are really tested
    assert with_exclusion != without


def test_targets_inside_the_excluded_set_are_misses() -> None:
    head, z, target, exclude = make_problem(2)
    exclude[:, 0] = target  # every target excluded: nothing can be found
    out = evaluate_ranking(head, loader(z, target, exclude), lambda b: tuple(b), ks=5)
    assert all(value == 0.0 for value in out.values())


def test_fewer_scorable_classes_than_k() -> None:
    head, z, target, _ = make_problem(3, num_classes=13)
    exclude = torch.stack([torch.randperm(13)[:10] for _ in range(Q)])  # 3 classes left
    relevant = [{int(t)} for t in target]
    out = evaluate_ranking(head, loader(z, target, exclude), lambda b: tuple(b), ks=(2, 5))
    assert_close(out, brute_force(masked_logits(head, z, exclude), relevant, (2, 5)))


def test_multi_label_targets_and_padding_idx() -> None:
    torch.manual_seed(4)
    head = FullSoftmaxHead(N, D, chunk_size=16, padding_idx=0)
    z = torch.randn(Q, D)
    rel = torch.rand(Q, N) < 0.08
    rel[:, 0] = False
    rel[3] = False  # a query without relevant items counts 0
    relevant = [set(r.nonzero().flatten().tolist()) for r in rel]
    out = evaluate_ranking(head, loader(z, rel), lambda b: (b[0], b[1]), ks=(3, 10))
    assert_close(out, brute_force(masked_logits(head, z, None), relevant, (3, 10)))


def test_metric_selection_keys_and_progress_bar() -> None:
    head, z, target, exclude = make_problem(5)
    out = evaluate_ranking(
        head,
        loader(z, target, exclude),
        lambda b: tuple(b),
        ks=[10, 3, 10],
        metrics=["recall", "ndcg"],
        progress=True,
    )
    assert list(out) == ["recall@3", "recall@10", "ndcg@3", "ndcg@10"]
    full = evaluate_ranking(head, loader(z, target, exclude), lambda b: tuple(b), ks=(3, 10))
    assert all(out[key] == full[key] for key in out)


def test_sequence_queries_with_ignored_positions() -> None:
    head, z, target, _ = make_problem(6)
    z_seq, target_seq = z[:40].reshape(10, 4, D), target[:40].reshape(10, 4).clone()
    target_seq[:, 0] = head.ignore_index  # skipped queries
    out = evaluate_ranking(head, loader(z_seq, target_seq), lambda b: (b[0], b[1]), ks=5)
    keep = target_seq.flatten() != head.ignore_index
    relevant = [{int(t)} for t in target_seq.flatten()[keep]]
    expected = brute_force(masked_logits(head, z_seq.reshape(40, D)[keep], None), relevant, (5,))
    assert_close(out, expected)


def test_empty_batches_with_exclusions_count_for_nothing() -> None:
    head, z, target, exclude = make_problem(9)
    empty = (torch.empty(0, D), torch.empty(0, dtype=torch.long), torch.empty(0, E).long())
    empty_sequences = (torch.empty(3, 0, D), torch.empty(3, 0).long(), torch.empty(3, 0, E).long())
    batches = [
        empty,
        (z[:20], target[:20], exclude[:20]),
        empty_sequences,
        (z[20:], target[20:], exclude[20:]),
    ]
    out = evaluate_ranking(head, batches, lambda b: b, ks=(1, 5))
    relevant = [{int(t)} for t in target]
    assert_close(out, brute_force(masked_logits(head, z, exclude), relevant, (1, 5)))
    # no query at all: every metric is 0, as the metrics give when no query counts
    nothing = evaluate_ranking(head, [empty, empty_sequences], lambda b: b, ks=(1, 5))
    assert nothing == dict.fromkeys(out, 0.0)


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ks": 0}, "ks must hold positive integers, got 0"),
        ({"ks": (5, 2.0)}, "ks must hold positive integers, got 2.0"),
        ({"ks": ()}, "ks must be a positive int or a non-empty sequence"),
        ({"ks": 98}, "ks must be <= the head's num_classes=97, got 98"),
        ({"metrics": ["ndcg", "hits"]}, "metrics must be names among .* got 'hits'"),
        ({"metrics": []}, "metrics must name at least one metric"),
        ({"empty_target_action": "drop"}, "empty_target_action .* got 'drop'"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    head, z, target, exclude = make_problem(7)
    with pytest.raises(ValueError, match=match):
        evaluate_ranking(head, loader(z, target, exclude), lambda b: tuple(b), **kwargs)


def test_bad_head_encode_and_loader() -> None:
    head, z, target, exclude = make_problem(8)
    with pytest.raises(ValueError, match="head must be an OutputHead, got Linear"):
        evaluate_ranking(torch.nn.Linear(2, 2), [], lambda b: b)
    with pytest.raises(ValueError, match="encode must return .* got Tensor"):
        evaluate_ranking(head, loader(z), lambda b: b[0])
    with pytest.raises(ValueError, match="dataloader yielded no batch"):
        evaluate_ranking(head, [], lambda b: b)
    bad_target = target.clone()
    bad_target[3] = N
    with pytest.raises(IndexError, match=f"target must hold class ids in \\[0, {N}\\), got {N}"):
        evaluate_ranking(head, loader(z, bad_target), lambda b: tuple(b))
    with pytest.raises(ValueError, match="z contains NaN"):
        evaluate_ranking(head, [(torch.full((2, D), math.nan), target[:2])], lambda b: b)
