"""Evaluation on held-out splits: success rate and score, overall and per task type.

Greedy decoding with `eval.temperature=0`, else sampling with a fixed seed (every eval of
a run samples alike, so before/after differ only by the weights; `eval.batch_size`
trajectories are played at a time whatever the env pool's size, so runs whose pools
differ — RSPO's is larger — sample alike too); `eval.samples_per_task` trajectories per
task (k > 1 averages out sampling noise: a task's `won` is then its fraction of wins);
`eval.num_tasks` tasks of each split in `eval.splits`, evenly spaced through the split
(deterministic), spread over ranks.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from rspo import checkpoint as ckpt
from rspo.batch import TARGET
from rspo.config import Config, load_config
from rspo.envs.pool import EnvPool
from rspo.log import write_json
from rspo.policy_io import build_policy, load_policy
from rspo.rollout import Plan, collect
from rspo.sft import model_corpus, run_base
from rspo.stats import bootstrap_diff, fmt_interval, wilson


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
    """`{prefix}{split}/success_rate` (with `success_lo`/`success_hi`), `…/score`, `…/{task_type}/…`."""
    return metrics_of(evaluate_tasks(policy, pool, cfg, adapter, rank, world, gather), prefix)


def evaluate_tasks(
    policy, pool, cfg: Config, adapter: str = "target", rank: int = 0, world: int = 1, gather=None
) -> list[dict]:
    """One record per eval task (split, task index, task type, won, score, progress, turns,
    invalid), in task order; every rank gets all of them."""
    with torch.random.fork_rng(devices=[]):  # the same sampling seed at every eval; training's RNG untouched
        torch.manual_seed(cfg.train.seed + rank)
        return _evaluate(policy, pool, cfg, adapter, rank, world, gather)


def _evaluate(policy, pool, cfg: Config, adapter, rank, world, gather) -> list[dict]:
    max_turns = cfg.rollout.max_turns or pool.max_steps
    records: list[dict] = []
    for split in cfg.eval.splits:
        tasks = [(split, i) for i in eval_tasks(cfg.eval.num_tasks, pool.num_tasks(split))][rank::world]
        mine = []
        k = cfg.eval.samples_per_task
        chunk = max(1, min(cfg.eval.batch_size, pool.num_envs) // k)  # tasks at once, not the pool's size
        for start in range(0, len(tasks), chunk):
            ro = collect(
                policy,
                pool,
                cfg.env.name,
                tasks[start : start + chunk],
                [Plan(adapter, k, TARGET)],
                cfg.rollout,
                temperature=cfg.eval.temperature,
                max_turns=max_turns,
                progress=cfg.log.progress,
                desc=f"eval {split}",
                behavior_logprobs=False,  # no update reads them: one forward pass a turn fewer
            )
            mine += _per_task(split, ro.trajectories, k)
        if gather is not None and world > 1:
            mine = gather(mine)
        records += sorted(mine, key=lambda r: r["task_index"])
    return records


def _per_task(split: str, trajectories: list, k: int) -> list[dict]:
    """One record per task from its k trajectories (consecutive in a rollout): means of
    won/score/progress (`won` stays a bool when k = 1), sums of turns, invalid actions and no-ops."""
    out = []
    for i in range(0, len(trajectories), k):
        ts = trajectories[i : i + k]
        won = sum(bool(t.won) for t in ts) / k
        out.append({"split": split, "task_index": ts[0].task_index, "task_type": ts[0].task_type,
                    "won": bool(won) if k == 1 else won, "score": sum(t.score for t in ts) / k,
                    "progress": sum(t.process for t in ts) / k, "turns": sum(t.turns for t in ts),
                    "invalid": sum(t.invalid for t in ts), "noop": sum(t.noop for t in ts)})  # fmt: skip
    return out


def eval_pool_size(cfg: Config) -> int:
    """Envs that eval needs at once: `eval.batch_size` trajectories, at least one task's k."""
    k = cfg.eval.samples_per_task
    return max(k, min(cfg.eval.num_tasks * k, cfg.eval.batch_size))


def eval_tasks(k: int, n: int) -> list[int]:
    """The fixed eval set: `k` task indices evenly spread over a split of `n` (all when
    k >= n). Splits are ordered by task type, so the first k would all be one type; evenly
    spaced indices keep the types balanced, and every eval of every run uses the same set."""
    k = min(k, n)
    return [i * n // k for i in range(k)]


def metrics_of(records: list[dict], prefix: str = "eval/") -> dict[str, float]:
    """Rates per split, overall and per task type, from per-task records.

    `progress` is the summed process reward, Phi(s_T) - Phi(s_0): on ALFWorld the fraction of
    the task's goal conditions met at the end (ALFRED's goal-condition success), on
    WebShop the score of the item last viewed/bought. It moves before success does.
    Each split's success rate comes with its 95% Wilson interval (`success_lo`, `success_hi`)."""
    out = {}
    for split in dict.fromkeys(r["split"] for r in records):
        trajs = [r for r in records if r["split"] == split]
        by_type: dict[str, list[dict]] = defaultdict(list)
        for t in trajs:
            by_type[t["task_type"]].append(t)
        for name, group in [("", trajs)] + sorted(by_type.items()):
            p = f"{prefix}{split}/" + (f"{name}/" if name else "")
            n = max(len(group), 1)
            out[p + "success_rate"] = sum(t["won"] for t in group) / n
            out[p + "score"] = sum(t["score"] for t in group) / n
            out[p + "progress"] = sum(t["progress"] for t in group) / n
            if not name:
                out[p + "success_lo"], out[p + "success_hi"] = wilson(sum(t["won"] for t in group), len(group))
                out[p + "num_tasks"] = float(len(group))
                turns = max(sum(t["turns"] for t in group), 1)
                out[p + "invalid_action_rate"] = sum(t["invalid"] for t in group) / turns
                out[p + "noop_rate"] = sum(t["noop"] for t in group) / turns
    return out


def paired_differences(before: list[dict], after: list[dict], prefix: str = "eval/") -> dict[str, float]:
    """After minus before, per split, for success and score, with a 95% paired bootstrap
    interval over the split's tasks: `{prefix}{split}/success_diff`, `…_diff_lo`, `…_diff_hi`."""
    out = {}
    for split in dict.fromkeys(r["split"] for r in after):
        a = {r["task_index"]: r for r in before if r["split"] == split}
        b = {r["task_index"]: r for r in after if r["split"] == split}
        common = sorted(a.keys() & b.keys())
        if not common:
            continue
        for key, metric in (("won", "success"), ("score", "score")):
            diff = bootstrap_diff([float(a[i][key]) for i in common], [float(b[i][key]) for i in common])
            p = f"{prefix}{split}/{metric}_diff"
            out[p], out[p + "_lo"], out[p + "_hi"] = diff
    return out


def summary_table(before: dict[str, float], after: dict[str, float], cfg: Config, diffs: dict | None = None) -> str:
    """Success rate and progress before and after RL, per split and task type; each split's
    success with its 95% interval, and the paired difference with its interval."""
    diffs = diffs or {}
    head = (
        f"eval summary: env={cfg.env.name} algo={cfg.algo.name} reward.mode={cfg.reward.mode}"
        "  [95% intervals: Wilson for a rate, paired bootstrap over tasks for a difference]"
    )
    keys = [k for k in after if k.endswith(("success_rate", "progress"))]
    w = max([len(k) for k in keys] + [6])
    lines = [head, f"{'metric':<{w}} {'n':>4}  {'before':<21}  {'after':<21}  after - before", "-" * (w + 74)]
    for k in keys:
        base, n = k.rsplit("/", 1)[0], after.get(k.rsplit("/", 1)[0] + "/num_tasks")
        cells = []
        for res in (before, after):
            if k not in res:
                cells.append("-")
            elif k.endswith("success_rate") and base + "/success_lo" in res:
                cells.append(fmt_interval(res[k], res[base + "/success_lo"], res[base + "/success_hi"]))
            else:
                cells.append(f"{res[k]:.3f}")
        d = base + "/success_diff"
        change = ""
        if k.endswith("success_rate") and d in diffs:
            change = fmt_interval(diffs[d], diffs[d + "_lo"], diffs[d + "_hi"], signed=True)
        lines.append(f"{k:<{w}} {'' if n is None else int(n):>4}  {cells[0]:<21}  {cells[1]:<21}  {change}".rstrip())
    return "\n".join(lines)


def evaluate_command(cfg: Config | None, checkpoint: str = "", overrides: list[str] | None = None) -> dict[str, float]:
    """`rspo eval`: evaluate a checkpoint (`checkpoint`, else the latest in `cfg`'s
    train.output_dir) with the model, envs and eval keys of its own recorded config.yaml,
    `overrides` applied on top. Prints and records which weights it evaluated."""
    path = ckpt.require(checkpoint) if checkpoint else ckpt.latest(cfg.train.output_dir)
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {cfg.train.output_dir}/checkpoints; pass --checkpoint DIR")
    cfg = load_config(path / "config.yaml", ["train.resume=", *(overrides or [])])  # resume: the run's, not eval's
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    cfg.model.init_from = run_base(cfg)
    adapters = ["target", "explorer"] if cfg.eval.explorer else ["target"]
    weights = {"checkpoint": str(path), "weights_sha256": ckpt.weights_digest(path / "policy")}
    with EnvPool(cfg.env, eval_pool_size(cfg)) as pool:
        policy = build_policy(cfg.model, model_corpus(cfg, pool), adapters=adapters)
        load_policy(policy, path / "policy", adapters)
        results = evaluate(policy, pool, cfg)
        if cfg.eval.explorer:
            results |= evaluate(policy, pool, cfg, adapter="explorer", prefix="eval_explorer/")
    write_json(path / "eval.json", {**weights, "metrics": results})
    print(f"evaluated {path / 'policy'} (weights sha256 {weights['weights_sha256']})")
    print(summary_table({}, results, cfg))
    print(f"written to {path / 'eval.json'}")
    return results
