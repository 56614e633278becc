"""Where the outcome reward's learning signal comes from: RSPO's mechanism, measured.

RSPO's premise is a sparse outcome reward. A task group whose outcome returns are all
equal (every trajectory failed, or every one won) gets a zero group-relative advantage:
under `reward.mode=outcome` it teaches the target nothing. RSPO mixes into each group the
explorer's trajectories of the same task (this iteration's, and replayed ones), rewards
swapped to the outcome; a group the target failed everywhere carries a gradient again if
one of those trajectories won. These metrics say how often that happened:

  rollout/groups_without_signal  of the groups with target trajectories, the fraction
                                 whose target outcome returns are all equal (any mode)
  rspo/groups_rescued            of the groups with no target success, the fraction whose
                                 explorer, replayed or expert trajectories hold a success
  rspo/explorer_only_successes   winning explorer trajectories in groups with no target
                                 success (a count for the iteration)
  rspo/replay_only_successes     the same for replayed trajectories
  rspo/expert_only_successes     the same for the expert's (only when the batch has any:
                                 `rspo.expert_fraction`)
  rspo/replayed                  replayed trajectories that joined the target's groups
                                 (a count for the iteration, won or not): whether replay
                                 happened at all (it needs a buffered task to recur)

The `rspo/…` keys appear only when the batch has explorer or replayed rows. A success is
a trajectory whose (unscaled) outcome return reaches 1: ALFWorld's `won`, WebShop's
purchase with score 1 under either `env.webshop.outcome`.

Notation (per trajectory, M rows; K task groups)
  o  (M,) outcome return;  s  (M,) source (TARGET, EXPLORER, REPLAY, EXPERT);  g  (M,) group id
"""

from __future__ import annotations

import torch
from torch import Tensor

from rspo.batch import EXPERT, EXPLORER, REPLAY, TARGET, TurnBatch

SUCCESS = 1.0 - 1e-6  # an outcome return at least this is a success


def trajectories_of(batch: TurnBatch) -> tuple[Tensor, Tensor, Tensor]:
    """Per-trajectory (outcome return (M,), source (M,), group id (M,)) of a turn batch."""
    M = int(batch.traj_id.max()) + 1 if len(batch) else 0
    ret = batch.outcome.new_zeros(M).index_add_(0, batch.traj_id, batch.outcome)
    source = batch.source.new_zeros(M).scatter_(0, batch.traj_id, batch.source)  # equal on a trajectory's rows
    group = batch.group_id.new_zeros(M).scatter_(0, batch.traj_id, batch.group_id)
    return ret, source, group


def signal_metrics(outcome_return: Tensor, source: Tensor, group_id: Tensor) -> dict[str, float]:
    """The module docstring's metrics from per-trajectory tensors (M,). Segment reductions
    over groups, no loop; `signal_metrics_loop` is the readable reference."""
    K = int(group_id.max()) + 1 if group_id.numel() else 0
    won = (outcome_return >= SUCCESS).float()
    target = source == TARGET

    def per_group(x: Tensor, reduce: str, fill: float) -> Tensor:  # (K,) reduction over each group's rows
        return torch.full((K,), fill, device=x.device).scatter_reduce(
            0, group_id, x.float(), reduce, include_self=False
        )

    n_target = per_group(target, "sum", 0.0)
    has_target = n_target > 0
    if not bool(has_target.any()):  # e.g. RSPO's explorer warm-up: the target sampled nothing
        return {}
    o = outcome_return.float()
    hi = per_group(torch.where(target, o, o.new_full(o.shape, -torch.inf)), "amax", -torch.inf)
    lo = per_group(torch.where(target, o, o.new_full(o.shape, torch.inf)), "amin", torch.inf)
    out = {"rollout/groups_without_signal": _fraction(hi[has_target] == lo[has_target])}
    if bool(target.all()):
        return out
    failed = has_target & (per_group(won * target, "sum", 0.0) == 0)  # (K,) groups the target never won
    in_failed = failed[group_id]  # (M,) the trajectory's group is one of them
    explorer_wins = won * (source == EXPLORER) * in_failed
    replay_wins = won * (source == REPLAY) * in_failed
    expert_wins = won * (source == EXPERT) * in_failed
    rescued = per_group(explorer_wins + replay_wins + expert_wins, "sum", 0.0) > 0
    if bool(failed.any()):
        out["rspo/groups_rescued"] = _fraction(rescued[failed])
    out["rspo/explorer_only_successes"] = float(explorer_wins.sum())
    out["rspo/replay_only_successes"] = float(replay_wins.sum())
    if bool((source == EXPERT).any()):
        out["rspo/expert_only_successes"] = float(expert_wins.sum())
    out["rspo/replayed"] = float(((source == REPLAY) & has_target[group_id]).sum())
    return out


def _fraction(flags: Tensor) -> float:
    """The fraction of True in a non-empty bool tensor, in float64 (k / n exactly as Python divides)."""
    return int(flags.sum()) / flags.numel()


def signal_metrics_loop(outcome_return: Tensor, source: Tensor, group_id: Tensor) -> dict[str, float]:
    """Loop reference for `signal_metrics`: group by group, trajectory by trajectory."""
    groups: dict[int, list[tuple[float, int]]] = {}
    for o, s, g in zip(outcome_return.tolist(), source.tolist(), group_id.tolist()):
        groups.setdefault(g, []).append((o, s))
    with_target = [rows for rows in groups.values() if any(s == TARGET for _, s in rows)]
    if not with_target:
        return {}
    flat = [len({o for o, s in rows if s == TARGET}) == 1 for rows in with_target]  # one distinct target return
    out = {"rollout/groups_without_signal": sum(flat) / len(with_target)}
    if all(s == TARGET for rows in groups.values() for _, s in rows):
        return out
    failed = [rows for rows in with_target if not any(o >= SUCCESS for o, s in rows if s == TARGET)]
    replayed = sum(s == REPLAY for rows in with_target for _, s in rows)
    wins = {EXPLORER: 0, REPLAY: 0, EXPERT: 0}
    rescued = 0
    for rows in failed:
        for o, s in rows:
            if o >= SUCCESS and s in wins:
                wins[s] += 1
        rescued += any(o >= SUCCESS and s != TARGET for o, s in rows)
    if failed:
        out["rspo/groups_rescued"] = rescued / len(failed)
    out["rspo/explorer_only_successes"] = float(wins[EXPLORER])
    out["rspo/replay_only_successes"] = float(wins[REPLAY])
    if any(s == EXPERT for rows in groups.values() for _, s in rows):
        out["rspo/expert_only_successes"] = float(wins[EXPERT])
    out["rspo/replayed"] = float(replayed)
    return out
