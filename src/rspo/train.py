"""The RL loop: rollout → rewards (and the RSPO swap) → advantages → update → log/eval/save.

Learners. Every reward mode trains the *target* policy; `reward.mode=rspo` adds the
*explorer*, a second policy (a second LoRA adapter on the same frozen base, or a second
model copy) trained on process rewards, whose trajectories — rewards swapped back to the
outcome — also feed the target's update. Each learner has its own optimizer and, when
the algorithm needs a critic (PPO), its own critic. The loop never branches on the
algorithm's name (estimators share one signature, `rspo.algorithms`) nor on the reward
mode (modes answer the same calls, `rspo.rewards.modes`).
"""

from __future__ import annotations

import dataclasses
import functools
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, DistributedType, gather_object, set_seed

from rspo import checkpoint
from rspo.algorithms import ALGORITHMS, turns_from_batch
from rspo.batch import EXPERT, EXPLORER, TARGET
from rspo.config import Config, ConfigError, dump
from rspo.envs.pool import EnvPool
from rspo.eval import eval_pool_size, evaluate_tasks, metrics_of, paired_differences, summary_table
from rspo.log import TRACE, Logger, RunProgress, format_transcript, write_json
from rspo.memory import estimate_for
from rspo.multinode import checked_everywhere, main_decides, share_dir
from rspo.policy_io import build_policy, load_policy, save_policy, state_dicts
from rspo.rewards.modes import MODES, RewardMode
from rspo.rewards.signal import signal_metrics, trajectories_of
from rspo.rollout import collect
from rspo.sft import model_corpus, run_base, run_sft, warm_start_dir
from rspo.update import Learner, critic_values, learner_advantages, make_learner, update_learner

CONSOLE_KEYS = [
    "rollout/success_rate",
    "rollout/return",
    "rollout/invalid_action_rate",
    "loss/policy",
    "explorer/rollout/success_rate",
    "perf/step_s",
]


@dataclass
class Run:
    """Everything the loop carries between steps."""

    cfg: Config
    acc: Accelerator
    policy: object
    pool: object
    learners: dict[str, Learner]
    mode: RewardMode  # what samples, what each learner trains on, what follows the update
    logger: Logger
    num_train_tasks: int
    max_turns: int
    step: int = 0
    env_steps: int = 0  # environment steps taken in training so far (every policy, all ranks)
    curve: list = dataclasses.field(default_factory=list)  # {"step", "env_steps", metrics} at each eval
    # the eval before RL: metrics and per-task records (kept for a resumed run)
    before: tuple = dataclasses.field(default_factory=lambda: ({}, []))
    trace: list = dataclasses.field(default_factory=list)  # {"step", "env_steps", TRACE's keys} every iteration


def setup(cfg: Config) -> Run:
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    ddp = DistributedDataParallelKwargs(find_unused_parameters=True)  # only the active adapter gets grads
    acc = Accelerator(kwargs_handlers=[ddp], mixed_precision="bf16" if cfg.model.dtype == "bfloat16" else "no")
    set_seed(cfg.train.seed + acc.process_index)
    if acc.distributed_type == DistributedType.DEEPSPEED:
        raise ConfigError(
            "DeepSpeed is not supported (its engine takes one model with one optimizer; rspo steps one per "
            "policy and critic): shard with configs/accelerate/fsdp.yaml instead, see the README, 'GPU and multi-GPU'"
        )
    shard = cfg.train.fsdp or acc.distributed_type == DistributedType.FSDP
    if shard and not acc.use_distributed:
        raise ConfigError("train.fsdp=true shards over processes: use `accelerate launch --num_processes N`")
    if run_base(cfg) != cfg.model.init_from:  # the run's own warm start (one rule: `sft.run_base`)
        cfg.model.init_from = str(warm_start(cfg, acc))
    mode = MODES[cfg.reward.mode](cfg)
    pool = EnvPool(cfg.env, max(cfg.rollout.num_tasks * mode.rollouts_per_task, eval_pool_size(cfg)))
    policy = build_policy(
        cfg.model,
        model_corpus(cfg, pool),
        adapters=list(mode.learners),
        critic=ALGORITHMS[cfg.algo.name].needs_critic,
        reference=cfg.algo.kl_coef > 0,
        device=acc.device,
    )
    acc.print(estimate_for(cfg, policy, shards=acc.num_processes if shard else 1).report())
    if shard:
        policy.shard()  # rspo's own FSDP2, not accelerate's: see rspo.sharding
    else:
        policy.wrap(acc.prepare)
    learners = {name: make_learner(acc, policy, cfg, name, lr) for name, lr in mode.learners.items()}
    out = Path(cfg.train.output_dir)
    logger = Logger(out / "tb", enabled=acc.is_main_process, tensorboard=cfg.log.tensorboard)
    max_turns = cfg.rollout.max_turns or pool.max_steps
    return Run(cfg, acc, policy, pool, learners, mode, logger, pool.num_tasks("train"), max_turns)


def warm_start(cfg: Config, acc: Accelerator) -> Path:
    """Run the SFT warm start once (global main process) and reuse it on later runs; sent
    to the machines that lack it (`rspo.multinode`)."""
    out = warm_start_dir(cfg)
    if acc.is_main_process and not (out / "config.json").is_file():
        run_sft(cfg, out, progress=cfg.log.progress)
    share_dir(acc, out)  # every rank waits here for the main
    return out


def train_task_draws(seed: int, step: int, num_tasks: int, num_train_tasks: int) -> list[int]:
    """The train-split task indices every rank together plays at `step`: `num_tasks` draws
    with replacement, deterministic in (seed, step)."""
    rng = random.Random(seed * 1_000_003 + step)
    return [rng.randrange(num_train_tasks) for _ in range(num_tasks)]


def sample_tasks(run: Run) -> list[tuple[str, int]]:
    """This rank's B train tasks for this step: deterministic in (seed, step, rank)."""
    cfg, world = run.cfg, run.acc.num_processes
    draws = train_task_draws(cfg.train.seed, run.step, cfg.rollout.num_tasks * world, run.num_train_tasks)
    return [("train", index) for index in draws[run.acc.process_index :: world]]


def rl_step(run: Run) -> dict[str, float]:
    """One iteration, in order: who samples (the reward mode's plans), the rollout, each
    learner's rows and rewards (the reward mode's: RSPO's swap), the base algorithm's
    advantages over them, the learner's update, what follows (RSPO: the buffer, the sync).
    Returns its metrics. It never branches on the algorithm or the reward mode."""
    cfg, mode, policy, t0 = run.cfg, run.mode, run.policy, time.perf_counter()
    tasks = sample_tasks(run)
    with policy.gathered():  # FSDP: each rank runs its own number of generate calls
        plans = mode.plans(run.step)  # which policies sample, how many trajectories a task
        ro = collect(policy, run.pool, cfg.env.name, tasks, plans, cfg.rollout, temperature=cfg.rollout.temperature,
                     max_turns=run.max_turns, progress=cfg.log.progress)  # fmt: skip
    batch = mode.complete(ro.batch, tasks, run.step, policy.tokenizer.pad_token_id)  # RSPO: + replayed rows
    metrics = rollout_metrics(ro) | count_env_steps(run, ro) | signal_metrics(*trajectories_of(batch))
    t_update = time.perf_counter()
    for name, data in mode.learner_data(batch, run.step).items():  # the learners that train, in order
        learner, (view, reward, offpolicy) = run.learners[name], data.of(batch)
        values = critic_values(policy, learner.critic, view, cfg.train.micro_batch)  # PPO's critic, else None
        adv, returns = learner_advantages(turns_from_batch(view, reward, values), cfg.algo)  # ALGORITHMS[algo.name]
        m = update_learner(run.acc, policy, learner, view, reward, adv, returns, values, offpolicy, cfg)
        metrics |= {learner.prefix + k: v for k, v in m.items()}
    mode.after_update(policy, batch, ro.trajectories, run.step)  # RSPO: store the explorer's trajectories, sync
    metrics |= perf_metrics(ro.timing, t_update - t0, time.perf_counter() - t_update)
    if cfg.log.sample_every and run.step % cfg.log.sample_every == 0 and ro.trajectories:
        run.logger.text("samples/trajectory", format_transcript(ro.trajectories[0]), run.step)
    return metrics


def count_env_steps(run: Run, ro) -> dict[str, float]:
    """Add this iteration's env steps (every rank's) to the run's; the total and the env faults."""
    faults = sum(bool(t.fault) for t in ro.trajectories)  # trajectories whose env failed (ended as failed)
    counts = gather_object([(int(ro.timing["env_steps"]), faults)])  # every rank's (env steps, faults)
    run.env_steps += sum(steps for steps, _ in counts)
    return {"rollout/env_steps_total": float(run.env_steps), "rollout/env_faults": float(sum(f for _, f in counts))}


def perf_metrics(timing: dict[str, float], before_update: float, update: float) -> dict[str, float]:
    """Seconds per phase and throughput, from the rollout's `timing` and the update's seconds."""
    return {
        "perf/time_generate_s": timing["generate"],
        "perf/time_env_s": timing["env"] + timing["reset"],
        "perf/time_update_s": update,
        "perf/tokens_per_s": timing["tokens"] / max(timing["generate"], 1e-9),
        "perf/env_steps_per_s": timing["env_steps"] / max(timing["env"], 1e-9),
        "perf/step_s": before_update + update,
    }


def rollout_metrics(ro) -> dict[str, float]:
    """`rollout/…` for the target's trajectories, `explorer/rollout/…` for the explorer's,
    `expert/rollout/…` for the expert's (RSPO's ceiling)."""
    out = {}
    for prefix, source in (("rollout/", TARGET), ("explorer/rollout/", EXPLORER), ("expert/rollout/", EXPERT)):
        trajs = [t for t in ro.trajectories if t.source == source]
        if not trajs:
            continue
        n, turns = len(trajs), sum(t.turns for t in trajs)
        out |= {
            prefix + "success_rate": sum(t.won for t in trajs) / n,
            prefix + "score": sum(t.score for t in trajs) / n,
            prefix + "return": sum(t.outcome for t in trajs) / n,
            prefix + "process_return": sum(t.process for t in trajs) / n,
            prefix + "process_positive": sum(t.process > 0 for t in trajs) / n,
            prefix + "turns": turns / n,
            prefix + "invalid_action_rate": sum(t.invalid for t in trajs) / max(turns, 1),
            prefix + "noop_rate": sum(t.noop for t in trajs) / max(turns, 1),
        }
    return out


def pick(metrics: dict[str, float], keys) -> dict[str, float]:
    return {k: metrics[k] for k in keys if k in metrics}


def save(run: Run) -> None:
    weights = state_dicts(run.policy)  # FSDP: gathered onto the main rank (all ranks take part)
    state = {name: l.state_dict() for name, l in run.learners.items()}
    state["rank_buffer"] = gather_object([run.mode.state_dict()])  # each rank's (RSPO: its replay buffer)
    state["rank_rng"] = gather_object([checkpoint.rng_state()])  # each rank samples its own stream
    state["env_steps"], state["curve"], state["before"] = run.env_steps, run.curve, run.before
    state["trace"] = run.trace
    if run.acc.is_main_process:
        write_policy = functools.partial(save_policy, run.policy, state=weights)
        checkpoint.save(run.cfg.train.output_dir, run.step, write_policy, state, dump(run.cfg))
    run.acc.wait_for_everyone()


def resume(run: Run) -> None:
    """Load the checkpoint `train.resume` names, as the global main process resolves it
    (`auto`: the latest on its disk), sent to the machines that lack it (`rspo.multinode`)."""
    path = main_decides(run.acc, lambda: checkpoint.resolve(run.cfg.train.resume, run.cfg.train.output_dir))
    if path is None:
        return
    share_dir(run.acc, path)
    state = checkpoint.load_trainer_state(path)
    load_policy(run.policy, path / "policy")
    for name, learner in run.learners.items():
        learner.load_state_dict(state[name])
    run.mode.load_state_dict(state.get("rank_buffer") or [], run.acc.process_index, run.acc.num_processes)
    per_rank = state.get("rank_rng") or []
    same_world = len(per_rank) == run.acc.num_processes
    checkpoint.set_rng_state(per_rank[run.acc.process_index] if same_world else state["rng"])
    run.step, run.env_steps = state["step"], state.get("env_steps", 0)
    run.curve, run.before = state.get("curve", []), state.get("before", ({}, []))
    run.trace = state.get("trace", [])
    if run.acc.is_main_process:
        print(f"resumed from {path} at step {run.step}")


def run_eval(run: Run) -> tuple[dict[str, float], list[dict]]:
    """Evaluate the target (and the explorer when `eval.explorer`); log under `eval/…` and
    add a point to the run's eval curve. Returns the metrics and the target's per-task records."""
    prefixes = {"target": "eval/", "explorer": "eval_explorer/"}
    adapters = {n: prefixes[n] for n in run.learners if n == "target" or run.cfg.eval.explorer}
    results: dict[str, float] = {}
    records = {}
    for adapter, prefix in adapters.items():
        rank, world = run.acc.process_index, run.acc.num_processes
        with run.policy.gathered():
            records[adapter] = evaluate_tasks(
                run.policy, run.pool, run.cfg, adapter=adapter, rank=rank, world=world, gather=gather_object
            )
        results |= metrics_of(records[adapter], prefix)
    run.logger.scalars(results, run.step)
    run.curve.append({"step": run.step, "env_steps": run.env_steps, **results, "tasks": compact(records["target"])})
    return results, records["target"]


def compact(records: list[dict]) -> list[dict]:
    """The per-task fields a run keeps of an eval (`rspo.results` reads them)."""
    return [{k: r[k] for k in ("split", "task_index", "task_type", "won", "score")} for r in records]


def eval_final_at(run: Run, temperature: float) -> dict:
    """The target's eval of the final weights at another sampling temperature (logged
    under `eval_T{temperature}/`): {"metrics", "tasks"}."""
    cfg = dataclasses.replace(run.cfg, eval=dataclasses.replace(run.cfg.eval, temperature=temperature))
    rank, world = run.acc.process_index, run.acc.num_processes
    with run.policy.gathered():
        records = evaluate_tasks(run.policy, run.pool, cfg, rank=rank, world=world, gather=gather_object)
    metrics = metrics_of(records, f"eval_T{temperature:g}/")
    run.logger.scalars(metrics, run.step)
    return {"metrics": metrics, "tasks": compact(records)}


def train(cfg: Config) -> dict:
    """Train with RL. Returns {"before": eval, "after": eval, "history": per-step metrics}."""

    def start_checks() -> None:  # before anything is built, on every machine's disk
        checkpoint.check_output_dir(cfg.train.output_dir, cfg.train.resume)
        checkpoint.check_resume(cfg)

    checked_everywhere(start_checks)
    run = setup(cfg)
    try:
        resume(run)
        bar = RunProgress(
            cfg.train.steps, run.step, len(run.curve), cfg.eval.every, cfg.log.progress and run.acc.is_main_process
        )
        if run.step == 0:
            run.before = run_eval(run)
        history = []
        while run.step < cfg.train.steps:
            bar.update(run.step, len(run.curve))  # run.curve: a point per eval
            metrics = rl_step(run)  # NaN/inf updates are skipped, too many in a row raise (rspo.update)
            history.append(metrics)
            run.trace.append({"step": run.step, "env_steps": run.env_steps} | pick(metrics, TRACE))
            run.logger.scalars(metrics, run.step)
            run.logger.console(run.step + 1, cfg.train.steps, metrics, CONSOLE_KEYS)
            run.step += 1
            if cfg.eval.every and run.step % cfg.eval.every == 0 and run.step < cfg.train.steps:
                run_eval(run)
            if cfg.train.save_every and run.step % cfg.train.save_every == 0:
                save(run)
        after, after_tasks = run_eval(run)
        final_at = {f"{t:g}": eval_final_at(run, t) for t in cfg.eval.final_temperatures}
        bar.close()
        if not (cfg.train.save_every and run.step % cfg.train.save_every == 0):  # not saved just above
            save(run)
        before, before_tasks = run.before
        if run.acc.is_main_process:
            diffs = paired_differences(before_tasks, after_tasks)
            summary = {"before": before, "after": after, "difference": diffs, "env_steps": run.env_steps,
                       "curve": run.curve, "before_tasks": before_tasks, "after_tasks": after_tasks,
                       "trace": run.trace} | ({"final_at": final_at} if final_at else {})  # fmt: skip
            write_json(Path(cfg.train.output_dir) / "eval_summary.json", summary)
            print(summary_table(before, after, cfg, diffs))
            print(
                f"TensorBoard logs: {Path(cfg.train.output_dir) / 'tb'}  (tensorboard --logdir {cfg.train.output_dir})"
            )
        return {"before": before, "after": after, "history": history}
    finally:
        run.logger.close()
        run.pool.close()
