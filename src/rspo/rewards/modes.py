"""Which rows each learner trains on, and with which per-turn reward (`reward.mode`).

Notation: N turns; every tensor below is (N,).

  mode      learner    rows               reward r_t
  outcome   target     target             c_o * outcome_t
  process   target     target             c_p * process_t
  shaped    target     target             c_o * outcome_t + lambda * c_p * process_t
  rspo      target     all (swap)         c_o * outcome_t       (explorer rows: rewards swapped to outcome)
            explorer   explorer (src 1)   c_p * process_t

Every learner's reward also carries the invalid-action penalty: r_t -= penalty on turns
whose response held no well-formed action. c_o = `reward.outcome_scale`,
c_p = `reward.process_scale`, lambda = `reward.shaped_coef`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rspo.batch import TARGET
from rspo.rewards.swap import swap_rewards


@dataclass
class LearnerData:
    """One learner's share of a batch."""

    rows: Tensor  # (N,) bool: the rows this learner trains on
    reward: Tensor  # (N,) float: per-turn reward (meaningful on `rows`)
    offpolicy: Tensor  # (N,) bool: rows sampled by another policy (importance-corrected)


def learner_data(
    outcome: Tensor,
    process: Tensor,
    valid: Tensor,
    source: Tensor,
    *,
    mode: str,
    outcome_scale: float,
    process_scale: float,
    shaped_coef: float,
    penalty: float,
) -> dict[str, LearnerData]:
    """Map learner name ("target", "explorer") -> its rows and rewards for `mode`."""
    pen = penalty * (~valid).float()
    on_policy = source == TARGET
    if mode == "rspo":
        target_r, explorer_r, explorer_rows = swap_rewards(outcome, process, source)
        return {
            "target": LearnerData(source >= 0, outcome_scale * target_r - pen, ~on_policy),
            "explorer": LearnerData(explorer_rows, process_scale * explorer_r - pen, torch.zeros_like(explorer_rows)),
        }
    reward = {
        "outcome": outcome_scale * outcome,
        "process": process_scale * process,
        "shaped": outcome_scale * outcome + shaped_coef * process_scale * process,
    }[mode]
    return {"target": LearnerData(on_policy, reward - pen, torch.zeros_like(on_policy))}
