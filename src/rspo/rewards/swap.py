"""The RSPO reward swap: who learns from which reward channel, over mixed groups.

Each task group mixes trajectories from three sources (`rspo.batch`):
  0 TARGET    the target policy's on-policy rollouts (G per task)
  1 EXPLORER  the explorer's rollouts of the same task this iteration (E per task)
  2 REPLAY    explorer trajectories of the same task from earlier iterations (up to R)

  Target update:   every row of the group, *outcome* reward (the explorer's and replayed
                   trajectories have their reward channel swapped back to the outcome),
                   so the target only ever optimizes the true objective.
  Explorer update: the group's EXPLORER rows only, *process* reward; on-policy for the
                   explorer. Replayed rows do not enter it (they are stale for the explorer).

The swap routes reward channels, per turn (`swap_rewards`); the advantages are then the
base algorithm's own (`rspo.algorithms`), run once per learner on its view of the batch
(`rspo.update.learner_advantages`), as for every other reward mode.

Notation (per turn)
  N  turns;  o (N,) outcome reward;  p (N,) process reward;  s (N,) source

    target view    rows: every row               reward: o_t   (the swap: rows of s = 1, 2 too)
    explorer view  rows: {t : s_t = 1}           reward: p_t
    A_learner = ALGORITHMS[algo.name].advantages(view)    each over its view's task groups

For GRPO this reads, per trajectory tau of task group g, R_o and R_p its summed outcome
and process rewards (std unbiased; a group, or explorer subgroup, of one gets 0):

    target_adv(tau)   = (R_o(tau) - mean_{tau' in g} R_o(tau')) / (std_{tau' in g} R_o + eps)
    explorer_adv(tau) = (R_p(tau) - mean_{tau' in g, s = 1} R_p(tau')) / (std_{...} R_p + eps)
                        for the explorer's trajectories (no others are in its view)

GiGPO adds its anchor-state groups within each view; with PPO each learner's critic
learns its own view's rewards. Scaling and the invalid-action penalty are the reward
mode's (`rspo.rewards.modes.Rspo`), applied to each channel after the swap.
`swap_rewards_loop` is the readable reference; benchmarks/bench_swap.py times the whole
path (the swap, then GRPO on both views) against the loop references.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rspo.batch import EXPLORER, TARGET
from rspo.rewards.signal import SUCCESS


def swap_rewards_loop(outcome: Tensor, process: Tensor, source: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Loop reference for `swap_rewards`: row by row."""
    target, explorer, rows = [], [], []
    for o, p, s in zip(outcome.tolist(), process.tolist(), source.tolist()):
        target.append(o)  # every row learns the outcome in the target's update
        explorer.append(p if s == EXPLORER else 0.0)
        rows.append(s == EXPLORER)
    return torch.tensor(target, dtype=outcome.dtype), torch.tensor(explorer, dtype=process.dtype), torch.tensor(rows)


def swap_rewards(outcome: Tensor, process: Tensor, source: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-turn reward channels of the two updates.

    outcome, process, source: (N,) per turn.
    Returns (target_reward (N,), explorer_reward (N,), explorer_rows (N,) bool):
      target_reward    the outcome for every row (the swap: explorer and replayed rows too);
      explorer_reward  the process reward on explorer rows, 0 elsewhere;
      explorer_rows    source == EXPLORER: the rows of the explorer's update.
    Scaling and the invalid-action penalty are the trainer's, applied to each channel after.
    """
    explorer_rows = source == EXPLORER
    explorer_reward = torch.where(explorer_rows, process, torch.zeros_like(process))
    return outcome.clone(), explorer_reward, explorer_rows


# -- which non-target trajectories join the target's groups (`rspo.join`) ------------------
#
#   all        every explorer, replayed and expert row (the swap as first built)
#   successes  only trajectories that won (outcome return >= SUCCESS)
#   rescues    only trajectories that won in a group where no target trajectory won
#
# Target rows always train the target. Per trajectory tau of group g, with won(tau) its
# success and T(g) = any target trajectory of g won:
#   joins(tau) = source(tau) == TARGET or rule(tau),   rule = True | won(tau) | won(tau) and not T(g)

JOIN_RULES = ("all", "successes", "rescues")


def joining_rows(outcome: Tensor, source: Tensor, traj_id: Tensor, group_id: Tensor, rule: str) -> Tensor:
    """(N,) bool: the rows of the target's update under `rspo.join` = `rule` (above).

    outcome, source, traj_id, group_id: (N,) per turn. Segment sums over trajectories and
    groups, no loop; `joining_rows_loop` is the readable reference."""
    if rule not in JOIN_RULES:
        raise ValueError(f"rspo.join must be one of {JOIN_RULES}, got {rule!r}")
    target = source == TARGET
    if rule == "all":
        return torch.ones_like(target)
    M, K = int(traj_id.max()) + 1, int(group_id.max()) + 1
    ret = outcome.new_zeros(M).index_add_(0, traj_id, outcome)  # (M,) outcome return
    won = (ret >= SUCCESS)[traj_id]  # (N,) the row's trajectory won
    target_wins = torch.zeros(K, device=outcome.device).index_add_(0, group_id, (won & target).float())  # (K,)
    joins = won if rule == "successes" else won & (target_wins[group_id] == 0)
    return target | joins


def joining_rows_loop(outcome: Tensor, source: Tensor, traj_id: Tensor, group_id: Tensor, rule: str) -> Tensor:
    """Loop reference for `joining_rows`: trajectory by trajectory."""
    ret: dict[int, float] = {}
    for o, t in zip(outcome.tolist(), traj_id.tolist()):
        ret[t] = ret.get(t, 0.0) + o
    target_won = {g for s, t, g in zip(source.tolist(), traj_id.tolist(), group_id.tolist())
                  if s == TARGET and ret[t] >= SUCCESS}  # fmt: skip
    out = []
    for s, t, g in zip(source.tolist(), traj_id.tolist(), group_id.tolist()):
        won = ret[t] >= SUCCESS
        keep = {"all": True, "successes": won, "rescues": won and g not in target_won}[rule]
        out.append(s == TARGET or keep)
    return torch.tensor(out, dtype=torch.bool)


# -- the per-group swap (`reward.mode=group_swap`) -----------------------------------------
#
# The other reading of "reward swap": no explorer. A group whose trajectories' outcome
# returns are all equal (all failed, or all won) has a zero outcome advantage; there, and
# only there, the process reward takes the outcome's place:
#   flat(g)  = max_{tau in g} R_o(tau) == min_{tau in g} R_o(tau)
#   r_t      = c_p * process_t  if flat(group of t)  else  c_o * outcome_t


def flat_groups(outcome: Tensor, traj_id: Tensor, group_id: Tensor) -> Tensor:
    """(N,) bool: the row's task group has no outcome signal (every trajectory's outcome
    return equal). Segment reductions, no loop; `flat_groups_loop` is the reference."""
    M, K = int(traj_id.max()) + 1, int(group_id.max()) + 1
    ret = outcome.new_zeros(M).index_add_(0, traj_id, outcome)  # (M,) outcome return
    group = group_id.new_zeros(M).scatter_(0, traj_id, group_id)  # (M,) each trajectory's group
    present = torch.zeros(M, dtype=torch.bool, device=outcome.device).scatter_(0, traj_id, True)  # ids in use
    ret, group = ret[present], group[present]
    hi = ret.new_full((K,), -torch.inf).scatter_reduce(0, group, ret, "amax")  # (K,)
    lo = ret.new_full((K,), torch.inf).scatter_reduce(0, group, ret, "amin")  # (K,)
    return (hi == lo)[group_id]


def flat_groups_loop(outcome: Tensor, traj_id: Tensor, group_id: Tensor) -> Tensor:
    """Loop reference for `flat_groups`: group by group."""
    ret: dict[int, float] = {}
    group: dict[int, int] = {}
    for o, t, g in zip(outcome.tolist(), traj_id.tolist(), group_id.tolist()):
        ret[t], group[t] = ret.get(t, 0.0) + o, g
    returns: dict[int, set[float]] = {}
    for t, g in group.items():
        returns.setdefault(g, set()).add(ret[t])
    return torch.tensor([len(returns[g]) == 1 for g in group_id.tolist()], dtype=torch.bool)
