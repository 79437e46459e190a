"""Whether draws follow a distribution: one chi-square test for every sampler test."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

MIN_EXPECTED = 5.0  # the usual floor on a bin's expected count for the chi-square approximation


def chi_square_pvalue(draws: torch.Tensor, probs: torch.Tensor) -> float:
    """The p-value of draws ``[S]`` (class ids) under probabilities ``probs`` ``[N]`` (any
    positive scale: renormalised over the classes of positive probability).

    Classes of probability zero must never be drawn (asserted) and are left out. Classes whose
    expected count is below :data:`MIN_EXPECTED` are pooled, rarest first, into bins that reach
    it (a remainder joins the last bin), so that the test keeps its power on peaked
    distributions without relying on a few tiny expectations.
    """
    probs = probs.detach().double().cpu()
    observed = torch.bincount(draws.reshape(-1).cpu(), minlength=probs.numel()).double()
    assert observed.numel() == probs.numel(), "a class id beyond the distribution was drawn"
    support = probs > 0
    assert observed[~support].sum() == 0, "a class of probability zero was drawn"
    expected = probs[support] / probs[support].sum() * observed.sum()
    observed = observed[support]
    order = torch.argsort(expected)
    expected_bins, observed_bins = [], []
    pending_e = pending_o = 0.0
    for i in order.tolist():
        pending_e += float(expected[i])
        pending_o += float(observed[i])
        if pending_e >= MIN_EXPECTED:
            expected_bins.append(pending_e)
            observed_bins.append(pending_o)
            pending_e = pending_o = 0.0
    if expected_bins:
        expected_bins[-1] += pending_e
        observed_bins[-1] += pending_o
    if len(expected_bins) < 2:
        return 1.0  # one bin: the draws cannot disagree with the distribution
    return float(chisquare(observed_bins, expected_bins).pvalue)
