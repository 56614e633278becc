"""How sparse is the outcome signal of a setting? A warm start's first rollouts, on TRAINING tasks only.

    .venv/bin/python benchmarks/sparse_probe.py --config configs/default.yaml sft.episodes=200
    .venv/bin/python benchmarks/sparse_probe.py --config configs/default.yaml env.alfworld.max_receptacles=10
    .venv/bin/python benchmarks/sparse_probe.py --config configs/webshop_cpu.yaml --tasks 24
    .venv/bin/python benchmarks/sparse_probe.py --checkpoint RUN/checkpoints/step_000040

Builds (or reuses) the warm start of the config plus the dotted overrides (under
`runs/probe/<warm-start key>/sft`, the key the sweep uses; with `sft.episodes=0` none: the
base model as it is), then samples what RL's first iterations would: `--tasks` train tasks
(drawn with `--task-seed`: another stream than training's, and the same tasks whatever
`train.seed`, so warm starts of several seeds are compared on one task set),
`rollout.group_size` target trajectories each at `rollout.temperature`, `rollout.num_tasks`
tasks at a time. It reports what the sparse-regime experiment is chosen by (configs/experiments/sparse.yaml):

  success                  the warm start's training success (the regime wants <= 0.06)
  score                    mean task score (WebShop's purchase score; ALFWorld: = success)
  groups_without_signal    groups whose outcome returns are all equal (wants >= 0.6)
  process_positive         trajectories ending with a positive process return (wants >= 0.5)

with 95% intervals (Wilson for rates of trajectories and groups; for success also a
bootstrap over tasks, the wider one and the one to read, as a task's trajectories succeed or
fail together), success by task type, and seconds per `rollout.num_tasks` tasks (the rollout
share of one RL iteration), in wall time and in this process's CPU time (which a loaded
machine does not inflate). On the generated WebShop it also says where trajectories end:
each is replayed in a fresh env and counted at the furthest stage it reached (the goal's
item never listed by a search, listed but never opened, opened but not bought, another item
bought, the goal's item bought with a wrong option or price, won), with the share of turns
the env did not apply (`noop_rate`) by kind: a click on a catalog item the results page
does not list, any no-op on an item page, the rest.
No eval split is read.

`--checkpoint` plays a run's trained target policy instead (the checkpoint's recorded config,
overrides on top), on the same training tasks: where trajectories end before and after RL.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import time
from pathlib import Path

import torch

from rspo import checkpoint as ckpt
from rspo.batch import TARGET
from rspo.config import load_config
from rspo.envs import make_env
from rspo.envs.pool import EnvPool
from rspo.envs.webshop import WebshopEnv
from rspo.envs.webshop import parse_action as shop_action
from rspo.policy_io import build_policy, load_policy
from rspo.prompts import parse_action
from rspo.rewards.signal import signal_metrics
from rspo.rollout import Plan, collect
from rspo.sft import run_base, run_sft
from rspo.stats import bootstrap_mean, wilson
from rspo.sweep import warm_start_key


def probe_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every probe of a warm start (or a checkpoint) on training tasks takes."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    ap.add_argument(
        "--tasks", type=int, default=48, help="train tasks played (each by rollout.group_size trajectories)"
    )
    ap.add_argument(
        "--task-seed", type=int, default=777, help="seed of the train tasks drawn (777: seed 0's tasks before it)"
    )
    ap.add_argument("--checkpoint", default="", help="a run's checkpoint: play its target policy, not a warm start")
    return ap


def probe_config(args: argparse.Namespace) -> tuple:
    """(config, checkpoint or None) of `probe_parser`'s arguments; torch seeded with train.seed."""
    checkpoint = ckpt.require(args.checkpoint) if args.checkpoint else None
    cfg = load_config(checkpoint / "config.yaml" if checkpoint else args.config, args.overrides)
    torch.manual_seed(cfg.train.seed)
    return cfg, checkpoint


def draw_tasks(pool, num_tasks: int, seed: int) -> list[tuple[str, int]]:
    """`num_tasks` train tasks drawn with `seed` (not training's task stream)."""
    rng = random.Random(seed)
    return [("train", rng.randrange(pool.num_tasks("train"))) for _ in range(num_tasks)]


def play(policy, pool, cfg, tasks):
    """(first task's index, rollout) for each `rollout.num_tasks` of `tasks` in turn, played as
    RL's iterations sample (`rollout.group_size` target trajectories a task)."""
    B, G = cfg.rollout.num_tasks, cfg.rollout.group_size
    for start in range(0, len(tasks), B):
        yield start, collect(policy, pool, cfg.env.name, tasks[start : start + B], [Plan("target", G, TARGET)],
                             cfg.rollout, temperature=cfg.rollout.temperature,
                             max_turns=cfg.rollout.max_turns or pool.max_steps, progress=False)  # fmt: skip


def main() -> None:
    args = probe_parser(__doc__.splitlines()[0]).parse_args()
    cfg, checkpoint = probe_config(args)
    policy, sft = probe_policy(cfg, checkpoint)
    with EnvPool(cfg.env, cfg.rollout.num_tasks * cfg.rollout.group_size) as pool:
        tasks = draw_tasks(pool, args.tasks, args.task_seed)
        trajs, seconds, cpu = [], [], []
        t1, c1 = time.time(), time.process_time()
        for start, ro in play(policy, pool, cfg, tasks):
            seconds.append(time.time() - t1)
            cpu.append(time.process_time() - c1)  # this process's CPU time (env workers excluded)
            trajs += [(start + t.group_id, t) for t in ro.trajectories]
            t1, c1 = time.time(), time.process_time()
    report(trajs, len(tasks), seconds, cpu, cfg, sft)
    env = make_env(cfg.env) if cfg.env.name == "webshop" else None  # ALFWorld: no replay
    if isinstance(env, WebshopEnv):  # the generated shop (the real one keeps no session to read)
        replays = [webshop_stage(env, t) for _, t in trajs]
        stages = collections.Counter(stage for stage, _ in replays)
        noops = sum((n for _, n in replays), collections.Counter())
        turns = sum(t.turns for _, t in trajs)
        print("  where trajectories end: " + ", ".join(f"{k} {stages[k] / len(trajs):.3f}" for k in STAGES))
        print("  no-op turns, of all turns: " + ", ".join(f"{k} {noops[k] / turns:.3f}" for k in NOOPS))


def probe_policy(cfg, checkpoint: Path | None = None) -> tuple:
    """(policy, where its weights came from): a run's `checkpoint` (the base it trained on,
    then its target adapter), else the config's warm start (built under
    `runs/probe/<warm-start key>/sft` if missing), else the model as it is (`sft.episodes=0`)."""
    t0 = time.time()
    if checkpoint:
        cfg.model.init_from = run_base(cfg)  # the base it trained on
        policy = build_policy(cfg.model)
        load_policy(policy, checkpoint / "policy", ["target"])
        return policy, checkpoint
    if not cfg.sft.episodes:  # a pretrained model, or model.init_from
        return build_policy(cfg.model), Path(cfg.model.init_from or cfg.model.name)
    sft = Path("runs/probe") / warm_start_key(cfg) / "sft"
    if not (sft / "config.json").exists():
        run_sft(cfg, sft, progress=False)
    print(f"warm start {sft} ({time.time() - t0:.0f} s)", flush=True)
    cfg.model.init_from = str(sft)
    return build_policy(cfg.model), sft


STAGES = (  # WebShop: the furthest a trajectory got with the goal's item, in order
    "never listed",
    "listed, not opened",
    "opened, not bought",
    "other item bought",
    "item bought, not won",
    "won",
)


NOOPS = ("an unlisted item", "on an item page", "other")  # what a turn the env did not apply was


def webshop_stage(env: WebshopEnv, traj) -> tuple[str, collections.Counter]:
    """Replay a trajectory's actions in the generated shop (deterministic): the furthest stage
    it reached with the goal's item (another item can also win), and its no-op turns by kind
    (a click on a catalog item the results page does not list; any no-op on an item page;
    the rest)."""
    env.reset(traj.split, traj.task_index)
    goal, s = env.goal.product_index, env.session
    listed, noops = False, collections.Counter()
    for _, response in traj.transcript:
        action, page = parse_action(response)[0], s.page
        state = env.step(action)
        if not state.valid:
            verb, target = shop_action(action) or ("", "")  # the env's own parse of `verb[target]`
            unlisted = page == "results" and verb == "click" and target in env.shop.by_asin
            noops[NOOPS[0] if unlisted else NOOPS[1] if page == "item" else NOOPS[2]] += 1
        listed |= s.page == "results" and goal in s.listed()
        if state.done:
            break
    if traj.won:
        stage = "won"
    elif s.page == "done":
        stage = "item bought, not won" if s.item == goal else "other item bought"
    else:
        stage = "opened, not bought" if goal in s.opened else "listed, not opened" if listed else "never listed"
    return stage, noops


def report(trajs: list, num_groups: int, seconds: list[float], cpu: list[float], cfg, sft: Path) -> None:
    n = len(trajs)
    won = sum(t.won for _, t in trajs)
    positive = sum(t.process > 0 for _, t in trajs)
    score = sum(t.score for _, t in trajs) / n
    signal = signal_metrics(
        torch.tensor([t.outcome for _, t in trajs]),
        torch.zeros(n, dtype=torch.long),
        torch.tensor([g for g, _ in trajs]),
    )
    flat = round(signal["rollout/groups_without_signal"] * num_groups)
    by_type = collections.defaultdict(list)
    for _, t in trajs:
        by_type[t.task_type].append(t.won)

    def rate(k: int, m: int) -> str:
        lo, hi = wilson(k, m)
        return f"{k / m:.3f} [{lo:.3f}, {hi:.3f}]"

    print(f"{num_groups} train tasks x {cfg.rollout.group_size} trajectories at T={cfg.rollout.temperature}:")
    per_task = collections.defaultdict(list)
    for g, t in trajs:
        per_task[g].append(t.won)
    _, lo, hi = bootstrap_mean([[sum(v) / len(v) for v in per_task.values()]])
    print(
        f"  success                {won / n:.3f} [{lo:.3f}, {hi:.3f}] (tasks resampled; trajectories: {rate(won, n)})"
    )
    print(f"  score                  {score:.3f}")
    print(f"  groups_without_signal  {rate(flat, num_groups)}")
    print(f"  process_positive       {rate(positive, n)}")
    turns = sum(t.turns for _, t in trajs)
    invalid, noop = (sum(getattr(t, k) for _, t in trajs) / max(1, turns) for k in ("invalid", "noop"))
    print(f"  turns {turns / n:.1f}, invalid actions {invalid:.3f}, no-op turns {noop:.3f}")
    print("  success by type: " + ", ".join(f"{k} {sum(v) / len(v):.3f}" for k, v in sorted(by_type.items())))
    wall, cpu_s = sum(seconds) / len(seconds), sum(cpu) / len(cpu)
    print(f"  {wall:.0f} s per {cfg.rollout.num_tasks} tasks (rollout only), {cpu_s:.0f} s of CPU time")
    summary = {"warm_start": str(sft), "success": won / n, "score": score,
               "groups_without_signal": flat / num_groups,
               "process_positive": positive / n, "tasks": num_groups, "trajectories": n,
               "rollout_s_per_iteration": wall, "rollout_cpu_s_per_iteration": cpu_s}  # fmt: skip
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
