"""GRPO: a trajectory's return normalized within its task group (Shao et al. 2024).

Notation
  N  turns (rows), sorted by (traj_id, turn);  M  trajectories;  K  task groups
  r_t      reward received at turn t (outcome at the last turn, plus any per-turn terms)
  R(tau)   episode return of trajectory tau: sum_t r_t (undiscounted)

    A(tau) = (R(tau) - mean_{tau' in g} R(tau')) / (std_{tau' in g} R(tau') + eps)   norm = "mean_std"
    A(tau) =  R(tau) - mean_{tau' in g} R(tau')                                      norm = "mean"

std is the unbiased (n - 1) standard deviation, as `torch.std`. A group holding a single
trajectory has no baseline to compare against, so its advantage is 0 (both norms). Every
turn of tau receives A(tau); the loss broadcasts it to the turn's response tokens.

`group_normalize` is the trajectory-level transform, reused by GiGPO (episode and anchor
groups) and by the RSPO swap. No Python loop over groups: segment reductions
(`rspo.segment`); `group_normalize_loop` is the readable reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rspo.segment import Segments, num_segments, segment_mean_std, weights

if TYPE_CHECKING:
    from rspo.algorithms import Turns

NORMS = ("mean_std", "mean")


def group_normalize(
    x: Tensor,
    groups: Tensor | Segments,
    norm: str = "mean_std",
    eps: float = 1e-6,
    *,
    mask: Tensor | None = None,
) -> Tensor:
    """Normalize x (M,) within groups -> (M,).

    `groups`: the group id of each row (M,), or their `Segments` (built once when several
    calls share the groups, as the RSPO swap's two do). With `mask` (M,) bool, only masked
    rows form the groups (statistics and count) and unmasked rows get 0. Groups of one
    (masked) row get 0.
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    seg = groups if isinstance(groups, Segments) else Segments.of(groups)
    dev, std, count = segment_mean_std(x, seg, mask)  # row-shaped, (K,), (K,); exact 0 for equal values
    scale = weights(count > 1, x.dtype)  # (K,) singletons -> 0
    if norm == "mean_std":
        scale = scale / (std + eps)  # std > 0 (see segment_mean_std), so finite even when eps = 0
    return seg.flat(dev.mul_(seg.expand(scale)))


def group_normalize_loop(
    x: Tensor, group_id: Tensor, norm: str = "mean_std", eps: float = 1e-6, *, mask: Tensor | None = None
) -> Tensor:
    """Loop reference for `group_normalize`: collect each group's rows, then normalize."""
    xs, gs = x.tolist(), group_id.tolist()
    ms = [True] * len(xs) if mask is None else mask.tolist()
    members: dict[int, list[int]] = {}
    for i, (g, m) in enumerate(zip(gs, ms)):
        if m:
            members.setdefault(g, []).append(i)
    out = [0.0] * len(xs)
    for rows in members.values():
        if len(rows) < 2:
            continue  # a singleton has no baseline: advantage 0
        vals = [xs[i] for i in rows]
        mean = sum(vals) / len(vals)
        std = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5
        for i in rows:
            out[i] = (xs[i] - mean) / (std + eps) if norm == "mean_std" else xs[i] - mean
    return torch.tensor(out, dtype=x.dtype, device=x.device)


def episode_advantages(turns: Turns, norm: str, eps: float) -> Tensor:
    """A(tau) of every turn's trajectory -> (N,). The GRPO advantage; GiGPO's A^E."""
    trajs = Segments(turns.traj_id, num_segments(turns.traj_id))  # rows -> trajectory ids [0, M)
    ret = trajs.sum(turns.reward)  # (M,) R(tau) = sum_t r_t
    # The task group of each trajectory (every row of a trajectory has the same group_id);
    # -1 marks ids no row uses (a `select`ed subset keeps sparse ids), left out by the mask.
    traj_group = turns.group_id.new_full((trajs.num,), -1).scatter_(0, turns.traj_id, turns.group_id)  # (M,)
    present = traj_group >= 0  # (M,)
    adv = group_normalize(ret, traj_group.clamp(min=0), norm, eps, mask=present)  # (M,)
    return trajs.expand(adv)  # (N,) broadcast to every turn


def grpo_advantages(
    turns: Turns, *, norm: str, gamma: float, lam: float, step_weight: float, eps: float = 1e-6
) -> tuple[Tensor, None]:
    """GRPO per-turn advantages (N,) and no critic returns. gamma, lam, step_weight: unused."""
    return episode_advantages(turns, norm, eps), None


def grpo_advantages_loop(turns: Turns, *, norm: str, eps: float = 1e-6, **_: float) -> Tensor:
    """Loop reference for `grpo_advantages`: per-trajectory returns, then per-group baselines."""
    ret: dict[int, float] = {}
    group: dict[int, int] = {}
    for r, t, g in zip(turns.reward.tolist(), turns.traj_id.tolist(), turns.group_id.tolist()):
        ret[t] = ret.get(t, 0.0) + r
        group[t] = g
    trajs = list(ret)
    adv = group_normalize_loop(
        torch.tensor([ret[t] for t in trajs], dtype=torch.float64), torch.tensor([group[t] for t in trajs]), norm, eps
    ).tolist()
    by_traj = dict(zip(trajs, adv))
    return torch.tensor([by_traj[t] for t in turns.traj_id.tolist()], dtype=turns.reward.dtype)
