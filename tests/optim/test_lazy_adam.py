"""LazyAdam against torch's SparseAdam / Adam / AdamW, sparse-aware norm clipping, and the checks
that a sparse class table meets a sparse-capable optimizer and a sparse tied lookup."""

import copy
import math
import warnings

import pytest
import torch
from fake_samplers import Stream
from torch import nn

from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.optim import LazyAdam, clip_grad_norm_, lazy_adam
from lightning_sampled.samplers import UniformSampler

N, D, M = 12, 4, 5
TOUCHED = 8  # inputs, targets and negatives only use classes < 8: rows 8.. are never touched


class Tied(nn.Module):
    """Sparse embedding lookup of ``ids [B, 2]`` -> Linear -> sampled head tied to the embedding;
    the head's negatives come from a preset stream, so two copies draw the same ones."""

    def __init__(self, seed: int, stream: torch.Tensor):
        super().__init__()
        torch.manual_seed(seed)
        self.embedding = nn.Embedding(N, D, sparse=True)
        self.linear = nn.Linear(2 * D, D)
        sampler = Stream(torch.full((N,), 1.0 / N), stream)
        self.head = SampledSoftmaxHead(
            N, D, sampler, M, shared_negatives=True, sparse_grad=True, weight=self.embedding.weight
        )

    def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.head(self.linear(self.embedding(ids).flatten(1)), target)


def batches(num_steps: int) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
    """Per step ``(ids [6, 2], target [6])`` over classes < TOUCHED with repeated ids; ``None``
    at step 3 marks a step whose table gradient is sparse and empty."""
    g = torch.Generator().manual_seed(3)
    out = []
    for step in range(num_steps):
        if step == 3:
            out.append(None)
            continue
        ids = torch.randint(TOUCHED, (6, 2), generator=g)
        ids[1] = ids[0]  # the same row looked up twice in one step
        out.append((ids, ids[:, 0].clone()))
    return out


def loss_of(model: Tied, batch) -> torch.Tensor:
    if batch is None:  # the table is read through an empty lookup: a sparse grad with no rows
        empty = model.embedding(torch.empty(0, 2, dtype=torch.long))
        return model.linear(torch.ones(1, 2 * D)).square().sum() + empty.sum()
    return model(*batch)


def stream_for(num_steps: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(4)
    return torch.randint(TOUCHED, (num_steps * M,), generator=g)


@pytest.mark.parametrize("rows_per_block", [None, 1, 3])
def test_equals_sparse_adam_plus_adam_and_leaves_untouched_rows_and_moments_alone(
    rows_per_block, monkeypatch
):
    if rows_per_block is not None:  # the touched rows are updated over several blocks
        monkeypatch.setattr(lazy_adam, "_BLOCK_BYTES", rows_per_block * D * 4)
    steps = 7
    stream, data = stream_for(steps), batches(steps)
    ours, ref = Tied(0, stream), Tied(0, stream)
    initial = ours.embedding.weight.detach().clone()
    lazy = LazyAdam(ours.parameters(), lr=0.01)
    sparse_adam = torch.optim.SparseAdam([ref.embedding.weight], lr=0.01)
    adam = torch.optim.Adam(ref.linear.parameters(), lr=0.01)
    table = ours.embedding.weight
    saw_duplicates = saw_empty = False
    for step, batch in enumerate(data):
        for opt in (lazy, sparse_adam, adam):
            opt.zero_grad()
        loss_of(ours, batch).backward()
        loss_of(ref, batch).backward()
        grad = table.grad
        assert grad.is_sparse
        rows = grad._indices()[0]
        saw_duplicates |= rows.numel() > rows.unique().numel()
        saw_empty |= grad._nnz() == 0
        touched = grad.coalesce().indices()[0]
        moments_before = {k: v.clone() for k, v in lazy.state[table].items()}
        lazy.step()
        sparse_adam.step()
        adam.step()
        for (name, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=f"{name} at step {step}")
        untouched = torch.ones(N, dtype=torch.bool)
        untouched[touched] = False
        for key in ("exp_avg", "exp_avg_sq"):
            moment = lazy.state[table][key]
            torch.testing.assert_close(moment, sparse_adam.state[ref.embedding.weight][key])
            if step > 0:  # moments of rows this step did not touch are kept as they were
                assert torch.equal(moment[untouched], moments_before[key][untouched])
    assert saw_duplicates and saw_empty
    assert float(lazy.state[table]["step"]) == steps
    assert float(sparse_adam.state[ref.embedding.weight]["step"]) == steps
    assert torch.equal(table[TOUCHED:], initial[TOUCHED:])
    assert not torch.equal(table[:TOUCHED], initial[:TOUCHED])
    assert torch.equal(lazy.state[table]["exp_avg"][TOUCHED:], torch.zeros(N - TOUCHED, D))


def random_grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def test_dense_parameters_get_adamw_with_decoupled_weight_decay_per_group():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 3))
    twin = copy.deepcopy(model)

    def groups(m):
        return [
            {"params": m[0].parameters()},
            {"params": m[1].parameters(), "lr": 0.03, "weight_decay": 0.5},
        ]

    ours = LazyAdam(groups(model), lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    ref = torch.optim.AdamW(groups(twin), lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    for step in range(6):
        random_grads(model.parameters(), step)
        random_grads(twin.parameters(), step)
        ours.step()
        ref.step()
        for a, b in zip(model.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def sparse_grad(rows, values, shape):
    """An uncoalesced sparse COO gradient with the given (possibly repeated) rows."""
    indices, values = torch.tensor([rows]), torch.tensor(values)
    return torch.sparse_coo_tensor(indices, values, shape, check_invariants=True)


def test_sparse_rows_decay_only_when_touched_then_take_the_sparse_adam_step():
    lr, (b1, b2), eps, wd = 0.1, (0.9, 0.99), 1e-3, 0.5
    table = nn.Parameter(torch.arange(18.0).reshape(6, 3) / 10 - 0.8)
    initial = table.detach().clone()
    opt = LazyAdam([table], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    grads = [
        sparse_grad([1, 1, 4], [[1.0, -2.0, 0.5], [0.5, 1.0, 1.0], [3.0, 0.0, -1.0]], (6, 3)),
        sparse_grad([4, 2], [[-1.0, 2.0, 0.25], [0.5, 0.5, -4.0]], (6, 3)),
    ]
    expected, m, v = initial.clone(), torch.zeros(6, 3), torch.zeros(6, 3)
    for t, grad in enumerate(grads, start=1):
        dense = grad.to_dense()
        for r in sorted(set(grad._indices()[0].tolist())):  # hand-computed, row by row
            m[r] = b1 * m[r] + (1 - b1) * dense[r]
            v[r] = b2 * v[r] + (1 - b2) * dense[r] ** 2
            step_size = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
            expected[r] = expected[r] * (1 - lr * wd) - step_size * m[r] / (v[r].sqrt() + eps)
        table.grad = grad
        opt.step()
        torch.testing.assert_close(table.detach(), expected, rtol=0, atol=1e-6)
    assert torch.equal(table[[0, 3, 5]], initial[[0, 3, 5]])  # never touched: no decay
    assert not torch.equal(table[1], initial[1])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"lr": 0.0}, "lr"),
        ({"lr": -1e-3}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"eps": 0.0}, "eps"),
        ({"eps": -1e-8}, "eps"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"betas": (1.0, 0.999)}, "betas"),
        ({"betas": (0.9, -0.1)}, "betas"),
        ({"betas": (0.9,)}, "betas"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        LazyAdam([nn.Parameter(torch.zeros(2))], **kwargs)


def test_state_dict_round_trips_and_the_next_steps_are_identical():
    steps = 6
    stream, data = stream_for(steps), batches(steps)
    model = Tied(0, stream)
    opt = LazyAdam(model.parameters(), lr=0.01, weight_decay=0.1)
    for batch in data[:4]:
        opt.zero_grad()
        loss_of(model, batch).backward()
        opt.step()
    twin = copy.deepcopy(model)
    loaded = LazyAdam(twin.parameters(), lr=0.5)
    loaded.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert loaded.param_groups[0]["lr"] == 0.01
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[a][key], loaded.state[b][key]), key
    for batch in data[4:]:
        for m, o in ((model, opt), (twin, loaded)):
            o.zero_grad()
            loss_of(m, batch).backward()
            o.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)


def test_step_returns_the_closure_loss_and_names_our_clipping_when_torch_clipping_fails():
    table = nn.Parameter(torch.zeros(5, 2))
    opt = LazyAdam([table])

    def closure():
        table.grad = sparse_grad([1], [[1.0, 1.0]], (5, 2))
        return torch.tensor(2.0)

    assert float(opt.step(closure)) == 2.0

    def clipping_closure():
        closure()
        torch.nn.utils.clip_grad_norm_([table], 1.0)
        return torch.tensor(2.0)

    with pytest.raises(RuntimeError, match=r"lightning_sampled\.optim\.clip_grad_norm_") as info:
        opt.step(clipping_closure)
    assert isinstance(info.value.__cause__, NotImplementedError)


def test_other_sparse_errors_in_the_closure_are_not_blamed_on_clipping():
    table = nn.Parameter(torch.zeros(5, 2))

    def ddp_error():  # what DDP's reducer raises when it meets a sparse grad it expected dense
        raise NotImplementedError("Cannot access storage of SparseTensorImpl")

    with pytest.raises(RuntimeError, match="DDP expected a dense gradient") as caught:
        LazyAdam([table]).step(ddp_error)
    assert "clip" not in str(caught.value)

    def other_error():
        raise NotImplementedError("no sparse kernel for this op: SparseCPU")

    with pytest.raises(NotImplementedError, match="SparseCPU"):
        LazyAdam([table]).step(other_error)


# -- clip_grad_norm_ ----------------------------------------------------------------------------


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_equals_torch_on_dense_grads(norm_type, max_norm):
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(7))]
    random_grads(params, 1)
    twins = [nn.Parameter(p.detach().clone()) for p in params]
    for p, t in zip(params, twins, strict=True):
        t.grad = p.grad.clone()
    total = clip_grad_norm_(params, max_norm, norm_type)
    expected = torch.nn.utils.clip_grad_norm_(twins, max_norm, norm_type)
    torch.testing.assert_close(total, expected)
    for p, t in zip(params, twins, strict=True):
        torch.testing.assert_close(p.grad, t.grad)
    assert (max_norm < float(total)) == (max_norm == 0.5)  # both cases really happen


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_clip_of_sparse_and_dense_grads_equals_clipping_the_densified_grads(norm_type):
    torch.manual_seed(0)
    emb, lin = nn.Embedding(6, 3, sparse=True), nn.Linear(3, 2)
    lin(emb(torch.tensor([1, 4, 1, 1]))).square().sum().backward()  # uncoalesced, row 1 thrice
    table = nn.Parameter(torch.zeros(5, 2))
    table.grad = sparse_grad([3, 0, 3], [[1.0, 2.0], [-1.0, 0.5], [3.0, 4.0]], (5, 2))
    params = [emb.weight, *lin.parameters(), table]
    assert not emb.weight.grad.is_coalesced() and not table.grad.is_coalesced()
    twins = [nn.Parameter(p.detach().clone()) for p in params]
    for p, t in zip(params, twins, strict=True):
        t.grad = p.grad.to_dense().clone()  # to_dense() of a dense grad is the grad itself
    total = clip_grad_norm_(params, 0.1, norm_type)
    expected = torch.nn.utils.clip_grad_norm_(twins, 0.1, norm_type)
    torch.testing.assert_close(total, expected)
    assert float(total) > 0.1
    for p, t in zip(params, twins, strict=True):
        torch.testing.assert_close(p.grad.to_dense(), t.grad)
    assert emb.weight.grad.is_sparse and table.grad.is_sparse


def test_clip_takes_one_tensor_no_grads_and_refuses_a_bad_max_norm():
    p = nn.Parameter(torch.zeros(3))
    assert float(clip_grad_norm_(p, 1.0)) == 0.0
    p.grad = torch.tensor([3.0, 4.0, 0.0])
    assert float(clip_grad_norm_(p, 1.0)) == pytest.approx(5.0)
    torch.testing.assert_close(p.grad, torch.tensor([0.6, 0.8, 0.0]), atol=1e-6, rtol=0)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="max_norm"):
            clip_grad_norm_(p, bad)


# -- sparse_checks ------------------------------------------------------------------------------


def sparse_head_with_grad(**kwargs):
    head = SampledSoftmaxHead(N, D, UniformSampler(N), M, sparse_grad=True, **kwargs)
    head(torch.randn(6, D), torch.randint(N, (6,))).backward()
    return head


def test_adam_on_a_sparse_head_table_raises_type_error_naming_lazy_adam_at_its_first_step():
    torch.manual_seed(0)
    head = sparse_head_with_grad()
    before = head.weight.detach().clone()
    opt = torch.optim.Adam(head.parameters())
    with pytest.raises(TypeError, match="LazyAdam") as info:
        opt.step()
    assert "SampledSoftmaxHead" in str(info.value)
    assert torch.equal(head.weight, before)


@pytest.mark.parametrize(
    "make", [lambda p: torch.optim.SGD(p, lr=0.1), torch.optim.SparseAdam, LazyAdam]
)
def test_sparse_capable_optimizers_step_a_sparse_head_table(make):
    torch.manual_seed(0)
    head = sparse_head_with_grad()
    assert head.weight.grad.is_sparse
    before = head.weight.detach().clone()
    make(head.parameters()).step()
    assert not torch.equal(head.weight, before)


def tied_steps(sparse_embedding: bool, steps: int = 3) -> list[warnings.WarningMessage]:
    torch.manual_seed(0)
    emb = nn.Embedding(N, D, sparse=sparse_embedding)
    head = SampledSoftmaxHead(N, D, UniformSampler(N), M, sparse_grad=True, weight=emb.weight)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            emb.weight.grad = None
            ids = torch.randint(N, (6,))
            head(emb(ids), ids.roll(1)).backward()
    return [w for w in caught if "sparse_grad=True" in str(w.message)]


def test_a_tied_dense_embedding_warns_once_naming_it():
    caught = tied_steps(sparse_embedding=False)
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert caught[0].category is UserWarning
    message = str(caught[0].message)
    assert "Embedding(" in message and "sparse=True" in message and "(sparse=False)" in message


def test_a_tied_sparse_embedding_does_not_warn():
    assert tied_steps(sparse_embedding=True) == []


def test_a_sparse_adam_state_dict_loads_and_lazy_adam_continues_its_steps():
    """Issue 32, item 12: SparseAdam's groups lack ``weight_decay`` (a KeyError at the next step
    before); its step counts and moments are LazyAdam's own, so the steps go on alike."""
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(6, (1, 4), generator=g) for _ in range(5)]
    grads = [torch.sparse_coo_tensor(r, torch.randn(4, 3, generator=g), (6, 3)) for r in rows]
    theirs = nn.Parameter(torch.randn(6, 3, generator=g))
    ours = nn.Parameter(theirs.detach().clone())
    sparse_adam = torch.optim.SparseAdam([theirs], lr=0.1)
    for grad in grads[:2]:
        theirs.grad = grad.clone()
        sparse_adam.step()
    lazy = LazyAdam([ours], lr=0.5, weight_decay=0.0)
    with torch.no_grad():
        ours.copy_(theirs)
    lazy.load_state_dict(sparse_adam.state_dict())
    assert lazy.param_groups[0]["lr"] == 0.1 and lazy.param_groups[0]["weight_decay"] == 0.0
    for grad in grads[2:]:
        theirs.grad, ours.grad = grad.clone(), grad.clone()
        sparse_adam.step()
        lazy.step()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
