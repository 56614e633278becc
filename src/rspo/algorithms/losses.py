"""Policy losses over response tokens: PPO clip (dual-clip optional), the off-policy
correction for RSPO's explorer tokens, KL to the reference, entropy.

Notation
  N  turns (rows);  R  response tokens (right-padded);  V  vocabulary
  mask (N, R)  1 on tokens we train on (the one mask convention)
  logp (N, R)  log pi_theta of each sampled token, carries gradient
  logp_old     log-prob when the batch was sampled (no gradient)
  A    (N,)    advantage of the row's turn, broadcast to its tokens

PPO clipped surrogate (Schulman et al. 2017), written as a loss to minimize:
    r_t  = exp(logp - logp_old)
    L_t  = max(-A r_t, -A clip(r_t, 1 - eps, 1 + eps))
Dual-clip (Ye et al. 2020), for A < 0 only, bounds the loss of a very large ratio:
    L_t  = min(L_t, -c A)                       (c > 1; off when dual_clip = 0)
Token-mean aggregation over every masked token of the batch (DAPO-style, as verl's
"token-mean"):  loss = sum_{n,t} mask L / sum_{n,t} mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rspo.algorithms.offpolicy import OffPolicy, offpolicy_token_loss


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(x * mask) / sum(mask) (over `dim`, or all elements). Empty masks give 0.

    `mask` may carry weights (`algo.loss_agg=trajectory_mean`), so sums below 1 are real
    denominators: only an exact 0 is guarded. (The update weighs each micro-batch's mean
    by its share of the minibatch's token weight, `rspo.update.policy_update`.)
    """
    mask = mask.to(x.dtype)
    total = (x * mask).sum() if dim is None else (x * mask).sum(dim)
    denom = mask.sum() if dim is None else mask.sum(dim)
    return total / torch.where(denom == 0, torch.ones_like(denom), denom)


def logprobs_from_logits(logits: Tensor, labels: Tensor, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """log softmax(logits)[labels] (N, R) from logits (N, R, V), without materializing
    log_softmax, and the entropy H = logsumexp(z) - sum_v softmax(z)_v z_v (N, R) when asked
    (else None); one logsumexp serves both."""
    lse = logits.logsumexp(-1)  # (N, R)
    logp = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, None
    return logp, lse - (logits.softmax(-1) * logits).sum(-1)


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref) (Schulman 2020), clamped as verl does.

    kl = exp(ref - logp) - (ref - logp) - 1  >= 0,  log-ratio clamped to [-20, 20],
    result clamped to [-10, 10]
    """
    log_ratio = (ref_logprobs - logprobs).clamp(-20, 20)  # (N, R)
    return (log_ratio.exp() - log_ratio - 1).clamp(-10, 10)


def low_var_kl(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Token-mean of `kl_k3` over the mask -> scalar (the `algo.kl_coef` term)."""
    return masked_mean(kl_k3(logprobs, ref_logprobs), mask)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio: float,
    dual_clip: float = 0.0,
    offpolicy: OffPolicy | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped policy loss, token-mean over the batch -> (loss scalar, metrics).

    logprobs, old_logprobs, mask: (N, R); advantages: (N,).
    offpolicy: the rows sampled by another policy (RSPO's explorer, replay, expert) and their
      correction, or None (every row on-policy: no off-policy code runs, no `offpolicy/*`
      metric). Their tokens use `rspo.algorithms.offpolicy.offpolicy_token_loss` instead of
      the PPO clip, and for those rows `old_logprobs` must hold the *behavior* log-probs
      recorded at sampling (`TurnBatch.behavior_logprobs`). On-policy rows are unchanged.
    The metrics are detached 0-dim tensors on the loss's device: no host sync here (the
    update converts them once per minibatch).
    """
    if dual_clip and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be 0 (off) or > 1, got {dual_clip}")
    mask = mask.to(logprobs.dtype)
    adv = advantages.unsqueeze(1).to(logprobs.dtype)  # (N, 1)
    log_ratio = logprobs - old_logprobs  # (N, R)
    ratio = torch.exp(log_ratio.clamp(-20, 20))  # (N, R)
    pg_unclipped = -adv * ratio  # (N, R)
    pg_clipped = -adv * ratio.clamp(1 - clip_ratio, 1 + clip_ratio)  # (N, R)
    loss_tok = torch.maximum(pg_unclipped, pg_clipped)  # (N, R)
    dual_active = torch.zeros_like(loss_tok, dtype=torch.bool)
    if dual_clip:
        dual_active = (adv < 0) & (-adv * dual_clip < loss_tok)  # (N, R)
        loss_tok = torch.where(dual_active, -adv * dual_clip, loss_tok)

    on_mask = mask
    if offpolicy is not None:
        off_rows = offpolicy.rows.unsqueeze(1)  # (N, 1)
        off_tok, weight = offpolicy_token_loss(
            logprobs,
            old_logprobs,
            advantages,
            method=offpolicy.method,
            clip=offpolicy.clip,
            shaping_gamma=offpolicy.shaping_gamma,
            clip_ratio=clip_ratio,
        )
        loss_tok = torch.where(off_rows, off_tok, loss_tok)
        on_mask = mask * (~off_rows).to(mask.dtype)
        off_mask = mask * off_rows.to(mask.dtype)

    loss = masked_mean(loss_tok, mask)
    with torch.no_grad():
        metrics = {
            "loss/policy": loss.detach(),
            "policy/clip_frac": masked_mean((pg_clipped > pg_unclipped).float(), on_mask),
            "policy/approx_kl": masked_mean(-log_ratio, on_mask),  # E[logp_old - logp], as verl's ppo_kl
            "policy/ratio_mean": masked_mean(ratio, on_mask),
        }
        if dual_clip:
            metrics["policy/dual_clip_frac"] = masked_mean(dual_active.float(), on_mask)
        if offpolicy is not None:
            # on off-policy rows `ratio` is pi_theta / pi_behavior
            tokens = mask > 0  # (N, R) counted, whatever weight `mask` carries (trajectory_mean)
            metrics["offpolicy/token_frac"] = (tokens & off_rows).sum() / tokens.sum().clamp(min=1)
            metrics["offpolicy/weight_mean"] = masked_mean(weight, off_mask)
            metrics["offpolicy/weight_std"] = masked_mean((weight - metrics["offpolicy/weight_mean"]).square(),
                                                          off_mask).sqrt()  # fmt: skip
            metrics["offpolicy/ratio_mean"] = masked_mean(ratio, off_mask)
            metrics["offpolicy/truncated_frac"] = masked_mean((ratio > offpolicy.clip).float(), off_mask)
    return loss, metrics
