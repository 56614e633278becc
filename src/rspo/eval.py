"""Evaluation on held-out splits: success rate and score, overall and per task type.

Greedy decoding with `eval.temperature=0`, else sampling with a fixed seed (every eval of
a run samples alike, so before/after differ only by the weights); one trajectory per task;
`eval.num_tasks` tasks of each split in `eval.splits`, evenly spaced through the split
(deterministic), spread over ranks.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch

from rspo.batch import TARGET
from rspo.config import Config
from rspo.log import write_json
from rspo.rollout import Plan, collect


def evaluate(
    policy,
    pool,
    cfg: Config,
    adapter: str = "target",
    rank: int = 0,
    world: int = 1,
    gather=None,
    prefix: str = "eval/",
) -> dict[str, float]:
    """`{prefix}{split}/success_rate`, `…/score`, `…/{task_type}/success_rate`, …"""
    with torch.random.fork_rng(devices=[]):  # the same sampling seed at every eval; training's RNG untouched
        torch.manual_seed(cfg.train.seed + rank)
        return _evaluate(policy, pool, cfg, adapter, rank, world, gather, prefix)


def _evaluate(policy, pool, cfg: Config, adapter, rank, world, gather, prefix) -> dict[str, float]:
    max_turns = cfg.rollout.max_turns or pool.max_steps
    results: dict[str, float] = {}
    for split in cfg.eval.splits:
        tasks = [(split, i) for i in spread(cfg.eval.num_tasks, pool.num_tasks(split))][rank::world]
        trajs = []
        for start in range(0, len(tasks), pool.num_envs):
            ro = collect(
                policy,
                pool,
                cfg.env.name,
                tasks[start : start + pool.num_envs],
                [Plan(adapter, 1, TARGET)],
                cfg.rollout,
                temperature=cfg.eval.temperature,
                max_turns=max_turns,
                progress=cfg.log.progress,
                desc=f"eval {split}",
            )
            trajs += [(t.task_type, t.won, t.score, t.process, t.turns, t.invalid) for t in ro.trajectories]
        if gather is not None and world > 1:
            trajs = gather(trajs)
        results |= split_metrics(trajs, f"{prefix}{split}/")
    return results


def spread(k: int, n: int) -> list[int]:
    """`k` task indices evenly spread over `n` (splits are ordered by task type, so the first
    k would all be one type)."""
    k = min(k, n)
    return [i * n // k for i in range(k)]


def split_metrics(trajs: list[tuple[str, bool, float, float, int, int]], prefix: str) -> dict[str, float]:
    """Aggregate (task_type, won, score, progress, turns, invalid) tuples into rates.

    `progress` is the summed process reward, Phi(s_T) - Phi(s_0): on ALFWorld the fraction of
    the task's goal conditions met at the end (ALFRED's goal-condition success), on
    WebShop the score of the item last viewed/bought. It moves before success does."""
    by_type: dict[str, list[tuple]] = defaultdict(list)
    for t in trajs:
        by_type[t[0]].append(t)
    out = {}
    for name, group in [("", trajs)] + sorted(by_type.items()):
        p = prefix + (f"{name}/" if name else "")
        n = max(len(group), 1)
        out[p + "success_rate"] = sum(t[1] for t in group) / n
        out[p + "score"] = sum(t[2] for t in group) / n
        out[p + "progress"] = sum(t[3] for t in group) / n
        if not name:
            turns = sum(t[4] for t in group)
            out[p + "num_tasks"] = float(len(group))
            out[p + "invalid_action_rate"] = sum(t[5] for t in group) / max(turns, 1)
    return out


def summary_table(before: dict[str, float], after: dict[str, float], cfg: Config) -> str:
    """Success rate and progress before and after RL, one line per split and task type."""
    keys = [k for k in after if k.endswith(("success_rate", "progress"))]
    width = max([len(k) for k in keys] + [10])
    lines = [f"{'metric':<{width}}  {'before':>8}  {'after':>8}", "-" * (width + 20)]
    for k in keys:
        b = f"{before[k]:.3f}" if k in before else "-"
        lines.append(f"{k:<{width}}  {b:>8}  {after[k]:>8.3f}")
    head = f"eval summary: env={cfg.env.name} algo={cfg.algo.name} reward.mode={cfg.reward.mode}"
    return "\n".join([head, *lines])


def evaluate_command(cfg: Config, checkpoint: str = "") -> dict[str, float]:
    """`rspo eval`: evaluate a checkpoint (default: the latest in train.output_dir)."""
    from rspo import checkpoint as ckpt
    from rspo.envs.pool import EnvPool
    from rspo.policy import build_policy
    from rspo.sft import model_corpus, warm_start_dir

    path = Path(checkpoint) if checkpoint else ckpt.latest(cfg.train.output_dir)
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {cfg.train.output_dir}/checkpoints; pass --checkpoint DIR")
    if cfg.sft.episodes > 0 and not cfg.model.init_from:  # the base model as `train.setup` chose it
        cfg.model.init_from = str(warm_start_dir(cfg))
    adapters = ["target", "explorer"] if cfg.eval.explorer else ["target"]
    with EnvPool(cfg.env, min(cfg.eval.num_tasks, 32)) as pool:
        policy = build_policy(cfg.model, model_corpus(cfg, pool), adapters=adapters)
        policy.load(path / "policy")
        results = evaluate(policy, pool, cfg)
        if cfg.eval.explorer:
            results |= evaluate(policy, pool, cfg, adapter="explorer", prefix="eval_explorer/")
    write_json(path / "eval.json", results)
    print(summary_table({}, results, cfg))
    print(f"written to {path / 'eval.json'}")
    return results
