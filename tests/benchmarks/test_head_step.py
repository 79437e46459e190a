"""benchmarks.head_step: every method builds and steps at a small N, the exact ones give the exact
softmax cross-entropy, and the bookkeeping (skips, ratios, gradient clean-up) says what it did."""

import argparse

import pytest
import torch

from benchmarks import head_step
from benchmarks.head_step import (
    METHODS,
    Method,
    make_problem,
    make_step,
    result_rows,
    skip_reason,
)
from lightning_sampled.heads import SampledSoftmaxHead

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, B, D = 200, 64, 16


def reference_loss(problem: head_step.Problem) -> float:
    """Mean softmax cross-entropy of the problem, in float64 from the definition."""
    logits = problem.z.detach().double() @ problem.table.double().T
    picked = logits.gather(1, problem.target[:, None]).squeeze(1)
    return float((torch.logsumexp(logits, dim=1) - picked).mean())


def runnable_methods() -> list[Method]:
    return [m for m in METHODS.values() if head_step.missing_requirement(m) is None]


def test_registry_has_every_head_and_peer_with_both_gradient_paths():
    sparse_capable = [
        "uniform",
        "uniform_shared",
        "unigram",
        "log_uniform",
        "in_batch",
        "midx_pq",
        "midx_rq",
        "midx_learn",
        "tapas",
        "ove",
        "cane",
    ]
    expected = {"plain_cross_entropy", "linear_cross_entropy", "cut_cross_entropy"}
    expected |= {"adaptive_log_softmax", "full_softmax_head", "full_softmax_head_chunked"}
    expected |= set(sparse_capable) | {f"{name}_sparse" for name in sparse_capable}
    assert set(METHODS) == expected
    assert {m.name for m in METHODS.values() if m.exact} == {
        "plain_cross_entropy",
        "linear_cross_entropy",
        "cut_cross_entropy",
        "full_softmax_head",
        "full_softmax_head_chunked",
    }


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_steps_with_a_finite_loss_and_the_gradient_it_claims(name):
    method = METHODS[name]
    missing = head_step.missing_requirement(method)
    if missing:
        pytest.skip(missing)
    problem = make_problem(N, B, D, "cpu")
    loss_fn, params = method.build(problem)
    loss = loss_fn()
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    weight = params[0]
    assert weight.grad is not None
    assert weight.grad.is_sparse == method.sparse_grad
    if method.family == "ours":  # our heads score the shared table, without a copy
        assert weight.data_ptr() == problem.table.data_ptr()
    assert problem.z.grad is not None and torch.isfinite(problem.z.grad).all()


def test_exact_methods_agree_with_the_float64_softmax_cross_entropy():
    problem = make_problem(N, B, D, "cpu")
    expected = reference_loss(problem)
    exact = [m for m in runnable_methods() if m.exact]
    assert len(exact) >= 3  # plain, linear_cross_entropy and the full head need no extra package
    for method in exact:
        loss_fn, _ = method.build(problem)
        assert float(loss_fn().detach()) == pytest.approx(expected, rel=1e-5), method.name


def test_the_targets_follow_the_zipf_law():
    """The Zipf law 1 / (i + 1) over 200 classes gives class 0 a share of 1 / H_200 = 0.171."""
    problem = make_problem(N, 20_000, D, "cpu")
    share = float((problem.target == 0).double().mean())
    harmonic = sum(1.0 / k for k in range(1, N + 1))
    assert share == pytest.approx(1.0 / harmonic, abs=0.01)
    assert int(problem.target.max()) < N


def test_a_step_drops_its_gradients_so_the_next_starts_without_them():
    problem = make_problem(N, B, D, "cpu")
    seen = []

    def recording_build(p):
        loss_fn, params = METHODS["uniform"].build(p)
        seen.extend(params)
        return loss_fn, params

    make_step(Method("probe", "ours", False, False, recording_build), problem)()
    assert seen and all(p.grad is None for p in seen)


@pytest.mark.parametrize(("name", "refreshes"), [("midx_learn", 3), ("midx_rq", 1)])
def test_only_midx_learn_reassigns_its_classes_inside_the_timed_step(name, refreshes, monkeypatch):
    """MIDX-Learn's codewords move every step, so its recipe reassigns every step and its timed
    step includes that; the k-means index is built once, before timing."""
    calls = []
    original = SampledSoftmaxHead.refresh_index
    monkeypatch.setattr(
        SampledSoftmaxHead, "refresh_index", lambda head: calls.append(1) or original(head)
    )
    step = make_step(METHODS[name], make_problem(N, B, D, "cpu"))
    step()
    step()
    assert len(calls) == refreshes


def test_a_peer_that_is_not_installed_is_skipped_with_a_reason():
    absent = Method("ghost", "peer", True, False, head_step.build_plain, requires="no_such_pkg_xyz")
    assert skip_reason(absent, N, B, D, "cpu") == "not installed: No module named 'no_such_pkg_xyz'"


def test_a_method_whose_estimate_exceeds_the_free_memory_is_skipped():
    plain = METHODS["plain_cross_entropy"]
    free = head_step.available_bytes("cpu")
    too_many = free // (plain.logits_bytes * B) + 1  # logits alone exceed what is free
    reason = skip_reason(plain, too_many, B, D, "cpu")
    assert reason is not None and reason.startswith("skipped: needs about")
    assert skip_reason(plain, N, B, D, "cpu") is None


def test_estimated_bytes_counts_the_logits_and_a_dense_table_gradient():
    plain, sparse = METHODS["plain_cross_entropy"], METHODS["uniform_sparse"]
    assert head_step.estimated_bytes(plain, 1000, 10, 8) == 12 * 10 * 1000 + 2 * 1000 * 8 * 4
    assert head_step.estimated_bytes(sparse, 1000, 10, 8) == 0
    cce = METHODS["cut_cross_entropy"]  # its Triton kernels never hold the logits
    assert head_step.estimated_bytes(cce, 1000, 10, 8, "cuda") == 2 * 1000 * 8 * 4
    assert head_step.estimated_bytes(cce, 1000, 10, 8, "cpu") == 12 * 10 * 1000 + 2 * 1000 * 8 * 4


def test_result_rows_give_time_and_memory_ratios_to_plain_cross_entropy():
    args = argparse.Namespace(sizes=[N], batch=B, dim=D, device="cpu", methods=list(METHODS))
    times = {(name, N): [2.0, 4.0, 3.0] for name in METHODS}
    times["plain_cross_entropy", N] = [6.0, 9.0, 12.0]
    peaks = {(name, N): float(2**20) for name in METHODS}
    peaks["plain_cross_entropy", N] = float(4 * 2**20)
    times["cut_cross_entropy", N] = "not installed: no module 'cut_cross_entropy'"
    peaks["cut_cross_entropy", N] = "not installed: no module 'cut_cross_entropy'"
    rows = {r["method"]: r for r in result_rows(args, times, peaks)}
    uniform = rows["uniform"]
    assert uniform["median_s"] == 3.0
    assert uniform["time_vs_plain"] == pytest.approx(3.0 / 9.0)
    assert uniform["peak_mib"] == 1.0
    assert uniform["memory_vs_plain"] == pytest.approx(0.25)
    assert uniform["status"] == "ok"
    assert rows["plain_cross_entropy"]["time_vs_plain"] == 1.0
    cce = rows["cut_cross_entropy"]
    assert cce["median_s"] == "" and cce["status"].startswith("not installed")


def test_memory_is_measured_in_a_fresh_process_and_grows_with_the_dense_gradient():
    """The dense gradient of a 20,000 x 16 table (1.2 MiB) shows in a sampled head's peak; the
    row-sparse path's peak stays below it."""
    sizes = [20_000]
    dense = head_step.memory_in_subprocess("uniform_shared", sizes, B, D, "cpu", 1)
    sparse = head_step.memory_in_subprocess("uniform_shared_sparse", sizes, B, D, "cpu", 1)
    table_bytes = sizes[0] * D * 4
    assert isinstance(dense[0], float) and isinstance(sparse[0], float)
    assert dense[0] >= table_bytes
    assert sparse[0] < table_bytes


def test_a_step_estimated_past_the_time_limit_is_skipped_linear_in_n():
    previous = (1_000, [0.9, 1.0, 5.0])  # median 1 s at N = 1,000
    assert head_step.slow_step_reason(None, 10_000, 5.0) is None
    assert head_step.slow_step_reason(previous, 4_000, 5.0) is None  # about 4 s
    reason = head_step.slow_step_reason(previous, 10_000, 5.0)  # about 10 s
    assert reason is not None and reason.startswith("skipped: about 10 s per step")


def test_the_selection_keeps_the_registry_order_and_always_the_reference():
    args = argparse.Namespace(methods=["tapas_sparse", "uniform"])
    names = [m.name for m in head_step.selected_methods(args)]
    assert names == ["plain_cross_entropy", "uniform", "tapas_sparse"]
