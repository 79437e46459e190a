"""The head contract (docs/architecture.md, "Heads"; the README's head options), tested once for
every head.

A new head is added by one line in :data:`HEADS`: a factory ``make(num_classes, dim, sampler,
**options)`` that passes the shared options (``weight``, ``bias``, ``padding_idx``,
``ignore_index``, ``chunk_size``, ``temperature``, ``normalize``, ``label_smoothing``, and
``sparse_grad`` for heads that draw) through to the head, plus what the head refuses. A head that
takes any ``sampler`` lists the other proposals of :data:`PROPOSALS` it runs with; the tests whose
outcome depends on the draws run over those pairs too (:data:`CASES`), the others over the heads
alone (:data:`BASE`). Every recipe head config (``recipes.registry``) must be the head class,
proposal and candidate set of some case (:func:`test_every_recipe_head_config_has_a_contract_case`).

Every comparison of two sampled losses seeds torch's global generator before each call, so both
draw the same classes; where the two calls see the same scored positions the draws are equal.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import pytest
import torch
import torch.nn.functional as F
from fake_samplers import draw_like_compiled_code, restart_draws
from tiny_configs import tiny_head
from torch import nn

from lightning_sampled.heads import (
    CaneHead,
    FullSoftmaxHead,
    OneVsEachHead,
    OutputHead,
    ProposalHead,
    SampledSoftmaxHead,
    TapasHead,
)
from lightning_sampled.protocols import HasProposal, Refreshable, Schedulable
from lightning_sampled.samplers import (
    LogUniformSampler,
    MIDXSampler,
    MixtureSampler,
    Sampler,
    UniformSampler,
    UnigramSampler,
)
from recipes.registry import entries

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, D = 48, 8
PAD = 5  # the padding class of the tests that set one (not 0: an off-by-one shows)
IGNORE = -7  # a non-default ignore_index, so that a head that hard-codes -100 shows
SEED = 11  # torch's global seed before every training-loss call

# -- the proposals ---------------------------------------------------------------------------------


def midx(mode: str, quantizer: str = "rq", **options) -> Callable[[int, int | None], Sampler]:
    return lambda n, pad: MIDXSampler(
        n, 4, quantizer, mode, padding_idx=pad, kmeans_iters=3, **options
    )


#: name -> make(num_classes, padding_idx); the ones with an index are built by the head's
#: refresh_index(), which :func:`build` calls for every head that draws
PROPOSALS: dict[str, Callable[[int, int | None], Sampler]] = {
    "uniform": lambda n, pad: UniformSampler(n, padding_idx=pad),
    "unigram": lambda n, pad: UnigramSampler(torch.arange(1.0, n + 1), padding_idx=pad),
    "log_uniform": lambda n, pad: LogUniformSampler(n, padding_idx=pad),
    "midx_rq_exact": midx("exact"),
    "midx_rq_fast": midx("fast"),
    "midx_pq_fast": midx("fast", "pq"),
    "mixture": lambda n, pad: MixtureSampler(
        [midx("fast")(n, pad), LogUniformSampler(n, padding_idx=pad)]
    ),
}
#: MIDX-Learn's trained codewords: for the head that runs it (it refuses ``normalize=True``)
LEARNABLE = {"midx_rq_learnable": midx("fast", learnable=True, dim=D)}
ANY = tuple(PROPOSALS)
PROPOSALS |= LEARNABLE
QUERY_INDEPENDENT = tuple(p for p in PROPOSALS if PROPOSALS[p](N, None).query_independent)

# -- the heads -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Head:
    """One head of the contract.

    Attributes:
        make: ``make(num_classes, dim, sampler, **options) -> OutputHead``.
        proposal: the :data:`PROPOSALS` entry passed as ``sampler`` by default (``None``: the
            head is built with ``sampler=None``, its own default, or takes no sampler).
        proposals: further proposals the draw-dependent tests also run the head with.
        refuses: shared options the head refuses (``ValueError`` naming the option) with the
            values of :data:`OPTION_VALUES`.
        breaks: why the training loss does not compile to one graph today (``None``: it
            does, and compiled must equal eager; ``tests/heads/test_compile.py`` counts breaks).
    """

    make: Callable[..., OutputHead]
    proposal: str | None = "uniform"
    proposals: tuple[str, ...] = ()
    refuses: tuple[str, ...] = ("label_smoothing",)
    breaks: str | None = None


def target_counts(n: int) -> torch.Tensor:
    """Fixed ``q_b`` of in-batch negatives, so that the head has no state that a training call
    changes (two calls under one seed then see the same proposal)."""
    return torch.arange(1.0, n + 1)


CANE = ("label_smoothing", "normalize")
DROPS = "drops ignored positions (ops/inputs.py: nonzero)"
CANE_BREAKS = f"{DROPS}; its tree cache compares data pointers (heads/cane.py)"

# fmt: off
HEADS: dict[str, Head] = {
    "full": Head(lambda n, d, s, **o: FullSoftmaxHead(n, d, backend="torch", **o), None, refuses=()),  # noqa: E501
    "full_triton": Head(lambda n, d, s, **o: FullSoftmaxHead(n, d, backend="triton", **o), None, refuses=(), breaks="the fused kernels launch from an autograd.Function, not a registered op"),  # noqa: E501
    "sampled_uniform": Head(lambda n, d, s, **o: SampledSoftmaxHead(n, d, s, 6, **o), proposals=ANY),  # noqa: E501
    "sampled_plain": Head(lambda n, d, s, **o: SampledSoftmaxHead(n, d, s, 6, in_batch_negatives=False, **o), proposals=ANY),  # noqa: E501
    "sampled_shared": Head(lambda n, d, s, **o: SampledSoftmaxHead(n, d, s, 6, shared_negatives=True, **o), proposals=QUERY_INDEPENDENT),  # noqa: E501
    "sampled_in_batch": Head(lambda n, d, s, **o: SampledSoftmaxHead(n, d, s, 3, in_batch_negatives=True, target_counts=target_counts(n), **o)),  # noqa: E501
    "sampled_limited": Head(lambda n, d, s, **o: SampledSoftmaxHead(n, d, s, 3, target_counts=target_counts(n), max_in_batch_draws=4, **o)),  # noqa: E501
    "sampled_grouped": Head(lambda n, d, s, **o: SampledSoftmaxHead(n, d, s, 3, target_counts=target_counts(n), max_in_batch_draws=4, in_batch_group_size=3, **o)),  # noqa: E501
    "sampled_in_batch_only": Head(lambda n, d, s, **o: SampledSoftmaxHead(n, d, s, 0, in_batch_negatives=True, target_counts=target_counts(n), **o)),  # noqa: E501
    "sampled_midx_learn": Head(lambda n, d, s, **o: SampledSoftmaxHead(n, d, s, 6, in_batch_negatives=False, **o), "midx_rq_learnable", refuses=("label_smoothing", "normalize"), breaks="MIDX's is_built and chunked draw read the host"),  # noqa: E501
    "sampled_midx": Head(lambda n, d, s, **o: SampledSoftmaxHead(n, d, s, 6, **o), "midx_rq_fast", breaks="MIDX's is_built and chunked draw read the host"),  # noqa: E501
    "tapas": Head(lambda n, d, s, **o: TapasHead(n, d, s, 4, presample_factor=3, selection_temperature=1.0, **o), proposals=QUERY_INDEPENDENT, breaks=f"{DROPS}; the first pass draws until K + 1 distinct classes"),  # noqa: E501
    "one_vs_each": Head(lambda n, d, s, **o: OneVsEachHead(n, d, s, 6, **o), None),
    "one_vs_each_sampler": Head(lambda n, d, s, **o: OneVsEachHead(n, d, s, 6, **o), proposals=ANY),  # noqa: E501
    "cane_flat": Head(lambda n, d, s, **o: CaneHead(n, d, 4, 6, 4, sampler=s, **o), proposals=ANY, refuses=CANE, breaks=CANE_BREAKS),  # noqa: E501
    "cane_path": Head(lambda n, d, s, **o: CaneHead(n, d, 4, 6, 4, parameterization="path", sampler=s, **o), refuses=(*CANE, "weight"), breaks=CANE_BREAKS),  # noqa: E501
    "cane_frequency": Head(lambda n, d, s, **o: CaneHead(n, d, 4, 6, 4, sampler=s, tree="frequency", class_counts=target_counts(n), num_subsets=3, **o), proposals=ANY, refuses=CANE, breaks=CANE_BREAKS),  # noqa: E501
}
# fmt: on

#: (head, proposal): every head with its own proposal, then with each further one it lists
BASE = [(name, spec.proposal) for name, spec in HEADS.items()]
CASES = BASE + [
    (name, p) for name, spec in HEADS.items() for p in spec.proposals if p != spec.proposal
]


def case_id(case: tuple[str, str | None]) -> str:
    name, proposal = case
    return name if proposal == HEADS[name].proposal else f"{name}-{proposal}"


over_cases = pytest.mark.parametrize("case", CASES, ids=case_id)
over_heads = pytest.mark.parametrize("case", BASE, ids=case_id)

#: a value of each shared option that a head either accepts (and then uses) or refuses
OPTION_VALUES: dict[str, Callable[[], object]] = {
    "weight": lambda: nn.Parameter(torch.randn(N, D)),
    "bias": lambda: nn.Parameter(torch.randn(N)),
    "padding_idx": lambda: PAD,
    "ignore_index": lambda: IGNORE,
    "chunk_size": lambda: 7,
    "temperature": lambda: 0.5,
    "normalize": lambda: True,
    "label_smoothing": lambda: 0.1,
}


def sampler_for(case, padding_idx=None, num_classes=N) -> Sampler | None:
    proposal = case[1]
    return None if proposal is None else PROPOSALS[proposal](num_classes, padding_idx)


def make(case, **options) -> OutputHead:
    """The head of ``case`` as its factory builds it (initial parameters, no refresh)."""
    sampler = sampler_for(case, options.get("padding_idx"))
    return HEADS[case[0]].make(N, D, sampler, **options)


def build(case, *, seed: int = 0, **options) -> OutputHead:
    """The head of ``case`` with ``options``, random parameters of a useful scale (logits of
    about unit spread, a random bias) and, for heads that draw, its index built."""
    torch.manual_seed(seed)
    head = make(case, **options)
    with torch.no_grad():
        head.weight.normal_(0.0, 1.5 / math.sqrt(D))
        if head.bias is not None:
            head.bias.normal_(0.0, 0.5)
        if isinstance(getattr(head, "edges", None), nn.Parameter):  # CANE's path edges
            head.edges.normal_(0.0, 0.5 / math.sqrt(D))
    if isinstance(head, ProposalHead):
        head.refresh_index()
    return head


def batch(shape=(3, 4), seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries ``[*shape, D]`` and targets ``[*shape]`` in ``[0, N)``, never :data:`PAD`."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(*shape, D, generator=g)
    y = torch.randint(N - 1, shape, generator=g)
    return z, y + (y >= PAD).long()


def seeded(fn, *args, seed: int = SEED):
    """``fn(*args)`` after ``restart_draws``: two calls draw the same negatives."""
    restart_draws(fn, seed)
    return fn(*args)


def dense(grad: torch.Tensor | None) -> torch.Tensor | None:
    return grad.to_dense() if grad is not None and grad.is_sparse else grad


def grads_of(head: OutputHead) -> dict[str, torch.Tensor]:
    return {name: dense(p.grad) for name, p in head.named_parameters() if p.grad is not None}


def reference_logits(head: OutputHead, z: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch: ``normalize(z) . normalize(v) / temperature + b`` over the head's class
    vectors ``v = head.class_table()`` (CANE path: the path sums), ``-inf`` at the padding."""
    q = F.normalize(z, dim=-1) if head.normalize else z
    table = head.class_table()
    table = F.normalize(table, dim=-1) if head.normalize else table
    logits = q @ table.T / head.temperature
    if head.bias is not None:
        logits = logits + head.bias
    if head.padding_idx is not None:
        logits = logits.index_fill(-1, torch.tensor([head.padding_idx]), -math.inf)
    return logits


@cache
def draws(name: str) -> bool:
    """Whether the head ``name`` is a :class:`ProposalHead` (takes ``sampler``, ``sparse_grad``)."""
    return isinstance(make((name, HEADS[name].proposal)), ProposalHead)


def skip_unless_it_draws(name: str) -> None:
    if not draws(name):
        pytest.skip(f"{name} is not a ProposalHead: it takes no sampler nor sparse_grad")


def per_position_losses(
    head: OutputHead, z: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The training objective ``[T]`` of each scored position of ``z`` ``[T, D]``, ``y`` ``[T]``
    (no ignored position), drawn under the current global seed, and the proposal's auxiliary
    loss of the step (a scalar, 0 unless the sampler learns)."""
    if isinstance(head, ProposalHead):
        queries = head.score_queries(z)
        return head.sampled_losses(queries, y), head.proposal_loss(queries)
    if type(head) is FullSoftmaxHead and not head.label_smoothing:
        return -head.log_prob(z, y), torch.zeros(())
    raise NotImplementedError(f"say here what {type(head).__name__}'s per-position losses are")


def close(got, want, tol=1e-5):
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


TYPICAL = dict(bias=True, padding_idx=PAD)

# -- 1. shapes -------------------------------------------------------------------------------------


@over_cases
@pytest.mark.parametrize("shape", [(6,), (3, 4)], ids=["BD", "BLD"])
def test_training_loss_and_exact_methods_have_the_contract_shapes(case, shape):
    head = build(case, **TYPICAL)
    z, y = batch(shape)
    z.requires_grad_()
    loss = seeded(head, z, y)
    assert loss.shape == () and loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert z.grad.shape == z.shape and torch.isfinite(z.grad).all()
    assert head.weight.grad is not None
    for name, p in head.named_parameters():
        if p.grad is not None:
            assert p.grad.shape == p.shape, name
            assert torch.isfinite(dense(p.grad)).all(), name
    k = 3
    with torch.no_grad():
        assert head.logits(z).shape == (*shape, N)
        assert head.log_prob(z, y).shape == shape
        assert head.full_loss(z, y).shape == ()
    values, indices = head.topk(z, k)
    assert values.shape == indices.shape == (*shape, k)
    assert values.dtype == torch.float32 and indices.dtype == torch.long


# -- 2. ignore_index -------------------------------------------------------------------------------


@over_cases
def test_ignored_positions_change_nothing(case):
    head = build(case, **TYPICAL, ignore_index=IGNORE)
    z, y = batch((3, 4))
    y[0, 1] = y[2, 3] = y[1, 0] = IGNORE
    mask = y != IGNORE
    z.requires_grad_()
    loss = seeded(head, z, y)
    loss.backward()
    kept_z = z.detach()[mask].requires_grad_()
    kept = seeded(head, kept_z, y[mask])
    kept.backward()
    close(loss, kept)
    assert torch.equal(z.grad[~mask], torch.zeros_like(z.grad[~mask]))
    close(z.grad[mask], kept_z.grad)
    with torch.no_grad():
        assert torch.equal(head.log_prob(z, y)[~mask], torch.zeros(3))
        close(head.full_loss(z, y), head.full_loss(z[mask], y[mask]))
    # -100 is not ignored by a head with another ignore_index: it is an id out of range
    with pytest.raises(IndexError, match="target"):
        head(z, y.masked_fill(~mask, -100))


@over_cases
def test_every_position_ignored_gives_zero_attached_to_the_graph(case):
    head = build(case, **TYPICAL, ignore_index=IGNORE)
    z, _ = batch((3, 4))
    z.requires_grad_()
    y = torch.full((3, 4), IGNORE)
    loss = seeded(head, z, y, torch.rand(3, 4))
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.equal(z.grad, torch.zeros_like(z))
    assert head.full_loss(z, y).item() == 0.0


# -- 3. padding_idx --------------------------------------------------------------------------------


@over_cases
def test_padding_class_is_never_predicted_nor_trained(case):
    head = build(case, **TYPICAL)
    z, y = batch((4, 4))
    with torch.no_grad():
        logits = head.logits(z)
        assert torch.isneginf(logits[..., PAD]).all()
        others = torch.cat([logits[..., :PAD], logits[..., PAD + 1 :]], dim=-1)
        assert torch.isfinite(others).all()
        # log_prob of every class but the padding, at every query: sums to 1 in probability
        classes = torch.tensor([c for c in range(N) if c != PAD])
        every = classes[:, None, None].expand(-1, *y.shape)
        log_probs = head.log_prob(z.expand(len(classes), *z.shape), every)
        close(log_probs.exp().sum(0), torch.ones(y.shape))
    _, indices = head.topk(z, N - 1)
    assert not (indices == PAD).any()
    assert torch.equal(indices.sort(-1).values, classes.expand(*y.shape, -1))
    for fn in (head, head.log_prob, head.full_loss):
        with pytest.raises(IndexError, match="padding_idx"):
            fn(z, y.masked_fill(y == y[0, 0], PAD))
    # the sampled loss never reads the padding row: three steps' draws, no gradient there
    for seed in range(3):
        seeded(head, z, y, seed=seed).backward()
    assert torch.equal(dense(head.weight.grad)[PAD], torch.zeros(D))
    assert head.bias.grad[PAD].item() == 0.0


# -- 4. sample_weight ------------------------------------------------------------------------------


@over_cases
def test_sample_weight_gives_the_weighted_mean_of_the_position_losses(case):
    head = build(case, **TYPICAL, ignore_index=IGNORE)
    z, y = batch((3, 4))
    y[0, 1] = y[2, 3] = IGNORE
    w = torch.rand(3, 4) * 3
    w[1, 1] = 0.0  # a scored position of weight 0
    mask = y != IGNORE
    z.requires_grad_()
    loss = seeded(head, z, y, w)
    restart_draws(head, SEED)
    losses, auxiliary = per_position_losses(head, z[mask], y[mask])
    close((losses * w[mask]).sum() / w[mask].sum() + auxiliary, loss)
    loss.backward()
    assert torch.equal(z.grad[1, 1], torch.zeros(D))  # weight 0: no gradient to its query
    # uniform weights are no weights
    close(seeded(head, z, y, torch.full((3, 4), 2.5)), seeded(head, z, y))
    negative = w.clone()
    negative[0, 0] = -0.5
    with pytest.raises(ValueError, match="sample_weight must be non-negative"):
        head(z, y, negative)
    with pytest.raises(ValueError, match="sample_weight is 0 at all"):
        head(z, y, torch.zeros(3, 4).masked_fill(~mask, 1.0))  # weight only where ignored
    with pytest.raises(ValueError, match="sample_weight must be a tensor of shape"):
        head(z, y, w.reshape(-1))


@over_cases
def test_reduction_none_gives_each_positions_weighted_loss_and_sum_their_total(case):
    head = build(case, **TYPICAL, ignore_index=IGNORE)
    z, y = batch((3, 4))
    y[0, 1] = y[2, 3] = IGNORE
    w = torch.rand(3, 4) * 3
    mask = y != IGNORE
    restart_draws(head, SEED)
    losses, auxiliary = per_position_losses(head, z[mask], y[mask])
    weighted = losses * w[mask]
    # the sampler's auxiliary loss is shared in proportion to the weights
    want = torch.zeros(3, 4).masked_scatter(mask, weighted + auxiliary * w[mask] / w[mask].sum())
    restart_draws(head, SEED)
    none = head(z, y, w, reduction="none")
    assert none.shape == y.shape and none.dtype == torch.float32
    close(none, want)
    assert torch.equal(none[~mask], torch.zeros(2))
    restart_draws(head, SEED)
    close(head(z, y, w, reduction="sum"), weighted.sum() + auxiliary)
    restart_draws(head, SEED)
    close(head(z, y, reduction="sum"), losses.sum() + auxiliary)
    restart_draws(head, SEED)
    close(head(z, y, w, reduction="mean"), weighted.sum() / w[mask].sum() + auxiliary)
    # the exact loss reduces alike
    exact = -head.log_prob(z, y) * w
    close(head.full_loss(z, y, w, reduction="none"), exact)
    close(head.full_loss(z, y, w, reduction="sum"), exact.sum())
    # weights 0 everywhere have a sum (0), not a mean; every position ignored gives zeros
    zero = torch.zeros(3, 4)
    close(head.full_loss(z, y, zero, reduction="sum"), torch.tensor(0.0))
    ignored = torch.full_like(y, IGNORE)
    z.requires_grad_()
    out = head(z, ignored, reduction="none")
    assert torch.equal(out, zero)
    out.sum().backward()
    assert torch.equal(z.grad, torch.zeros_like(z))
    for fn in (head, head.full_loss):
        with pytest.raises(ValueError, match="reduction must be one of"):
            fn(z, y, reduction="batchmean")


# -- 5. temperature and normalize ------------------------------------------------------------------

SETTINGS = [(0.5, False), (2.0, True)]


@over_heads
@pytest.mark.parametrize(("temperature", "normalize"), SETTINGS)
def test_exact_logits_are_normalize_z_dot_normalize_v_over_temperature_plus_b(
    case, temperature, normalize
):
    options = dict(TYPICAL, temperature=temperature, normalize=normalize, chunk_size=7)
    if normalize and "normalize" in HEADS[case[0]].refuses:
        with pytest.raises(ValueError, match="normalize"):
            build(case, **options)
        return
    head = build(case, **options)
    z, _ = batch((3, 4))
    close(head.logits(z), reference_logits(head, z))
    # settable (TemperatureSchedule): the logits less the bias scale with 1 / temperature
    assert isinstance(head, Schedulable) and "temperature" in head.schedulable
    bias = head.bias.detach()
    before = head.logits(z) - bias
    head.temperature = temperature / 4
    close(head.logits(z) - bias, 4 * before, tol=1e-4)


@over_cases
@pytest.mark.parametrize(("temperature", "normalize"), SETTINGS)
def test_training_loss_scores_the_normalized_query_over_temperature(case, temperature, normalize):
    """The head with ``temperature`` and ``normalize`` gives, on ``z``, the loss that the plain
    head with the unit class vectors gives on ``normalize(z) / temperature``: the sampled path
    (and the proposal) see what the exact methods score."""
    if normalize and "normalize" in HEADS[case[0]].refuses:
        pytest.skip(f"{case[0]} refuses normalize=True (test above)")
    head = build(case, **TYPICAL, temperature=temperature, normalize=normalize)
    plain = make(case, **TYPICAL)
    plain.load_state_dict(head.state_dict())  # the same index: built from unit rows if normalize
    if normalize:
        with torch.no_grad():
            plain.weight.copy_(F.normalize(head.weight, dim=-1))
    z, y = batch((3, 4))
    q = F.normalize(z, dim=-1) if normalize else z
    close(seeded(head, z, y), seeded(plain, q / temperature, y), tol=1e-4)


# -- 6. bf16 autocast ------------------------------------------------------------------------------


@over_cases
def test_bf16_autocast_loss_is_fp32_finite_and_close_to_fp32(case):
    head = build(case, **TYPICAL)
    z, y = batch((4, 4))
    z.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = seeded(head, z, y)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert z.grad.dtype == torch.float32 and torch.isfinite(z.grad).all()
    torch.testing.assert_close(loss, seeded(head, z, y), rtol=5e-2, atol=5e-2)


@over_heads
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_queries_of_any_float_dtype_give_an_fp32_loss_and_gradients_in_their_dtype(case, dtype):
    head = build(case, **TYPICAL)
    z, y = batch((4, 4))
    z = z.to(dtype).requires_grad_()
    loss = seeded(head, z, y)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert z.grad.dtype == dtype and torch.isfinite(z.grad).all()
    assert head.weight.grad.dtype == head.weight.dtype
    torch.testing.assert_close(loss, seeded(head, z.detach().float(), y), rtol=2e-2, atol=2e-2)
    assert head.logits(z).dtype == head.topk(z, 3)[0].dtype == torch.float32


# -- 7. sparse_grad --------------------------------------------------------------------------------


@over_cases
def test_sparse_table_gradient_equals_the_dense_one(case):
    skip_unless_it_draws(case[0])
    heads = [build(case, **TYPICAL, sparse_grad=sparse) for sparse in (False, True)]
    z, y = batch((3, 4))
    zs = [z.clone().requires_grad_() for _ in heads]
    for head, zi in zip(heads, zs, strict=True):
        assert head.sparse_grad == (head is heads[1])
        seeded(head, zi, y).backward()
    assert not heads[0].weight.grad.is_sparse
    assert heads[1].weight.grad.is_sparse and heads[1].weight.grad.layout == torch.sparse_coo
    want, got = grads_of(heads[0]), grads_of(heads[1])
    assert want.keys() == got.keys()
    for name in want:
        close(got[name], want[name])
    close(zs[1].grad, zs[0].grad)


# -- 8. state dict ---------------------------------------------------------------------------------


@over_cases
def test_state_dict_round_trip_restores_the_loss_and_the_exact_logits(case):
    head = build(case, **TYPICAL)
    z, y = batch((3, 4))
    with torch.no_grad():  # a step, then a refresh, so that the state is not the initial one
        head.weight.add_(0.1 * torch.randn(N, D))
    if isinstance(head, ProposalHead):
        head.refresh_index()
    torch.manual_seed(123)
    fresh = make(case, **TYPICAL)
    fresh.load_state_dict(head.state_dict(), strict=True)
    assert torch.equal(fresh.logits(z), head.logits(z))
    assert torch.equal(seeded(fresh, z, y), seeded(head, z, y))
    # the draw streams are in the state dict: a loaded head draws what the saved one draws next,
    # whatever torch's global generator holds
    fresh.load_state_dict(head.state_dict(), strict=True)
    torch.manual_seed(1)
    from_checkpoint = fresh(z, y)
    torch.manual_seed(2)
    assert torch.equal(from_checkpoint, head(z, y))


# -- 9. exact methods ------------------------------------------------------------------------------


@over_heads
def test_exact_methods_equal_the_full_softmax(case):
    head = build(case, **TYPICAL, chunk_size=7)
    z, y = batch((3, 4))
    z.requires_grad_()
    ref = reference_logits(head, z)
    params = [z, *head.parameters()]
    close(head.logits(z), ref)
    close(head.log_prob(z, y), torch.log_softmax(ref, -1).gather(-1, y[..., None])[..., 0])
    loss = head.full_loss(z, y)
    want = F.cross_entropy(ref.reshape(-1, N), y.reshape(-1))
    close(loss, want)
    got_grads = torch.autograd.grad(loss, params, allow_unused=True)
    want_grads = torch.autograd.grad(want, params, allow_unused=True)
    for got_grad, want_grad in zip(got_grads, want_grads, strict=True):
        if want_grad is None:
            assert got_grad is None or not got_grad.any()
        else:
            close(got_grad, want_grad, tol=1e-4)
    ref = ref.detach()
    values, indices = head.topk(z, 5)
    want_values, want_indices = ref.topk(5, dim=-1)
    close(values, want_values)
    assert torch.equal(indices, want_indices)
    exclude = torch.randint(N, (3, 4, 6))
    exclude[0, 0, :2] = -1  # padding of the exclusion lists
    exclude[1, 2, 0] = PAD
    masked = ref.scatter(-1, exclude.clamp(min=0), -math.inf)
    masked[0, 0] = ref[0, 0].scatter(-1, exclude[0, 0, 2:], -math.inf)
    values, indices = head.topk(z, 5, exclude=exclude)
    want_values, want_indices = masked.topk(5, dim=-1)
    close(values, want_values)
    assert torch.equal(indices, want_indices)


# -- 10. torch.compile -----------------------------------------------------------------------------

# test_compile.py counts where each head breaks the graph and compares inductor with eager; here a
# head that declares no ``breaks`` must compile with fullgraph=True through AOTAutograd and give
# eager's loss and gradients (no ignored position: under compile those are kept, weighted 0, and
# drawn for, so the draws would differ), on two batch shapes in a row, as a training loop's
# smaller last batch or another sequence length brings: the second call recompiles with
# symbolic sizes (dynamo's automatic dynamic shapes), which every draw must accept.


@over_heads
def test_declared_compiling_heads_compile_to_one_graph_equal_to_eager(case):
    breaks = HEADS[case[0]].breaks
    if breaks is not None:
        pytest.skip(f"{case[0]} breaks the graph today: {breaks}")
    head = draw_like_compiled_code(build(case, **TYPICAL))
    torch._dynamo.reset()
    compiled = torch.compile(head, backend="aot_eager", fullgraph=True)
    for shape in ((3, 4), (2, 5)):
        z, y = batch(shape)
        w = torch.rand(shape) + 0.5
        results = []
        before = copy.deepcopy(head.state_dict())  # a training call changes state (in-batch q_b)
        for fn in (head, compiled):
            head.load_state_dict(before)
            head.zero_grad()
            zi = z.clone().requires_grad_()
            loss = seeded(fn, zi, y, w)
            loss.backward()
            results.append([loss.detach(), zi.grad, *grads_of(head).values()])
        for got, want in zip(*results, strict=True):
            close(got, want)
    torch._dynamo.reset()


# -- every recipe head config is a contract case ------------------------------------------------

#: the attributes that set which candidates a head scores (those it has)
SOURCE_OPTIONS = ("shared_negatives", "in_batch_negatives", "tree_kind", "parameterization")


def proposal_kind(sampler: Sampler) -> str:
    """A proposal as the contract tells proposals apart: its class, MIDX's quantizer and whether
    it learns, a mixture's parts."""
    if isinstance(sampler, MixtureSampler):
        return " + ".join(proposal_kind(part) for part in sampler.components)
    if isinstance(sampler, MIDXSampler):
        return f"MIDX-{sampler.quantizer.name}{'-learnable' if sampler.learnable else ''}"
    return type(sampler).__name__


def structure(head: OutputHead) -> tuple:
    """What a head's contract outcomes depend on, sizes aside: its class, its proposal and the
    candidates it scores (drawn ones or none, shared, in-batch, CANE's tree)."""
    if not isinstance(head, ProposalHead):
        return (type(head).__name__,)
    sources = tuple(getattr(head, option, None) for option in SOURCE_OPTIONS)
    draws = getattr(head, "num_negatives", 1) > 0
    return (type(head).__name__, proposal_kind(head.sampler), draws, *sources)


def test_every_recipe_head_config_has_a_contract_case():
    """Each config of ``recipes/configs/heads`` (``recipes.registry``), built at a tiny size, is
    a head, proposal and candidate set that a case of :data:`CASES` runs; a new config that is
    not needs its line in :data:`HEADS` (or a proposal in a head's ``proposals``)."""
    covered = {structure(make(case)) for case in CASES}
    counts = torch.arange(1.0, N + 1)
    configs = {name: structure(tiny_head(name, N, D, class_counts=counts)) for name in entries()}
    missing = {name: kind for name, kind in configs.items() if kind not in covered}
    assert not missing, f"recipe head configs without a contract case: {missing}"


# -- 11. bad input ---------------------------------------------------------------------------------


@over_heads
def test_bad_queries_and_targets_are_refused_naming_the_argument(case):
    head = build(case, **TYPICAL)
    z, y = batch((3, 4))
    nan = z.clone()
    nan[1, 2, 3] = math.nan
    bad_z = [
        (z[..., :-1], "z must have shape"),
        (nan, "z contains NaN"),
        (z.long(), "z must be a floating-point"),
    ]
    bad_y = [
        (y.masked_fill(y == y[0, 0], N), IndexError, r"target must be in \[0, 48\)"),
        (y.masked_fill(y == y[0, 0], -3), IndexError, r"target must be in \[0, 48\)"),
        (y[:, :-1], ValueError, "target must have shape"),
        (y.float(), ValueError, "target must be an integer tensor"),
    ]
    for fn in (head, head.log_prob, head.full_loss):
        for bad, match in bad_z:
            with pytest.raises(ValueError, match=match):
                fn(bad, y)
        for bad, error, match in bad_y:
            with pytest.raises(error, match=match):
                fn(z, bad)
    for fn in (head.logits, lambda z: head.topk(z, 3)):
        for bad, match in bad_z:
            with pytest.raises(ValueError, match=match):
                fn(bad)
    for k in (0, N + 1):
        with pytest.raises(ValueError, match="k must be"):
            head.topk(z, k)
    with pytest.raises(IndexError, match="exclude"):
        head.topk(z, 3, exclude=torch.full((3, 4, 2), N))
    with pytest.raises(ValueError, match="exclude must have shape"):
        head.topk(z, 3, exclude=torch.zeros(4, 2, dtype=torch.long))


@over_heads
def test_a_nan_class_vector_gives_nan_numbers_and_a_refused_topk(case):
    """One documented behaviour (OutputHead's docstring): the exact methods that return numbers
    return NaN, visibly, as ``F.cross_entropy`` does and without a host sync; ``topk``, whose
    indices would hide it, refuses, naming the class."""
    head = build(case, **TYPICAL)
    with torch.no_grad():
        head.weight[PAD + 1] = math.nan  # not the padding class, which is never scored
    if not torch.isnan(head.class_table()[PAD + 1]).all():
        pytest.skip(f"{case[0]}'s class vectors are not the rows of its weight")
    z, y = batch((3, 4))
    assert torch.isnan(head.log_prob(z, y)).all()
    assert torch.isnan(head.full_loss(z, y))
    assert torch.isnan(head.logits(z)[..., PAD + 1]).all()
    with pytest.raises(ValueError, match=f"class table .*{PAD + 1}"):
        head.topk(z, 3)


BAD_OPTIONS = [
    ("num_classes", dict(num_classes=0)),
    ("dim", dict(dim=-1)),
    ("bias", dict(bias=nn.Parameter(torch.zeros(N + 1)))),
    ("bias", dict(bias=torch.zeros(N))),
    ("weight", dict(weight=nn.Parameter(torch.zeros(N, D + 1)))),
    ("weight", dict(weight=torch.zeros(N, D))),
    ("temperature", dict(temperature=0.0)),
    ("temperature", dict(temperature=math.nan)),
    ("ignore_index", dict(ignore_index=3)),
    ("padding_idx", dict(padding_idx=N)),
    ("chunk_size", dict(chunk_size=0)),
    ("normalize", dict(normalize="yes")),
    ("label_smoothing", dict(label_smoothing=1.5)),
]


@over_heads
def test_bad_constructor_options_are_refused_naming_them(case):
    spec = HEADS[case[0]]
    for name, bad in BAD_OPTIONS:
        options = dict(bad)
        n, d = options.pop("num_classes", N), options.pop("dim", D)
        with pytest.raises(ValueError, match=name):
            spec.make(n, d, sampler_for(case), **options)  # the head's check, not the sampler's


@over_heads
def test_shared_options_are_accepted_and_used_or_refused_as_declared(case):
    spec = HEADS[case[0]]
    for name, value in OPTION_VALUES.items():
        value = value()
        options = {name: value}
        if name in spec.refuses:
            with pytest.raises(ValueError, match=name):
                make(case, **options)
            continue
        head = make(case, **options)
        if isinstance(value, nn.Parameter):  # tied: the head's own parameter, trained
            assert getattr(head, name) is value
            if isinstance(head, ProposalHead):
                head.refresh_index()
            z, y = batch((3, 4))
            seeded(head, z, y).backward()
            assert value.grad is not None and dense(value.grad).abs().sum() > 0
        else:
            assert getattr(head, name) == value, name


# -- 12. heads that draw ---------------------------------------------------------------------------


@over_cases
def test_heads_that_draw_expose_their_proposal(case):
    torch.manual_seed(0)
    sampler = sampler_for(case, PAD)
    head = HEADS[case[0]].make(N, D, sampler, **TYPICAL)
    assert isinstance(head, Schedulable)
    if not isinstance(head, ProposalHead):
        assert not isinstance(head, HasProposal)
        return
    if sampler is None:  # the head's default proposal
        assert isinstance(head.sampler, Sampler)
    else:
        assert head.sampler is sampler
    assert isinstance(head, HasProposal) and isinstance(head, Refreshable)
    head.refresh_index()
    z, y = batch((3, 4))
    assert torch.isfinite(seeded(head, z, y))


@over_heads
def test_a_proposal_over_other_classes_is_refused_naming_sampler(case):
    skip_unless_it_draws(case[0])
    spec = HEADS[case[0]]
    proposal = case[1] or "uniform"
    for n, pad in ((N + 1, PAD), (N, PAD + 1), (N, None)):
        with pytest.raises(ValueError, match="sampler"):
            spec.make(N, D, PROPOSALS[proposal](n, pad), padding_idx=PAD)
