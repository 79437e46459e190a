"""Issue 32, item 13: bad input to CANE's beam search gives an empty answer for an empty batch
instead of torch's internal errors. Bad input to samplers (ids without one row per query,
integer queries, ...) is refused by name for every sampler in ``test_sampler_contract.py``."""

import torch

from lightning_sampled.heads import CaneHead


def test_beam_topk_of_no_query_is_empty_like_topk():
    head = CaneHead(50, 8, 3, 5)
    for shape in ((0, 8), (2, 0, 8)):
        z = torch.randn(shape)
        values, ids = head.beam_topk(z, 3)
        want_values, want_ids = head.topk(z, 3)
        assert values.shape == want_values.shape == ids.shape == want_ids.shape
        assert values.dtype == want_values.dtype and ids.dtype == want_ids.dtype
