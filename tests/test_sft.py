"""The warm start's batching: length-grouped, every sample once, little padding."""

import random

import torch
from hypothesis import given
from hypothesis import strategies as st

from rspo.config import LoraConfig, ModelConfig, TinyModelConfig
from rspo.models import load_base
from rspo.policy import Policy
from rspo.sft import length_grouped_batches, lr_factor, sft_loss


def padding(batches):
    """Padded cells / all cells, for batches as sft_loss builds them (prompts left-padded
    to the longest prompt, responses right-padded to the longest response)."""
    total = sum(len(b) * (max(len(p) for p, _ in b) + max(len(r) for _, r in b)) for b in batches)
    real = sum(len(p) + len(r) for b in batches for p, r in b)
    return 1 - real / total


@given(st.lists(st.integers(1, 700), min_size=1, max_size=300), st.integers(1, 20), st.integers(0, 10**6))
def test_every_sample_exactly_once_in_batches_of_the_size(lengths, batch_size, seed):
    samples = [([0] * n, [i]) for i, n in enumerate(lengths)]  # the response id names the sample
    batches = length_grouped_batches(samples, batch_size, random.Random(seed))
    assert sorted(r[0] for b in batches for _, r in b) == list(range(len(samples)))
    assert all(1 <= len(b) <= batch_size for b in batches)
    assert sum(len(b) < batch_size for b in batches) <= -(-len(samples) // (batch_size * 16))  # one short per pool


def test_grouping_cuts_padding_and_keeps_the_order_random():
    rng = random.Random(0)
    samples = [([0] * rng.randint(150, 700), [1, 2, 3]) for _ in range(2000)]
    shuffled = samples[:]
    rng.shuffle(shuffled)
    at_random = [shuffled[i : i + 16] for i in range(0, len(shuffled), 16)]
    grouped = length_grouped_batches(samples, 16, random.Random(1))
    assert padding(grouped) < 0.05 < 0.25 < padding(at_random)
    widths = [max(len(p) for p, _ in b) for b in grouped]
    assert widths != sorted(widths) and widths != sorted(widths, reverse=True)  # batches are shuffled


def test_sft_loss_equals_one_unpadded_pass_per_sample(tmp_path, monkeypatch):
    monkeypatch.setenv("RSPO_CACHE", str(tmp_path))
    cfg = ModelConfig(name="tiny", lora=LoraConfig(enabled=False), tiny=TinyModelConfig(hidden_size=32, vocab_size=300))
    model, tok = load_base(cfg, lambda: ["go to fridge 1, open fridge 1, take apple 1 from fridge 1"] * 10)
    net = Policy(cfg, model, tok).nets["target"]
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, len(tok)) for _ in range(n)]

    samples = [(tokens(rng.randint(1, 12)), tokens(n)) for n in (1, 4, 7)]
    loss, count = sft_loss(net, samples, tok.pad_token_id, "cpu")

    # loop reference: each sample alone, no padding; token t predicts token t+1, and only
    # the response's tokens are scored
    reference = 0.0
    for p, r in samples:
        ids = torch.tensor([p + r])
        logits = net(ids, torch.ones_like(ids))[0, :-1].float()  # (len(p) + len(r) - 1, V)
        reference += torch.nn.functional.cross_entropy(logits[len(p) - 1 :], torch.tensor(r), reduction="sum")
    assert count == 1 + 4 + 7
    torch.testing.assert_close(loss, reference, atol=1e-4, rtol=1e-5)


def test_cosine_lr_falls_from_the_full_rate_to_zero_and_constant_stays():
    # 4 steps: factors 0.5 * (1 + cos(pi * s / 4)) for s = 0..4
    #   s=0: 0.5 * (1 + 1) = 1;  s=2: 0.5 * (1 + 0) = 0.5;  s=4: 0.5 * (1 - 1) = 0
    assert lr_factor("cosine", 0, 4) == 1.0
    assert abs(lr_factor("cosine", 2, 4) - 0.5) < 1e-12
    assert abs(lr_factor("cosine", 4, 4)) < 1e-12
    factors = [lr_factor("cosine", s, 4) for s in range(5)]
    assert factors == sorted(factors, reverse=True)
    assert all(lr_factor("constant", s, 4) == 1.0 for s in range(5))
