"""Shared fixtures: a small WebShop config and a tiny policy built on its text (fast, in-process)."""

import pytest
import torch

from rspo.config import load_config

SMALL = [
    "env.name=webshop",
    "env.num_workers=0",
    "env.webshop.num_products=300",
    "env.webshop.num_goals=80",
    "env.webshop.num_test_goals=20",
    "model.tiny.hidden_size=64",
    "model.tiny.num_layers=1",
    "model.tiny.num_heads=2",
    "model.tiny.vocab_size=600",
    "rollout.max_new_tokens=40",
    "rollout.max_prompt_tokens=768",
    "rollout.num_tasks=2",
    "rollout.group_size=2",
    "rollout.max_turns=3",
    "rollout.micro_batch=3",
    "eval.splits=test",
    "eval.num_tasks=3",
    "sft.episodes=0",
    "log.progress=false",
    "log.tensorboard=false",
    "train.micro_batch=4",
    "train.lr=0.01",
]


def small_config(*overrides: str):
    return load_config(None, [*SMALL, *overrides])


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory):
    """A tiny model warm-started on WebShop expert demonstrations: it acts, imperfectly, so
    rollouts have varied rewards and nonzero advantages. Built once per test session."""
    from rspo.sft import run_sft

    out = tmp_path_factory.mktemp("warm") / "sft"
    cfg = small_config("sft.episodes=40", "sft.epochs=12", "sft.batch_size=8", "sft.lr=0.005")
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
