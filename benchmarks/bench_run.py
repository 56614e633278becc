"""Where a whole training run's time goes, phase by phase, beside what the arithmetic needs.

    .venv/bin/python benchmarks/bench_run.py                 # the sparse regime: warm start, then 2 arms
    .venv/bin/python benchmarks/bench_run.py --quick         # a 1-minute check of the same path
    .venv/bin/python benchmarks/bench_run.py --json out.json # also keep the raw numbers
    .venv/bin/python benchmarks/bench_run.py --compare before.json after.json  # phase by phase

The run is the sparse regime's (configs/experiments/sparse.yaml: configs/default.yaml with
`sft.episodes=300`) at `train.steps=10 eval.every=10`: one SFT warm start, then two arms
trained from it as a sweep does, the outcome arm and the RSPO arm (`reward.mode=rspo`),
each with its evals at iterations 0 and 10 and its checkpoint at 10. Everything runs in
this process through `rspo.sft.run_sft` and `rspo.train.train`, with torch's default
thread count and the config's 2 env worker processes, as `rspo train` would.

Phases. The benchmark wraps the functions below (nothing in `rspo` knows it is timed) and
charges each call's *exclusive* time (its own, minus the wrapped calls inside it) to a
phase, so the phases add up to the run's wall time:
  warm start          `run_sft`: expert demonstrations (`collect_demos`) and SFT training
  setup               `train.setup` (model, adapters, env workers) and the rest of `train`
  generate            `Policy.generate` (HF `generate` on the LoRA model)
  behaviour log-probs `Policy.logprobs` without grad (`rollout.behavior_logprobs=forward`)
  env reset / step    `EnvPool.reset` / `EnvPool.step` (the 2 worker processes)
  rollout other       the rest of `rollout.collect`: prompts, decoding, the batch
  rewards/advantages  the rest of `rl_step` (reward modes, the swap, replay, metrics) and
                      the estimators (`update.learner_advantages`)
  update forward      `Policy.logprobs` / `Policy.values` with grad
  update backward     `Accelerator.backward`
  update optimizer    `update.optimizer_step` (clip, AdamW)
  update other        the rest of `update.update_learner` (minibatches, slicing)
  eval                `train.run_eval`, split the same way (eval generate, eval env, ...)
  checkpoint          `train.save`
The first iteration's and the evals' calls are all counted: this is a whole run.

Lower bound. The same tokens through the same model in plain batched passes: a forward
(no grad) of 64 unpadded rows of the run's mean length, and a forward + backward into the
LoRA weights, give tokens/s on this machine; a phase's bound is its token count (prompt and
response tokens of every row it ran, padding excluded) divided by that rate. A generate
processes each token once with its KV cache, so one forward over prompt + response is what
its arithmetic needs. "x bound" is the phase's seconds over its bound. Env, rewards and
checkpoint phases do no model arithmetic: no bound.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import accelerate
import torch
from common import default_model_config

import rspo.eval
import rspo.policy
import rspo.rollout
import rspo.sft
import rspo.train
import rspo.update
from rspo.envs.pool import EnvPool

SPARSE = ["sft.episodes=300", "train.steps=10", "eval.every=10", "log.progress=false"]
QUICK = [  # the same path at a size that takes about a minute
    "sft.episodes=16",
    "sft.epochs=1",
    "train.steps=2",
    "eval.every=2",
    "eval.num_tasks=4",
    "rollout.num_tasks=2",
    "rollout.group_size=4",
    "rspo.explorer_rollouts=2",
    "env.alfworld.max_steps=5",
    "log.progress=false",
]
ARMS = {"outcome": ["reward.mode=outcome"], "rspo": ["reward.mode=rspo"]}
_WRAPPED: list[tuple[object, str, object]] = []  # (owner, attribute, original), to undo


class Profile:
    """Exclusive seconds and model tokens per phase; `context` prefixes phases ("eval: ")."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.tokens: dict[str, int] = defaultdict(int)
        self.rows: dict[str, int] = defaultdict(int)
        self.context = ""
        self._stack: list[list[float]] = []  # [start, seconds of wrapped calls inside]

    def phase(self, name: str) -> str:
        return self.context + name

    @contextlib.contextmanager
    def timed(self, name: str):
        """Charge the block's exclusive time to phase `name` (resolved when it ends)."""
        frame = [time.perf_counter(), 0.0]
        self._stack.append(frame)
        try:
            yield
        finally:
            self._stack.pop()
            elapsed = time.perf_counter() - frame[0]
            self.seconds[self.phase(name)] += elapsed - frame[1]
            if self._stack:
                self._stack[-1][1] += elapsed

    def count(self, name: str, tokens: int, rows: int) -> None:
        self.tokens[self.phase(name)] += tokens
        self.rows[self.phase(name)] += rows


def wrap(owner, attr: str, profile: Profile, name, on_call=None, context: str | None = None) -> None:
    """Replace `owner.attr` by a timed version charging phase `name` (a str, or a function of
    the call's args returning one); `on_call(result, *args, **kwargs)` may count tokens;
    `context` sets the phase prefix of every call inside."""
    inner = getattr(owner, attr)
    _WRAPPED.append((owner, attr, inner))

    @functools.wraps(inner)
    def timed(*args, **kwargs):
        label = name(*args, **kwargs) if callable(name) else name
        previous = profile.context
        if context is not None:
            profile.context = context
        try:
            with profile.timed(label):
                result = inner(*args, **kwargs)
            if on_call is not None:
                on_call(label, result, *args, **kwargs)
            return result
        finally:
            profile.context = previous

    setattr(owner, attr, timed)


def _unwrap_all() -> None:
    while _WRAPPED:
        owner, attr, original = _WRAPPED.pop()
        setattr(owner, attr, original)


def instrument(profile: Profile, captured: dict) -> None:
    """Wrap every function the phases are read from (module docstring)."""

    def count_generate(label, out, policy, input_ids, attention_mask, *args, **kwargs):
        new = out.sequences[:, input_ids.shape[1] :]
        real_new = int((new != policy.tokenizer.pad_token_id).sum())
        profile.count(label, int(attention_mask.sum()) + real_new, len(input_ids))

    def count_forward(label, out, policy, input_ids, attention_mask, *args, **kwargs):
        profile.count(label, int(attention_mask.sum()), len(input_ids))

    def logprobs_phase(*args, **kwargs):
        return "update forward" if torch.is_grad_enabled() else "behaviour log-probs"

    def capture_run(label, run, *args, **kwargs):
        captured["run"] = run

    wrap(rspo.sft, "collect_demos", profile, "warm start: demonstrations")
    wrap(rspo.sft, "run_sft", profile, "warm start: training")
    wrap(rspo.train, "setup", profile, "setup", on_call=capture_run)
    wrap(rspo.train, "train", profile, "setup")  # what train() does around the phases below
    wrap(rspo.train, "rl_step", profile, "rewards/advantages", context="")
    wrap(rspo.train, "run_eval", profile, "eval other", context="eval: ")
    wrap(rspo.train, "save", profile, "checkpoint")
    wrap(rspo.policy.Policy, "generate", profile, "generate", on_call=count_generate)
    wrap(rspo.policy.Policy, "logprobs", profile, logprobs_phase, on_call=count_forward)
    wrap(rspo.policy.Policy, "values", profile, "update forward", on_call=count_forward)
    wrap(EnvPool, "reset", profile, "env reset")
    wrap(EnvPool, "step", profile, "env step")
    for module in (rspo.train, rspo.eval):  # each calls collect by the name it imported
        wrap(module, "collect", profile, "rollout other")
    wrap(rspo.train, "update_learner", profile, "update other")
    wrap(rspo.train, "learner_advantages", profile, "rewards/advantages")  # rl_step calls it
    wrap(rspo.update, "optimizer_step", profile, "update optimizer")
    wrap(accelerate.Accelerator, "backward", profile, "update backward")


def throughput(policy, length: int, response: int, rows: int = 64, repeats: int = 3) -> dict[str, float]:
    """Tokens/s of one plain batched forward (no grad) and forward + backward (LoRA grads)
    of the target policy over `rows` unpadded rows of `length` tokens, logits at the last
    `response` + 1 positions (as `Policy.logprobs` computes them). Best of `repeats`."""
    g = torch.Generator().manual_seed(0)
    vocab = policy.model_config.vocab_size
    ids = torch.randint(3, vocab, (rows, length), generator=g).to(policy.device)
    mask = torch.ones_like(ids)
    net = policy.nets["target"]

    def forward_backward():
        with policy.use("target"):
            logits = net(ids, mask, logits_to_keep=response + 1)
        logits.float().logsumexp(-1).mean().backward()
        for p in policy.parameters_of("target"):
            p.grad = None

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    with torch.no_grad(), policy.use("target"):
        forward = best(lambda: net.eval()(ids, mask, logits_to_keep=response + 1))
    backward = best(forward_backward)
    return {"forward": rows * length / forward, "forward_backward": rows * length / backward}


def time_arm(cfg_overrides: list[str], profile: Profile, captured: dict) -> float:
    cfg = default_model_config(*cfg_overrides)
    t0 = time.perf_counter()
    rspo.train.train(cfg)
    return time.perf_counter() - t0


def bounds(profile: Profile, rates: dict[str, float]) -> dict[str, float]:
    """Seconds the arithmetic of each model phase needs at the measured rates."""
    out = {}
    for phase, tokens in profile.tokens.items():
        backward = phase.endswith("update forward")
        out[phase] = tokens / rates["forward_backward" if backward else "forward"]
    return out


def table(profile: Profile, total: float, lower: dict[str, float]) -> str:
    phases = sorted(profile.seconds, key=lambda p: -profile.seconds[p])
    lines = ["| phase | s | share | tokens | bound s | x bound |", "|---|---:|---:|---:|---:|---:|"]
    for p in phases:
        s = profile.seconds[p]
        b = lower.get(p)
        # the update's forward bound covers its backward too: shown on the forward's row, against both
        if p.endswith("update forward"):
            s_model = s + profile.seconds.get(p.replace("forward", "backward"), 0.0)
            ratio = f"{s_model / b:.1f} (fwd+bwd)"
        else:
            ratio = f"{s / b:.1f}" if b else ""
        tok = f"{profile.tokens[p]:,}" if p in profile.tokens else ""
        lines.append(f"| {p} | {s:.1f} | {s / total:.1%} | {tok} | {f'{b:.1f}' if b else ''} | {ratio} |")
    rest = total - sum(profile.seconds.values())
    lines.append(f"| (unaccounted) | {rest:.1f} | {rest / total:.1%} | | | |")
    lines.append(f"| **total** | **{total:.1f}** | 100% | | **{sum(lower.values()):.1f}** | |")
    return "\n".join(lines)


def compare(before: dict, after: dict) -> str:
    """Each arm's phases, seconds and share before and after, and before / after (two --json files)."""
    lines = []
    for arm in after["arms"].keys() & before["arms"].keys():
        b, a = before["arms"][arm], after["arms"][arm]
        lines += [f"## {arm} arm: {before['commit']} -> {after['commit']}\n"]
        lines += ["| phase | before s | share | after s | share | before / after |", "|---|---:|---:|---:|---:|---:|"]
        phases = sorted(b["seconds"].keys() | a["seconds"].keys(), key=lambda p: -b["seconds"].get(p, 0.0))
        for p in [*phases, "total"]:
            sb = b["total"] if p == "total" else b["seconds"].get(p, 0.0)
            sa = a["total"] if p == "total" else a["seconds"].get(p, 0.0)
            ratio = f"{sb / sa:.1f}" if sa >= 0.05 else ("-" if sb < 0.05 else "gone")
            lines.append(f"| {p} | {sb:.1f} | {sb / b['total']:.1%} | {sa:.1f} | {sa / a['total']:.1%} | {ratio} |")
        lines.append("")
    return "\n".join(lines)


def commit() -> str:
    """The commit of the rspo source that runs (PYTHONPATH may point at another checkout)."""
    src = Path(rspo.train.__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=src, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=src, capture_output=True, text=True)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run of the same path (about a minute)")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated: outcome, rspo ('': warm start only)")
    parser.add_argument("--warm-start", default="", help="reuse this warm start (a model dir) instead of building one")
    parser.add_argument("--json", default="", help="write the raw numbers here")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="print two --json files side by side")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every arm")
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(Path(f).read_text()) for f in args.compare)
        print(compare(before, after))
        return
    base = (QUICK if args.quick else SPARSE) + ["log.tensorboard=false"] + args.overrides
    print(f"commit {commit()}, torch {torch.__version__}, threads {torch.get_num_threads()}, cpus {os.cpu_count()}")
    print(f"{platform.processor() or platform.machine()}; load before {tuple(round(x, 2) for x in os.getloadavg())}")
    print(f"overrides: {' '.join(base)}\n")
    results = {"commit": commit(), "overrides": base, "arms": {}}
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(args.warm_start) if args.warm_start else Path(tmp) / "warm" / "sft"
        if not args.warm_start:
            profile, captured = Profile(), {}
            instrument(profile, captured)
            t0 = time.perf_counter()
            rspo.sft.run_sft(default_model_config(*base, f"train.output_dir={warm.parent}"), warm, progress=False)
            total = time.perf_counter() - t0
            print(f"## warm start: {total:.1f} s\n\n{table(profile, total, {})}\n", flush=True)
            results["warm_start"] = {"total": total, "seconds": dict(profile.seconds)}
            _unwrap_all()
        for arm in [a for a in args.arms.split(",") if a]:
            profile, captured = Profile(), {}
            instrument(profile, captured)
            overrides = [*base, *ARMS[arm], f"model.init_from={warm}", f"train.output_dir={tmp}/{arm}"]
            total = time_arm(overrides, profile, captured)
            policy = captured["run"].policy
            length = max(8, profile.tokens["generate"] // max(profile.rows["generate"], 1))  # prompt + response
            rates = throughput(policy, length, min(24, length - 1))
            lower = bounds(profile, rates)
            print(
                f"## {arm} arm: {total:.1f} s; plain passes at {length} tokens a row: forward "
                f"{rates['forward']:,.0f} tok/s, forward+backward {rates['forward_backward']:,.0f} tok/s\n"
            )
            print(table(profile, total, lower) + "\n", flush=True)
            results["arms"][arm] = {
                "total": total,
                "seconds": dict(profile.seconds),
                "tokens": dict(profile.tokens),
                "rates": rates,
                "bounds": lower,
            }
            _unwrap_all()
    print(f"load after (1/5/15 min): {tuple(round(x, 2) for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
