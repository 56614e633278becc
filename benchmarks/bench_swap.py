"""The RSPO swap (mixed-group advantages) vs its loop reference, measured in one run.

    PYTHONPATH=src python benchmarks/bench_swap.py [--quick]

N = 65,536 trajectories in 4,096 groups (16 per group: target, explorer and replay rows),
one row per trajectory. Prints the vectorized time on CPU (and on CUDA when available),
the loop reference's time and their ratio.
"""

from __future__ import annotations

import argparse

import torch
from common import keep_freed_memory, timed

from rspo.rewards.swap import rspo_group_advantages, rspo_group_advantages_loop


def make_inputs(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    group = torch.arange(n) // (n // k)  # (N,) n/k rows per group
    outcome = torch.randint(0, 2, (n,), generator=g).float() * 10  # sparse success, outcome_scale 10
    process = torch.randn(n, generator=g)  # dense process return
    source = torch.randint(0, 3, (n,), generator=g)  # target / explorer / replay
    return outcome, process, source, group


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 8,192 in 512 groups, fewer repeats")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: a per-core ratio)")
    parser.add_argument("--min-cuda-ratio", type=float, default=0, help="exit 1 unless CUDA is this many x the loop")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    allocator = keep_freed_memory()
    n, k, repeats = (8192, 512, 5) if args.quick else (65536, 4096, 20)
    inputs = make_inputs(n, k)
    cuda = torch.cuda.is_available()
    threads = torch.get_num_threads()
    print(f"N = {n:,} trajectories in {k:,} groups, torch {torch.__version__}, {threads} CPU threads")
    print(f"allocator: {allocator}")
    t_fast = timed(lambda: rspo_group_advantages(*inputs), repeats)
    t_loop = timed(lambda: rspo_group_advantages_loop(*inputs), repeats=3)
    print(
        f"vectorized CPU {t_fast * 1e3:9.2f} ms   loop reference {t_loop * 1e3:9.1f} ms   ratio {t_loop / t_fast:6.0f}x"
    )
    print(f"loop reference: pure Python over lists (the *_loop function), one core; vectorized: {threads} thread(s)")
    if cuda:
        cu = tuple(x.cuda() for x in inputs)
        t_cuda = timed(lambda: rspo_group_advantages(*cu), repeats, torch.cuda.synchronize)
        print(
            f"vectorized CUDA ({torch.cuda.get_device_name()}) {t_cuda * 1e3:9.3f} ms   "
            f"ratio vs loop {t_loop / t_cuda:6.0f}x"
        )
    else:
        print("CUDA: not available here")
    if args.min_cuda_ratio and not (cuda and t_loop / t_cuda >= args.min_cuda_ratio):
        raise SystemExit(f"FAILED: the CUDA swap is not {args.min_cuda_ratio:g}x its loop reference")


if __name__ == "__main__":
    main()
