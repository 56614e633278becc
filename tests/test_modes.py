"""Reward modes: each mode's rows and rewards on a hand-computed batch, what samples and
trains in RSPO's warm-up, and what follows the update (tests/test_train.py runs them end to end)."""

from dataclasses import fields

import pytest
import torch

from rspo.batch import TARGET, TurnBatch
from rspo.config import ConfigError, load_config
from rspo.rewards.modes import MODES

T, E, R = 0, 1, 2
SCALES = ["reward.outcome_scale=10", "reward.process_scale=2", "reward.shaped_coef=0.5"]


def mode(name: str, *overrides: str):
    return MODES[name](load_config(None, [f"reward.mode={name}", *SCALES, "rollout.invalid_action_penalty=0.1",
                                          *overrides]))  # fmt: skip


def batch(outcome, process, valid, source) -> TurnBatch:
    n = len(outcome)
    empty = {f.name: torch.zeros(n, 1) for f in fields(TurnBatch)}  # fields the modes do not read
    return TurnBatch(**empty | {"outcome": torch.tensor(outcome), "process": torch.tensor(process),
                                "valid": torch.tensor(valid), "source": torch.tensor(source)})  # fmt: skip


# rows: target (won), target (invalid action), explorer (won), replayed
ROWS = batch([1.0, 0.0, 1.0, 0.0], [0.5, 0.2, 0.4, 0.1], [True, False, True, True], [T, T, E, R])


@pytest.mark.parametrize(
    "name, reward",
    [
        ("outcome", [10.0, -0.1]),  # 10 * outcome, minus 0.1 on the invalid turn
        ("process", [1.0, 0.3]),  # 2 * process: 2 * .5, 2 * .2 - .1
        ("shaped", [10.5, 0.1]),  # 10 * outcome + 0.5 * 2 * process: 10 + .5, 0 + .2 - .1
    ],
)
def test_single_learner_modes_train_the_target_on_its_own_rows(name, reward):
    m = mode(name)
    assert list(m.learners) == ["target"]
    assert [(p.adapter, p.count, p.source) for p in m.plans(0)] == [("target", m.group_size, TARGET)]
    data = m.learner_data(ROWS, step=0)
    assert list(data) == ["target"]
    d = data["target"]
    assert d.rows.tolist() == [True, True, False, False] and d.offpolicy is None  # no off-policy code runs
    torch.testing.assert_close(d.reward[d.rows], torch.tensor(reward))


def test_rspo_swaps_the_explorer_rows_to_the_outcome():
    m = mode("rspo")
    assert list(m.learners) == ["target", "explorer"]
    data = m.learner_data(ROWS, step=0)
    assert list(data) == ["target", "explorer"]  # the update order
    target, explorer = data["target"], data["explorer"]
    # target: every row, 10 * outcome - penalty; the explorer's and the replayed rows are off-policy
    assert target.rows.all() and target.offpolicy.rows.tolist() == [False, False, True, True]
    assert (target.offpolicy.method, target.offpolicy.clip) == ("clip", 2.0)  # rspo.offpolicy, rspo.offpolicy_clip
    torch.testing.assert_close(target.reward, torch.tensor([10.0, -0.1, 10.0, 0.0]))
    # explorer: its own row only, 2 * process = 0.8
    assert explorer.rows.tolist() == [False, False, True, False] and explorer.offpolicy is None
    torch.testing.assert_close(explorer.reward[explorer.rows], torch.tensor([0.8]))


def test_rspo_warm_up_samples_and_trains_the_explorer_alone():
    m = mode("rspo", "rspo.explorer_warmup_steps=1", "rollout.group_size=3", "rspo.explorer_rollouts=2")
    assert m.rollouts_per_task == 5  # 3 target + 2 explorer trajectories per task
    assert [(p.adapter, p.count) for p in m.plans(0)] == [("explorer", 2)]
    assert [(p.adapter, p.count) for p in m.plans(1)] == [("target", 3), ("explorer", 2)]
    assert list(m.learner_data(ROWS, step=0)) == ["explorer"]
    assert list(m.learner_data(ROWS, step=1)) == ["target", "explorer"]


class Trajectory:  # what `after_update` reads of a rollout's trajectories
    def __init__(self, won: bool) -> None:
        self.won = won


class Policy:  # records the copies a sync makes
    def __init__(self) -> None:
        self.copies = []

    def copy_weights(self, src: str, dst: str) -> None:
        self.copies.append((src, dst))


def test_rspo_after_update_stores_explorer_trajectories_and_syncs():
    m = mode("rspo", "rspo.sync_every=2", "rspo.buffer_successes_only=true")
    b = batch([0.0, 1.0, 0.0], [0.1, 0.2, 0.3], [True, True, True], [T, E, E])
    b.traj_id, b.task_index = torch.tensor([0, 1, 2]), torch.tensor([7, 7, 7])
    b.response_mask, b.behavior_logprobs = torch.ones(3, 1), torch.zeros(3, 1)
    policy, trajectories = Policy(), [Trajectory(False), Trajectory(True), Trajectory(False)]
    m.after_update(policy, b, trajectories, step=0)
    assert len(m.buffer) == 1 and policy.copies == []  # trajectory 1, the explorer's won one; no sync at step 1
    m.after_update(policy, b, trajectories, step=1)
    assert policy.copies == [("explorer", "target")]  # step 2 of sync_every=2
    restored = mode("rspo")
    restored.load_state_dict([m.state_dict()], rank=0, world=1)
    assert len(restored.buffer) == 2  # the won explorer trajectory, stored at steps 0 and 1
    untouched = mode("rspo")
    untouched.load_state_dict([None], rank=0, world=1)  # a checkpoint of another mode holds no buffer
    assert len(untouched.buffer) == 0


X = 3  # the expert (RSPO's ceiling)


def grouped(outcome, process, source, traj, group) -> TurnBatch:
    b = batch(outcome, process, [True] * len(outcome), source)
    b.traj_id, b.group_id = torch.tensor(traj), torch.tensor(group)
    return b


# one-turn trajectories: g0 = T lost, E won, X won (a failed group, rescued); g1 = T won, E won, E lost
JOIN = grouped([0.0, 1.0, 1.0, 1.0, 1.0, 0.0], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [T, E, X, T, E, E],
               [0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 1, 1])  # fmt: skip


@pytest.mark.parametrize(
    "rule, rows",
    [
        ("all", [1, 1, 1, 1, 1, 1]),
        ("successes", [1, 1, 1, 1, 1, 0]),  # g1's losing explorer row stays out
        ("rescues", [1, 1, 1, 1, 0, 0]),  # and g1's winning one: the target won g1 itself
    ],
)
def test_rspo_join_picks_the_target_rows(rule, rows):
    data = mode("rspo", f"rspo.join={rule}").learner_data(JOIN, step=0)
    assert data["target"].rows.tolist() == [bool(r) for r in rows]
    # off-policy as before: every row not the target's
    assert data["target"].offpolicy.rows.tolist() == [False, True, True, False, True, True]
    assert data["explorer"].rows.tolist() == [False, True, False, False, True, True]  # the expert trains no explorer


def test_rspo_explorer_reward_shaped_adds_the_outcome():
    # shaped: 10 * outcome + 0.5 * 2 * process on the explorer's rows: 10 + 0.2, 10 + 0.5, 0 + 0.6
    data = mode("rspo", "rspo.explorer_reward=shaped").learner_data(JOIN, step=0)["explorer"]
    torch.testing.assert_close(data.reward[data.rows], torch.tensor([10.2, 10.5, 0.6]))
    # process (the default): 2 * process
    data = mode("rspo").learner_data(JOIN, step=0)["explorer"]
    torch.testing.assert_close(data.reward[data.rows], torch.tensor([0.4, 1.0, 1.2]))


def test_rspo_expert_plays_one_explorer_row_in_a_fraction_of_the_tasks():
    # 8 tasks, q = 0.25: round(2.0) = 2 tasks get the expert in place of one of their 4 explorer rows
    m = mode("rspo", "rspo.expert_fraction=0.25", "rollout.num_tasks=8", "rollout.group_size=8")
    plans = [(p.adapter, p.count, p.source, p.groups) for p in m.plans(0)]
    assert plans == [
        ("target", 8, T, None),
        ("expert", 1, X, (0, 1)),
        ("explorer", 3, E, (0, 1)),
        ("explorer", 4, E, (2, 3, 4, 5, 6, 7)),
    ]
    assert m.rollouts_per_task == 12  # the pool's size per task is unchanged: 8 + 3 + 1 or 8 + 4
    assert [(p.adapter, p.count, p.groups) for p in mode("rspo").plans(0)] == [
        ("target", 4, None),
        ("explorer", 4, None),
    ]


def test_expert_fraction_needs_rspo():
    with pytest.raises(ConfigError, match="rspo.expert_fraction"):
        load_config(None, ["reward.mode=outcome", "rspo.expert_fraction=0.5"])


def test_group_swap_uses_the_process_reward_only_where_the_outcome_is_flat():
    # g0: returns 0, 0 -> flat: 2 * process;  g1: 1, 0 -> the outcome: 10 * outcome (minus 0.1 if invalid)
    b = grouped([0.0, 0.0, 1.0, 0.0], [0.5, -0.25, 0.3, 0.2], [T, T, T, T], [0, 1, 2, 3], [0, 0, 1, 1])
    b.valid = torch.tensor([True, True, True, False])
    m = mode("group_swap")
    assert list(m.learners) == ["target"] and [p.adapter for p in m.plans(0)] == ["target"]
    d = m.learner_data(b, step=0)["target"]
    torch.testing.assert_close(d.reward, torch.tensor([1.0, -0.5, 10.0, -0.1]))
