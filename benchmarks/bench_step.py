"""Where one training step's time goes: generate / env / update, outcome vs RSPO, per algorithm.

    .venv/bin/python benchmarks/bench_step.py            # 4 tasks x 4 trajectories, 4 turns, 3 timed steps
    .venv/bin/python benchmarks/bench_step.py --quick    # 2 tasks x 4 trajectories, 3 turns, 2 timed steps

For reward.mode in (outcome, rspo) and algo.name in (grpo, ppo, gigpo), `rspo.train.setup`
then `rl_step`: one warm-up step, then the timed steps, read from the step's own metrics
(`perf/time_generate_s`, `perf/time_env_s`, `perf/time_update_s`, `perf/step_s`; "other"
is the rest: rewards, advantages' inputs, replay, the buffer). The model is the untrained
tiny Llama (`sft.episodes=0`: it acts at random, which is fine for timing, but the replay
buffer, which keeps successes only, stays empty) on in-process WebShop.

With `reward.mode=rspo` each task also gets `rspo.explorer_rollouts` explorer trajectories
(a second LoRA adapter: a second `generate` per turn) and the explorer gets its own update,
so "rspo / outcome" is RSPO's cost per iteration; the extra seconds are split into the
explorer's rollouts (generate + env) and the update. All numbers come from this one run;
absolute seconds depend on the machine and its load (printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from common import default_model_config

import rspo.train
from rspo.train import rl_step, setup

ALGOS = ["grpo", "ppo", "gigpo"]
MODES = ["outcome", "rspo"]
PARTS = {"gen": "perf/time_generate_s", "env": "perf/time_env_s", "update": "perf/time_update_s"}
BASE = [  # on top of configs/default.yaml (its tiny model, untrained)
    "env.name=webshop",
    "env.num_workers=0",
    "rollout.group_size=4",
    "rollout.max_new_tokens=24",
    "rollout.max_prompt_tokens=768",
    "rspo.explorer_rollouts=4",
    "train.micro_batch=16",
    "train.lr=0.001",
    "sft.episodes=0",
    "eval.num_tasks=1",
    "eval.splits=[test]",  # WebShop's (configs/default.yaml lists ALFWorld's)
    "log.progress=false",
    "log.tensorboard=false",
    "log.sample_every=0",
]


def time_steps(overrides: list[str], steps: int) -> list[dict[str, float]]:
    """Metrics of `steps` timed `rl_step`s after one warm-up step, each with "adv_s": the
    seconds its learners spent in `learner_advantages` (the base algorithm's estimator)."""
    real, spent = rspo.train.learner_advantages, []

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        out = real(*args, **kwargs)
        spent.append(time.perf_counter() - t0)
        return out

    rspo.train.learner_advantages = timed
    with tempfile.TemporaryDirectory() as out:
        run = setup(default_model_config(*BASE, *overrides, f"train.output_dir={out}"))
        try:
            history = []
            for i in range(steps + 1):
                spent.clear()
                metrics = rl_step(run) | {"adv_s": sum(spent)}
                run.step += 1
                if i:  # step 0 is the warm-up
                    history.append(metrics)
            return history
        finally:
            rspo.train.learner_advantages = real
            run.logger.close()
            run.pool.close()


def summarize(history: list[dict[str, float]]) -> dict[str, float]:
    """Mean seconds per step of each part, plus the spread of the step time."""
    row = {part: statistics.mean(m[key] for m in history) for part, key in PARTS.items()}
    steps = [m["perf/step_s"] for m in history]
    row["step"] = statistics.mean(steps)
    row["other"] = row["step"] - row["gen"] - row["env"] - row["update"]
    row["spread"] = (max(steps) - min(steps)) / row["step"]
    # the advantage estimators (target and explorer learners), part of "update"
    row["adv"] = statistics.mean(m["adv_s"] for m in history)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 tasks, 3 turns, 2 timed steps")
    parser.add_argument("--tasks", type=int, default=0, help="rollout.num_tasks (default 4; --quick 2)")
    parser.add_argument("--turns", type=int, default=0, help="rollout.max_turns (default 4; --quick 3)")
    parser.add_argument("--steps", type=int, default=0, help="timed steps after the warm-up (default 3; --quick 2)")
    parser.add_argument("--algos", default=",".join(ALGOS))
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: see bench_rollout.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tasks = args.tasks or (2 if args.quick else 4)
    turns = args.turns or (3 if args.quick else 4)
    steps = args.steps or (2 if args.quick else 3)
    algos = [a for a in args.algos.split(",") if a]
    shape = [f"rollout.num_tasks={tasks}", f"rollout.max_turns={turns}"]
    print(
        f"tiny Llama (hidden 128, 2 layers, LoRA r=16), untrained; WebShop in-process; {tasks} tasks x 4 target "
        f"(+4 explorer with rspo) trajectories, {turns} turns, 24 new tokens; {steps} timed steps after 1 warm-up"
    )
    print(f"torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}, load before {os.getloadavg()}\n")

    rows: dict[tuple[str, str], dict[str, float]] = {}
    for algo in algos:
        for mode in MODES:  # adjacent, so a load change hits both modes of one algorithm alike
            t0 = time.perf_counter()
            rows[algo, mode] = summarize(time_steps([*shape, f"algo.name={algo}", f"reward.mode={mode}"], steps))
            print(f"  {algo}/{mode}: {time.perf_counter() - t0:.1f} s", flush=True)

    head = (
        f"{'algo':<7}{'reward':<9}{'step s':>8}{'gen':>7}{'env':>7}{'update':>8}{'other':>7}{'spread':>8}"
        f"{'advantages (in update)':>24}"
    )
    print("\n" + head + "\n" + "-" * len(head))
    for (algo, mode), r in rows.items():
        fractions = "".join(f"{r[p] / r['step']:>{w}.0%}" for p, w in (("gen", 7), ("env", 7), ("update", 8)))
        adv = f"{r['adv'] * 1e3:.2f} ms = {r['adv'] / r['step']:.3%}"
        print(
            f"{algo:<7}{mode:<9}{r['step']:>8.2f}{fractions}{r['other'] / r['step']:>7.0%}{r['spread']:>8.0%}{adv:>24}"
        )

    print("\nRSPO's cost per iteration (rspo / outcome, same run):")
    for algo in algos:
        o, s = rows[algo, "outcome"], rows[algo, "rspo"]
        rollout_extra = (s["gen"] + s["env"]) - (o["gen"] + o["env"])
        update_extra = s["update"] - o["update"]
        print(
            f"  {algo:<6} step x{s['step'] / o['step']:.2f}  (generate x{s['gen'] / o['gen']:.2f}, "
            f"update x{s['update'] / o['update']:.2f}); extra per step: explorer rollouts "
            f"{rollout_extra / o['step']:+.0%}, explorer update {update_extra / o['step']:+.0%} of an outcome step"
        )
    print(f"\nload after (1/5/15 min): {tuple(round(x, 2) for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
