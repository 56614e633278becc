"""Policy loss (clip, dual-clip, token-mean), the off-policy corrections, KL and entropy helpers."""

import math

import pytest
import torch

from rspo.algorithms.losses import (
    kl_k3,
    logprobs_from_logits,
    low_var_kl,
    masked_mean,
    policy_loss,
)
from rspo.algorithms.offpolicy import OffPolicy, offpolicy_token_loss

ln = math.log


def lp(*probs: float) -> torch.Tensor:
    """One row of log-probs (1, R) that tracks gradients."""
    return torch.tensor([[ln(p) for p in probs]], requires_grad=True)


# ---------------------------------------------------------------- PPO clip


def test_clip_positive_advantage():
    # A = 1, clip 0.2, ratios (1.5, 0.9) (old log-probs 0):
    #   -A r = (-1.5, -0.9);  -A clip(r) = (-1.2, -0.9);  max -> (-1.2, -0.9);  token-mean -1.05
    logp = lp(1.5, 0.9)
    loss, m = policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), clip_ratio=0.2)
    torch.testing.assert_close(loss, torch.tensor(-1.05))
    assert m["policy/clip_frac"] == pytest.approx(0.5)
    assert m["policy/ratio_mean"] == pytest.approx(1.2)
    loss.backward()
    # token 0 is clipped: no gradient;  token 1: d(-r)/dlogp / 2 = -0.9 / 2
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.45]]))


def test_clip_negative_advantage_and_dual_clip():
    # A = -1, ratios (4.0, 0.5):  -A r = (4, 0.5);  -A clip(r) = (1.2, 0.8);  max -> (4, 0.8): mean 2.4
    # dual-clip c = 3 bounds the loss of A < 0 at -c A = 3: (min(4, 3), 0.8) -> mean 1.9
    args = (torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2))
    loss, _ = policy_loss(lp(4.0, 0.5), *args, clip_ratio=0.2)
    torch.testing.assert_close(loss, torch.tensor(2.4))
    logp = lp(4.0, 0.5)
    loss, m = policy_loss(logp, *args, clip_ratio=0.2, dual_clip=3.0)
    torch.testing.assert_close(loss, torch.tensor(1.9))
    assert m["policy/dual_clip_frac"] == pytest.approx(0.5)
    loss.backward()
    # the dual-clipped token has constant loss (no gradient); token 1 is clipped at 0.8 (r < 1 - eps, A < 0)
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0]]))
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(lp(1.0, 1.0), *args, clip_ratio=0.2, dual_clip=0.5)


def test_token_mean_over_the_batch():
    # ratio 1 everywhere: loss per token = -A.  row 0: A = 1, 2 tokens;  row 1: A = -2, 1 token + 1 pad
    # token-mean: (-1 - 1 + 2) / 3 = 0   (a per-row mean first would give (-1 + 2) / 2 = 0.5)
    logp = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, _ = policy_loss(logp, logp, torch.tensor([1.0, -2.0]), mask, clip_ratio=0.2)
    torch.testing.assert_close(loss, torch.tensor(0.0))
    # micro-batches weighted by their share of the tokens sum to it (as the update does):
    # row 0 alone -1 (2 of 3 tokens), row 1 alone 2 (1 of 3): -1 * 2/3 + 2 * 1/3 = 0
    a, _ = policy_loss(logp[:1], logp[:1], torch.tensor([1.0]), mask[:1], clip_ratio=0.2)
    b, _ = policy_loss(logp[1:], logp[1:], torch.tensor([-2.0]), mask[1:], clip_ratio=0.2)
    torch.testing.assert_close(a * 2 / 3 + b / 3, loss)


# ---------------------------------------------------------------- off-policy corrections
# Two tokens sampled by the explorer with probs (0.5, 0.1); the target now gives (0.4, 0.5):
# rho = (0.8, 5.0).

BEHAVIOR = torch.tensor([[ln(0.5), ln(0.1)]])


def offpolicy_loss(logp, method, behavior=BEHAVIOR, adv=(1.0,), **kw):
    """`policy_loss` with every row off-policy, all tokens masked in; `kw`: `OffPolicy`'s settings."""
    n = logp.shape[0]
    off = OffPolicy(torch.ones(n, dtype=torch.bool), method, **kw)
    return policy_loss(logp, behavior, torch.tensor(adv), torch.ones(n, 2), clip_ratio=0.2, offpolicy=off)


def test_offpolicy_clip():
    # c = 2: w = min(rho, 2) = (0.8, 2.0);  A = 1: loss = -(0.8 + 2.0) / 2 = -1.4
    logp = lp(0.4, 0.5)
    loss, m = offpolicy_loss(logp, "clip", clip=2.0)
    torch.testing.assert_close(loss, torch.tensor(-1.4))
    assert m["offpolicy/truncated_frac"] == pytest.approx(0.5)
    assert m["offpolicy/weight_mean"] == pytest.approx(1.4)
    loss.backward()
    # truncated IS gradient: -A * min(rho, c) * grad(logp) / 2 = (-0.4, -1.0); the capped token still learns
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.4, -1.0]]))


def test_offpolicy_shaping():
    # gamma 0.1: f(p) = p / (p + 0.1) = (0.4 / 0.5, 0.5 / 0.6) = (0.8, 0.83333); A = 1: loss = -0.816667
    # d f / d logp = gamma p / (p + gamma)^2 = (0.04 / 0.25, 0.05 / 0.36) = (0.16, 0.138889); /2 tokens
    logp = lp(0.4, 0.5)
    loss, _ = offpolicy_loss(logp, "shaping", shaping_gamma=0.1)
    torch.testing.assert_close(loss, torch.tensor(-(0.8 + 0.5 / 0.6) / 2))
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.08, -0.05 / 0.36 / 2]]))
    # no behavior ratio: the explorer's probabilities do not matter
    other, _ = offpolicy_loss(logp, "shaping", behavior=torch.zeros(1, 2), shaping_gamma=0.1)
    torch.testing.assert_close(other, loss)


def test_offpolicy_positive_only():
    # the same two tokens in two rows, A = +1 and A = -1: row 0 as `clip` (-0.8, -2.0), row 1 zero loss;
    # zeroed tokens stay in the denominator: (-0.8 - 2.0 + 0 + 0) / 4 = -0.7
    logp = torch.tensor([[ln(0.4), ln(0.5)]] * 2, requires_grad=True)
    loss, _ = offpolicy_loss(logp, "positive_only", behavior=BEHAVIOR.expand(2, 2), adv=(1.0, -1.0))
    torch.testing.assert_close(loss, torch.tensor(-0.7))
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.2, -0.5], [0.0, 0.0]]))


def test_offpolicy_ppo_is_a_trust_region_on_both_signs():
    # rho = (0.8, 5.0), eps = 0.2: clip(rho) = (0.8, 1.2)
    # A = +1: max(-rho, -clip) = (-0.8, -1.2); token-mean -1.0; the second token is past 1 + eps: no gradient
    logp = lp(0.4, 0.5)
    loss, m = offpolicy_loss(logp, "ppo")
    torch.testing.assert_close(loss, torch.tensor(-1.0))
    assert m["offpolicy/weight_mean"] == pytest.approx(1.0)  # weights (0.8, 1.2)
    assert m["offpolicy/weight_std"] == pytest.approx(0.2)  # sqrt(((0.8 - 1)^2 + (1.2 - 1)^2) / 2)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.4, 0.0]]))  # -A rho / 2 tokens; 0 where clipped
    # A = -1 on rho' = (0.5, 1.5) (the target gives (0.25, 0.15)): max(rho', clip(rho')) = (0.8, 1.5), mean 1.15;
    # the first token, already below 1 - eps, is not pushed further down; the second is, with weight rho'
    logp = lp(0.25, 0.15)
    loss, _ = offpolicy_loss(logp, "ppo", adv=(-1.0,))
    torch.testing.assert_close(loss, torch.tensor(1.15))
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.75]]))


@pytest.mark.parametrize(
    "method, grad",
    [
        # rho = p / 1 = (0.4, 0.5): clip and ppo both weigh the gradient by p: -A p / 2 tokens
        ("clip", [-0.2, -0.25]),
        ("ppo", [-0.2, -0.25]),
        # shaping: -A gamma p / (p + gamma)^2 / 2 = (-0.08, -0.069444), as for an explorer row
        ("shaping", [-0.08, -0.05 / 0.36 / 2]),
    ],
)
def test_expert_rows_use_behavior_probability_one(method, grad):
    # A demonstration (the expert ceiling) has no behaviour policy: its log-probs are 0 (LUFFY's pi_behavior = 1)
    logp = lp(0.4, 0.5)
    loss, _ = offpolicy_loss(logp, method, behavior=torch.zeros(1, 2))
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([grad]))


def test_onpolicy_rows_unchanged_by_the_flag():
    g = torch.Generator().manual_seed(0)
    logp, old = torch.randn(4, 5, generator=g) * 0.3, torch.randn(4, 5, generator=g) * 0.3
    adv, mask = torch.randn(4, generator=g), (torch.rand(4, 5, generator=g) > 0.2).float()
    base, _ = policy_loss(logp, old, adv, mask, clip_ratio=0.2)
    none_off = OffPolicy(torch.zeros(4, dtype=torch.bool))
    flagged, _ = policy_loss(logp, old, adv, mask, clip_ratio=0.2, offpolicy=none_off)
    torch.testing.assert_close(flagged, base)
    # mixed: rows 0-1 PPO, rows 2-3 off-policy; the token-mean weighs both by token count
    off = OffPolicy(torch.tensor([False, False, True, True]))
    mixed, _ = policy_loss(logp, old, adv, mask, clip_ratio=0.2, offpolicy=off)
    on_part, _ = policy_loss(logp[:2], old[:2], adv[:2], mask[:2], clip_ratio=0.2)  # its own token-mean
    off_tok, _ = offpolicy_token_loss(logp[2:], old[2:], adv[2:])
    torch.testing.assert_close(mixed, (on_part * mask[:2].sum() + (off_tok * mask[2:]).sum()) / mask.sum())
    with pytest.raises(ValueError, match="offpolicy"):
        offpolicy_token_loss(logp, old, adv, method="importance")


def test_offpolicy_token_frac_counts_tokens_whatever_their_weight():
    # trajectory_mean weights: row 0 on-policy, 2 tokens of weight 0.1; row 1 off-policy, 2 tokens of 0.05
    # and a padded one. 2 of the 4 tokens are off-policy: 0.5 (the weighted sums read 0.1 / 0.3, and
    # with the total clamped at 1, 0.1 / 1)
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[0.1, 0.1, 0.0], [0.05, 0.05, 0.0]])
    off = OffPolicy(torch.tensor([False, True]))
    _, m = policy_loss(logp, logp, torch.tensor([1.0, 1.0]), mask, clip_ratio=0.2, offpolicy=off)
    assert m["offpolicy/token_frac"] == pytest.approx(0.5)


# ---------------------------------------------------------------- helpers


def test_low_var_kl():
    # logp = 0 (p = 1), ref = log 0.5: log-ratio ref - logp = -0.693147; k3 = 0.5 + 0.693147 - 1 = 0.193147
    logp, ref = torch.zeros(1, 2), torch.tensor([[ln(0.5), 0.0]])
    torch.testing.assert_close(kl_k3(logp, ref), torch.tensor([[0.193147, 0.0]]))
    torch.testing.assert_close(low_var_kl(logp, ref, torch.tensor([[1.0, 0.0]])), torch.tensor(0.193147))
    assert kl_k3(torch.zeros(1, 1), torch.full((1, 1), 50.0)).item() == 10.0  # clamped as verl


def test_entropy_and_logprobs_from_logits():
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0))
    ref = torch.distributions.Categorical(logits=logits).entropy()
    labels = torch.randint(0, 7, (2, 3))
    logp, entropy = logprobs_from_logits(logits, labels, with_entropy=True)
    torch.testing.assert_close(entropy, ref)
    uniform = logprobs_from_logits(torch.zeros(1, 1, 4), torch.zeros(1, 1, dtype=torch.long), with_entropy=True)[1]
    torch.testing.assert_close(uniform, torch.tensor([[ln(4)]]))
    expected = logits.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logp, expected)
    assert logprobs_from_logits(logits, labels)[1] is None


def test_masked_mean():
    x, mask = torch.tensor([[1.0, 2.0], [3.0, 100.0]]), torch.tensor([[1, 1], [1, 0]])
    torch.testing.assert_close(masked_mean(x, mask), torch.tensor(2.0))
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.5, 3.0]))
    torch.testing.assert_close(masked_mean(x, torch.zeros(2, 2)), torch.tensor(0.0))  # empty -> 0


# ---------------------------------------------------------------- aggregation over trajectories


class Rows:
    def __init__(self, traj_id, tokens):
        width = max(tokens)
        self.traj_id = torch.tensor(traj_id)
        self.response_mask = torch.tensor([[1.0] * t + [0.0] * (width - t) for t in tokens])

    def __len__(self):
        return len(self.traj_id)


def test_row_weights_hand_computed():
    from rspo.update import row_weights

    rows = Rows([7, 7, 3], [1, 3, 2])  # trajectory 7: 1 + 3 = 4 tokens; trajectory 3: 2 tokens
    torch.testing.assert_close(row_weights(rows, "trajectory_mean"), torch.tensor([0.25, 0.25, 0.5]))
    torch.testing.assert_close(row_weights(rows, "token_mean"), torch.ones(3))


def test_sampled_nll_hand_computed_leaves_out_offpolicy_rows():
    from rspo.update import sampled_nll

    rows = Rows([0, 1, 2], [2, 1, 2])
    rows.behavior_logprobs = torch.tensor([[-1.0, -3.0], [-0.5, -9.0], [-7.0, -7.0]])  # -9.0: padding
    # all rows the learner's own: (1 + 3 + 0.5 + 7 + 7) / 5 tokens = 3.7
    torch.testing.assert_close(sampled_nll(rows, None), torch.tensor(3.7))
    torch.testing.assert_close(sampled_nll(rows, OffPolicy(torch.tensor([False, False, False]))), torch.tensor(3.7))
    # row 2 the explorer's (RSPO): (1 + 3 + 0.5) / 3 = 1.5
    torch.testing.assert_close(sampled_nll(rows, OffPolicy(torch.tensor([False, False, True]))), torch.tensor(1.5))
    torch.testing.assert_close(sampled_nll(rows, OffPolicy(torch.tensor([True, True, True]))), torch.tensor(0.0))


def test_trajectory_mean_removes_the_long_failure_bias():
    # One group, two trajectories: a success in 1 turn of 2 tokens (A = +1) and a failure in
    # 3 turns of 2 tokens each (A = -1): the advantages sum to 0 over trajectories.
    # token_mean at ratio 1: -(2*1 + 6*(-1)) / 8 = +0.5: a net push down on every sampled token.
    # trajectory_mean: weights 1/2 and 1/6 -> -(2*1/2 - 6*1/6) / (1 + 1) = 0.
    from rspo.update import row_weights

    rows = Rows([0, 1, 1, 1], [2, 2, 2, 2])
    adv = torch.tensor([1.0, -1.0, -1.0, -1.0])
    logp = torch.zeros(4, 2)
    token, _ = policy_loss(logp, logp, adv, rows.response_mask, clip_ratio=0.2)
    torch.testing.assert_close(token, torch.tensor(0.5))
    weighted = rows.response_mask * row_weights(rows, "trajectory_mean")[:, None]
    traj, _ = policy_loss(logp, logp, adv, weighted, clip_ratio=0.2)
    torch.testing.assert_close(traj, torch.tensor(0.0))
