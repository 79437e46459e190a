"""recipes.registry: one entry per head config, parsed from the YAML and built through
recipes.specs, at the configs' own sizes and at tiny ones."""

import pytest
import torch
import yaml
from tiny_configs import tiny_head

from lightning_sampled.heads import ProposalHead
from recipes.registry import HEAD_CONFIGS, LABELS, entries, entry, parse
from recipes.specs import factory_class

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEMS = sorted(path.stem for path in HEAD_CONFIGS.glob("*.yaml"))
N, D = 48, 8


def yaml_model(name: str) -> dict:
    """The ``model.init_args`` of config ``name`` as the YAML writes them."""
    return yaml.safe_load((HEAD_CONFIGS / f"{name}.yaml").read_text())["model"]["init_args"]


def sizes_and_flags(init_args: dict) -> dict:
    """The numbers and booleans among ``init_args`` (what a head or sampler keeps as is)."""
    return {k: v for k, v in init_args.items() if isinstance(v, int | float)}


def test_every_config_is_an_entry_with_a_label():
    assert sorted(entries()) == STEMS
    assert sorted(LABELS) == STEMS, "add a label to recipes.registry.LABELS for every config"
    assert all(entries()[name].label == LABELS[name] for name in STEMS)


def assert_parsed(factory, spec: dict) -> None:
    """``factory`` is the class of ``spec`` with every one of its ``init_args`` (nested
    factories, a mixture's ``components``, alike)."""
    assert factory_class(factory).__name__ == spec["class_path"].rsplit(".", 1)[1]
    for option, value in spec.get("init_args", {}).items():
        if isinstance(value, list) and all(isinstance(v, dict) for v in value):
            for part, part_spec in zip(factory.keywords[option], value, strict=True):
                assert_parsed(part, part_spec)
        else:
            assert factory.keywords[option] == value, option


def assert_kept(module: torch.nn.Module, spec: dict) -> None:
    """The numbers and flags of ``spec``'s ``init_args`` are ``module``'s, where it keeps them
    under their names (most options are kept so)."""
    assert type(module).__name__ == spec["class_path"].rsplit(".", 1)[1]
    for option, value in sizes_and_flags(spec.get("init_args", {})).items():
        assert getattr(module, option, value) == value, option


@pytest.mark.parametrize("name", STEMS)
def test_the_configs_options_reach_the_head_and_its_sampler(name):
    """Built at the config's own sizes, the head and the sampler are the classes the YAML names
    with every option it gives them."""
    model, config = yaml_model(name), entry(name)
    head = config.head(512, D, class_counts=torch.ones(512))
    assert_parsed(config.head_factory, model["head"])
    assert_kept(head, model["head"])
    if model.get("sampler") is not None:
        assert_parsed(config.sampler_factory, model["sampler"])
        assert_kept(head.sampler, model["sampler"])


@pytest.mark.parametrize("name", STEMS)
def test_every_config_trains_at_a_tiny_size(name):
    """Forward and backward of the tiny head (its index built, as IndexRefresh would) give a
    finite loss and a gradient on the class table."""
    torch.manual_seed(0)
    head = tiny_head(name, N, D, class_counts=torch.arange(1.0, N + 1))
    if isinstance(head, ProposalHead):
        head.refresh_index()
    z = torch.randn(3, 4, D, requires_grad=True)
    loss = head(z, torch.randint(N, (3, 4)))
    loss.backward()
    assert torch.isfinite(loss)
    assert head.weight.grad is not None and head.weight.grad.to_dense().abs().sum() > 0
    assert z.grad.abs().sum() > 0


@pytest.mark.parametrize("name", STEMS)
def test_configs_whose_proposal_has_an_index_add_index_refresh(name):
    """A query-dependent proposal (MIDX) or CANE's tree is built from the class table: the
    config must add the callback that rebuilds it."""
    head = tiny_head(name, N, D, class_counts=torch.ones(N))
    needs_index = isinstance(head, ProposalHead) and (
        not head.sampler.query_independent
        or type(head).refresh_index is not ProposalHead.refresh_index
    )
    paths = [spec["class_path"] for spec in entry(name).callbacks]
    assert needs_index == ("lightning_sampled.callbacks.IndexRefresh" in paths)


def test_overrides_reach_the_head_the_sampler_and_the_tied_table():
    weight = torch.nn.Parameter(torch.randn(64, D))
    head = entry("midx_rq").head(
        64, D, weight=weight, padding_idx=3, num_negatives=7, sampler_options={"codebook_size": 8}
    )
    assert head.num_negatives == 7 and head.weight is weight
    assert head.sampler.codebook_size == 8
    assert head.padding_idx == head.sampler.padding_idx == 3
    assert entry("uniform").head(64, D, shared_negatives=True).shared_negatives


def test_class_counts_reach_a_unigram_proposal():
    counts = torch.tensor([1.0, 2.0, 5.0, 9.0])
    sampler = entry("unigram").sampler(4, D, class_counts=counts)
    assert sampler.alpha == 0.75
    probs = sampler.log_prob(torch.zeros(1, D), torch.arange(4)[None]).exp()
    want = counts**0.75 / (counts**0.75).sum()
    torch.testing.assert_close(probs[0], want)
    assert entry("full").sampler(4, D) is None


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown head config 'ovee'; known: full, uniform, .*ove"):
        entry("ovee")


def test_a_config_without_a_label_is_refused(tmp_path):
    path = tmp_path / "new_head.yaml"
    path.write_text((HEAD_CONFIGS / "uniform.yaml").read_text())
    with pytest.raises(ValueError, match="add 'new_head' to recipes.registry.LABELS"):
        parse(path)
