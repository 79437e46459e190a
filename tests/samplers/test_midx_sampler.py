"""MIDXSampler: exact mode is the softmax, fast mode is Eq. (6), degenerate tables, checkpoints.
What every proposal must do (normalised, draws that follow log_q, padding, state dict,
restriction, growth, bad input) is in ``test_sampler_contract.py``."""

import io
import math

import pytest
import torch
from draw_law import chi_square_pvalue

from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.samplers import MIDXSampler
from lightning_sampled.samplers.inverse_cdf import inverse_cdf, inverse_cdf_in_row

QUANTIZERS = ["pq", "rq"]


def table(n: int, d: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def built(n=120, d=8, k=4, quantizer="rq", mode="fast", padding_idx=None, seed=0, scale=1.0):
    sampler = MIDXSampler(n, k, quantizer, mode, padding_idx=padding_idx, kmeans_iters=10)
    sampler.refresh(table(n, d, seed, scale))
    return sampler


def full_log_softmax(z, emb, padding_idx=None):
    logits = z @ emb.T
    if padding_idx is not None:
        logits[:, padding_idx] = -math.inf
    return torch.log_softmax(logits, dim=-1)


# -- exact mode: Theorem 1 -------------------------------------------------------------------------


@pytest.mark.parametrize("quantizer", QUANTIZERS)
@pytest.mark.parametrize("padding_idx", [None, 5])
def test_exact_mode_proposal_is_the_full_softmax(quantizer, padding_idx):
    n, d = 150, 8
    emb = table(n, d, seed=1)
    sampler = MIDXSampler(n, 5, quantizer, "exact", padding_idx=padding_idx, kmeans_iters=10)
    sampler.refresh(emb)
    z = table(6, d, seed=2)
    log_q = sampler.log_prob(z, torch.arange(n))
    expected = full_log_softmax(z, emb, padding_idx)
    torch.testing.assert_close(log_q.exp(), expected.exp(), atol=1e-5, rtol=1e-5)
    finite = torch.isfinite(expected)
    torch.testing.assert_close(log_q[finite], expected[finite], atol=1e-4, rtol=1e-5)
    assert torch.equal(torch.isfinite(log_q), finite)


# -- fast mode: Theorem 2 / Eq. (6) ----------------------------------------------------------------


@pytest.mark.parametrize("quantizer", QUANTIZERS)
@pytest.mark.parametrize("padding_idx", [None, 0])
def test_fast_mode_log_q_is_softmax_of_o_minus_residual_logits(quantizer, padding_idx):
    n, d, k = 200, 10, 4
    emb = table(n, d, seed=5)
    sampler = MIDXSampler(n, k, quantizer, "fast", padding_idx=padding_idx, kmeans_iters=10)
    sampler.refresh(emb)
    # Brute force from the buffers: q_i - r_i is the reconstruction c1[k1] (+) c2[k2].
    cells = sampler.class_cells
    k1, k2 = cells.clamp(min=0) // k, cells.clamp(min=0) % k
    c1, c2 = sampler.codewords[0], sampler.codewords[1]
    if quantizer == "pq":
        reconstruction = torch.cat([c1[k1], c2[k2]], dim=1)
    else:
        reconstruction = c1[k1] + c2[k2]
    residual = emb - reconstruction
    z = table(5, d, seed=6)
    o, o_residual = z @ emb.T, z @ residual.T
    closed_form = torch.log_softmax((o - o_residual).masked_fill(cells < 0, -math.inf), dim=-1)
    log_q = sampler.log_prob(z, torch.arange(n))
    finite = torch.isfinite(closed_form)
    torch.testing.assert_close(log_q[finite], closed_form[finite], atol=2e-5, rtol=1e-5)
    assert torch.equal(torch.isfinite(log_q), finite)
    # ... and it is not the softmax itself: the residuals matter.
    assert (log_q[finite] - full_log_softmax(z, emb, padding_idx)[finite]).abs().max() > 0.1


def test_fast_mode_chi_square_catches_a_wrong_proposal():
    # The same frequencies tested against the full softmax (not what fast mode draws) must fail.
    n, d = 200, 8
    emb = table(n, d, seed=7)
    sampler = MIDXSampler(n, 4, "pq", "fast", kmeans_iters=10)
    sampler.refresh(emb)
    z = table(1, d, seed=8)
    draw = sampler.sample(z, 40000, generator=torch.Generator().manual_seed(1))
    assert chi_square_pvalue(draw.ids[0], full_log_softmax(z, emb)[0].exp()) < 1e-6


def test_draws_stay_in_their_cell_and_empty_cells_are_never_drawn():
    # 64 cells for 40 classes: most cells are empty.
    sampler = built(n=40, d=6, k=8, quantizer="pq", seed=9)
    counts = sampler.cell_counts
    assert (counts == 0).sum() > 20
    z = table(4, 6, seed=10, scale=3.0)
    draw = sampler.sample(z, 5000, generator=torch.Generator().manual_seed(2))
    assert counts[sampler.class_cells[draw.ids]].min() > 0
    assert torch.isfinite(draw.log_q).all()
    # and the frequencies are the proposal's: an empty cell's share would land on a neighbour
    probs = sampler.log_prob(z, torch.arange(40)).exp()
    for b in range(4):
        assert chi_square_pvalue(draw.ids[b], probs[b]) > 1e-3


def test_inverse_cdf_never_returns_a_zero_probability_entry():
    probs = torch.tensor([[0.25, 0.0, 0.75, 0.0, 0.0]])
    u = torch.tensor([[0.0, 0.25, 0.2499, 0.99999994]])
    assert inverse_cdf(probs, u).tolist() == [[0, 2, 0, 2]]
    # fp32 running sums that end below 1 (here 0.9999) still map every u in [0, 1) in range.
    short = torch.tensor([[0.3, 0.3, 0.3999, 0.0]])
    assert inverse_cdf(short, torch.tensor([[0.99999994]])).item() == 2


def test_inverse_cdf_in_row_draws_from_the_chosen_row_only():
    probs = torch.tensor(
        [[[0.0, 0.5, 0.5, 0.0], [0.0] * 4, [0.2, 0.0, 0.0, 0.0], [1.0, 1.0, 0, 0]]]
    )
    rows = torch.tensor([[0, 0, 0, 2, 2, 3, 3, 3]])
    u = torch.tensor([[0.0, 0.5, 0.99999994, 0.0, 0.99999994, 0.0, 0.5, 0.99999994]])
    assert inverse_cdf_in_row(probs, rows, u).tolist() == [[1, 2, 2, 0, 0, 0, 1, 1]]
    g = torch.Generator().manual_seed(0)
    probs = torch.rand(3, 5, 5, generator=g) * (torch.rand(3, 5, 5, generator=g) > 0.4)
    probs[:, :, 0] += 1e-3
    rows = torch.randint(0, 5, (3, 20000), generator=g)
    cols = inverse_cdf_in_row(probs, rows, torch.rand(3, 20000, generator=g))
    assert (probs[torch.arange(3)[:, None], rows, cols] > 0).all()
    for r in range(5):
        drawn = torch.bincount(cols[0][rows[0] == r], minlength=5).double()
        expected = probs[0, r].double() / probs[0, r].sum()
        torch.testing.assert_close(drawn / drawn.sum(), expected, atol=0.03, rtol=0)


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_autocast_leaves_the_proposal_in_fp32(mode):
    sampler = built(mode=mode)
    z = table(3, 8, seed=1)
    expected = sampler.log_prob(z, torch.arange(120))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = sampler.log_prob(z.bfloat16(), torch.arange(120))
        draw = sampler.sample(z, 10, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(got, sampler.log_prob(z.bfloat16().float(), torch.arange(120)))
    assert got.dtype == torch.float32 and draw.log_q.dtype == torch.float32
    torch.testing.assert_close(draw.log_q, expected.gather(1, draw.ids))


@pytest.mark.parametrize("mode", ["fast", "exact"])
@pytest.mark.parametrize("quantizer", QUANTIZERS)
def test_sample_and_score_scores_the_positive_from_the_draws_proposal(mode, quantizer, monkeypatch):
    sampler = built(mode=mode, quantizer=quantizer, padding_idx=5)
    z = table(4, 8, seed=1)
    positives = torch.tensor([[0], [5], [119], [42]])  # 5 is the padding class: -inf
    calls = []
    stage_logits = sampler._stage_logits
    monkeypatch.setattr(sampler, "_stage_logits", lambda q: calls.append(1) or stage_logits(q))
    draw, log_q = sampler.sample_and_score(
        z, 30, positives, generator=torch.Generator().manual_seed(3)
    )
    assert len(calls) == 1, "the codeword logits must be computed once for draw and score"
    alone = sampler.sample(z, 30, generator=torch.Generator().manual_seed(3))
    assert torch.equal(draw.ids, alone.ids) and torch.equal(draw.log_q, alone.log_q)
    torch.testing.assert_close(log_q, sampler.log_prob(z, positives))
    assert log_q[1, 0] == -math.inf and torch.isfinite(log_q[[0, 2, 3]]).all()


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_sampled_softmax_head_trains_with_midx(mode):
    """Training the class table with MIDX negatives learns the targets' distribution: the KL
    from it to the model's exact softmax falls from 2.3 to below 0.3, and the most likely class
    of every context is the targets' mode. (A detached gradient stays at 2.3, a log q of the
    wrong sign ends near 1.6, no correction at all near 0.75.)"""
    n, d, contexts = 30, 8, 4
    g = torch.Generator().manual_seed(0)
    z = torch.randn(contexts, d, generator=g)
    probs = torch.tensor([0.6, 0.25, 0.1] + [0.05 / (n - 3)] * (n - 3))
    target_probs = torch.stack([probs[torch.randperm(n, generator=g)] for _ in range(contexts)])
    torch.manual_seed(0)
    head = SampledSoftmaxHead(n, d, MIDXSampler(n, 4, "rq", mode, kmeans_iters=5), 20)
    optimizer = torch.optim.Adam(head.parameters(), lr=0.15)

    def kl_to_the_model() -> float:
        log_model = torch.log_softmax(z @ head.weight.detach().T, dim=-1)
        return float((target_probs * (target_probs.log() - log_model)).sum(-1).mean())

    before = kl_to_the_model()
    context = torch.arange(contexts).repeat_interleave(32)
    for step in range(40):
        if step % 10 == 0:
            head.refresh_index()  # as IndexRefresh would, so that the proposal follows the table
        target = torch.multinomial(target_probs, 32, replacement=True, generator=g).flatten()
        optimizer.zero_grad()
        head(z[context], target).backward()
        optimizer.step()
    assert before > 2.0
    assert kl_to_the_model() < 0.3
    assert torch.equal((z @ head.weight.detach().T).argmax(-1), target_probs.argmax(-1))


# -- degenerate tables, huge queries ------------------------------------------------------------

DEGENERATE_TABLES = {
    "all_zero": torch.zeros(40, 6),
    "two_point": torch.cat([torch.ones(20, 6), -torch.ones(20, 6)]),
}
VARIANTS = [(q, m, learn) for q in QUANTIZERS for m in ("fast", "exact") for learn in (False, True)]


@pytest.mark.parametrize(("quantizer", "mode", "learnable"), VARIANTS)
@pytest.mark.parametrize("name", list(DEGENERATE_TABLES))
@pytest.mark.parametrize("scale", [1.0, 1e30])
def test_degenerate_class_tables_give_a_normalised_proposal(
    quantizer, mode, learnable, name, scale
):
    """Empty codewords and cells (a zero-initialised table: one distinct row for 16 cells; two
    distinct rows) get probability 0: log_q is finite for every draw, the proposal sums to one
    over all classes and nothing of probability 0 is drawn, also for queries of 1e30."""
    emb = DEGENERATE_TABLES[name]
    sampler = MIDXSampler(40, 4, quantizer, mode, learnable, dim=6, padding_idx=3, kmeans_iters=3)
    sampler.refresh(emb)
    sampler.refresh(emb)  # learnable: the second refresh reassigns with the learned codewords
    z = table(3, 6, seed=1, scale=scale)
    log_q = sampler.log_prob(z, torch.arange(40))
    assert not log_q.isnan().any()
    torch.testing.assert_close(log_q.exp().sum(-1), torch.ones(3))
    draw = sampler.sample(z, 2000, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(draw.log_q).all()
    assert torch.equal(draw.log_q, sampler.log_prob(z, draw.ids))
    assert (log_q.gather(1, draw.ids) > -math.inf).all()  # no class of probability 0 drawn
    assert not (draw.ids == 3).any()


@pytest.mark.parametrize("mode", ["fast", "exact"])
@pytest.mark.parametrize("quantizer", QUANTIZERS)
@pytest.mark.parametrize("scale", [1e3, 1e10, 1e30, 1e37])
def test_huge_queries_keep_log_q_normalised(mode, quantizer, scale):
    """Finite queries with logits up to 1e38: fast mode used to report log_q summing to the size
    of the best cell (8 to 17) from 1e10 on, as ``s1 + s2 - log Z`` rounds away ``log|Omega|``."""
    sampler = built(n=200, d=8, k=4, quantizer=quantizer, mode=mode, seed=2)
    z = table(4, 8, seed=3, scale=scale)
    log_q = sampler.log_prob(z, torch.arange(200))
    torch.testing.assert_close(log_q.exp().sum(-1), torch.ones(4))
    draw = sampler.sample(z, 500, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(draw.log_q).all()
    assert torch.equal(draw.log_q, sampler.log_prob(z, draw.ids))


@pytest.mark.parametrize("quantizer", QUANTIZERS)
@pytest.mark.parametrize("norm", [1e5, 1e9, 1e18])
@pytest.mark.parametrize("seed", [0, 2])
def test_exact_mode_stays_normalised_beside_one_huge_class_row(quantizer, norm, seed):
    """One class row of norm 1e5-1e18 owns a codeword whose logit dwarfs the others': the rows
    of cells below it used to add ``log omega`` to ``s2 ~ -1e8`` in fp32 and lose it, so that
    PQ's exact ``log_q`` summed to 0.7-12 per query."""
    n, k, huge = 500, 16, 7
    emb = table(n, 4, seed=seed)
    emb[huge] *= norm / emb[huge].norm()
    sampler = MIDXSampler(n, k, quantizer, "exact", kmeans_iters=5)
    sampler.refresh(emb)
    z = table(6, 4, seed=seed + 100)
    log_q = sampler.log_prob(z, torch.arange(n))
    torch.testing.assert_close(log_q.double().exp().sum(-1), torch.ones(6, dtype=torch.float64))
    draw = sampler.sample(z, 4000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(draw.log_q, sampler.log_prob(z, draw.ids))
    # the rows the draws fall in: their share among the draws is their probability
    rows = draw.ids != huge
    share = rows.double().mean(1)
    expected = 1.0 - log_q[:, huge].double().exp()
    assert (share - expected).abs().max() < 5 * math.sqrt(0.25 / 4000) + 1e-9


def test_queries_whose_logits_overflow_get_a_clear_error():
    sampler = built(n=100, d=8, k=4, mode="exact", seed=2)
    z = 1e38 * table(2, 8, seed=3).sign()  # finite, but z . residual overflows to +-inf
    with pytest.raises(RuntimeError, match="logits z . c overflow fp32"):
        sampler.sample(z, 5)


# -- refresh, checkpoints -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fast", "exact"])
@pytest.mark.parametrize("quantizer", QUANTIZERS)
def test_checkpoint_restores_the_index_bit_for_bit(mode, quantizer):
    n, d = 90, 6
    source = MIDXSampler(n, 4, quantizer, mode, padding_idx=2, kmeans_iters=5)
    source.refresh(table(n, d, seed=11))
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    restored = MIDXSampler(n, 4, quantizer, mode, padding_idx=2)
    assert not restored.is_built
    restored.load_state_dict(torch.load(buffer))
    assert restored.is_built
    for (name, a), (_, b) in zip(source.named_buffers(), restored.named_buffers(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a.nan_to_num(), b.nan_to_num()), name
    z = table(4, d, seed=12)
    a = source.sample(z, 64, generator=torch.Generator().manual_seed(5))
    b = restored.sample(z, 64, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.ids, b.ids) and torch.equal(a.log_q, b.log_q)


def test_head_checkpoint_restores_sampling():
    n, d = 70, 8
    head = SampledSoftmaxHead(n, d, MIDXSampler(n, 4, kmeans_iters=5), 10)
    head.refresh_index()
    other = SampledSoftmaxHead(n, d, MIDXSampler(n, 4), 10)
    other.load_state_dict(head.state_dict())
    z = torch.randn(3, d)
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    assert torch.equal(
        head.sampler.sample(z, 20, generator=g1).ids, other.sampler.sample(z, 20, generator=g2).ids
    )


@pytest.mark.parametrize(
    ("saved", "loading", "match"),
    [
        (dict(quantizer="rq"), dict(quantizer="pq"), "quantizer='rq' and this MIDXSampler has"),
        (dict(quantizer="pq"), dict(quantizer="rq"), "quantizer='pq'"),
        (dict(codebook_size=4), dict(codebook_size=5), "codebook_size=4"),
    ],
)
def test_a_checkpoint_of_another_index_is_refused_at_load(saved, loading, match):
    """An RQ head's state fits a PQ head's resizable buffers: it used to load silently, then
    the first draw failed with "z must have 16 features to match the index, got 8"."""
    n, d = 70, 16
    options = dict(quantizer="rq", codebook_size=4) | saved
    head = SampledSoftmaxHead(n, d, MIDXSampler(n, options.pop("codebook_size"), **options), 10)
    head.refresh_index()
    options = dict(quantizer="rq", codebook_size=4) | loading
    other = SampledSoftmaxHead(n, d, MIDXSampler(n, options.pop("codebook_size"), **options), 10)
    with pytest.raises(ValueError, match=match):
        other.load_state_dict(head.state_dict())


def test_a_checkpoint_from_before_the_index_kind_was_saved_still_loads():
    """Checkpoints whose sampler state holds only the draw stream load as they did."""
    n, d = 70, 8
    head = SampledSoftmaxHead(n, d, MIDXSampler(n, 4, kmeans_iters=5), 10)
    head.refresh_index()
    state = head.state_dict()
    state["sampler._extra_state"] = {"seed": 3, "draws": 7}
    other = SampledSoftmaxHead(n, d, MIDXSampler(n, 4), 10)
    other.load_state_dict(state)
    assert other.sampler.draw_stream.state() == {"seed": 3, "draws": 7}
    assert torch.equal(other.sampler.codewords, head.sampler.codewords)


def test_refresh_warm_starts_and_counts():
    sampler = built(n=300, d=8, k=6)
    first = sampler.codewords.clone()
    sampler.refresh(table(300, 8, seed=0) + 0.01)
    assert int(sampler.num_refreshes) == 2
    assert (sampler.codewords - first).abs().max() < 0.2
    stats = sampler.index_stats()
    assert stats["nonempty_cells"] <= 36 and stats["quantization_mse"] > 0
    assert stats["max_cell_size"] == float(sampler.cell_counts.max())


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"codebook_size": 1}, "codebook_size must be in"),
        ({"codebook_size": 11}, "codebook_size must be in"),
        ({"codebook_size": 10, "padding_idx": 0}, r"codebook_size must be in \[2, 9\]"),
        ({"quantizer": "opq"}, "quantizer must be one of"),
        ({"mode": "approx"}, "mode must be one of"),
        ({"learnable": True}, "learnable=True needs dim"),
        ({"quantizer": "pq", "dim": 7}, "must be even, got 7"),
        ({"kl_num_classes": 0}, "kl_num_classes must be a positive integer"),
        ({"kl_weight": -1.0}, "kl_weight must be a finite number"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, match):
    args = {"codebook_size": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        MIDXSampler(10, **args)


def test_refresh_rejects_bad_class_tables():
    sampler = MIDXSampler(20, 4, "pq")
    with pytest.raises(ValueError, match="must be even, got 5"):
        sampler.refresh(torch.randn(20, 5))
    with pytest.raises(ValueError, match=r"shape \[num_classes=20, D\]"):
        sampler.refresh(torch.randn(19, 4))
    bad = torch.randn(20, 4)
    bad[3, 1] = math.nan
    with pytest.raises(ValueError, match=r"class_embeddings contains NaN values \(row 3 of"):
        sampler.refresh(bad)
    bad[3, 1] = math.inf
    with pytest.raises(ValueError, match="class_embeddings contains infinite values"):
        sampler.refresh(bad)
    bad[3, 1] = 3e38  # finite, but faiss' fp32 distances overflow: it used to abort the process
    with pytest.raises(ValueError, match=r"class_embeddings has a row of norm 3e\+38 \(row 3\)"):
        sampler.refresh(bad)
    assert not sampler.is_built
    with pytest.raises(ValueError, match="D = dim = 6"):
        MIDXSampler(20, 4, dim=6).refresh(torch.randn(20, 4))


def test_using_the_sampler_before_its_first_refresh_is_a_clear_error():
    sampler = MIDXSampler(20, 4)
    with pytest.raises(RuntimeError, match="no index yet: call refresh"):
        sampler.sample(torch.randn(2, 4), 3)
    with pytest.raises(RuntimeError, match="no index yet"):
        sampler.log_prob(torch.randn(2, 4), torch.tensor([1]))
    sampler.refresh(torch.randn(20, 4))
    with pytest.raises(ValueError, match="z must have 4 features"):
        sampler.sample(torch.randn(2, 5), 3)
