"""GiGPO: episode-level plus anchor-state step-level relative advantages.

Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training"
(arXiv 2505.10978). Symbols follow the paper. The combination is its Eq. (8) (numbering as
cited by another implementation, Trinity-RFT's; we could not check the paper's other
equation numbers, so the other quantities are cited by name).

Notation
  N  turns (rows), sorted by (traj_id, turn);  M  trajectories;  K  task groups
  r_t^(i)      reward of trajectory i at step t
  s~           an anchor state: the raw observation before a step, as an integer hash
  G^S(s~)      the step group of s~: every step, in any trajectory of the same task group
               and at any time, taken from state s~ (the paper's "anchor state grouping")

    A^E(tau_i)   = GRPO's episode advantage of trajectory i         episode relative advantage
    R_t^(i)      = sum_{k>=t} gamma^(k-t) r_k^(i)                   discounted step return
    A^S(a_t^(i)) = (R_t^(i) - mean_{G^S(s~)} R) / (std_{G^S(s~)} R + eps)   step relative adv.
    A(a_t^(i))   = A^E(tau_i) + omega * A^S(a_t^(i))                             Eq. (8)

Singletons: a step group of one gets A^S = 0, as in the reference code (verl-agent,
`step_norm_reward`). An episode group of one gets A^E = 0 here too, where verl's GRPO
normalization (which the reference's episode level follows) uses mean 0 / std 1 and so
passes the raw return through; rspo treats singletons one way at both levels.
`norm` ("mean_std" / "mean") applies to both levels, as in the reference (the paper's
F_norm = std or 1).

Vectorization: R_t is a segment-wise reverse discounted cumsum (a log-depth scan, no loop
over trajectories); step groups are dense ids of the distinct (group_id, anchor) pairs,
from a stable sort (what `torch.unique(..., return_inverse=True)` does, faster), so no
hashing in Python. `gigpo_advantages_loop` is the readable reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rspo.algorithms.grpo import episode_advantages, group_normalize, group_normalize_loop, grpo_advantages_loop
from rspo.segment import segment_discounted_cumsum, segment_discounted_cumsum_loop

if TYPE_CHECKING:
    from rspo.algorithms import Turns


def anchor_groups(group_id: Tensor, anchor: Tensor) -> tuple[Tensor, int]:
    """Step-group id of every turn (N,), one per distinct (group_id, anchor), and the count.

    Equivalent to `torch.unique(torch.stack([group_id, anchor], 1), dim=0, return_inverse=True)`,
    which is far slower on CPU (~150 ms vs ~2 ms at N = 65,536). Here: order the rows so that equal pairs are adjacent
    (rows sorted by group, then stably by anchor), mark where a pair starts, number the
    starts with a cumsum and scatter the numbers back. One 64-bit sort when the rows are
    already grouped by task (the trainer's batches are), two otherwise.
    """
    n = anchor.numel()
    if n == 0:
        return anchor.clone(), 0
    order = torch.arange(n, device=anchor.device)
    if not bool((group_id[1:] >= group_id[:-1]).all()):
        order = torch.argsort(group_id, stable=True)
    a, by_anchor = torch.sort(anchor.index_select(0, order), stable=True)  # (N,) sorted anchors
    order = order.index_select(0, by_anchor)  # (N,) row of each sorted position
    g = group_id.index_select(0, order)  # (N,) equal (g, a) pairs are now adjacent
    starts = torch.ones(n, dtype=torch.long, device=anchor.device)  # (N,) 1 where a new pair begins
    starts[1:] = ((g[1:] != g[:-1]) | (a[1:] != a[:-1])).long()
    ids_sorted = torch.cumsum(starts, 0) - 1  # (N,) step-group id in sorted order
    step_group = torch.empty_like(ids_sorted).scatter_(0, order, ids_sorted)  # (N,) back to row order
    return step_group, int(ids_sorted[-1]) + 1


def step_returns(turns: Turns, gamma: float) -> Tensor:
    """R_t = r_t + gamma * R_{t+1} within each trajectory, 0 after its last turn -> (N,)."""
    return segment_discounted_cumsum(turns.reward, gamma, turns.traj_id)


def gigpo_advantages(
    turns: Turns, *, norm: str, gamma: float, lam: float, step_weight: float, eps: float = 1e-6
) -> tuple[Tensor, None]:
    """GiGPO per-turn advantages (N,) and no critic returns. lam: unused."""
    a_episode = episode_advantages(turns, norm, eps)  # (N,) A^E(tau_i)
    step_group, num = anchor_groups(turns.group_id, turns.anchor)  # (N,) G^S(s~)
    ret = step_returns(turns, gamma)  # (N,) R_t^(i)
    a_step = group_normalize(ret, step_group, norm, eps, num_groups=num)  # (N,) A^S(a_t^(i))
    return a_episode + step_weight * a_step, None  # Eq. (8)


def gigpo_advantages_loop(
    turns: Turns, *, norm: str, gamma: float, step_weight: float, eps: float = 1e-6, **_: float
) -> Tensor:
    """Loop reference for `gigpo_advantages`: dict-keyed step groups, per-trajectory returns."""
    a_episode = grpo_advantages_loop(turns, norm=norm, eps=eps)
    ret = segment_discounted_cumsum_loop(turns.reward, gamma, turns.traj_id)
    keys: dict[tuple[int, int], int] = {}
    step_group = [keys.setdefault((g, a), len(keys)) for g, a in zip(turns.group_id.tolist(), turns.anchor.tolist())]
    a_step = group_normalize_loop(ret, torch.tensor(step_group), norm, eps)
    return a_episode + step_weight * a_step
