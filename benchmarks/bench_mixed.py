"""RSPO rollouts: one generate per policy vs one mixed-adapter generate for both (LoRA).

    .venv/bin/python benchmarks/bench_mixed.py             # 32 tasks x (4 target + 4 explorer)
    .venv/bin/python benchmarks/bench_mixed.py --quick     # 4 tasks, 2 turns, 1 repeat

Both modes run the same `rspo.rollout.collect` with the plans of `reward.mode=rspo` (the
target's G and the explorer's E trajectories per task) on the same model, envs, tasks and
seed; only `rollout.mixed_adapters` differs:
  per-policy  each turn, the target's envs then the explorer's, each in its own generate
              passes (`policy.use(adapter)`);
  mixed       each turn, every env in the same passes, each row with its own adapter
              (peft's mixed-adapter batches: the base layers run once for all rows, each
              LoRA adapter on its rows).
The two adapters are given different random LoRA weights, as after training. tok/s =
generated tokens / time inside generation (sampling + the behavior log-prob forward), the
better of `--repeats` interleaved runs. The ratio mixed / per-policy comes from this one run;
absolute numbers depend on the machine and its load. CPU or CUDA, whichever torch sees.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from bench_rollout import build_model, make_config, spread_tasks

from rspo.batch import EXPLORER, TARGET
from rspo.envs.pool import EnvPool
from rspo.rollout import Plan, collect


def tokens_per_s(timing: dict) -> float:
    return timing["tokens"] / timing["generate"]


def run_once(policy, pool, cfg, tasks, plans, turns: int, mixed: bool, seed: int) -> dict:
    cfg.rollout.mixed_adapters = mixed
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    ro = collect(policy, pool, "webshop", tasks, plans, cfg.rollout, temperature=1.0, max_turns=turns, progress=False)
    return {**ro.timing, "wall": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 tasks, 2 turns, 1 repeat")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--group", type=int, default=4, help="target trajectories per task (G)")
    parser.add_argument("--explorer", type=int, default=4, help="explorer trajectories per task (E)")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per mode")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (see bench_rollout.py)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. rollout.micro_batch=16")
    args = parser.parse_args()
    tasks_n, turns, repeats = (4, 2, 1) if args.quick else (args.tasks, args.turns, args.repeats)
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = make_config("webshop", 24, tuple(args.overrides))
    n = tasks_n * (args.group + args.explorer)
    policy = build_model(cfg, ("target", "explorer"), device)
    torch.manual_seed(args.seed)
    for name, p in policy.peft_model.named_parameters():  # LoRA B starts at 0: two different policies
        if "lora_B" in name:
            p.data.normal_(0, 0.02)
    plans = [Plan("target", args.group, TARGET), Plan("explorer", args.explorer, EXPLORER)]
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(
        f"{cfg.model.name} on {where}, LoRA r={cfg.model.lora.r}: "
        f"{tasks_n} tasks x ({args.group} target + {args.explorer} explorer) = {n} envs, {turns} turns, "
        f"micro_batch {cfg.rollout.micro_batch}, max_new_tokens {cfg.rollout.max_new_tokens}, best of {repeats}; "
        f"torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}"
    )
    with EnvPool(cfg.env, n) as pool:
        tasks = spread_tasks(pool, tasks_n)
        run_once(policy, pool, cfg, tasks[:1], plans, 1, True, args.seed)  # warm-up: first-call costs
        runs: dict[str, list[dict]] = {"per-policy": [], "mixed": []}
        for _ in range(repeats):  # interleaved, so a load change hits both modes
            for mode in runs:
                runs[mode].append(run_once(policy, pool, cfg, tasks, plans, turns, mode == "mixed", args.seed))
    best = {mode: max(rs, key=tokens_per_s) for mode, rs in runs.items()}
    for mode, r in best.items():
        print(
            f"  {mode:<11} {r['tokens']:7.0f} tokens in {r['generate']:7.2f} s generating: "
            f"{tokens_per_s(r):8.0f} tok/s   (collect {r['wall']:.2f} s)"
        )
    ratio = tokens_per_s(best["mixed"]) / tokens_per_s(best["per-policy"])
    print(f"mixed / per-policy tok/s: x{ratio:.2f}   (load after {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
