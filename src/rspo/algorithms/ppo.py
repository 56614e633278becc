"""PPO with a turn-level critic: GAE over each trajectory's turns, and a clipped value loss.

Notation
  N  turns (rows), sorted by (traj_id, turn);  M  trajectories
  r_t   reward received at turn t;  V_t  critic value of turn t's prompt (V_{T} = 0 after
        the last turn: the episode ends there, truncated or not)

    delta_t = r_t + gamma V_{t+1} - V_t                                (Schulman et al. 2016)
    A_t     = sum_{k>=0} (gamma lambda)^k delta_{t+k} = delta_t + gamma lambda A_{t+1}
    returns = A_t + V_t                                                (critic targets)

How this departs from the GiGPO reference's PPO (verl's token-level GAE): there, every
response token is an action, the critic scores every token and GAE runs over the
concatenated token sequence, the reward sitting on the last token of a turn. Here each
turn is one action: the critic reads the turn's prompt (the observation and history the
policy saw) and emits one value, GAE runs over turns, and the turn's advantage is
broadcast to all its response tokens. This matches the per-turn samples every algorithm
in rspo trains on (each turn's prompt is rebuilt from a window of history, so there is
no single token sequence across turns to run token-level GAE over).

Vectorized across trajectories with a log-depth segment scan (`rspo.segment`);
`gae_loop` is the readable reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rspo.segment import Segments, discounted_cumsum, segment_mean_std, weights

if TYPE_CHECKING:
    from rspo.algorithms import Turns


def gae(
    reward: Tensor, value: Tensor, last: Tensor, gamma: float, lam: float, max_len: int | None = None
) -> tuple[Tensor, Tensor]:
    """Turn-level GAE -> (advantages (N,), returns (N,)).

    Rows sorted by (traj_id, turn); `last` (N,) bool marks each trajectory's last turn, after
    which V = 0. `max_len` (the longest trajectory) defaults to N.
    """
    cont = weights(~last, value.dtype)  # (N,) 1 where the trajectory goes on after turn t
    next_value = torch.cat([value[1:], value.new_zeros(1)]) * cont  # (N,) V_{t+1}, 0 after the last turn
    delta = torch.add(reward - value, next_value, alpha=gamma)  # (N,) delta_t = r_t + gamma V_{t+1} - V_t
    adv = discounted_cumsum(delta, (gamma * lam) * cont, reward.numel() if max_len is None else max_len)  # (N,) A_t
    return adv, adv + value


def gae_loop(reward: Tensor, value: Tensor, last: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Loop reference for `gae`: the textbook backward recursion per trajectory."""
    r, v, ends = reward.tolist(), value.tolist(), last.tolist()
    adv = [0.0] * len(r)
    for t in reversed(range(len(r))):
        v_next, a_next = (0.0, 0.0) if ends[t] or t + 1 == len(r) else (v[t + 1], adv[t + 1])
        adv[t] = r[t] + gamma * v_next - v[t] + gamma * lam * a_next
    adv_t = torch.tensor(adv, dtype=reward.dtype)
    return adv_t, adv_t + value


def ppo_advantages(
    turns: Turns, *, norm: str, gamma: float, lam: float, step_weight: float, eps: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """PPO per-turn advantages and returns (N,) from `turns.value`. norm, step_weight: unused."""
    if turns.value is None:
        raise ValueError("ppo needs critic values: build Turns with value=(N,) critic outputs")
    value = turns.value.detach().to(turns.reward.dtype)
    return gae(turns.reward, value, turns.last, gamma, lam, turns.max_len())


def ppo_advantages_loop(turns: Turns, *, gamma: float, lam: float, **_: float) -> tuple[Tensor, Tensor]:
    """Loop reference for `ppo_advantages`."""
    assert turns.value is not None
    return gae_loop(turns.reward, turns.value.to(turns.reward.dtype), turns.last, gamma, lam)


def whiten(x: Tensor, mask: Tensor | None = None, eps: float = 1e-8) -> Tensor:
    """(x - mean) / (std + eps) over the batch (or the rows where `mask`), unbiased std.

    Optional advantage whitening for PPO (`algo.whiten_advantages`); rows outside the mask
    are returned as they are. Equal values give exactly 0 (the two-pass mean of
    `segment_mean_std`; a one-pass mean misses them by an ulp, which / (0 + eps) blows up).
    """
    if not x.numel():
        return x
    batch = Segments(torch.zeros(x.shape, dtype=torch.long, device=x.device), 1, block=x.numel())  # one segment
    dev, std, _ = segment_mean_std(x, batch, mask)  # dev: x - mean on the mask, 0 off it
    out = batch.flat(dev) / (std + eps)
    return out if mask is None else torch.where(mask, out, x)


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, clip: float, mask: Tensor | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss over turns (N,) -> (loss scalar, metrics as detached 0-dim tensors).

        V_clip = V_old + clamp(V - V_old, -clip, clip)
        loss   = 0.5 * mean_t max((V - R)^2, (V_clip - R)^2)

    `old_values` are the critic's values at rollout time (the ones GAE used); `clip <= 0`
    turns clipping off. `mask` (N,) bool restricts the mean to some rows (e.g. on-policy).
    """
    err = (values - returns) ** 2  # (N,)
    if clip > 0:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)
        err_clip = (v_clip - returns) ** 2  # (N,)
        per_row = torch.maximum(err, err_clip)
        clipped = (err_clip > err).float()
    else:
        per_row, clipped = err, torch.zeros_like(err)
    w = torch.ones_like(err) if mask is None else mask.to(err.dtype)
    n = w.sum().clamp(min=1)
    loss = 0.5 * (per_row * w).sum() / n
    with torch.no_grad():
        metrics = {
            "critic/value_loss": loss.detach(),
            "critic/clip_frac": ((clipped * w).sum() / n),
            "critic/value_mean": ((values * w).sum() / n),
            "critic/return_mean": ((returns * w).sum() / n),
        }
    return loss, metrics
