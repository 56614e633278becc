"""RSPO's mechanism metrics: a hand-built batch, agreement with the loop reference on
random groups (Hypothesis), and the turn-to-trajectory reduction."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rspo.batch import TurnBatch
from rspo.rewards.signal import signal_metrics, signal_metrics_loop, trajectories_of

T, E, R, X = 0, 1, 2, 3  # X: the expert (RSPO's ceiling)


def test_hand_built_groups():
    # g0: T 1, T 0, E 1, R 1   signal (1 != 0); the target won: not a failed group
    # g1: T 0, T 0, E 1, R 1   no signal; failed; rescued by the explorer and by replay
    # g2: T 0, T 0, E 0        no signal; failed; not rescued
    # g3: T 1, T 1             no signal (all won); not failed
    # g4: E 1, R 1             no target rows: left out of every metric
    # g5: T .5, T 0, E .75     signal (.5 != 0) but failed (a score of .5 is no success); not rescued
    rows = [(1, T, 0), (0, T, 0), (1, E, 0), (1, R, 0), (0, T, 1), (0, T, 1), (1, E, 1), (1, R, 1),
            (0, T, 2), (0, T, 2), (0, E, 2), (1, T, 3), (1, T, 3), (1, E, 4), (1, R, 4), (0.5, T, 5), (0, T, 5),
            (0.75, E, 5)]  # fmt: skip
    o, s, g = (torch.tensor(c) for c in zip(*rows))
    want = {
        "rollout/groups_without_signal": 3 / 5,  # g1, g2, g3 of g0, g1, g2, g3, g5
        "rspo/groups_rescued": 1 / 3,  # g1 of the failed g1, g2, g5
        "rspo/explorer_only_successes": 1.0,  # g1's explorer win (g0's is in a group the target won, g4 has no target)
        "rspo/replay_only_successes": 1.0,  # g1's replayed win (g0's is in a group the target won)
        "rspo/replayed": 2.0,  # g0's and g1's replayed trajectories (g4 has no target)
    }
    assert signal_metrics(o.float(), s, g) == want
    assert signal_metrics_loop(o.float(), s, g) == want


def test_expert_rows_rescue_and_are_counted_apart():
    # g0: T 0, T 0, X 1        failed, rescued by the expert alone
    # g1: T 0, E 0, X 1, E 1   failed, rescued (by both)
    # g2: T 1, X 1             the target won: the expert's win rescues nothing
    rows = [(0, T, 0), (0, T, 0), (1, X, 0), (0, T, 1), (0, E, 1), (1, X, 1), (1, E, 1), (1, T, 2), (1, X, 2)]
    o, s, g = (torch.tensor(c) for c in zip(*rows))
    want = {
        "rollout/groups_without_signal": 1.0,  # every group's target returns are equal
        "rspo/groups_rescued": 1.0,  # g0 and g1, the failed groups
        "rspo/explorer_only_successes": 1.0,  # g1's explorer win
        "rspo/replay_only_successes": 0.0,
        "rspo/expert_only_successes": 2.0,  # g0's and g1's (g2's is in a group the target won)
        "rspo/replayed": 0.0,
    }
    assert signal_metrics(o.float(), s, g) == want
    assert signal_metrics_loop(o.float(), s, g) == want
    # without expert rows the key is absent, so runs without the ceiling report what they did before
    assert "rspo/expert_only_successes" not in signal_metrics(o[s != X].float(), s[s != X], g[s != X])


def test_target_only_and_no_target():
    # outcome / process modes: only the target samples, so only the first metric exists
    o, s, g = torch.tensor([0.0, 0.0, 1.0, 0.0]), torch.tensor([T, T, T, T]), torch.tensor([0, 0, 1, 1])
    assert signal_metrics(o, s, g) == {"rollout/groups_without_signal": 0.5}  # g0 all 0; g1 has 1 and 0
    # RSPO's explorer warm-up: the target sampled nothing, there is nothing to report
    assert signal_metrics(o, torch.full((4,), E), g) == {}


def test_no_failed_group_leaves_rescued_out():
    # every group won by the target: nothing to rescue, so no rescued fraction (not a 0 or 1)
    o, s, g = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([T, T, E]), torch.tensor([0, 0, 0])
    out = signal_metrics(o, s, g)
    assert "rspo/groups_rescued" not in out and out["rspo/explorer_only_successes"] == 0.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0]), st.sampled_from([T, E, R, X]), st.integers(0, 6)),
                min_size=1, max_size=40))  # fmt: skip
def test_matches_loop(rows):
    o, s, g = (torch.tensor(c) for c in zip(*rows))
    got, want = signal_metrics(o.float(), s, g), signal_metrics_loop(o.float(), s, g)
    assert got.keys() == want.keys()
    for k in want:
        assert abs(got[k] - want[k]) < 1e-9, k


def test_trajectories_of_sums_each_trajectory_turns():
    # trajectory 0: turns with outcome 0, 0, 1 (won at the last turn); trajectory 1: 0, 0; trajectory 2: 0.5
    traj = torch.tensor([0, 0, 0, 1, 1, 2])
    n = len(traj)
    batch = TurnBatch(
        **{f: torch.zeros(n, 1) for f in ("input_ids", "attention_mask", "response_mask", "behavior_logprobs")},
        group_id=torch.tensor([3, 3, 3, 3, 3, 5]),
        traj_id=traj,
        turn=torch.tensor([0, 1, 2, 0, 1, 0]),
        last=torch.tensor([False, False, True, False, True, True]),
        outcome=torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.5]),
        process=torch.zeros(n),
        valid=torch.ones(n, dtype=torch.bool),
        anchor=torch.zeros(n, dtype=torch.long),
        source=torch.tensor([T, T, T, E, E, R]),
        task_index=torch.zeros(n, dtype=torch.long),
    )
    ret, source, group = trajectories_of(batch)
    assert ret.tolist() == [1.0, 0.0, 0.5] and source.tolist() == [T, E, R] and group.tolist() == [3, 3, 5]
