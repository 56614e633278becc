"""Run under `accelerate launch` by test_distributed.py: one RL step on two CPU processes.

Writes JSON: the process count, each rank's tasks, and a checksum of each rank's target
weights before and after the step (equal across ranks iff DDP synchronized the gradients).
With RSPO, also each rank's replay-buffer tasks before a checkpoint and after resuming it.
"""

import json
import sys

import torch
from accelerate.utils import gather_object
from conftest import small_config

from rspo.rewards.buffer import ReplayBuffer
from rspo.train import resume, rl_step, sample_tasks, save, setup


def checksum(policy) -> float:
    return float(sum(p.detach().double().sum() for p in policy.parameters_of("target")))


def main() -> None:
    warm, out, *overrides = sys.argv[1:]
    cfg = small_config(f"model.init_from={warm}", f"train.output_dir={out}.run", *overrides)
    run = setup(cfg)
    try:
        before = checksum(run.policy)
        tasks = sample_tasks(run)
        metrics = rl_step(run)
        after = checksum(run.policy)
        buffer, restored = None, None
        if run.buffer is not None:
            buffer = [e.task for e in run.buffer._entries]
            save(run)
            run.buffer = ReplayBuffer(size=1, staleness=1)
            run.cfg.train.resume = "auto"
            resume(run)
            restored = [e.task for e in run.buffer._entries]
        rows = gather_object(
            [
                {
                    "rank": run.acc.process_index,
                    "tasks": tasks,
                    "before": before,
                    "after": after,
                    "finite": all(torch.isfinite(torch.tensor(v)) for v in metrics.values()),
                    "buffer": buffer,
                    "restored": restored,
                }
            ]
        )
        if run.acc.is_main_process:
            with open(out, "w") as f:
                json.dump({"num_processes": run.acc.num_processes, "ranks": rows}, f)
    finally:
        run.pool.close()


if __name__ == "__main__":
    main()
