"""How often RSPO's replay buffer can reach the target at all, in an experiment's rspo runs.

A replayed trajectory joins a task's group only when that task is drawn again within
`rspo.buffer_staleness` iterations of an iteration where the explorer won it (the buffer is
keyed by task and, by default, keeps successes only). Training tasks are drawn with
replacement, `rollout.num_tasks` an iteration from the train split (`rspo.train.train_task_draws`),
so with few draws from many tasks a buffered task rarely comes back. This counts, for every
rspo run of the experiment, the draws whose task was drawn in the staleness window before
(the replay's opportunities, from the runs' own task streams; no model is run), next to the
chance a draw has of one: 1 - (1 - 1/N)^(B * S) for N train tasks, B draws an iteration, S
the staleness. A replay then needs the explorer to have won that earlier draw.

  python benchmarks/replay_reach.py --config configs/experiments/sparse.yaml
"""

from __future__ import annotations

import argparse

from rspo.config import load_config
from rspo.envs import make_env
from rspo.sweep import load_experiment, runs
from rspo.train import train_task_draws


def opportunities(seed: int, steps: int, num_tasks: int, num_train: int, staleness: int) -> list[tuple[int, int]]:
    """(step, task) of every draw whose task was also drawn in one of the `staleness`
    iterations before: the buffer (pruned to versions >= step - staleness) can hold it."""
    draws = [train_task_draws(seed, step, num_tasks, num_train) for step in range(steps)]
    return [(step, task) for step in range(steps) for task in draws[step]
            if any(task in draws[s] for s in range(max(0, step - staleness), step))]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="an experiment file (configs/experiments/*.yaml)")
    exp = load_experiment(ap.parse_args().config)
    num_train = {}  # env config (as text) -> train split size
    for spec in runs(exp):
        cfg = load_config(exp.base, spec.overrides)
        if cfg.reward.mode != "rspo":
            continue
        key = repr(cfg.env)
        if key not in num_train:
            num_train[key] = make_env(cfg.env).num_tasks("train")
        n, b, s, steps = num_train[key], cfg.rollout.num_tasks, cfg.rspo.buffer_staleness, cfg.train.steps
        found = opportunities(cfg.train.seed, steps, b, n, s)
        chance = 1 - (1 - 1 / n) ** (b * s)
        print(f"{spec.name}: {len(found)} of {steps * b} draws could be replayed "
              f"(N={n} train tasks, B={b}, staleness {s}; expected per draw after the first {s} "
              f"iterations {chance:.3f}): {found}")  # fmt: skip


if __name__ == "__main__":
    main()
