"""The one interface the rollout engine knows: a text environment.

A task is `(split, index)`: the same pair always gives the same game and the same first
observation (the env's seed is part of its construction). The rollout code sees only
`TextEnv` and `EnvState`; ALFWorld and WebShop are interchangeable behind them.

Reward channels carried by every state:
  outcome  the true task reward of this step (ALFWorld: 1 when won; WebShop: the purchase
           score or success, per config), nonzero only on the final step;
  process  the dense process reward of this step, Phi(s_{t+1}) - Phi(s_t) with Phi the
           env's progress potential (documented per env); it sums to Phi(s_T) - Phi(s_0).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass
class EnvState:
    """What the agent observes after `reset` or `step`."""

    observation: str  # the env's raw text; also the GiGPO anchor state of the next step
    admissible: list[str]  # actions the env accepts now (ALFWorld: sorted)
    task: str  # the goal sentence
    task_type: str  # ALFWorld task type / WebShop product category (for per-type eval)
    done: bool = False
    outcome: float = 0.0  # outcome reward of this step
    process: float = 0.0  # dense process reward of this step
    won: bool = False  # task solved (WebShop: purchase scored 1.0)
    score: float = 0.0  # task score (ALFWorld: won as 0/1; WebShop: purchase score)
    valid: bool = True  # the env understood the action (False: a no-op, e.g. "Nothing happens.")
    info: dict = field(default_factory=dict)  # env-specific extras (not read by the trainer)


class TextEnv(ABC):
    """A text environment: one episode at a time."""

    max_steps: int  # the env's own step cap; the episode is done when it is reached

    @abstractmethod
    def num_tasks(self, split: str) -> int:
        """How many tasks `split` holds; raise ValueError naming the valid splits if unknown."""

    @abstractmethod
    def reset(self, split: str, index: int) -> EnvState:
        """Start task `index` of `split`."""

    @abstractmethod
    def step(self, action: str) -> EnvState:
        """Apply one action. Never raises on bad text: an invalid action is a no-op step."""

    @abstractmethod
    def expert_action(self) -> str:
        """The expert's next action from the current state (for demonstrations)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass
