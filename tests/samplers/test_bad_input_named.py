"""Issue 32, item 13: bad input to samplers and to CANE's beam search gives a named error (or,
for an empty batch, an empty answer) instead of torch's internal errors."""

import pytest
import torch

from lightning_sampled.heads import CaneHead
from lightning_sampled.samplers import LogUniformSampler, MIDXSampler, UniformSampler


def built_midx() -> MIDXSampler:
    midx = MIDXSampler(50, 4, dim=8)
    midx.refresh(torch.randn(50, 8, generator=torch.Generator().manual_seed(0)))
    return midx


@pytest.mark.parametrize(
    "make", [built_midx, lambda: UniformSampler(50), lambda: LogUniformSampler(50)]
)
def test_per_query_ids_must_have_one_row_per_query(make):
    sampler = make()
    with pytest.raises(
        ValueError, match=r"one row per query of z \[B, D\], got ids of shape \(5, 2\)"
    ):
        sampler.log_prob(torch.randn(3, 8), torch.randint(50, (5, 2)))
    with pytest.raises(ValueError, match="one row per query"):
        sampler.sample_and_score(torch.randn(3, 8), 4, torch.randint(50, (5, 2)))
    assert sampler.log_prob(torch.randn(3, 8), torch.randint(50, (3, 2))).shape == (3, 2)
    assert sampler.log_prob(torch.randn(3, 8), torch.randint(50, (2,))).shape[-1] == 2  # shared


def test_integer_queries_are_refused_by_name():
    with pytest.raises(ValueError, match="z must be a floating-point"):
        built_midx().sample(torch.randint(5, (3, 8)), 4)


def test_beam_topk_of_no_query_is_empty_like_topk():
    head = CaneHead(50, 8, 3, 5)
    for shape in ((0, 8), (2, 0, 8)):
        z = torch.randn(shape)
        values, ids = head.beam_topk(z, 3)
        want_values, want_ids = head.topk(z, 3)
        assert values.shape == want_values.shape == ids.shape == want_ids.shape
        assert values.dtype == want_values.dtype and ids.dtype == want_ids.dtype
