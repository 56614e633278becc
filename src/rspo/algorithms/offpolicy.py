"""Per-token losses for off-policy tokens: the target learning from explorer samples.

In RSPO the target policy pi_theta trains on trajectories sampled by the explorer pi_phi
(this iteration's, or replayed ones). For those tokens PPO's ratio to "the old policy"
has no meaning: the sampling policy is pi_phi, whose log-probs (`behavior_logprobs`) were
recorded at sampling time. The RSPO paper's text is not available to us; its summary says
only that the explorer's trajectories enter the target's update off-policy. Everything
below is therefore rspo's own choice, selected by `rspo.offpolicy`:

Notation (per token; N rows, R response tokens)
  logp     log pi_theta(a_t | s_t)      current target policy, carries gradient   (N, R)
  logmu    log pi_phi(a_t | s_t)        behavior (explorer at sampling), no grad  (N, R)
  rho      = exp(logp - logmu)          importance ratio
  A        advantage of the token's turn (target advantage, outcome reward)      (N,)
  sg(.)    stop-gradient

  clip           loss = -w A,  w = min(rho, c) in value, with the *truncated IS* gradient
                 grad = -min(rho, c) A grad(logp)   (as Retrace / V-trace / ACER truncate).
                 Implemented as w = exp(logp - logmu - sg(max(logp - logmu - log c, 0))).
                 Choice: rho is never zeroed by a trust region (unlike PPO's clip, which
                 stops the gradient once the ratio leaves [1-eps, 1+eps]); it is only
                 capped at c, so tokens the target already likes more than the explorer
                 keep a bounded weight instead of an exploding one. Explorer tokens are
                 mostly unlikely under the target (rho << 1), so the cap rarely binds.
  shaping        loss = -f(p) A,  f(p) = p / (p + gamma),  p = exp(logp)  (LUFFY, Yan et
                 al. 2025, "policy shaping"). As in LUFFY the behavior probability is
                 dropped (taken as 1): no ratio, no clipping. The gradient
                 f'(p) p grad(logp) = gamma p / (p + gamma)^2 grad(logp) favours
                 low-probability tokens, which keeps the target from collapsing onto the
                 tokens it already likes.
  positive_only  the `clip` loss on rows with A > 0, zero loss on rows with A <= 0
                 (self-imitation, Oh et al. 2018: learn only from better-than-expected
                 off-policy trajectories). Zeroed rows stay in the token-mean denominator.
  ppo            PPO's clipped surrogate with the behavior policy as the old policy, a
                 trust region on both signs of A:
                   loss = max(-A rho, -A clip(rho, 1 - eps, 1 + eps)),  eps = algo.clip_ratio
                 The gradient stops once rho leaves the interval in the direction A pushes
                 it: a token the target already likes less than the explorer did (rho <
                 1 - eps) is not pushed further down by A < 0, nor one it likes more
                 (rho > 1 + eps) further up by A > 0. (`clip` bounds only rho's size.)

Demonstrations (RSPO's expert ceiling, `rspo.expert_fraction`) have no behavior policy;
by default their log-probs are recorded as 0, as LUFFY sets pi_behavior = 1, so rho = p =
pi_theta: `clip` then weighs each token by p (gradient A grad p: the tokens the target does
not yet take learn least), `shaping` by f(p) as LUFFY does, and `ppo` as `clip` where A > 0
(rho = p <= 1 never reaches 1 + eps). `rspo.expert_behavior=target` records the target's
own log-probs at rollout time instead: rho starts at 1 and every method weighs the
expert's tokens as the target's own (gradient A grad log p).

A learner's off-policy rows and their correction travel together as an `OffPolicy` (built
by the reward mode from `rspo.offpolicy*`; None where a learner sampled every row it trains
on). All functions are pure and per token; `rspo.algorithms.losses.policy_loss` aggregates.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor

METHODS = ["clip", "shaping", "positive_only", "ppo"]  # `rspo.offpolicy`


@dataclass(frozen=True)
class OffPolicy:
    """The rows of a learner's batch that another policy sampled, and their correction."""

    rows: Tensor  # (N,) bool: sampled by another policy (RSPO's explorer, replay, expert)
    method: str = "clip"  # one of METHODS
    clip: float = 2.0  # `clip`, `positive_only`: the cap c of rho
    shaping_gamma: float = 0.1  # `shaping`: gamma of f(p)

    def select(self, rows: Tensor) -> OffPolicy:
        """The same correction for the rows `rows` (a mask or an index tensor) of the batch."""
        return dataclasses.replace(self, rows=self.rows[rows])

    def to(self, device: torch.device | str) -> OffPolicy:
        return dataclasses.replace(self, rows=self.rows.to(device))


def truncated_is_weight(logprobs: Tensor, behavior_logprobs: Tensor, clip: float) -> Tensor:
    """w = min(rho, c) in value, gradient min(rho, c) * grad(logp) -> (N, R). Never overflows."""
    log_rho = logprobs - behavior_logprobs  # (N, R)
    excess = (log_rho - math.log(clip)).clamp(min=0).detach()  # (N, R) how far above log c
    return torch.exp(log_rho - excess)


def offpolicy_token_loss(
    logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    *,
    method: str = "clip",
    clip: float = 2.0,
    shaping_gamma: float = 0.1,
    clip_ratio: float = 0.2,
) -> tuple[Tensor, Tensor]:
    """Per-token off-policy loss -> (loss (N, R), weight (N, R) detached, for metrics).

    logprobs (N, R) current policy; behavior_logprobs (N, R) sampling policy; advantages (N,).
    The loss is -weight * A, weight per `method` (see the module docstring).
    """
    adv = advantages.unsqueeze(1)  # (N, 1)
    if method == "clip":
        w = truncated_is_weight(logprobs, behavior_logprobs, clip)
    elif method == "shaping":
        p = logprobs.exp()  # (N, R)
        w = p / (p + shaping_gamma)  # f(p)
    elif method == "positive_only":
        w = truncated_is_weight(logprobs, behavior_logprobs, clip) * (adv > 0).to(logprobs.dtype)
    elif method == "ppo":
        rho = torch.exp((logprobs - behavior_logprobs).clamp(-20, 20))  # (N, R)
        clipped = rho.clamp(1 - clip_ratio, 1 + clip_ratio).detach()  # no gradient outside the interval
        w = torch.where(-adv * rho >= -adv * clipped, rho, clipped)  # PPO's max(), as a weight on -A
    else:
        raise ValueError(f"offpolicy method must be one of {METHODS}, got {method!r}")
    return -w * adv, w.detach()
