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

Vectorization: R_t is a reverse discounted cumsum along each trajectory (a log-depth
scan, no loop over trajectories); step groups come from a sort-free hash-table election
on (group_id, anchor) (`anchor_groups`), and A^S from segment reductions over them.
`gigpo_advantages_loop` is the readable reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rspo.algorithms.grpo import episode_advantages, group_normalize, group_normalize_loop, grpo_advantages_loop
from rspo.segment import Segments, discounted_cumsum, segment_discounted_cumsum_loop, weights

if TYPE_CHECKING:
    from rspo.algorithms import Turns


def _odd_constant(i: int) -> int:
    """The i-th odd pseudo-random 64-bit constant (splitmix64 of i), as a signed int64."""
    z = (i + 1) * 0x9E3779B97F4A7C15 % 2**64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 % 2**64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB % 2**64
    z = (z ^ (z >> 31)) | 1
    return z - 2**64 if z >= 2**63 else z


def anchor_groups(group_id: Tensor, anchor: Tensor) -> Segments:
    """Step groups G^S: one segment per distinct (group_id, anchor) pair.

    The pair is compared as one 64-bit key, anchor + group_id * C (wrapping, C a random odd
    constant): two pairs share a key with probability ~2^-64, as likely as two observations
    sharing their 63-bit anchor hash, which the grouping already accepts.

    A segment's id is the index of one of its rows (ids in [0, N)), found without sorting by
    electing a representative per key in hash tables, exactly (a slot collision costs a
    round, never merges two keys):
      1. hash each pending row's key to a slot of a table of 2^b >= 2 * (pending rows) slots
         (multiplicative hashing: the top b bits of key * odd multiplier, wrapping);
      2. every pending row writes its index into its slot; one writer per slot wins;
      3. a row whose slot's winner has the same key joins the winner's segment (the winner
         joins its own); the rest, whose slot a different key won, go again with a new
         multiplier.
    Every key that wins a slot is settled in its round, so the pending rows shrink
    geometrically (about 1/8 of them are left after a round). This replaces
    `torch.unique(key, return_inverse=True)`, whose 64-bit sort dominated the estimator.
    """
    key = anchor + group_id * _odd_constant(0)  # (N,)
    rows, p_key = torch.arange(key.numel(), device=key.device), key  # (P,) pending rows and their keys
    rep = rows  # (N,) the representative row of each row's key, once settled
    round_ = 0
    while rows.numel():
        bits = max(1, (2 * rows.numel() - 1).bit_length())
        slot = ((p_key * _odd_constant(1 + round_)) >> (64 - bits)) & ((1 << bits) - 1)  # (P,)
        winner = rows.new_empty(1 << bits).scatter_(0, slot, rows).index_select(0, slot)  # (P,)
        rep = winner if round_ == 0 else rep.index_copy_(0, rows, winner)  # right for the settled rows
        left = (key.index_select(0, winner) != p_key).nonzero().squeeze(1)  # (P',) a different key won the slot
        rows, p_key = rows.index_select(0, left), p_key.index_select(0, left)
        round_ += 1
    return Segments(rep, rep.numel())


def step_returns(turns: Turns, gamma: float) -> Tensor:
    """R_t = r_t + gamma * R_{t+1} within each trajectory, 0 after its last turn -> (N,)."""
    link = weights(~turns.last, turns.reward.dtype) * gamma  # (N,) gamma, 0 at a trajectory's last turn
    return discounted_cumsum(turns.reward, link, turns.max_len())


def gigpo_advantages(
    turns: Turns, *, norm: str, gamma: float, lam: float, step_weight: float, eps: float = 1e-6
) -> tuple[Tensor, None]:
    """GiGPO per-turn advantages (N,) and no critic returns. lam: unused."""
    a_episode = episode_advantages(turns, norm, eps)  # (N,) A^E(tau_i)
    ret = step_returns(turns, gamma)  # (N,) R_t^(i)
    a_step = group_normalize(ret, anchor_groups(turns.group_id, turns.anchor), norm, eps)  # (N,) A^S(a_t^(i))
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
