"""Replay buffer of explorer trajectories, keyed by task, bounded in size and staleness.

RSPO's target update mixes into each task's group up to R explorer trajectories of the
same task from earlier iterations. The buffer keeps whole trajectories (all their turns,
with the behavior log-probs recorded at sampling, which the off-policy correction needs).

  add(batch, version, success)   store the batch's EXPLORER trajectories (successful ones
                                 only when `successes_only`), tagged with the policy version
  sample(task, k, version)       up to k stored trajectories of `task`, newest first

Bounds: at most `size` trajectories (the oldest insertion is dropped first), and none
older than `version - staleness` (entries with version' < version - staleness are dropped
on every add/sample). Deterministic: order is insertion order, no randomness.
A trajectory with a NaN/inf reward or behavior log-prob is never stored: replayed, it
would make every target update it joins skip (`rspo.update`).

Stored trajectories are one-trajectory `TurnBatch`es on CPU with padding trimmed, marked
`source = REPLAY`, with `traj_id` and `group_id` reset to 0: the caller assigns ids for
the batch it joins (then `rspo.batch.cat`, which re-pads) and moves them to its device.

Bookkeeping, not maths: `add` loops over the few trajectories of one iteration (B * E).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from rspo.batch import EXPLORER, REPLAY, TurnBatch


@dataclass
class _Entry:
    seq: int  # insertion counter: larger = newer
    version: int  # policy version (training step) that sampled it
    task: int  # task_index
    batch: TurnBatch  # one trajectory, CPU, trimmed, source = REPLAY


class ReplayBuffer:
    def __init__(self, size: int, staleness: int, successes_only: bool = True) -> None:
        self.size = size
        self.staleness = staleness
        self.successes_only = successes_only
        self._entries: list[_Entry] = []  # in insertion order (oldest first)
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def prune(self, version: int) -> None:
        """Drop entries older than `version - staleness`, then the oldest beyond `size`."""
        self._entries = [e for e in self._entries if e.version >= version - self.staleness]
        if len(self._entries) > self.size:
            self._entries = self._entries[len(self._entries) - max(self.size, 0) :]

    def add(self, batch: TurnBatch, version: int, success: Tensor) -> int:
        """Store the EXPLORER trajectories of `batch`; returns how many were stored.

        success (M,) bool: one entry per trajectory of `batch`, in traj_id order (the order
        rows appear in), whatever the ids are. Rows of other sources are skipped, so a
        mixed batch can be passed as well as `batch.select(batch.source == EXPLORER)`.
        """
        batch = batch.to("cpu")
        _, counts = torch.unique_consecutive(batch.traj_id, return_counts=True)  # (M,) rows per trajectory
        if success.numel() != counts.numel():
            raise ValueError(f"success has {success.numel()} entries for {counts.numel()} trajectories")
        added = 0
        for k, rows in enumerate(torch.split(torch.arange(len(batch)), counts.tolist())):
            if int(batch.source[rows[0]]) != EXPLORER or (self.successes_only and not bool(success[k])):
                continue
            b = batch.select(rows).trim()
            if not all(bool(t.isfinite().all()) for t in (b.outcome, b.process, b.behavior_logprobs)):
                continue
            b.source = torch.full_like(b.source, REPLAY)
            b.traj_id = torch.zeros_like(b.traj_id)
            b.group_id = torch.zeros_like(b.group_id)
            self._entries.append(_Entry(self._seq, version, int(b.task_index[0]), b))
            self._seq += 1
            added += 1
        self.prune(version)
        return added

    def sample(self, task_index: int, k: int, version: int) -> list[TurnBatch]:
        """Up to k stored trajectories of `task_index`, newest first (after pruning at `version`)."""
        self.prune(version)
        found = [e.batch for e in reversed(self._entries) if e.task == task_index]
        return found[: max(k, 0)]

    def state_dict(self) -> dict:
        """Tensors and ints only (torch.save-able, loads with weights_only=True)."""
        return {
            "size": self.size,
            "staleness": self.staleness,
            "successes_only": self.successes_only,
            "seq": self._seq,
            "entries": [
                {"seq": e.seq, "version": e.version, "task": e.task}
                | {f.name: getattr(e.batch, f.name) for f in fields(TurnBatch)}
                for e in self._entries
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        self.size, self.staleness = int(state["size"]), int(state["staleness"])
        self.successes_only = bool(state["successes_only"])
        self._seq = int(state["seq"])
        self._entries = [
            _Entry(
                int(d["seq"]),
                int(d["version"]),
                int(d["task"]),
                TurnBatch(**{f.name: d[f.name] for f in fields(TurnBatch)}),
            )
            for d in state["entries"]
        ]


def resume_state(per_rank: list[dict], rank: int, world: int) -> dict:
    """The buffer state that rank `rank` of `world` processes resumes from, given every
    saving rank's state.

    Each rank keeps its own buffer (the explorer trajectories of the tasks it played). With
    as many processes as at saving, a rank gets its own back; otherwise every rank gets all
    saved entries merged (oldest version first, then saving rank, then insertion order), so
    no stored trajectory is lost; the size bound then keeps the newest.
    """
    if len(per_rank) == world:
        return per_rank[rank]
    entries = [(e["version"], r, e["seq"], e) for r, state in enumerate(per_rank) for e in state["entries"]]
    merged = [e | {"seq": i} for i, (*_, e) in enumerate(sorted(entries, key=lambda x: x[:3]))]
    return per_rank[0] | {"entries": merged, "seq": len(merged)}
