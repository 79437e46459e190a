"""``reduction`` with a sampler that learns (MIDX-Learn): its auxiliary loss is added once to the
``"mean"`` and ``"sum"`` losses and shared among the scored positions, by weight, under
``"none"``. (The head contract tests every reduction with the other proposals, whose auxiliary
loss is 0.)"""

import torch
from fake_samplers import restart_draws

from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.samplers import MIDXSampler

N, D = 40, 6


def test_a_learning_samplers_auxiliary_loss_is_shared_by_weight_under_none():
    torch.manual_seed(0)
    sampler = MIDXSampler(N, 4, "rq", learnable=True, dim=D, kmeans_iters=3)
    head = SampledSoftmaxHead(N, D, sampler, 7, ignore_index=-1)
    head.refresh_index()
    z = torch.randn(2, 5, D)
    y = torch.randint(N, (2, 5))
    y[1, 2] = -1
    w = torch.rand(2, 5) + 0.5
    mask = y != -1
    queries = head.score_queries(z[mask])
    auxiliary = head.proposal_loss(queries)
    assert auxiliary.item() > 0.01  # large enough that a dropped or doubled share shows
    restart_draws(head, 3)
    losses = head.sampled_losses(queries, y[mask])
    restart_draws(head, 3)
    none = head(z, y, w, reduction="none")
    shares = auxiliary * w[mask] / w[mask].sum()
    torch.testing.assert_close(none[mask], losses * w[mask] + shares)
    assert none[1, 2].item() == 0.0
    restart_draws(head, 3)
    total = head(z, y, w, reduction="sum")
    torch.testing.assert_close(total, (losses * w[mask]).sum() + auxiliary)
    torch.testing.assert_close(none.sum(), total)
    restart_draws(head, 3)
    mean = head(z, y, w)
    torch.testing.assert_close(mean, (losses * w[mask]).sum() / w[mask].sum() + auxiliary)
