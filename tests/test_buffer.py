"""Replay buffer: which trajectories it keeps, its bounds, order, and checkpoint round trip."""

import io

import pytest
import torch

from rspo.batch import EXPLORER, REPLAY, TARGET, TurnBatch, cat
from rspo.rewards.buffer import ReplayBuffer, resume_state

P, R = 6, 4  # prompt / response widths of the fake batch


def fake_batch(trajs: list[tuple[int, int, int]]) -> TurnBatch:
    """trajs: (source, task_index, num_turns) per trajectory; traj_id = position in the list.

    Prompts are left-padded to 3 real tokens, responses hold 2 real tokens: the buffer can trim
    3 prompt and 2 response columns. Token ids encode (traj, turn) so rows can be recognized.
    """
    rows = []
    for tid, (src, task, n) in enumerate(trajs):
        for t in range(n):
            rows.append((tid, t, t == n - 1, src, task))
    n = len(rows)
    ids = torch.zeros(n, P + R, dtype=torch.long)
    att = torch.zeros(n, P + R, dtype=torch.long)
    for i, (tid, t, *_rest) in enumerate(rows):
        ids[i, 3:P] = 100 * tid + 10 * t + torch.arange(3)
        ids[i, P : P + 2] = 1000 + 100 * tid + t
        att[i, 3 : P + 2] = 1
    col = lambda j, dt=torch.long: torch.tensor([r[j] for r in rows], dtype=dt)  # noqa: E731
    resp = torch.zeros(n, R)
    resp[:, :2] = 1
    return TurnBatch(
        input_ids=ids,
        attention_mask=att,
        response_mask=resp,
        behavior_logprobs=-resp * 0.5,
        group_id=col(4),
        traj_id=col(0),
        turn=col(1),
        last=col(2, torch.bool),
        outcome=torch.zeros(n),
        process=torch.zeros(n),
        valid=torch.ones(n, dtype=torch.bool),
        anchor=torch.zeros(n, dtype=torch.long),
        source=col(3),
        task_index=col(4),
    )


def test_stores_explorer_trajectories_only_and_successes():
    # traj 0 target, traj 1 explorer (success), traj 2 explorer (failure), traj 3 explorer (success)
    batch = fake_batch([(TARGET, 7, 2), (EXPLORER, 7, 3), (EXPLORER, 7, 1), (EXPLORER, 8, 2)])
    success = torch.tensor([True, True, False, True])  # indexed by traj_id
    buf = ReplayBuffer(size=10, staleness=4, successes_only=True)
    assert buf.add(batch, version=0, success=success) == 2
    assert len(buf) == 2
    (got,) = buf.sample(task_index=7, k=5, version=0)
    assert len(got) == 3 and torch.equal(got.turn, torch.tensor([0, 1, 2]))
    assert torch.equal(got.source, torch.full((3,), REPLAY))  # marked as replay
    assert torch.equal(got.traj_id, torch.zeros(3, dtype=torch.long))  # ids for the caller to assign
    assert got.input_ids.shape == (3, 3 + 2)  # padding trimmed: 3 prompt + 2 response columns
    assert torch.equal(got.input_ids[1], torch.tensor([110, 111, 112, 1101, 1101]))  # traj 1, turn 1
    assert got.response_mask.shape == got.behavior_logprobs.shape == (3, 2)
    all_buf = ReplayBuffer(size=10, staleness=4, successes_only=False)
    assert all_buf.add(batch, version=0, success=success) == 3


def test_success_is_positional_over_the_batch_trajectories():
    # the explorer rows of a mixed batch keep their sparse traj ids (1, 3); success has one
    # entry per trajectory present, in traj_id order: (traj 1 failed, traj 3 won)
    batch = fake_batch([(TARGET, 7, 2), (EXPLORER, 7, 3), (TARGET, 7, 1), (EXPLORER, 7, 2)])
    explorer = batch.select(batch.source == EXPLORER)
    buf = ReplayBuffer(size=10, staleness=4, successes_only=True)
    assert buf.add(explorer, version=0, success=torch.tensor([False, True])) == 1
    (got,) = buf.sample(7, 5, version=0)
    assert len(got) == 2 and got.input_ids[0, 0] == 300  # traj 3, turn 0
    with pytest.raises(ValueError, match="trajectories"):
        buf.add(explorer, version=0, success=torch.ones(4, dtype=torch.bool))


def test_size_bound_drops_oldest_and_sample_is_newest_first():
    buf = ReplayBuffer(size=3, staleness=100, successes_only=False)
    for version in range(5):  # one explorer trajectory of task 1 per version, `version` + 1 turns
        buf.add(fake_batch([(EXPLORER, 1, version + 1)]), version=version, success=torch.tensor([True]))
    assert len(buf) == 3
    got = buf.sample(task_index=1, k=10, version=4)
    assert [len(b) for b in got] == [5, 4, 3]  # versions 4, 3, 2 newest first; 0 and 1 dropped
    assert [len(b) for b in buf.sample(task_index=1, k=2, version=4)] == [5, 4]
    assert buf.sample(task_index=2, k=2, version=4) == []
    assert len(cat(got)) == 12  # ready to join a batch


def test_staleness():
    buf = ReplayBuffer(size=100, staleness=2, successes_only=False)
    buf.add(fake_batch([(EXPLORER, 1, 1)]), version=0, success=torch.tensor([True]))
    buf.add(fake_batch([(EXPLORER, 1, 2)]), version=1, success=torch.tensor([True]))
    assert len(buf.sample(1, k=5, version=2)) == 2  # 0 >= 2 - 2: both kept
    assert [len(b) for b in buf.sample(1, k=5, version=3)] == [2]  # version 0 < 3 - 2: dropped
    buf.add(fake_batch([(EXPLORER, 1, 3)]), version=10, success=torch.tensor([True]))
    assert len(buf) == 1


def test_state_dict_round_trip():
    buf = ReplayBuffer(size=5, staleness=3, successes_only=False)
    buf.add(
        fake_batch([(EXPLORER, 1, 2), (EXPLORER, 2, 1), (TARGET, 1, 1)]),
        version=2,
        success=torch.ones(3, dtype=torch.bool),
    )
    f = io.BytesIO()
    torch.save(buf.state_dict(), f)
    f.seek(0)
    restored = ReplayBuffer(size=0, staleness=0)
    restored.load_state_dict(torch.load(f, weights_only=True))
    assert len(restored) == len(buf) == 2
    assert (restored.size, restored.staleness, restored.successes_only) == (5, 3, False)
    for task in (1, 2):
        (a,), (b,) = buf.sample(task, 1, version=2), restored.sample(task, 1, version=2)
        for name in a.__dataclass_fields__:
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    # insertion order survives: new entries are still newer than restored ones
    restored.add(fake_batch([(EXPLORER, 1, 4)]), version=3, success=torch.tensor([True]))
    assert [len(x) for x in restored.sample(1, 5, version=3)] == [4, 2]


def test_resume_state_per_rank_or_merged():
    # rank 0 stored tasks 1 (version 2) and 2 (version 5); rank 1 stored task 3 (version 4)
    ranks = [ReplayBuffer(size=10, staleness=10, successes_only=False) for _ in range(2)]
    ranks[0].add(fake_batch([(EXPLORER, 1, 1)]), version=2, success=torch.tensor([True]))
    ranks[0].add(fake_batch([(EXPLORER, 2, 1)]), version=5, success=torch.tensor([True]))
    ranks[1].add(fake_batch([(EXPLORER, 3, 2)]), version=4, success=torch.tensor([True]))
    saved = [b.state_dict() for b in ranks]
    # same world size: each rank gets its own entries back
    assert resume_state(saved, rank=1, world=2) is saved[1]
    # another world size: every rank gets all of them, ordered by version (task 1, 3, 2)
    merged = ReplayBuffer(size=0, staleness=0)
    merged.load_state_dict(resume_state(saved, rank=0, world=1))
    assert [e.task for e in merged._entries] == [1, 3, 2]
    assert [e.seq for e in merged._entries] == [0, 1, 2]
    assert [len(b) for b in merged.sample(3, 5, version=5)] == [2]
    merged.add(fake_batch([(EXPLORER, 3, 1)]), version=6, success=torch.tensor([True]))
    assert [len(b) for b in merged.sample(3, 5, version=6)] == [1, 2]  # new entries stay newest
