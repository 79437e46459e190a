"""Building heads and samplers from factories, injecting what a config cannot hold."""

from functools import partial

import pytest
import torch

from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead, TapasHead
from lightning_sampled.samplers import (
    LogUniformSampler,
    MIDXSampler,
    UniformSampler,
    UnigramSampler,
)
from recipes import SASRec
from recipes.specs import SamplerMixture, build_head, build_sampler, factory_class


def test_sampler_gets_only_the_injected_arguments_its_class_takes():
    counts = torch.tensor([0, 5, 1, 1])
    unigram = build_sampler(partial(UnigramSampler, alpha=0.5), 4, 6, 0, counts)
    assert isinstance(unigram, UnigramSampler) and unigram.padding_idx == 0
    assert unigram.alpha == 0.5 and unigram.num_classes == 4
    uniform = build_sampler(UniformSampler, 4, 6, 0, None)
    assert (uniform.num_classes, uniform.padding_idx) == (4, 0)
    learnable = build_sampler(partial(MIDXSampler, codebook_size=2, learnable=True), 5, 6, 0, None)
    assert learnable.dim == 6 and learnable.codewords.shape[-1] == 6


def test_head_gets_the_sampler_the_tied_table_and_one_padding_idx():
    sampler = build_sampler(UniformSampler, 4, 3, 0, None)
    weight = torch.nn.Parameter(torch.randn(4, 3))
    tapas = build_head(
        partial(TapasHead, num_negatives=2), 4, 3, weight=weight, padding_idx=0, sampler=sampler
    )
    assert isinstance(tapas, TapasHead) and tapas.sampler is sampler
    assert tapas.weight is weight and tapas.num_negatives == 2
    head = build_head(SampledSoftmaxHead, 4, 3, padding_idx=0, sampler=sampler)
    assert head.sampler is sampler and head.padding_idx == head.sampler.padding_idx == 0
    assert isinstance(build_head(FullSoftmaxHead, 4, 3), FullSoftmaxHead)


def test_mixture_components_are_built_with_the_injected_arguments():
    parts = [partial(MIDXSampler, codebook_size=2), LogUniformSampler]
    mixture = build_sampler(partial(SamplerMixture, parts, weights=[3, 1]), 6, 4, 0, None)
    assert [type(c) for c in mixture.components] == [MIDXSampler, LogUniformSampler]
    assert all((c.num_classes, c.padding_idx) == (6, 0) for c in mixture.components)
    assert mixture.weights == [0.75, 0.25] and mixture.padding_idx == 0


def test_factory_class_sees_through_partials():
    assert factory_class(TapasHead) is TapasHead
    assert factory_class(partial(partial(TapasHead, num_negatives=2), temperature=0.5)) is TapasHead
    with pytest.raises(ValueError, match="must be a class or a partial of one, got 3"):
        factory_class(3)


def test_bad_factories_are_clear():
    with pytest.raises(ValueError, match="UnigramSampler needs class_counts"):
        build_sampler(UnigramSampler, 4, 3, None, None)
    with pytest.raises(ValueError, match="FullSoftmaxHead takes no sampler"):
        build_head(FullSoftmaxHead, 4, 3, sampler=UniformSampler(4))


def test_python_callers_pass_classes_and_partials():
    model = SASRec(
        num_classes=12,
        dim=8,
        num_blocks=1,
        max_len=5,
        head=partial(SampledSoftmaxHead, num_negatives=5),
        sampler=UniformSampler,
    )
    assert model.head.weight is model.item_emb.weight and model.head.num_negatives == 5
    assert type(model.head.sampler) is UniformSampler and model.head.sampler.padding_idx == 0
    assert type(SASRec(num_classes=12, dim=8, num_blocks=1, max_len=5).head) is FullSoftmaxHead
