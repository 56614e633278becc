"""The memory estimate (rspo.memory) against memory measured on the CPU, tiny model.

Each estimated part is compared with the tensors it stands for, measured in one real pass:
the optimizer state after an AdamW step, the KV cache of a forward pass, and the tensors
autograd keeps for the backward of a log-prob pass (recorded with saved-tensor hooks,
weights excluded). Stated factor: within 1.5x either way.
"""

from __future__ import annotations

import pytest
import torch

from rspo.config import load_config
from rspo.memory import estimate_for
from rspo.models import load_base
from rspo.policy import Policy

FACTOR = 1.5
SIZES = [
    "model.tiny.hidden_size=64",
    "model.tiny.num_layers=2",
    "model.tiny.num_heads=4",
    "model.tiny.vocab_size=512",
    "model.lora.r=4",
    "rollout.micro_batch=4",
    "rollout.max_prompt_tokens=112",
    "rollout.max_new_tokens=16",
    "train.micro_batch=3",
]


@pytest.fixture(autouse=True)
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RSPO_CACHE", str(tmp_path / "cache"))


def build(*overrides: str, device: str = "cpu"):
    cfg = load_config(None, [*SIZES, *overrides])
    model, tok = load_base(cfg.model)
    return cfg, Policy(cfg.model, model, tok, adapters=["target", "explorer"]).to(device)


def within(estimated: int, measured: int) -> bool:
    return measured / FACTOR <= estimated <= measured * FACTOR


def saved_for_backward(policy: Policy, fn) -> int:
    """Bytes of the distinct non-weight tensors autograd saves while `fn()` runs."""
    weights = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(saved.values())


def test_lora_all_linear_trains_every_linear_layer_and_the_optimizer_state_is_as_estimated():
    cfg, policy = build("model.lora.target_modules=[all-linear]")
    est = estimate_for(cfg, policy)
    # r (in + out) per linear layer: q, o (H x H), k, v (H x H here: 4 KV heads), gate, up, down (H x 4H)
    H, r = 64, 4
    per_layer = r * (4 * 2 * H + 3 * (H + 4 * H))
    assert est.trainable == 2 * 2 * per_layer * 4  # 2 adapters x 2 layers x fp32
    params = policy.parameters_of("target")
    for p in params:
        p.grad = torch.ones_like(p)
    opt = torch.optim.AdamW(params)
    opt.step()
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for k, t in s.items() if k != "step")
    assert est.optimizer == 2 * state  # both adapters' optimizers
    assert estimate_for(cfg, policy, shards=2).optimizer == state  # FSDP over 2 processes: half each


def test_kv_cache_estimate_matches_a_forward_pass_cache():
    cfg, policy = build()
    est = estimate_for(cfg, policy)
    n, length = cfg.rollout.micro_batch, cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
    ids = torch.randint(3, 400, (n, length))
    with torch.no_grad():
        cache = policy.raw_nets["target"].lm(input_ids=ids, use_cache=True).past_key_values
    measured = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert est.kv_cache == measured


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("overrides", [[], ["model.gradient_checkpointing=true"], ["model.dtype=bfloat16"]])
def test_activation_estimate_within_factor_of_what_autograd_saves(overrides, device):
    cfg, policy = build(*overrides, device=device)
    est = estimate_for(cfg, policy)
    n, R = cfg.train.micro_batch, cfg.rollout.max_new_tokens
    length = cfg.rollout.max_prompt_tokens + R
    ids = torch.randint(3, 400, (n, length), device=device)
    mask = torch.ones(n, length, dtype=torch.long, device=device)
    measured = saved_for_backward(policy, lambda: policy.logprobs(ids, mask, R)[0].sum().backward())
    assert within(est.activations, measured), (est.activations, measured)
    assert est.total > est.parameters + est.activations
    assert "activations" in est.report() and "GiB" in est.report()
