"""The names that issue 33 replaced keep working, with a ``FutureWarning`` naming the new one, and
build the same head as the new names."""

import warnings

import pytest
import torch

from lightning_sampled.heads import CaneHead, SampledSoftmaxHead, TapasHead
from lightning_sampled.samplers import UniformSampler, UnigramSampler

N, D = 40, 6


def same_loss(old, new, z, y):
    new.load_state_dict(old.state_dict())
    torch.manual_seed(3)
    want = new(z, y)
    torch.manual_seed(3)
    torch.testing.assert_close(old(z, y), want)


def test_tapas_presampler_is_sampler():
    sampler = UnigramSampler(torch.arange(1.0, N + 1))
    with pytest.warns(FutureWarning, match=r"presampler=.*use sampler="):
        old = TapasHead(N, D, num_negatives=4, presampler=sampler)
    assert old.sampler is sampler
    with pytest.warns(FutureWarning, match="TapasHead.presampler"):
        assert old.presampler is sampler
    new = TapasHead(N, D, UnigramSampler(torch.arange(1.0, N + 1)), 4)
    same_loss(old, new, torch.randn(5, D), torch.randint(N, (5,)))
    with pytest.raises(ValueError, match="both presampler= and sampler="):
        TapasHead(N, D, sampler, 4, presampler=sampler)


def test_tapas_old_temperatures_map_to_the_new_names():
    with pytest.warns(FutureWarning) as caught:
        old = TapasHead(N, D, num_negatives=4, temperature=0.3, logit_temperature=0.5)
    messages = " | ".join(str(w.message) for w in caught)
    assert "TapasHead(logit_temperature=...)" in messages
    assert "use selection_temperature=tau" in messages
    assert old.temperature == 0.5 and old.selection_temperature == 0.3
    new = TapasHead(N, D, None, 4, temperature=0.5, selection_temperature=0.3)
    same_loss(old, new, torch.randn(5, D), torch.randint(N, (5,)))


def test_tapas_temperature_alone_warns_that_its_meaning_changed():
    with pytest.warns(FutureWarning, match="now the temperature of the logits"):
        head = TapasHead(N, D, num_negatives=4, temperature=0.3)
    assert head.temperature == 0.3 and head.selection_temperature == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TapasHead(N, D, num_negatives=4, temperature=0.3, selection_temperature=1.0)
        TapasHead(N, D, num_negatives=4, temperature=1.0)


@pytest.mark.parametrize(
    ("switches", "convention"),
    [
        ({"logq_correction": True}, "exact_positive"),
        ({"logq_correction": True, "remove_accidental_hits": False}, "corrected_all"),
        ({"remove_accidental_hits": False}, "uncorrected_with_hits"),
        ({"logq_correction": False, "remove_accidental_hits": True}, "uncorrected"),
    ],
)
def test_tapas_correction_switches_are_conventions(switches, convention):
    with pytest.warns(FutureWarning, match=f"convention='{convention}'"):
        old = TapasHead(N, D, num_negatives=4, **switches)
    assert old.convention == convention
    new = TapasHead(N, D, None, 4, convention=convention)
    same_loss(old, new, torch.randn(5, D), torch.randint(N, (5,)))


def test_cane_noise_sampler_is_sampler():
    sampler = UniformSampler(N)
    with pytest.warns(FutureWarning, match=r"noise_sampler=.*use sampler="):
        old = CaneHead(N, D, 3, 4, noise_sampler=sampler)
    assert old.sampler is sampler
    with pytest.warns(FutureWarning, match="CaneHead.noise_sampler"):
        assert old.noise_sampler is sampler
    new = CaneHead(N, D, 3, 4, sampler=UniformSampler(N))
    same_loss(old, new, torch.randn(5, D), torch.randint(N, (5,)))


def test_logit_temperature_attribute_is_temperature():
    head = SampledSoftmaxHead(N, D, num_negatives=4)
    with pytest.warns(FutureWarning, match=r"logit_temperature is deprecated.*use \.temperature"):
        head.logit_temperature = 0.5
    assert head.temperature == 0.5
    with pytest.warns(FutureWarning):
        assert head.logit_temperature == 0.5
