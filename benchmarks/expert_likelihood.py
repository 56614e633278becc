"""How likely the env's expert's actions are under a run's target policy, checkpoint by checkpoint:
does RL move the target toward the expert's demonstrations? (Issue 45: under RSPO's expert
ceiling, `rspo.expert_fraction`, the target trains on the expert's swapped successes.)

    .venv/bin/python benchmarks/expert_likelihood.py RUN_DIR [RUN_DIR ...] [--episodes 16] [--seed 7]

For each run directory: its warm start (the base it trained on, with a fresh adapter, which
adds nothing: LoRA's B starts at 0) and each saved checkpoint. The expert plays `--episodes`
training tasks (drawn with `--seed`; the same demonstrations for every run of one env
config), and the target scores each turn's response (the expert's action as the warm start
learned to write it, then eos): per turn, the mean -log p of its response tokens (averaged
over turns; beside it the change from the warm start, paired turn by turn, with its 95%
bootstrap interval over turns), the mean probability of a whole response, and the share of
turns where that probability is below 0.5. Training tasks only: nothing here reads an eval
split.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import torch

from rspo.checkpoint import checkpoint_dir
from rspo.config import load_config
from rspo.envs.pool import EnvPool
from rspo.policy_io import build_policy, load_policy
from rspo.sft import expert_demos, run_base, sft_batches, sft_loss
from rspo.stats import bootstrap_diff


@torch.no_grad()
def scores(policy, samples: list[tuple[list[int], list[int]]]) -> tuple[np.ndarray, np.ndarray]:
    """Per turn: (the mean -log p of its response tokens, the probability of the whole response)."""
    nll, prob = [], []
    with policy.use("target"):
        for sample in samples:  # one at a time: each response's own sum
            loss, n = sft_loss(policy.nets["target"], [sample], policy.tokenizer.pad_token_id, policy.device)
            nll.append(loss.item() / n)
            prob.append(math.exp(-loss.item()))
    return np.array(nll), np.array(prob)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each with checkpoints/)")
    parser.add_argument("--episodes", type=int, default=16, help="expert episodes on training tasks")
    parser.add_argument("--seed", type=int, default=7, help="draws the training tasks")
    args = parser.parse_args()
    torch.set_num_threads(1)
    demos = None
    print(f"{'run':<32}{'step':>5}{'nll/token':>11}{'change from the warm start':>30}{'p(response)':>13}{'p < 0.5':>9}")
    for run in args.runs:
        steps = sorted(checkpoint_dir(run).glob("step_*"))
        if not steps:
            raise SystemExit(f"{run}: no checkpoints")
        cfg = load_config(steps[-1] / "config.yaml", ["train.resume="])
        cfg.model.init_from = run_base(cfg)  # the warm start it trained on
        policy = build_policy(cfg.model)
        if demos is None:  # the same demonstrations (text) for every run
            with EnvPool(cfg.env, 8) as pool:
                max_turns = cfg.rollout.max_turns or pool.max_steps
                demos = expert_demos(pool, pool.num_tasks("train"), args.episodes, max_turns,
                                     cfg.rollout.history_length, args.seed)  # fmt: skip
        # tokenized by each run's own tokenizer: every seed's warm start builds its own
        samples = sft_batches(policy.tokenizer, demos, cfg.env.name, cfg.rollout.require_think,
                              cfg.rollout.max_prompt_tokens)  # fmt: skip
        print(f"({len(samples)} expert turns from {args.episodes} training episodes)")
        start = scores(policy, samples)
        rows = [(0, start)]
        for step in steps:
            load_policy(policy, step / "policy", ["target"])
            rows.append((int(step.name.removeprefix("step_")), scores(policy, samples)))
        for number, (nll, prob) in rows:
            change, lo, hi = bootstrap_diff(start[0], nll)  # paired over turns
            print(f"{run.name:<32}{number:>5}{nll.mean():>11.4f}{f'{change:+.4f} [{lo:+.4f}, {hi:+.4f}]':>30}"
                  f"{prob.mean():>13.3f}{(prob < 0.5).mean():>9.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
