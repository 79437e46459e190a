"""Every recipe test: no pytest argv for LightningCLI to warn about, the Arrow cache in the
session's temporary folder, one torch thread (restored afterwards)."""

import sys

import pytest
import torch


@pytest.fixture(autouse=True)
def recipe_run(tmp_path_factory, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["recipes"])  # LightningCLI warns about pytest's own argv
    monkeypatch.setenv("LIGHTNING_SAMPLED_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
