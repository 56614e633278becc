"""Vectorized advantage estimators vs their loop references, measured in one run.

    PYTHONPATH=src python benchmarks/bench_estimators.py [--quick] [--turns N]

Prints, per estimator (grpo, gigpo, ppo-gae), the median time of the vectorized version on
CPU (and CUDA when available), the loop reference's time and their ratio. A loop reference
that would take too long at full N is timed on a prefix of the batch and scaled linearly
(the references are linear in N); the output says so.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from common import keep_freed_memory, timed

from rspo.algorithms import Turns, random_turns
from rspo.algorithms.gigpo import gigpo_advantages, gigpo_advantages_loop
from rspo.algorithms.grpo import grpo_advantages, grpo_advantages_loop
from rspo.algorithms.ppo import ppo_advantages, ppo_advantages_loop

KW = dict(norm="mean_std", gamma=0.95, lam=0.95, step_weight=1.0)
ESTIMATORS = {
    "grpo": (grpo_advantages, grpo_advantages_loop),
    "gigpo": (gigpo_advantages, gigpo_advantages_loop),
    "ppo-gae": (ppo_advantages, ppo_advantages_loop),
}


def make_turns(n: int, seed: int = 0) -> Turns:
    """Exactly n turns in whole groups, as a trainer batch: groups of 8 trajectories of 1..16
    turns, 3 anchor states per turn index. The last trajectories are shortened (never cut
    off) to land on n."""
    full = random_turns(num_groups=n // 8 // 8 + 8, group_size=8, max_turns=16, seed=seed)
    lengths = torch.bincount(full.traj_id)  # (M,)
    ends = torch.cumsum(lengths.view(-1, 8).sum(1), 0)  # (K,) rows through each whole group
    num_traj = 8 * (int(torch.searchsorted(ends, n)) + 1)  # the fewest whole groups holding >= n rows
    lengths = lengths[:num_traj].clone()
    excess = int(lengths.sum()) - n
    for i in reversed(range(num_traj)):  # shorten from the end, keeping every trajectory >= 1 turn
        cut = min(excess, int(lengths[i]) - 1)
        lengths[i] -= cut
        excess -= cut
    keep = (full.traj_id < num_traj) & (full.turn < lengths[full.traj_id.clamp(max=num_traj - 1)])
    turns = full.select(keep)
    turns.last = turns.turn == lengths[turns.traj_id] - 1
    return turns


def time_loop(loop: Callable[[Turns], object], turns: Turns, budget_s: float) -> tuple[float, str]:
    """Loop reference time at full N, or scaled from a prefix when full N would exceed the budget."""
    n = len(turns)
    sub = min(n, 4096)
    t_sub = timed(lambda: loop(turns.select(torch.arange(sub)), **KW), repeats=3)
    if sub == n or t_sub * n / sub <= budget_s:
        return timed(lambda: loop(turns, **KW), repeats=3), "full N"
    return t_sub * n / sub, f"timed on {sub} turns, scaled x{n / sub:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 8,192 and fewer repeats")
    parser.add_argument("--turns", type=int, default=None, help="N (default 65,536)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: a per-core ratio)")
    parser.add_argument("--min-cuda-ratio", type=float, default=0, help="exit 1 unless CUDA is this many x the loop")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    allocator = keep_freed_memory()
    n = args.turns or (8192 if args.quick else 65536)
    repeats, budget = (5, 5.0) if args.quick else (20, 60.0)
    torch.manual_seed(0)
    turns = make_turns(n)
    cuda = torch.cuda.is_available()
    num_traj = int(torch.unique(turns.traj_id).numel())
    device = f", CUDA {torch.cuda.get_device_name()}" if cuda else ", no CUDA"
    threads = torch.get_num_threads()
    print(f"N = {n:,} turns, {num_traj:,} trajectories, torch {torch.__version__}, {threads} CPU threads{device}")
    print(f"allocator: {allocator}")
    print(f"{'estimator':<10}{'vectorized CPU':>16}{'loop reference':>16}{'ratio':>9}  {'CUDA':>18}  loop timing")
    slow = []  # estimators whose CUDA ratio misses --min-cuda-ratio
    for name, (fast, loop) in ESTIMATORS.items():
        t_fast = timed(lambda fast=fast: fast(turns, **KW), repeats)
        t_loop, how = time_loop(loop, turns, budget)
        t_cuda = ""
        if cuda:
            cu = turns.to("cuda")
            t = timed(lambda fast=fast, cu=cu: fast(cu, **KW), repeats, torch.cuda.synchronize)
            t_cuda = f"{t * 1e3:8.3f} ms {t_loop / t:6.0f}x"
        if args.min_cuda_ratio and not (cuda and t_loop / t >= args.min_cuda_ratio):
            slow.append(name)
        print(f"{name:<10}{t_fast * 1e3:13.2f} ms{t_loop * 1e3:13.1f} ms{t_loop / t_fast:8.0f}x  {t_cuda:>18}  {how}")
    print(f"loop references: pure Python over lists (*_loop), one core; vectorized: {threads} thread(s); best times")
    if slow:
        raise SystemExit(f"FAILED: CUDA is not {args.min_cuda_ratio:g}x the loop reference for {', '.join(slow)}")


if __name__ == "__main__":
    main()
