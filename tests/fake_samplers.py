"""Samplers with controlled draws, shared by the head tests (importable: ``tests`` is on the
pytest ``pythonpath``), and :func:`restart_draws`, which makes two calls draw alike."""

import torch

from lightning_sampled.samplers import DrawStream, Sample, Sampler


def restart_draws(module, seed: int = 1) -> None:
    """Restarts torch's global generator and the draw stream of every sampler in ``module`` (a
    head, a sampler, or any module holding them) from ``seed``: what is drawn after one restart
    is drawn again after the next. Samplers draw from their own streams, not from torch's global
    generator, so ``torch.manual_seed`` alone no longer repeats their draws."""
    torch.manual_seed(seed)
    for sub in module.modules():
        if isinstance(sub, Sampler):
            sub.draw_stream = DrawStream(seed)


def draw_like_compiled_code(module):
    """Makes the samplers in ``module`` draw from torch's default generator in eager code too,
    as compiled code always does (dynamo cannot trace a sampler's own ``torch.Generator``): after
    the same ``torch.manual_seed``, eager and compiled calls then draw the same negatives.
    Returns ``module``."""
    for sub in module.modules():
        if isinstance(sub, Sampler):
            sub.own_stream = False
    return module


class Stream(Sampler):
    """A query-independent proposal with a given ``q`` whose draws come from a preset stream.

    Each ``sample`` call consumes the next ``num_samples`` ids (the same ids for every query when
    not shared).
    """

    query_independent = True

    def __init__(self, probs, stream):
        super().__init__(probs.numel())
        self.log_probs = probs.log()
        self.stream = stream
        self.pos = 0

    def _sample(self, z, num_samples, shared, generator):
        ids = self.stream[self.pos : self.pos + num_samples]
        self.pos += num_samples
        assert ids.numel() == num_samples, "stream exhausted"
        ids = ids if shared else ids.expand(z.shape[0], -1)
        return Sample(ids, self.log_probs[ids])

    def _log_prob(self, z, ids):
        return self.log_probs[ids]


class PerQueryOnly(Sampler):
    """A proposal that adapts to the query (not query-independent): never asked to draw."""

    def _sample(self, z, num_samples, shared, generator):
        raise AssertionError("not reached")
