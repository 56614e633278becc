"""Shared fixtures: a small WebShop config and a tiny policy built on its text (fast, in-process)."""

import pytest
import torch
from support import SMALL, WARM_SFT

from rspo.config import load_config


def small_config(*overrides: str):
    return load_config(None, [*SMALL, *overrides])


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory):
    """A tiny model warm-started on WebShop expert demonstrations: it acts, imperfectly, so
    rollouts have varied rewards and nonzero advantages. Built once per test session."""
    from rspo.sft import run_sft

    out = tmp_path_factory.mktemp("warm") / "sft"
    cfg = small_config("sft.episodes=40", *WARM_SFT)
    torch.manual_seed(0)
    run_sft(cfg, out, progress=False)
    return out


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
