"""How likely the env's expert's actions are under a run's target policy, checkpoint by checkpoint,
and how far the target moved: does RL move the target toward the expert's demonstrations?
(Issue 45: under RSPO's expert ceiling, `rspo.expert_fraction`, the target trains on the
expert's swapped successes.) How large are its updates, measured where every arm can be
compared? (The training trace's `policy/approx_kl` is measured on the very rows the update
was fit to, and only on the target's own rows: an arm whose positive-advantage rows are
off-policy shows a first-order drop there that a GRPO group, whose advantages sum to zero
over its own rows, cancels.)

    .venv/bin/python benchmarks/expert_likelihood.py RUN_DIR [RUN_DIR ...] [--episodes 16] [--seed 7]

For each run directory: its warm start (the base it trained on, with a fresh adapter, which
adds nothing: LoRA's B starts at 0) and each saved checkpoint. The expert plays `--episodes`
training tasks (drawn with `--seed`; the same demonstrations for every run of one env
config), and the target scores each turn's response (the expert's action as the warm start
learned to write it, then eos): per turn, the mean -log p of its response tokens (averaged
over turns; beside it the change from the warm start, paired turn by turn, with its 95%
bootstrap interval over turns), the mean probability of a whole response, and the share of
turns where that probability is below 0.5; and the drift, exact over the vocabulary at every
response position of those turns: KL(previous checkpoint || this one) and KL(warm start ||
this one) per token, and the entropy. `--states own` measures the drift where the target acts
instead: at the turns of the warm start's own episodes on those tasks (sampled at the
rollout temperature, `--seed` seeding the draw; the expert columns then score those turns'
sampled responses). Then, for runs tokenized alike (the arms of one warm
start), each run's drift against the first run's, paired turn by turn. Training tasks only:
nothing here reads an eval split.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
import torch

from rspo.batch import TARGET
from rspo.checkpoint import checkpoint_dir
from rspo.config import load_config
from rspo.envs.pool import EnvPool
from rspo.policy_io import build_policy, load_policy
from rspo.rollout import Plan, collect
from rspo.sft import expert_demos, response_logits, run_base, sft_batches
from rspo.stats import bootstrap_diff, bootstrap_mean, fmt_interval


@torch.no_grad()
def distributions(policy, samples: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """Per turn: log pi(. | s_t) at each of its response positions, (r, V)."""
    out = []
    with policy.use("target"):
        for sample in samples:  # one at a time: no padding to drop
            logits, _ = response_logits(policy.nets["target"], [sample], policy.tokenizer.pad_token_id, policy.device)
            out.append(logits[0].log_softmax(-1).cpu())
    return out


def scores(logp: list[torch.Tensor], samples) -> dict[str, np.ndarray]:
    """Per turn: the mean -log p of its response tokens and the probability of the whole response."""
    token = [lp.gather(-1, torch.tensor(r).unsqueeze(-1)).squeeze(-1) for lp, (_, r) in zip(logp, samples)]
    return {"nll": np.array([-t.mean().item() for t in token]), "prob": np.array([t.sum().exp().item() for t in token]),
            "entropy": np.array([-(lp.exp() * lp).sum(-1).mean().item() for lp in logp])}  # fmt: skip


def own_turns(policy, cfg, episodes: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) of every turn the policy plays on `episodes` training tasks,
    one episode each, at the rollout temperature."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    with EnvPool(cfg.env, episodes) as pool:
        tasks = [("train", rng.randrange(pool.num_tasks("train"))) for _ in range(episodes)]
        batch = collect(policy, pool, cfg.env.name, tasks, [Plan("target", 1, TARGET)], cfg.rollout,
                        temperature=cfg.rollout.temperature, max_turns=cfg.rollout.max_turns or pool.max_steps,
                        progress=False).batch  # fmt: skip
    P = batch.prompt_len
    return [(ids[:P][att[:P] > 0].tolist(), ids[P:][resp > 0].tolist())
            for ids, att, resp in zip(batch.input_ids, batch.attention_mask, batch.response_mask)]  # fmt: skip


def kl(p: list[torch.Tensor], q: list[torch.Tensor]) -> np.ndarray:
    """Per turn: KL(p || q) = sum_v p (log p - log q), exact, averaged over its response positions."""
    return np.array([(a.exp() * (a - b)).sum(-1).mean().item() for a, b in zip(p, q)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each with checkpoints/)")
    parser.add_argument("--episodes", type=int, default=16, help="expert episodes on training tasks")
    parser.add_argument("--seed", type=int, default=7, help="draws the training tasks")
    parser.add_argument("--states", choices=["expert", "own"], default="expert",
                        help="the turns scored: the expert's episodes, or the warm start's own")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    demos, own = None, {}  # own: warm start -> its turns (the same for every run that trained from it)
    print(f"{'run':<32}{'step':>5}{'nll/token':>11}{'change from the warm start':>30}{'p(response)':>13}"
          f"{'p < 0.5':>9}{'KL(prev||this)':>16}{'KL(start||this)':>17}{'entropy':>9}")  # fmt: skip
    drift = {}  # run -> (samples, per-turn KL(prev || this) averaged over its windows, per-turn KL(start || last))
    for run in args.runs:
        steps = sorted(checkpoint_dir(run).glob("step_*"))
        if not steps:
            raise SystemExit(f"{run}: no checkpoints")
        cfg = load_config(steps[-1] / "config.yaml", ["train.resume="])
        cfg.model.init_from = run_base(cfg)  # the warm start it trained on
        policy = build_policy(cfg.model)
        if demos is None and args.states == "expert":  # the same demonstrations (text) for every run
            with EnvPool(cfg.env, 8) as pool:
                max_turns = cfg.rollout.max_turns or pool.max_steps
                demos = expert_demos(pool, pool.num_tasks("train"), args.episodes, max_turns,
                                     cfg.rollout.history_length, args.seed)  # fmt: skip
        if args.states == "own":
            if cfg.model.init_from not in own:
                own[cfg.model.init_from] = own_turns(policy, cfg, args.episodes, args.seed)
            samples = own[cfg.model.init_from]
        else:  # tokenized by each run's own tokenizer: every seed's warm start builds its own
            samples = sft_batches(policy.tokenizer, demos, cfg.env.name, cfg.rollout.require_think,
                                  cfg.rollout.max_prompt_tokens)  # fmt: skip
        print(f"({len(samples)} {args.states} turns from {args.episodes} training episodes)")
        start = prev = distributions(policy, samples)
        rows = [(0, scores(start, samples), np.zeros(len(samples)), np.zeros(len(samples)))]
        for step in steps:
            load_policy(policy, step / "policy", ["target"])
            here = distributions(policy, samples)
            rows.append((int(step.name.removeprefix("step_")), scores(here, samples), kl(prev, here), kl(start, here)))
            prev = here
        for number, s, kl_prev, kl_start in rows:
            change, lo, hi = bootstrap_diff(rows[0][1]["nll"], s["nll"])  # paired over turns
            print(f"{run.name:<32}{number:>5}{s['nll'].mean():>11.4f}{f'{change:+.4f} [{lo:+.4f}, {hi:+.4f}]':>30}"
                  f"{s['prob'].mean():>13.3f}{(s['prob'] < 0.5).mean():>9.3f}{kl_prev.mean():>16.2e}"
                  f"{kl_start.mean():>17.2e}{s['entropy'].mean():>9.4f}", flush=True)  # fmt: skip
        windows = np.mean([r[2] for r in rows[1:]], axis=0)  # per turn, KL of one checkpoint interval
        drift[run.name] = (samples, windows, rows[-1][3])
    names = list(drift)
    print("\ndrift per checkpoint interval and in all, mean per token over turns (95% bootstrap over turns)")
    for name in names:
        _, windows, total = drift[name]
        print(f"  {name:<32} KL(prev||this) {fmt_interval(*bootstrap_mean(windows), sci=True)}"
              f"   KL(start||last) {fmt_interval(*bootstrap_mean(total), sci=True)}")  # fmt: skip
    base = names[0]
    for name in names[1:]:
        if drift[name][0] != drift[base][0]:
            print(f"  {name} - {base}: not paired (tokenized differently: another warm start)")
            continue
        for label, i in (("KL(prev||this)", 1), ("KL(start||last)", 2)):
            diff = fmt_interval(*bootstrap_diff(drift[base][i], drift[name][i]), signed=True, sci=True)  # paired
            print(f"  {name} - {base}, {label}: {diff} ({drift[name][i].mean() / drift[base][i].mean():.1f}x)")


if __name__ == "__main__":
    main()
