"""Building heads and samplers from specs."""

import pytest
import torch

from lightning_sampled.heads import SampledSoftmaxHead, TapasHead
from lightning_sampled.samplers import UnigramSampler
from recipes.specs import build_head, build_sampler


def test_bare_names_and_injected_arguments():
    counts = torch.tensor([0, 5, 1, 1])
    sampler = build_sampler({"class_path": "UnigramSampler"}, 4, 3, 0, counts)
    assert isinstance(sampler, UnigramSampler)
    weight = torch.nn.Parameter(torch.randn(4, 3))
    head = build_head(
        {"class_path": "TapasHead", "init_args": {"num_negatives": 2}},
        4,
        3,
        weight=weight,
        padding_idx=0,
        sampler=sampler,
    )
    assert isinstance(head, TapasHead) and head.presampler is sampler and head.weight is weight
    head = build_head({"class_path": "SampledSoftmaxHead"}, 4, 3, padding_idx=0, sampler=sampler)
    assert isinstance(head, SampledSoftmaxHead) and head.sampler is sampler


def test_bad_specs_are_clear():
    with pytest.raises(ValueError, match="unknown OutputHead 'Nope'.*FullSoftmaxHead"):
        build_head({"class_path": "Nope"}, 4, 3)
    with pytest.raises(ValueError, match="unknown Sampler 'torch.nn.Linear'"):
        build_sampler({"class_path": "torch.nn.Linear"}, 4, 3, None, None)
    with pytest.raises(ValueError, match="UnigramSampler needs class_counts"):
        build_sampler({"class_path": "UnigramSampler"}, 4, 3, None, None)
    with pytest.raises(ValueError, match="takes no sampler"):
        build_head({"class_path": "FullSoftmaxHead"}, 4, 3, sampler=object())
    with pytest.raises(ValueError, match="head FullSoftmaxHead has no argument 'args'; it takes"):
        build_head({"class_path": "FullSoftmaxHead", "args": {}}, 4, 3)
    with pytest.raises(ValueError, match="sampler UniformSampler has no argument 'alpha'"):
        build_sampler({"class_path": "UniformSampler", "init_args": {"alpha": 1}}, 4, 3, 0, None)
    with pytest.raises(ValueError, match="init_args must be a mapping"):
        build_head({"class_path": "FullSoftmaxHead", "init_args": [1]}, 4, 3)


def test_flattened_init_args_win_over_init_args():
    spec = {"class_path": "SampledSoftmaxHead", "init_args": {"num_negatives": 5}}
    assert build_head({**spec, "num_negatives": 7}, 4, 3).num_negatives == 7
    assert build_head(spec, 4, 3).num_negatives == 5
