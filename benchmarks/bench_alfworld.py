"""ALFWorld benchmark: generation speed, env throughput in-process vs the worker pool,
and an expert check of a whole generated split.

    python benchmarks/bench_alfworld.py            # speed: generation, resets/s, steps/s
    python benchmarks/bench_alfworld.py --quick    # the same, smaller
    python benchmarks/bench_alfworld.py --check    # the expert must win every game of a split

All numbers come from this one run on this machine; the ratios compare the two modes on
identical work (the same tasks, the same expert actions, deterministic envs).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from collections import Counter
from pathlib import Path

from rspo.config import AlfworldConfig, EnvConfig
from rspo.envs import alfworld_gen as gen
from rspo.envs.alfworld import ensure_generated, index_split
from rspo.envs.pool import EnvPool


def bench_generation(root: Path, num: int) -> float:
    """Seconds per generated game (PDDL + traj_data written to disk)."""
    start = time.perf_counter()
    gen.generate(root / "gen", "train", num, seed=0, task_types=gen.TASK_TYPES)
    return (time.perf_counter() - start) / num


def bench_lazy_defaults(root: Path) -> float:
    """Seconds to generate the default split sizes the way the env does on first use."""
    cfg = AlfworldConfig(games_dir=str(root / "lazy"))
    start = time.perf_counter()
    for split in gen.SPLIT_DIRS:
        ensure_generated(cfg, split)
    return time.perf_counter() - start


def run_episodes(pool: EnvPool, tasks: list[tuple[str, int]]) -> dict:
    """Play `tasks` with the expert, `len(pool)` at a time; time resets and steps apart."""
    n = len(pool)
    stats = Counter()
    for first in range(0, len(tasks) - n + 1, n):
        start = time.perf_counter()
        states = pool.reset(tasks[first : first + n])
        stats["reset_s"] += time.perf_counter() - start
        stats["resets"] += n
        while not all(s.done for s in states):
            actions = [None if s.done else a for s, a in zip(states, pool.expert_actions())]
            start = time.perf_counter()
            results = pool.step(actions)
            stats["step_s"] += time.perf_counter() - start
            stats["steps"] += sum(a is not None for a in actions)
            states = [r if r is not None else s for s, r in zip(states, results)]
            stats["won"] += sum(bool(r and r.won) for r in results)
    return stats


def bench_throughput(cfg: AlfworldConfig, num_envs: int, rounds: int, workers: int) -> None:
    tasks = [("train", i) for i in range(num_envs * rounds)]
    warmup = [("train", len(tasks) + i) for i in range(num_envs)]  # imports the engine in every worker
    results = {}
    for w in (0, workers):
        with EnvPool(EnvConfig(name="alfworld", num_workers=w, alfworld=cfg), num_envs) as pool:
            pool.reset(warmup)
            results[w] = run_episodes(pool, tasks)
    local, pooled = results[0], results[workers]
    assert (local["steps"], local["won"]) == (pooled["steps"], pooled["won"])  # identical work
    print(f"envs={num_envs}, episodes={local['resets']}, env steps={local['steps']}, won={local['won']}")
    for what in ("reset", "step"):
        a, b = local[what + "s"] / local[what + "_s"], pooled[what + "s"] / pooled[what + "_s"]
        print(f"  {what}s/s: in-process {a:7.1f} | pool({workers} workers) {b:7.1f} | ratio {b / a:4.2f}x")


def check_split(cfg: AlfworldConfig, split: str, workers: int, num_envs: int) -> bool:
    """Play every game of `split` with the expert; print the solve count per task type."""
    total = len(index_split(ensure_generated(cfg, split), split, cfg.task_types))
    per_type, won, bad_phi = Counter(), Counter(), 0
    with EnvPool(EnvConfig(name="alfworld", num_workers=workers, alfworld=cfg), num_envs) as pool:
        for first in range(0, total, num_envs):
            chunk = [(split, i) for i in range(first, min(first + num_envs, total))]
            states = pool.reset(chunk + [None] * (num_envs - len(chunk)))
            phis = [s.info["phi"] if s else 1.0 for s in states]
            per_type.update(s.task_type for s in states if s)
            while not all(s is None or s.done for s in states):
                actions = [None if s is None or s.done else a for s, a in zip(states, pool.expert_actions())]
                for e, r in enumerate(pool.step(actions)):
                    if r is not None:  # phi must not drop, and is 1 exactly at the win
                        bad_phi += r.info["phi"] < phis[e] or (r.info["phi"] == 1.0) != r.won
                        phis[e], states[e] = r.info["phi"], r
                        won[r.task_type] += r.won
    solved = sum(won.values())
    print(f"expert check of {split}: solved {solved}/{total} ({100 * solved / total:.1f}%), phi violations: {bad_phi}")
    for task_type in gen.TASK_TYPES:
        print(f"  {task_type:32s} {won[task_type]:4d}/{per_type[task_type]}")
    return solved == total and bad_phi == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast run (fewer games and episodes)")
    parser.add_argument("--check", action="store_true", help="expert-solve a whole generated split")
    parser.add_argument("--check-split", default="train", choices=list(gen.SPLIT_DIRS))
    parser.add_argument("--check-num", type=int, default=240, help="games in the checked split (>= 200)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rspo-bench-alfworld-") as tmp:
        root = Path(tmp)
        sizes = {"num_train": 64, "num_eval_in_distribution": 8, "num_eval_out_of_distribution": 8}
        cfg = AlfworldConfig(games_dir=str(root / "games"), **sizes)
        if args.check:
            field = {"train": "num_train", "eval_in_distribution": "num_eval_in_distribution"}
            cfg = dataclasses.replace(
                cfg, **{field.get(args.check_split, "num_eval_out_of_distribution"): args.check_num}
            )
            return 0 if check_split(cfg, args.check_split, args.workers, num_envs=2 * max(args.workers, 1)) else 1
        per_game = bench_generation(root, 60 if args.quick else 600)
        print(f"generation: {1000 * per_game:.2f} ms/game")
        if not args.quick:
            print(f"lazy generation of the default splits (600/140/134): {bench_lazy_defaults(root):.1f} s")
        bench_throughput(cfg, num_envs=4, rounds=2 if args.quick else 6, workers=args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
