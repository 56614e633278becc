"""A few RL iterations on one GPU: rollout and update throughput, peak memory, MFU.

    PYTHONPATH=src python benchmarks/bench_gpu_train.py [--steps 3] [key=value ...]

Defaults: a random-init model with Qwen2.5-1.5B's sizes (`model.name=random-qwen2.5-1.5b`,
nothing downloads), bf16, LoRA on every linear layer, gradient checkpointing,
`reward.mode=rspo` with GRPO on generated WebShop (target and explorer both sample and
train). A random model never emits eos, so every response runs to `max_new_tokens`.
Each iteration prints:
  rollout tok/s   generated tokens / time in generate (incl. the behavior log-prob pass)
  update tok/s    tokens through differentiated forwards (prompt + response, both
                  learners) / update time
  peak GiB        torch.cuda.max_memory_allocated over the iteration
  MFU             update FLOPs / update time / --peak-tflops, counting 6 N FLOPs per token
                  (N = non-embedding parameters): forward 2N + input-gradient backward 2N
                  + checkpointing's recomputed forward 2N (a frozen base computes no weight
                  gradients, so this is LoRA's count too; attention's L^2 term is left out)
Iterations alternate between one generate per policy and one mixed-adapter generate for
both (`rollout.mixed_adapters`), starting per-policy; with >= 3 iterations the ratio of
their rollout tok/s is printed (iteration 1, the warm-up, left out).
Exits non-zero on any error or non-finite metric. `--quick` runs one iteration, and on a
machine without CUDA swaps in the tiny model (`QUICK_CPU`), so `make bench` stays quick.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from rspo.config import load_config
from rspo.memory import GIB, estimate_for
from rspo.train import rl_step, setup

DEFAULTS = [
    "model.name=random-qwen2.5-1.5b",
    "model.dtype=bfloat16",
    "model.gradient_checkpointing=true",
    "model.lora.target_modules=[all-linear]",
    "model.lora.r=16",
    "model.lora.alpha=32",
    "env.name=webshop",
    "env.num_workers=4",
    "env.webshop.num_products=1000",
    "env.webshop.num_goals=200",
    "env.webshop.num_test_goals=50",
    "reward.mode=rspo",
    "algo.name=grpo",
    "rspo.explorer_rollouts=4",
    "rspo.buffer_successes_only=false",
    "rollout.num_tasks=4",
    "rollout.group_size=4",
    "rollout.max_turns=3",
    "rollout.max_new_tokens=48",
    "rollout.max_prompt_tokens=1024",
    "rollout.micro_batch=32",
    "train.micro_batch=8",
    "train.lr=1e-5",
    "train.output_dir=runs/bench_gpu_train",
    "sft.episodes=0",
    "log.progress=false",
    "log.tensorboard=false",
    "log.sample_every=0",
]

QUICK_CPU = [
    "model.name=tiny",
    "model.dtype=float32",
    "env.num_workers=0",
    "rollout.num_tasks=2",
    "rollout.group_size=2",
    "rspo.explorer_rollouts=2",
    "rollout.max_new_tokens=16",
    "rollout.max_prompt_tokens=256",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="RL iterations")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak (H100/H200 SXM datasheet)")
    parser.add_argument("--quick", action="store_true", help="one iteration; the tiny model without CUDA")
    parser.add_argument("overrides", nargs="*", help="config key=value, after the defaults above")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    quick = QUICK_CPU if args.quick and not cuda else []
    steps = 1 if args.quick else args.steps
    cfg = load_config(None, [*DEFAULTS, *quick, *args.overrides])
    t0 = time.perf_counter()
    run = setup(cfg)  # prints the memory estimate
    estimate = estimate_for(cfg, run.policy)
    base = run.policy.model_config
    n_params = sum(p.numel() for p in run.policy.parameters())
    n_embed = base.vocab_size * base.hidden_size * (1 if base.tie_word_embeddings else 2)
    n_flop = n_params - n_embed - sum(p.numel() for p in run.policy.trainable_parameters())  # adapters: negligible
    device = torch.cuda.get_device_name() if cuda else "CPU"
    setup_s = time.perf_counter() - t0
    print(f"{cfg.model.name} on {device}: {n_flop / 1e9:.2f}B non-embedding parameters; setup {setup_s:.0f} s")
    tokens = {"update": 0}

    def count(module, args, kwargs):  # PolicyNet.forward(input_ids, attention_mask, ...)
        if torch.is_grad_enabled():
            tokens["update"] += int((kwargs["attention_mask"] if "attention_mask" in kwargs else args[1]).sum())

    nets = {id(n): n for n in run.policy.raw_nets.values()}.values()
    hooks = [net.register_forward_pre_hook(count, with_kwargs=True) for net in nets]
    rollout_tps = {}  # mixed_adapters -> rollout tok/s of its latest iteration after the first (warm-up)
    try:
        for i in range(steps):
            # per-policy generate passes, then mixed-adapter ones, alternately (LoRA, several policies)
            cfg.rollout.mixed_adapters = cfg.model.lora.enabled and cfg.reward.mode == "rspo" and i % 2 == 1
            tokens["update"] = 0
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            m = rl_step(run)
            run.step += 1
            bad = [k for k, v in m.items() if not math.isfinite(v)]
            if bad:
                raise SystemExit(f"FAILED: non-finite metrics at step {run.step}: {bad}")
            t_update = m["perf/time_update_s"]
            update_tps = tokens["update"] / max(t_update, 1e-9)
            mfu = 6 * n_flop * update_tps / (args.peak_tflops * 1e12)
            peak = torch.cuda.max_memory_allocated() / GIB if cuda else float("nan")
            print(
                f"step {run.step}: rollout {m['perf/tokens_per_s']:8.0f} tok/s   update {update_tps:8.0f} tok/s "
                f"({tokens['update']} tokens in {t_update:.1f} s)   peak {peak:6.2f} GiB   MFU {mfu:6.1%}   "
                f"step {m['perf/step_s']:.1f} s (generate {m['perf/time_generate_s']:.1f} s"
                f"{', mixed adapters' if cfg.rollout.mixed_adapters else ''})"
            )
            if i > 0:
                rollout_tps[cfg.rollout.mixed_adapters] = m["perf/tokens_per_s"]
        if len(rollout_tps) == 2:
            print(f"rollout tok/s, mixed-adapter / per-policy generate: x{rollout_tps[True] / rollout_tps[False]:.2f}")
        print(f"estimated peak {estimate.total / GIB:.2f} GiB ({estimate.report()})")
    finally:
        for h in hooks:
            h.remove()
        run.pool.close()
        run.logger.close()
    print(f"bench_gpu_train: OK, {steps} iterations of reward.mode={cfg.reward.mode}")


if __name__ == "__main__":
    sys.exit(main())
