"""Warm start (`rspo sft`): supervised fine-tuning on the environments' expert demonstrations.

The expert (ALFWorld's planner, WebShop's rule-based shopper) plays train tasks; each of
its turns becomes one sample rendered with the same prompt template as RL, with the
answer `<action>…</action>`. The loss is the token-mean cross-entropy on response tokens
only. A randomly initialised tiny model cannot act at all; after the warm start it acts
with an imperfect, non-zero success rate — the setting where RL has something to learn.
The result is a full Hugging Face model directory (LoRA adapters merged), which
`model.init_from` points RL at.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from rspo.config import Config
from rspo.envs.pool import EnvPool
from rspo.policy_io import build_policy, merged_target
from rspo.prompts import Turn, add_history, format_response, render_prompt, user_message


def expert_demos(
    pool, num_tasks: int, episodes: int, max_turns: int, history_length: int, seed: int
) -> list[tuple[Turn, str]]:
    """(turn, expert action) pairs from `episodes` expert episodes on train tasks, episode by
    episode: the same list whatever the pool's size (it plays `pool.num_envs` at a time)."""
    rng = random.Random(seed)
    tasks = [("train", rng.randrange(num_tasks)) for _ in range(episodes)]
    by_episode: list[list[tuple[Turn, str]]] = [[] for _ in tasks]
    for start in range(0, episodes, pool.num_envs):
        chunk = tasks[start : start + pool.num_envs]
        states = pool.reset(chunk + [None] * (pool.num_envs - len(chunk)))[: len(chunk)]
        history: list[list[tuple[str, str]]] = [[] for _ in chunk]
        active = [True] * len(chunk)
        for _ in range(max_turns):
            if not any(active):
                break
            experts = pool.expert_actions(active + [False] * (pool.num_envs - len(chunk)))
            actions: list[str | None] = [None] * pool.num_envs
            for i, s in enumerate(states):
                if active[i]:
                    actions[i] = experts[i]
                    turn = Turn(s.task, s.observation, s.admissible, list(history[i]))
                    by_episode[start + i].append((turn, experts[i]))
            new = pool.step(actions)
            for i in range(len(chunk)):
                if active[i]:
                    history[i] = add_history(history[i], states[i].observation, actions[i], history_length)
                    states[i] = new[i]
                    active[i] = not new[i].done
    return [demo for episode in by_episode for demo in episode]


def corpus(demos: list[tuple[Turn, str]], env_name: str, require_think: bool) -> list[str]:
    """Text for training the tiny model's tokenizer: the prompts and answers it will see."""
    return [user_message(env_name, t, require_think) + "\n" + format_response(a, require_think) for t, a in demos]


def sft_batches(tokenizer, demos, env_name: str, require_think: bool, max_prompt_tokens: int):
    """Tokenize demonstrations into (prompt ids, response ids) pairs."""
    out = []
    for turn, action in demos:
        prompt = render_prompt(tokenizer, env_name, turn, require_think, max_prompt_tokens)
        response = tokenizer(format_response(action, require_think), add_special_tokens=False)["input_ids"]
        out.append((prompt, response + [tokenizer.convert_tokens_to_ids(tokenizer.eos_token)]))
    return out


def response_logits(net, samples: list[tuple[list[int], list[int]]], pad_id: int, device):
    """The logits at every response position (n, R, V) float32, and the labels (n, R) (-100 on padding).

    The rollout's layout: prompts left-padded to P, responses right-padded to R, so only the
    R response positions' logits are computed (the LM head over every prompt position would
    cost more than the rest of a tiny model with a large vocabulary).
    """
    P = max(len(p) for p, _ in samples)
    R = max(len(r) for _, r in samples)
    ids = torch.full((len(samples), P + R), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full((len(samples), R), -100, dtype=torch.long)  # -100: padding, not trained on
    for i, (p, r) in enumerate(samples):
        ids[i, P - len(p) : P + len(r)] = torch.tensor(p + r)
        attn[i, P - len(p) : P + len(r)] = 1
        labels[i, : len(r)] = torch.tensor(r)
    # positions P-1 .. P+R-2 predict the response tokens at P .. P+R-1
    logits = net(ids.to(device), attn.to(device), logits_to_keep=R + 1)[:, :-1].float()  # (n, R, V)
    return logits, labels.to(device)


def sft_loss(net, samples: list[tuple[list[int], list[int]]], pad_id: int, device) -> tuple[torch.Tensor, int]:
    """Summed cross-entropy over response tokens (`response_logits`' layout), and their count."""
    logits, targets = response_logits(net, samples, pad_id, device)
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100, reduction="sum"
    )
    return loss, int((targets != -100).sum())


def length_grouped_batches(samples: list, batch_size: int, rng: random.Random, pool: int = 16) -> list[list]:
    """Shuffled batches of similar lengths: shuffle, sort each run of `pool` batches' worth
    of samples by length, cut it into batches, shuffle the batches. Prompts vary 2-3x in
    length, so random batches are padded heavily; this keeps the order random at the
    batch level while padding little."""
    order = samples[:]
    rng.shuffle(order)
    batches = []
    for start in range(0, len(order), batch_size * pool):
        chunk = sorted(order[start : start + batch_size * pool], key=lambda s: len(s[0]) + len(s[1]))
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def collect_demos(cfg: Config, pool, episodes: int) -> list[tuple[Turn, str]]:
    max_turns = cfg.rollout.max_turns or pool.max_steps
    return expert_demos(pool, pool.num_tasks("train"), episodes, max_turns, cfg.rollout.history_length, cfg.train.seed)


def demo_corpus(cfg: Config, pool, episodes: int = 32) -> Callable[[], list[str]]:
    """The tiny model's tokenizer corpus when there is no warm start: a few expert episodes."""
    text = corpus(collect_demos(cfg, pool, episodes), cfg.env.name, cfg.rollout.require_think)
    return lambda: text


def model_corpus(cfg: Config, pool) -> Callable[[], list[str]] | None:
    """The corpus `build_policy` needs for `cfg.model`, the same in training and evaluation:
    a tiny model built from scratch (no `model.init_from`) trains its tokenizer on a few
    expert episodes; any other model brings its own tokenizer."""
    return demo_corpus(cfg, pool) if cfg.model.name == "tiny" and not cfg.model.init_from else None


def warm_start_dir(cfg: Config) -> Path:
    """Where a run's SFT warm start lives (a full model, `model.init_from` for RL)."""
    return Path(cfg.train.output_dir) / "sft"


def run_base(cfg: Config) -> str:
    """The `model.init_from` a run trains from, as `train.setup` sets it: the config's own,
    else the run's warm start when it builds one (`sft.episodes` > 0), else "" (`model.name`)."""
    return cfg.model.init_from or (str(warm_start_dir(cfg)) if cfg.sft.episodes > 0 else "")


def lr_factor(schedule: str, step: int, steps: int) -> float:
    """sft.lr's multiplier at optimizer step `step` of `steps`: 1 throughout ("constant"),
    or a half cosine from 1 at the first step to 0 after the last ("cosine")."""
    return 1.0 if schedule == "constant" else 0.5 * (1 + math.cos(math.pi * step / steps))


def run_sft(cfg: Config, out_dir: Path, progress: bool = True) -> Path:
    """Collect demonstrations, build/load the model, fine-tune, save a full model to `out_dir`."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    with EnvPool(cfg.env, min(16, cfg.sft.episodes)) as pool:
        demos = collect_demos(cfg, pool, cfg.sft.episodes)
    text = corpus(demos, cfg.env.name, cfg.rollout.require_think)
    model_cfg = dataclasses.replace(cfg.model, lora=dataclasses.replace(cfg.model.lora, enabled=cfg.sft.lora))
    policy = build_policy(model_cfg, lambda: text, device="cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = policy.tokenizer
    samples = sft_batches(tokenizer, demos, cfg.env.name, cfg.rollout.require_think, cfg.rollout.max_prompt_tokens)
    params = policy.parameters_of("target")
    opt = torch.optim.AdamW(params, lr=cfg.sft.lr, weight_decay=cfg.train.weight_decay)
    rng = random.Random(cfg.train.seed)
    steps = cfg.sft.epochs * -(-len(samples) // cfg.sft.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(cfg.sft.lr_schedule, s, steps))
    bar = tqdm(total=steps, desc="sft", disable=not progress)
    losses = []
    with policy.use("target"):
        for _ in range(cfg.sft.epochs):
            for batch in length_grouped_batches(samples, cfg.sft.batch_size, rng):
                loss_sum, n = sft_loss(policy.nets["target"], batch, tokenizer.pad_token_id, policy.device)
                (loss_sum / n).backward()
                torch.nn.utils.clip_grad_norm_(params, cfg.train.max_grad_norm)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss_sum.item() / n)
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
                bar.update(1)
    bar.close()
    tmp = out_dir.with_name(f".tmp-{out_dir.name}-{os.getpid()}")  # written whole, then renamed: a killed
    shutil.rmtree(tmp, ignore_errors=True)  # run never leaves a warm start that looks complete
    merged_target(policy).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "sft_summary.txt").write_text(
        f"demonstrations={len(demos)} episodes={cfg.sft.episodes} steps={steps} "
        f"first_loss={losses[0]:.4f} last_loss={losses[-1]:.4f}\n"
    )
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def sft_command(cfg: Config) -> None:
    out = warm_start_dir(cfg)
    run_sft(cfg, out, progress=cfg.log.progress)
    print(f"warm start saved to {out}  (train from it with model.init_from={out})")
