"""Reward modes (`reward.mode`): what an iteration samples, what each learner trains on,
and what follows the update — the one place each mode says so.

Every mode answers the same calls, so the trainer never branches on the mode. In the
order `rspo.train` makes them:

  MODES[name](cfg)                   setup: `.learners` (name -> learning rate) are the
                                     policies built (LoRA adapters) and trained
  .plans(step)                       which policies sample, how many trajectories per task
  .complete(batch, tasks, step, pad) the batch the learners see (RSPO: replayed
                                     trajectories join their task's group)
  .learner_data(batch, step)         the rows and per-turn rewards of each learner that
                                     trains this step, in update order
  .after_update(policy, batch, trajectories, step)
                                     RSPO: store the explorer's trajectories, copy the
                                     explorer into the target every `rspo.sync_every` steps
  .state_dict() / .load_state_dict(per_rank, rank, world)
                                     what a checkpoint keeps (RSPO: each rank's buffer)

Rows and rewards. Notation: N turns; every tensor below is (N,).

  mode        learner    rows               reward r_t
  outcome     target     target             c_o * outcome_t
  process     target     target             c_p * process_t
  shaped      target     target             c_o * outcome_t + lambda * c_p * process_t
  group_swap  target     target             c_p * process_t  in groups without outcome signal,
                                            c_o * outcome_t  elsewhere
  rspo        target     target + joining   c_o * outcome_t       (explorer, replayed, expert rows:
                         rows (swap)                             rewards swapped to the outcome)
              explorer   explorer (src 1)   c_p * process_t       (`rspo.explorer_reward=shaped`:
                                                                 c_o * outcome_t + lambda * c_p * process_t)

Every learner's reward also carries the invalid-action penalty: r_t -= penalty on turns
whose response held no well-formed action. c_o = `reward.outcome_scale`,
c_p = `reward.process_scale`, lambda = `reward.shaped_coef`.

"Joining rows" (`rspo.join`): which explorer, replayed and expert trajectories join the
target's groups: all, successes only, or rescues only (`rspo.rewards.swap.joining_rows`).

RSPO lives in three files: this one (its mode, `Rspo`), `rspo.rewards.swap` (the swap)
and `rspo.rewards.buffer` (the replay buffer). rspo's own choices where the paper is
silent (the explorer's warm-up, the sync, which rows join, the expert ceiling) are `Rspo`'s.
`GroupSwap` is the other reading of "reward swap": no explorer, the process reward where
the outcome carries no signal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rspo.algorithms.offpolicy import OffPolicy
from rspo.batch import EXPERT, EXPLORER, REPLAY, TARGET, TurnBatch, cat
from rspo.config import Config
from rspo.rewards.buffer import ReplayBuffer, resume_state
from rspo.rewards.swap import flat_groups, joining_rows, swap_rewards
from rspo.rollout import EXPERT_PLAN, Plan


@dataclass
class LearnerData:
    """One learner's share of a batch."""

    rows: Tensor  # (N,) bool: the rows this learner trains on
    reward: Tensor  # (N,) float: per-turn reward (meaningful on `rows`)
    offpolicy: OffPolicy | None = None  # rows sampled by another policy and their correction; None: none

    def of(self, batch: TurnBatch) -> tuple[TurnBatch, Tensor, OffPolicy | None]:
        """This learner's rows of `batch`, their rewards (n,) and their off-policy part."""
        off = None if self.offpolicy is None else self.offpolicy.select(self.rows)
        return batch.select(self.rows), self.reward[self.rows], off


def penalty_of(valid: Tensor, penalty: float) -> Tensor:
    """(N,) the invalid-action penalty of each turn: `penalty` where no well-formed action."""
    return penalty * (~valid).float()


class RewardMode:
    """The calls every mode answers (module docstring), answered for the modes where the
    target trains alone on its own rollouts; those differ only in `reward` (the table)."""

    def __init__(self, cfg: Config) -> None:
        r = cfg.reward
        self.c_o, self.c_p, self.lam = r.outcome_scale, r.process_scale, r.shaped_coef
        self.penalty = cfg.rollout.invalid_action_penalty
        self.group_size = cfg.rollout.group_size
        self.learners = {"target": cfg.train.lr}  # name -> learning rate
        self.rollouts_per_task = self.group_size

    def reward(self, batch: TurnBatch) -> Tensor:
        """(N,) the target's per-turn reward before the penalty: each mode's own (the table)."""
        raise NotImplementedError

    def plans(self, step: int) -> list[Plan]:
        return [Plan("target", self.group_size, TARGET)]

    def complete(self, batch: TurnBatch, tasks: list[tuple[str, int]], step: int, pad_id: int) -> TurnBatch:
        return batch

    def learner_data(self, batch: TurnBatch, step: int) -> dict[str, LearnerData]:
        on_policy = batch.source == TARGET
        reward = self.reward(batch) - penalty_of(batch.valid, self.penalty)
        return {"target": LearnerData(on_policy, reward)}

    def after_update(self, policy, batch: TurnBatch, trajectories: list, step: int) -> None:
        pass

    def state_dict(self) -> dict | None:
        return None

    def load_state_dict(self, per_rank: list, rank: int, world: int) -> None:
        pass


class Outcome(RewardMode):
    """The baseline: the outcome reward alone."""

    def reward(self, batch: TurnBatch) -> Tensor:
        return self.c_o * batch.outcome


class Process(RewardMode):
    """The dense process reward alone: the misaligned surrogate."""

    def reward(self, batch: TurnBatch) -> Tensor:
        return self.c_p * batch.process


class Shaped(RewardMode):
    """Outcome plus lambda times the process reward."""

    def reward(self, batch: TurnBatch) -> Tensor:
        return self.c_o * batch.outcome + self.lam * self.c_p * batch.process


class GroupSwap(RewardMode):
    """The per-group swap: in a task group whose outcome returns are all equal (no outcome
    signal: all failed, or all won) the process reward takes the outcome's place; every other
    group trains on the outcome (`rspo.rewards.swap.flat_groups`). No explorer.

    Scale: ALFWorld's and WebShop's potentials reach 1 exactly at the win, so with
    `reward.process_scale` = `reward.outcome_scale` a trajectory from no progress to the win
    earns as much in either channel; the process channel's group advantages are then as
    large as the progress differences within the group (at most a win's)."""

    def reward(self, batch: TurnBatch) -> Tensor:
        flat = flat_groups(batch.outcome, batch.traj_id, batch.group_id)  # (N,)
        return torch.where(flat, self.c_p * batch.process, self.c_o * batch.outcome)


class Rspo(RewardMode):
    """RSPO: the explorer learns from the process reward on its own rollouts; its
    trajectories, rewards swapped back to the outcome, join the target's task groups, this
    iteration's and up to R earlier ones of the same task from a replay buffer.

    rspo's own choices: the explorer alone samples and trains for the first
    `rspo.explorer_warmup_steps` iterations; every `rspo.sync_every` iterations (0: never)
    the explorer's weights are copied into the target after the update; `rspo.join` says
    which non-target trajectories join the target's groups; `rspo.explorer_reward` is the
    explorer's reward (process, or shaped: outcome + lambda * process).

    The ceiling (`rspo.expert_fraction` = q > 0): in the first round(q * B) of the
    iteration's B tasks (drawn at random, so a random subset), the env's expert plays one
    of the E explorer rows (source EXPERT). It joins the target's group as an explorer row
    does, rewards swapped to the outcome, marked off-policy; it trains neither the explorer
    nor enters the buffer. It has no behaviour probability: by default its log-probs are
    recorded as 0 (probability 1), as LUFFY (Yan et al. 2025, arXiv 2504.14945) sets
    pi_behavior = 1 for demonstrations, so the off-policy ratio is pi_theta itself
    (`rspo.algorithms.offpolicy`); `rspo.expert_behavior=target` records the target's own
    log-probs of the expert's tokens at rollout time instead (the ratio starts at 1).
    """

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        r = cfg.rspo
        self.explorer_rollouts, self.replay_per_task = r.explorer_rollouts, r.replay_per_task
        self.warmup_steps, self.sync_every = r.explorer_warmup_steps, r.sync_every
        self.join, self.explorer_shaped = r.join, r.explorer_reward == "shaped"
        self.correction = {"method": r.offpolicy, "clip": r.offpolicy_clip, "shaping_gamma": r.shaping_gamma}
        self.num_tasks, self.expert_tasks = cfg.rollout.num_tasks, round(r.expert_fraction * cfg.rollout.num_tasks)
        self.expert_scorer = "target" if r.expert_behavior == "target" else None  # None: probability 1
        self.buffer = ReplayBuffer(r.buffer_size, r.buffer_staleness, r.buffer_successes_only)
        self.learners = {"target": cfg.train.lr, "explorer": r.explorer_lr or cfg.train.lr}
        self.rollouts_per_task = self.group_size + self.explorer_rollouts

    def warming_up(self, step: int) -> bool:
        return step < self.warmup_steps

    def plans(self, step: int) -> list[Plan]:
        target = [] if self.warming_up(step) else [Plan("target", self.group_size, TARGET)]
        if not self.expert_tasks:
            return [*target, Plan("explorer", self.explorer_rollouts, EXPLORER)]
        k, E = self.expert_tasks, self.explorer_rollouts
        with_expert, rest = tuple(range(k)), tuple(range(k, self.num_tasks))  # task positions
        return [
            *target,
            Plan(EXPERT_PLAN, 1, EXPERT, groups=with_expert, scored_by=self.expert_scorer),
            Plan("explorer", E - 1, EXPLORER, groups=with_expert),
            Plan("explorer", E, EXPLORER, groups=rest),
        ]

    def complete(self, batch: TurnBatch, tasks: list[tuple[str, int]], step: int, pad_id: int) -> TurnBatch:
        return add_replay(batch, self.buffer, tasks, self.replay_per_task, step, pad_id)

    def learner_data(self, batch: TurnBatch, step: int) -> dict[str, LearnerData]:
        """The swap (`swap_rewards`): the target trains on its own rows and the joining ones
        (`rspo.join`) with the outcome, the explorer on its own rows with its reward
        (`rspo.explorer_reward`); warming up, the explorer alone."""
        pen = penalty_of(batch.valid, self.penalty)
        target_r, explorer_r, explorer_rows = swap_rewards(batch.outcome, batch.process, batch.source)
        joining = joining_rows(batch.outcome, batch.source, batch.traj_id, batch.group_id, self.join)  # (N,)
        explorer_r = self.c_p * explorer_r
        if self.explorer_shaped:
            explorer_r = self.c_o * batch.outcome * explorer_rows + self.lam * explorer_r
        data = {
            "target": LearnerData(
                joining, self.c_o * target_r - pen, OffPolicy(batch.source != TARGET, **self.correction)
            ),
            "explorer": LearnerData(explorer_rows, explorer_r - pen),  # on-policy: its own rows
        }
        return {"explorer": data["explorer"]} if self.warming_up(step) else data

    def after_update(self, policy, batch: TurnBatch, trajectories: list, step: int) -> None:
        """Store this iteration's explorer trajectories (`trajectories`: the rollout's, by
        traj_id) for replay; on a sync step, copy the explorer into the target."""
        explorer = batch.select(batch.source == EXPLORER)
        ids = torch.unique(explorer.traj_id).tolist()  # (M,) in the order the buffer reads them
        self.buffer.add(explorer, step, torch.tensor([trajectories[i].won for i in ids], dtype=torch.bool))
        if self.sync_every and (step + 1) % self.sync_every == 0:
            policy.copy_weights("explorer", "target")

    def state_dict(self) -> dict:
        return self.buffer.state_dict()

    def load_state_dict(self, per_rank: list, rank: int, world: int) -> None:
        """Each rank's buffer back (`resume_state`); nothing from a checkpoint of another mode."""
        if per_rank and all(state is not None for state in per_rank):
            self.buffer.load_state_dict(resume_state(per_rank, rank, world))


def add_replay(
    batch: TurnBatch, buffer: ReplayBuffer, tasks: list[tuple[str, int]], k: int, version: int, pad_id: int
) -> TurnBatch:
    """`batch` with up to `k` replayed explorer trajectories appended to each task's group
    (group = the task's position in `tasks`; fresh traj ids; source = REPLAY)."""
    parts, next_traj = [batch], int(batch.traj_id.max()) + 1
    for group, (_, index) in enumerate(tasks):
        for old in buffer.sample(index, k, version):
            n = len(old)
            ids = dict(
                group_id=torch.full((n,), group), traj_id=torch.full((n,), next_traj), source=torch.full((n,), REPLAY)
            )
            parts.append(TurnBatch(**{**old.__dict__, **ids}))
            next_traj += 1
    return cat(parts, pad_id) if len(parts) > 1 else batch


MODES: dict[str, type[RewardMode]] = {
    "outcome": Outcome,
    "process": Process,
    "shaped": Shaped,
    "rspo": Rspo,
    "group_swap": GroupSwap,
}
