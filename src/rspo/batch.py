"""The tensors a rollout produces: one row per turn (per-turn samples, as GiGPO does).

Notation
  N  turns in the batch (rows), sorted by (traj_id, turn)
  M  trajectories; K  task groups (trajectories of one task sharing an env seed)
  P  prompt length (left-padded);  R  response length (right-padded);  L = P + R

One mask convention everywhere: 1 marks a token we train on.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

# `source` values: who sampled a trajectory. EXPERT: the env's expert played it (RSPO's
# ceiling, `rspo.expert_fraction`); it has no behaviour log-probs (stored as 0: probability 1).
TARGET, EXPLORER, REPLAY, EXPERT = 0, 1, 2, 3


@dataclass
class TurnBatch:
    input_ids: Tensor  # (N, L) long: prompt (left-padded) then response (right-padded)
    attention_mask: Tensor  # (N, L) long: 1 on real prompt and response tokens
    response_mask: Tensor  # (N, R) float: 1 on generated tokens we train on
    behavior_logprobs: Tensor  # (N, R) float: log-prob of each response token under the sampling policy
    group_id: Tensor  # (N,) long in [0, K): the task group
    traj_id: Tensor  # (N,) long in [0, M): the trajectory
    turn: Tensor  # (N,) long: turn index within the trajectory, from 0
    last: Tensor  # (N,) bool: last turn of its trajectory
    outcome: Tensor  # (N,) float: outcome reward received at this turn (env units, unscaled)
    process: Tensor  # (N,) float: dense process reward received at this turn
    valid: Tensor  # (N,) bool: the response held a well-formed action
    anchor: Tensor  # (N,) long: deterministic hash of the raw observation before the turn
    source: Tensor  # (N,) long: TARGET (0), EXPLORER (1), REPLAY (2) or EXPERT (3)
    task_index: Tensor  # (N,) long: the task's index in its split (replay buffer key)

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1] - self.response_mask.shape[1]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> TurnBatch:
        return TurnBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def trim(self) -> TurnBatch:
        """Drop columns that are padding in every row (left of prompts, right of responses)."""
        P = self.prompt_len
        first = int(self.attention_mask[:, :P].any(0).float().argmax()) if P else 0  # first used prompt column
        R = max(int(self.response_mask.sum(1).max()), 1) if len(self) else 1  # longest response
        keep = torch.cat([torch.arange(first, P), torch.arange(P, P + R)])
        return TurnBatch(
            **{
                **self.__dict__,
                "input_ids": self.input_ids[:, keep],
                "attention_mask": self.attention_mask[:, keep],
                "response_mask": self.response_mask[:, :R],
                "behavior_logprobs": self.behavior_logprobs[:, :R],
            }
        )

    def select(self, rows: Tensor) -> TurnBatch:
        """Rows `rows` (a bool mask or an index tensor), every field sliced alike."""
        rows = rows.nonzero().squeeze(1) if rows.dtype == torch.bool else rows  # one scan, not one per field
        return TurnBatch(**{f.name: getattr(self, f.name)[rows] for f in fields(self)})


def _pad_to(x: Tensor, width: int, value: float, left: bool) -> Tensor:
    pad = width - x.shape[1]
    if pad == 0:
        return x
    fill = torch.full((x.shape[0], pad), value, dtype=x.dtype, device=x.device)
    return torch.cat([fill, x] if left else [x, fill], dim=1)


def cat(batches: list[TurnBatch], pad_token_id: int = 0) -> TurnBatch:
    """Concatenate batches whose prompt/response widths differ, re-padding both sides.

    Ids (group_id, traj_id) are kept as they are: callers make them unique beforehand.
    """
    P = max(b.prompt_len for b in batches)
    R = max(b.response_mask.shape[1] for b in batches)
    out = {}
    for f in fields(TurnBatch):
        parts = []
        for b in batches:
            x = getattr(b, f.name)
            if f.name in ("input_ids", "attention_mask"):
                value = pad_token_id if f.name == "input_ids" else 0
                p, r = x[:, : b.prompt_len], x[:, b.prompt_len :]
                x = torch.cat([_pad_to(p, P, value, left=True), _pad_to(r, R, value, left=False)], dim=1)
            elif f.name in ("response_mask", "behavior_logprobs"):
                x = _pad_to(x, R, 0, left=False)
            parts.append(x)
        out[f.name] = torch.cat(parts, dim=0)
    return TurnBatch(**out)
