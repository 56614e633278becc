"""Run under `accelerate launch` by test_distributed.py: one RL step on two CPU processes
(DDP, or rspo's FSDP with `train.fsdp=true`), on one machine or on two. Arguments: the
JSON file to write (by the main process), then config overrides.

Writes JSON: the process count, each rank's tasks, and a checksum of each rank's target
weights before and after the step (equal across ranks iff the gradients were synchronized).
Then a checkpoint is saved, the weights and Adam moments zeroed, and the checkpoint
resumed: their checksums at the save and after resuming, and with RSPO each rank's
replay-buffer tasks before and after.
"""

import json
import sys

import torch
from accelerate.utils import gather_object
from conftest import small_config
from torch.distributed.tensor import DTensor

from rspo.cli import end_process
from rspo.multinode import checked_everywhere
from rspo.rewards.buffer import ReplayBuffer
from rspo.train import resume, rl_step, sample_tasks, save, setup


def total(tensors) -> float:
    """The sum of whole tensors (FSDP shards gathered: a collective)."""
    return float(sum((t.full_tensor() if isinstance(t, DTensor) else t).detach().double().sum() for t in tensors))


def checksum(policy) -> float:
    return total(policy.parameters_of("target"))


def adam_moments(learner) -> list:
    return [v for state in learner.optimizer.state.values() for k, v in state.items() if k.startswith("exp_avg")]


def main() -> None:
    out, *overrides = sys.argv[1:]
    cfg = checked_everywhere(lambda: small_config(f"train.output_dir={out}.run", *overrides))  # as `rspo train`
    run = setup(cfg)
    try:
        before = checksum(run.policy)
        tasks = sample_tasks(run)
        metrics = rl_step(run)
        after = checksum(run.policy)
        stored = getattr(run.mode, "buffer", None)  # RSPO's replay buffer
        buffer = [e.task for e in stored._entries] if stored is not None else None
        moments = total(adam_moments(run.learners["target"]))
        local = [m.to_local() if isinstance(m, DTensor) else m for m in adam_moments(run.learners["target"])]
        moment_bytes = sum(m.numel() * m.element_size() for m in local)  # what this rank holds
        save(run)
        with torch.no_grad():
            for p in run.policy.parameters_of("target") + adam_moments(run.learners["target"]):
                p.zero_()
        if stored is not None:
            run.mode.buffer = ReplayBuffer(size=1, staleness=1)
        run.cfg.train.resume = "auto"
        resume(run)
        resumed = checksum(run.policy)
        moments = [moments, total(adam_moments(run.learners["target"]))]  # at the save, after resuming
        restored = [e.task for e in run.mode.buffer._entries] if stored is not None else None
        rows = gather_object(
            [
                {
                    "rank": run.acc.process_index,
                    "tasks": tasks,
                    "before": before,
                    "after": after,
                    "finite": all(torch.isfinite(torch.tensor(v)) for v in metrics.values()),
                    "metrics": metrics,
                    "buffer": buffer,
                    "restored": restored,
                    "resumed": resumed,
                    "moments": moments,
                    "moment_bytes": moment_bytes,
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
    end_process()  # as `rspo train` ends: no process-group teardown (rspo.cli.end_process)
