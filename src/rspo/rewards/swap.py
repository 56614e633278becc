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

Notation (one row per trajectory in `rspo_group_advantages`, per turn in `swap_rewards`)
  N  rows;  K  task groups
  o  (N,) outcome reward;  p  (N,) process reward;  s  (N,) source;  g  (N,) group id

    target_adv_i   = (o_i - mean_{j: g_j = g_i} o_j) / (std_{j: g_j = g_i} o_j + eps)
    explorer_adv_i = (p_i - mean_{j: g_j = g_i, s_j = 1} p_j) / (std_{...} p_j + eps)   if s_i = 1
                   = 0                                                                  otherwise
  ("mean" norm drops the division; std is unbiased; a group or explorer subgroup of one
  row gets 0.)

`rspo_group_advantages` is the GRPO special case as one batched transform (segment
reductions, no Python loop; the same code on CPU and CUDA), with the loop reference
`rspo_group_advantages_loop`. `swap_rewards` is the general per-turn routing the trainer
uses with any base estimator: run it on the target view (all rows, target reward) and
on the explorer view (explorer rows, explorer reward).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rspo.algorithms.grpo import group_normalize, group_normalize_loop
from rspo.batch import EXPLORER
from rspo.segment import Segments


def rspo_group_advantages(
    outcome: Tensor, process: Tensor, source: Tensor, group_id: Tensor, norm: str = "mean_std", eps: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """Per-trajectory (target_adv (N,), explorer_adv (N,)) of mixed groups (see module docstring)."""
    groups = Segments.of(group_id)  # shared by both updates' statistics
    target_adv = group_normalize(outcome, groups, norm, eps)  # all rows, outcome reward
    explorer_adv = group_normalize(process, groups, norm, eps, mask=source == EXPLORER)  # explorer rows, process
    return target_adv, explorer_adv


def rspo_group_advantages_loop(
    outcome: Tensor, process: Tensor, source: Tensor, group_id: Tensor, norm: str = "mean_std", eps: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """Loop reference for `rspo_group_advantages`."""
    target_adv = group_normalize_loop(outcome, group_id, norm, eps)
    explorer_adv = group_normalize_loop(process, group_id, norm, eps, mask=source == EXPLORER)
    return target_adv, explorer_adv


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
