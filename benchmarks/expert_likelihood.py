"""How likely the env's expert's actions are under a run's target policy, checkpoint by checkpoint:
does RL move the target toward the expert's demonstrations? (Issue 45: under RSPO's expert
ceiling, `rspo.expert_fraction`, the target trains on the expert's swapped successes.)

    .venv/bin/python benchmarks/expert_likelihood.py RUN_DIR [RUN_DIR ...] [--episodes 16] [--seed 7]

For each run directory: its warm start (the base it trained on, with a fresh adapter, which
adds nothing: LoRA's B starts at 0) and each saved checkpoint. The expert plays `--episodes`
training tasks (drawn with `--seed`; the same demonstrations for every run of one env
config), and the target scores each turn's response (the expert's action as the warm start
learned to write it, then eos): the mean -log p per response token, the mean probability of a
whole response, and the share of turns where that probability is below 0.5. Training tasks
only: nothing here reads an eval split.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from rspo.checkpoint import checkpoint_dir
from rspo.config import load_config
from rspo.envs.pool import EnvPool
from rspo.policy_io import build_policy, load_policy
from rspo.sft import expert_demos, run_base, sft_batches, sft_loss


@torch.no_grad()
def scores(policy, samples: list[tuple[list[int], list[int]]]) -> tuple[float, float, float]:
    """(mean -log p per token, mean probability of a whole response, share of responses below 0.5)."""
    nll_sum, tokens, probs = 0.0, 0, []
    with policy.use("target"):
        for sample in samples:  # one at a time: each response's own sum
            loss, n = sft_loss(policy.nets["target"], [sample], policy.tokenizer.pad_token_id, policy.device)
            nll_sum, tokens = nll_sum + loss.item(), tokens + n
            probs.append(math.exp(-loss.item()))
    return nll_sum / tokens, sum(probs) / len(probs), sum(p < 0.5 for p in probs) / len(probs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each with checkpoints/)")
    parser.add_argument("--episodes", type=int, default=16, help="expert episodes on training tasks")
    parser.add_argument("--seed", type=int, default=7, help="draws the training tasks")
    args = parser.parse_args()
    torch.set_num_threads(1)
    samples = None
    print(f"{'run':<40}{'step':>6}{'nll/token':>11}{'p(response)':>13}{'p < 0.5':>9}")
    for run in args.runs:
        steps = sorted(checkpoint_dir(run).glob("step_*"))
        if not steps:
            raise SystemExit(f"{run}: no checkpoints")
        cfg = load_config(steps[-1] / "config.yaml", ["train.resume="])
        cfg.model.init_from = run_base(cfg)  # the warm start it trained on
        policy = build_policy(cfg.model)
        if samples is None:
            with EnvPool(cfg.env, 8) as pool:
                max_turns = cfg.rollout.max_turns or pool.max_steps
                demos = expert_demos(pool, pool.num_tasks("train"), args.episodes, max_turns,
                                     cfg.rollout.history_length, args.seed)  # fmt: skip
            samples = sft_batches(policy.tokenizer, demos, cfg.env.name, cfg.rollout.require_think,
                                  cfg.rollout.max_prompt_tokens)  # fmt: skip
            print(f"({len(samples)} expert turns from {args.episodes} training episodes)")
        rows = [("warm start", 0, scores(policy, samples))]
        for step in steps:
            load_policy(policy, step / "policy", ["target"])
            rows.append((step.name, int(step.name.removeprefix("step_")), scores(policy, samples)))
        for _, number, (nll, prob, low) in rows:
            print(f"{run.name:<40}{number:>6}{nll:>11.4f}{prob:>13.3f}{low:>9.3f}", flush=True)


if __name__ == "__main__":
    main()
