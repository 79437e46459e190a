"""LazyAdam's lean table state: FBGEMM's exact row-wise Adagrad against a row-by-row reference,
bf16 state against fp32 state, a bf16 table written back by stochastic rounding, checkpoints, and
the arguments it refuses."""

import copy

import pytest
import torch
from torch import nn

from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.optim import LazyAdam, lazy_adam
from lightning_sampled.optim.lazy_adam import stochastic_round_bf16
from lightning_sampled.samplers import UniformSampler

N, D = 10, 4
TOUCHED = 7  # the gradients below touch rows < 7 only


def random_sparse_grad(seed: int, nnz: int = 9, dtype=torch.float32) -> torch.Tensor:
    """An uncoalesced ``[N, D]`` COO gradient on rows < TOUCHED, with duplicate rows."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(TOUCHED, (nnz,), generator=g)
    rows[1] = rows[0]  # a row drawn twice
    values = torch.randn(nnz, D, generator=g).to(dtype)
    return torch.sparse_coo_tensor(rows[None], values, (N, D), check_invariants=True)


def reference_row_wise_adagrad(w, G, grad, *, lr, eps, wd):
    """FBGEMM's exact row-wise Adagrad, written row by row from its definition (in place)."""
    dense = grad.to_dense()  # duplicates summed
    for r in sorted(set(grad._indices()[0].tolist())):
        g = dense[r]
        G[r] = G[r] + (g * g).sum() / g.numel()
        w[r] = (1 - lr * wd) * w[r] - lr * g / (torch.sqrt(G[r]) + eps)


@pytest.mark.parametrize("rows_per_block", [None, 2])
@pytest.mark.parametrize("wd", [0.0, 0.3])
def test_row_wise_adagrad_equals_the_row_by_row_reference(rows_per_block, wd, monkeypatch):
    if rows_per_block is not None:  # the touched rows are updated over several blocks
        monkeypatch.setattr(lazy_adam, "_BLOCK_BYTES", rows_per_block * D * 4)
    torch.manual_seed(0)
    table = nn.Parameter(torch.randn(N, D))
    initial = table.detach().clone()
    opt = LazyAdam(
        [table], lr=1e-3, eps=1e-3, weight_decay=wd, table_state="row_wise_adagrad", table_lr=0.1
    )
    w, G = initial.clone(), torch.zeros(N)
    for step in range(5):
        grad = random_sparse_grad(step)
        assert not grad.is_coalesced() and grad._indices()[0].unique().numel() < grad._nnz()
        table.grad = grad
        opt.step()
        reference_row_wise_adagrad(w, G, grad, lr=0.1, eps=1e-3, wd=wd)
        torch.testing.assert_close(table.detach(), w, rtol=0, atol=1e-6, msg=f"step {step}")
        torch.testing.assert_close(opt.state[table]["row_sum_sq"], G, rtol=1e-6, atol=0)
    state = opt.state[table]
    assert set(state) == {"step", "row_sum_sq"} and float(state["step"]) == 5
    assert state["row_sum_sq"].shape == (N,) and state["row_sum_sq"].dtype == torch.float32
    assert torch.equal(table[TOUCHED:], initial[TOUCHED:])  # untouched rows: unchanged
    assert torch.equal(state["row_sum_sq"][TOUCHED:], torch.zeros(N - TOUCHED))


def test_a_coalesced_gradient_and_a_later_dense_one_take_the_same_row_wise_update():
    torch.manual_seed(0)
    table = nn.Parameter(torch.randn(N, D))
    opt = LazyAdam([table], eps=1e-3, table_state="row_wise_adagrad", table_lr=0.1)
    w, G = table.detach().clone(), torch.zeros(N)
    sparse = random_sparse_grad(0).coalesce()
    dense = torch.randn(N, D)  # a dense gradient touches every row
    for grad in (sparse, dense, dense.to_sparse(1)):
        table.grad = grad
        opt.step()
        reference_row_wise_adagrad(w, G, grad.to_sparse(1), lr=0.1, eps=1e-3, wd=0.0)
        torch.testing.assert_close(table.detach(), w, rtol=0, atol=1e-6)
    assert opt.state[table]["row_sum_sq"].shape == (N,)


def test_dense_parameters_still_equal_adamw_beside_a_row_wise_table():
    torch.manual_seed(0)
    linear, table = nn.Linear(D, 3), nn.Parameter(torch.randn(N, D))
    twin = copy.deepcopy(linear)
    opt = LazyAdam(
        [table, *linear.parameters()],
        lr=0.01,
        betas=(0.8, 0.99),
        weight_decay=0.1,
        table_state="row_wise_adagrad",
        state_dtype=torch.bfloat16,
    )
    ref = torch.optim.AdamW(twin.parameters(), lr=0.01, betas=(0.8, 0.99), weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        table.grad = random_sparse_grad(step)
        for a, b in zip(linear.parameters(), twin.parameters(), strict=True):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        opt.step()
        ref.step()
        for a, b in zip(linear.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
            assert opt.state[a]["exp_avg"].dtype == torch.float32  # dense: Adam in fp32
    assert opt.state[table]["row_sum_sq"].dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_sampled_head_with_a_sparse_table_steps_with_row_state_of_shape_n(dtype):
    torch.manual_seed(0)
    head = SampledSoftmaxHead(50, 8, UniformSampler(50), 5, sparse_grad=True, bias=True)
    head = head.to(dtype)
    opt = LazyAdam(head.parameters(), table_state="row_wise_adagrad")
    before = head.weight.detach().clone()
    head(torch.randn(6, 8), torch.randint(50, (6,))).backward()
    touched = head.weight.grad.coalesce().indices()[0]
    opt.step()
    assert opt.state[head.weight]["row_sum_sq"].shape == (50,)
    assert opt.state[head.weight]["row_sum_sq"].dtype == torch.float32
    assert opt.state[head.bias]["exp_avg"].shape == (50,)  # the dense bias keeps Adam
    assert head.weight.dtype == dtype
    moved = (head.weight != before).any(dim=1)
    assert moved[touched].all() and moved.sum() == touched.numel()


@pytest.mark.parametrize("table_state", ["adam", "row_wise_adagrad"])
def test_bf16_state_stays_close_to_fp32_state(table_state):
    keys = ("row_sum_sq",) if table_state == "row_wise_adagrad" else ("exp_avg", "exp_avg_sq")
    tables, opts = [], []
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        tables.append(nn.Parameter(torch.randn(N, D)))
        opts.append(
            LazyAdam([tables[-1]], lr=0.01, table_state=table_state, state_dtype=dtype, eps=1e-6)
        )
    for step in range(30):
        for table, opt in zip(tables, opts, strict=True):
            table.grad = random_sparse_grad(step)
            opt.step()
    for key in keys:
        full, low = (opt.state[t][key] for t, opt in zip(tables, opts, strict=True))
        assert low.dtype == torch.bfloat16 and full.dtype == torch.float32
        torch.testing.assert_close(low.float(), full, rtol=0.03, atol=1e-3, msg=key)
    torch.testing.assert_close(tables[1], tables[0], rtol=0, atol=3e-3)


# -- stochastic rounding and the bf16 table ------------------------------------------------------


def test_stochastic_rounding_is_unbiased_where_nearest_and_truncation_are_not():
    ulp = 2.0**-7  # bf16's spacing on [1, 2)
    for fraction in (0.1, 0.3, 0.7):
        x = torch.full((40_000,), 1 + fraction * ulp)
        torch.manual_seed(0)
        rounded = stochastic_round_bf16(x)
        assert rounded.dtype == torch.bfloat16
        assert set(rounded.float().unique().tolist()) == {1.0, 1.0 + ulp}
        # a Bernoulli(fraction) mean over 40,000 draws: 5 standard errors
        bound = 5 * ulp * (fraction * (1 - fraction) / x.numel()) ** 0.5
        assert abs(float(rounded.float().mean()) - float(x[0])) < bound, fraction
        assert abs(float(x.to(torch.bfloat16).float()[0]) - float(x[0])) > 10 * bound
        assert 1.0 - float(x[0]) < -10 * bound  # truncation (round toward zero) is biased too


def test_stochastic_rounding_keeps_signs_exact_values_and_non_finite_ones():
    torch.manual_seed(0)
    exact = torch.tensor(
        [0.0, -0.0, 1.5, -2.25, 2.0**120, -(2.0**-130), float("inf"), -float("inf")]
    )
    assert torch.equal(stochastic_round_bf16(exact).float(), exact)
    assert torch.equal(stochastic_round_bf16(exact).float().signbit(), exact.signbit())
    payloads = torch.tensor([0x7FC00000, 0x7FFFFFFF, -1, 0x7F800001], dtype=torch.int32)
    nans = payloads.view(torch.float32).repeat(1000)  # -1 is 0xFFFFFFFF: a negative nan
    assert nans.isnan().all() and stochastic_round_bf16(nans).isnan().all()
    big = stochastic_round_bf16(torch.full((1000,), 3.4e38))  # beyond bf16's largest, 3.39e38
    assert set(big.float().unique().tolist()) <= {torch.finfo(torch.bfloat16).max, float("inf")}
    small = stochastic_round_bf16(torch.full((1000,), -1.00001))
    assert set(small.float().unique().tolist()) == {-1.0, -1.0078125}
    x = torch.randn(1000)
    torch.manual_seed(3)
    first = stochastic_round_bf16(x)
    torch.manual_seed(3)
    assert torch.equal(first, stochastic_round_bf16(x))  # repeatable under manual_seed


@pytest.mark.parametrize("table_state", ["adam", "row_wise_adagrad"])
def test_a_bf16_table_moves_by_the_fp32_update_in_expectation_where_nearest_loses_it(table_state):
    rows, dim = 512, 64
    table = nn.Parameter(torch.ones(rows, dim, dtype=torch.bfloat16))
    # both options move each entry by 1e-4 on a first step with a gradient of ones
    opt = LazyAdam([table], lr=1e-4, table_lr=1e-4, eps=1e-12, table_state=table_state)
    ids = torch.arange(rows).repeat(2)  # every row, twice: duplicates summed in fp32
    ones = torch.ones(2 * rows, dim, dtype=torch.bfloat16)
    table.grad = torch.sparse_coo_tensor(ids[None], ones, (rows, dim), check_invariants=True)
    expected = 1 - 1e-4  # the fp32 update
    assert torch.equal(
        torch.tensor(expected).to(torch.bfloat16), torch.tensor(1.0, dtype=torch.bfloat16)
    )
    torch.manual_seed(0)
    opt.step()
    assert table.dtype == torch.bfloat16
    values = table.detach().float()
    assert set(values.unique().tolist()) == {1.0 - 2.0**-8, 1.0}
    p = 1e-4 / 2.0**-8  # the probability of rounding down to 1 - 2**-8
    bound = 5 * 2.0**-8 * (p * (1 - p) / values.numel()) ** 0.5
    assert abs(float(values.mean()) - expected) < bound  # bound: 1.7e-5, the update: 1e-4
    state = opt.state[table]
    assert all(v.dtype == torch.float32 for k, v in state.items() if k != "step")


def test_a_bf16_table_run_is_repeatable_under_manual_seed():
    def run(seed):
        torch.manual_seed(seed)
        table = nn.Parameter(torch.randn(N, D).to(torch.bfloat16))
        opt = LazyAdam([table], state_dtype="bfloat16", table_state="row_wise_adagrad")
        for step in range(3):
            table.grad = random_sparse_grad(step, dtype=torch.bfloat16)
            opt.step()
        return table.detach().clone()

    assert torch.equal(run(0), run(0))
    assert not torch.equal(run(0), run(1))


# -- checkpoints ---------------------------------------------------------------------------------


@pytest.mark.parametrize("table_state", ["adam", "row_wise_adagrad"])
def test_state_dict_round_trips_dtypes_and_shapes_and_the_next_steps_are_identical(table_state):
    torch.manual_seed(0)
    table = nn.Parameter(torch.randn(N, D).to(torch.bfloat16))
    linear = nn.Linear(D, 2)
    kwargs = dict(table_state=table_state, state_dtype=torch.float32, table_lr=0.05)
    opt = LazyAdam([table, *linear.parameters()], lr=0.01, **kwargs)

    def step(t, lin, o, i):
        t.grad = random_sparse_grad(i, dtype=torch.bfloat16)
        for p in lin.parameters():
            p.grad = torch.full_like(p, 0.1 * (i + 1))
        o.step()

    for i in range(3):
        step(table, linear, opt, i)
    twin_table, twin_linear = copy.deepcopy(table), copy.deepcopy(linear)
    loaded = LazyAdam([twin_table, *twin_linear.parameters()], lr=0.5)  # options come from it
    loaded.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert loaded.param_groups[0]["table_state"] == table_state
    assert loaded.param_groups[0]["table_lr"] == 0.05
    for key, value in opt.state[table].items():
        restored = loaded.state[twin_table][key]
        assert restored.dtype == value.dtype and torch.equal(restored, value), key
    shape = (N,) if table_state == "row_wise_adagrad" else (N, D)
    assert all(v.shape == shape for k, v in loaded.state[twin_table].items() if k != "step")
    for i in range(3, 5):
        torch.manual_seed(i)
        step(table, linear, opt, i)
        torch.manual_seed(i)
        step(twin_table, twin_linear, loaded, i)
    assert torch.equal(table, twin_table)
    for a, b in zip(linear.parameters(), twin_linear.parameters(), strict=True):
        assert torch.equal(a, b)


def test_an_older_checkpoint_without_the_options_loads_and_keeps_adam():
    table = nn.Parameter(torch.randn(N, D))
    opt = LazyAdam([table])
    table.grad = random_sparse_grad(0)
    opt.step()
    saved = opt.state_dict()
    for group in saved["param_groups"]:
        for key in ("table_state", "table_lr", "state_dtype"):
            del group[key]
    loaded = LazyAdam([table])
    loaded.load_state_dict(saved)
    assert loaded.param_groups[0]["table_state"] == "adam"
    table.grad = random_sparse_grad(1)
    loaded.step()
    switched = LazyAdam([table], table_state="row_wise_adagrad")
    switched.load_state_dict(saved)
    with pytest.raises(ValueError, match="table_state='row_wise_adagrad'"):
        switched.step()


def test_the_default_state_is_todays_two_moments_in_the_parameters_dtype():
    table = nn.Parameter(torch.randn(N, D, dtype=torch.float64))
    opt = LazyAdam([table])
    table.grad = random_sparse_grad(0).double()
    opt.step()
    state = opt.state[table]
    assert set(state) == {"step", "exp_avg", "exp_avg_sq"}
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float64


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"table_state": "rowwise"}, "table_state"),
        ({"table_state": None}, "table_state"),
        ({"table_lr": 0.0}, "table_lr"),
        ({"table_lr": float("inf")}, "table_lr"),
        ({"state_dtype": torch.float16}, "state_dtype"),
        ({"state_dtype": "float64"}, "state_dtype"),
    ],
)
def test_bad_lean_options_raise_value_error_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        LazyAdam([nn.Parameter(torch.zeros(2))], **kwargs)
    with pytest.raises(ValueError, match=name):  # in a parameter group too
        LazyAdam([{"params": [nn.Parameter(torch.zeros(2))], **kwargs}])


@pytest.mark.parametrize("nonzeros", ["every entry", "one entry"])
@pytest.mark.parametrize("table_state", ["adam", "row_wise_adagrad"])
def test_a_sparse_gradient_with_two_sparse_dims_is_refused_naming_sparse_dim(table_state, nonzeros):
    """Issue 32, item 2: an element-sparse gradient (``sparse * param`` gives one) crashed with
    several non-zeros and, with one, moved its whole row by ``-lr``; now it is refused."""
    table = nn.Parameter(torch.zeros(4, 3))
    grad = torch.ones(4, 3) if nonzeros == "every entry" else torch.zeros(4, 3)
    grad[1, 2] = 1.0
    table.grad = grad.to_sparse(2)
    with pytest.raises(ValueError, match="sparse_dim 2"):
        LazyAdam([table], table_state=table_state).step()
    assert torch.equal(table, torch.zeros(4, 3))


@pytest.mark.parametrize("table_state", ["adam", "row_wise_adagrad"])
def test_state_of_another_tables_rows_is_refused_not_indexed(table_state):
    """A whole table's state loaded for one rank's rows (a split table without ShardedTables)."""
    whole = nn.Parameter(torch.zeros(10, 3))
    whole.grad = torch.ones(10, 3).to_sparse(1)
    saved = LazyAdam([whole], table_state=table_state)
    saved.step()
    rows = nn.Parameter(torch.zeros(5, 3))
    optimizer = LazyAdam([rows], table_state=table_state)
    optimizer.load_state_dict(saved.state_dict())
    rows.grad = torch.ones(5, 3).to_sparse(1)
    with pytest.raises(ValueError, match="has 10 rows and its parameter 5"):
        optimizer.step()
