"""Experiment harness (`rspo sweep --config configs/experiments/<name>.yaml`): a grid of
training runs, then one table, learning-curve plots and a JSON of every number (`rspo.results`).

An experiment file names a base run config, a grid of dotted keys, and where things go:

    base: configs/default.yaml                 # any run config (relative to the working dir)
    output_dir: runs/sweeps/small              # one sub-directory per run
    results_dir: benchmarks/results/small      # results.json, results.md, curves_*.png
    parallel: 1                                # runs at a time: 0 = in this process, k = k child processes
    launcher: accelerate launch --multi_gpu -m  # optional: how a child starts `rspo train` (default: python -m)
    env_step_budget: 27000                     # optional: where "equal environment steps" reads every run
    overrides: {train.steps: 40}               # dotted keys applied to every run (optional)
    grid:                                      # every combination is one run
      algo.name: [grpo, gigpo]
      reward.mode: [outcome, process, rspo]
      train.seed: [0, 1, 2]

Arms that differ in more than one key are named under `arms` and listed by the grid's
`arm` key; the reports compare them by that name (the baseline arm is named `outcome`):

    arms:
      outcome: {reward.mode: outcome}
      ceiling: {reward.mode: rspo, rspo.expert_fraction: 0.25}
    grid: {arm: [outcome, ceiling], train.seed: [0, 1]}

Runs that share everything the warm start depends on (model, env, sft, rollout, seed; not what only RL reads)
share one SFT warm start, so the arms of a comparison start from the same weights; each
run records the sha256 of the weights it started from (`warm_start` in results.json), so
runs built in other sessions pair only when their starts are bitwise equal. A run
whose `eval_summary.json` exists is finished and never rerun; an interrupted one resumes
from its latest checkpoint (`train.resume=auto`). A finished run whose recorded config is
not what the grid now asks of it (`config_drift`) is never reported under the grid's name.
`--collect` only rebuilds the results.

What is compared and how: `rspo.results`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from rspo.config import ConfigError, load_config, to_dict
from rspo.log import write_json
from rspo.results import write_results

KEYS = {
    "base",
    "output_dir",
    "results_dir",
    "parallel",
    "launcher",
    "env_step_budget",
    "overrides",
    "arms",
    "grid",
}
WARM_START_SECTIONS = ("model", "env", "sft", "rollout")  # what an SFT warm start depends on (and train.seed)
# settings inside those sections that only change how RL batches its passes, not what SFT
# learns: they stay out of the key, so adding or flipping one keeps existing warm starts
WARM_START_IGNORED = {"rollout": ("mixed_adapters", "merge_adapter")}
# keys added to those sections after warm starts were built, left out of the key while they
# hold the value every earlier warm start had: adding one keeps existing warm starts
WARM_START_ADDED = {("env", "webshop", "expert"): "oracle", ("model", "allow_pickle_adapters"): False}
# RL-only settings that earlier keys hashed, every experiment at this value: hashed at it
# whatever they hold, so a grid over them shares its warm starts and existing keys stay
WARM_START_PINNED = {("rollout", "num_tasks"): 8, ("rollout", "behavior_logprobs"): "forward"}


@dataclasses.dataclass
class Experiment:
    base: str
    output_dir: str
    results_dir: str
    parallel: int = 1
    launcher: str = ""
    env_step_budget: int | None = None  # None: the smallest env-step total of each algorithm's runs
    overrides: dict = dataclasses.field(default_factory=dict)
    arms: dict = dataclasses.field(default_factory=dict)  # name -> {dotted key: value}, for the grid's `arm`
    grid: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RunSpec:
    name: str
    values: dict  # the grid's values for this run
    overrides: list[str]  # every dotted override, in order

    def dir(self, exp: Experiment) -> Path:
        return Path(exp.output_dir) / self.name


def load_experiment(path: str | Path) -> Experiment:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"experiment file {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"experiment file {path}: expected a mapping")
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise ConfigError(f"experiment file {path}: unknown key {unknown[0]} (valid: {', '.join(sorted(KEYS))})")
    missing = sorted({"base", "output_dir", "results_dir", "grid"} - set(data))
    if missing:
        raise ConfigError(f"experiment file {path}: missing key {missing[0]}")
    exp = Experiment(**data)
    if not isinstance(exp.grid, dict) or not all(isinstance(v, list) and v for v in exp.grid.values()):
        raise ConfigError(f"experiment file {path}: grid must map dotted keys to non-empty lists")
    if exp.arms or "arm" in exp.grid:
        if not isinstance(exp.arms, dict) or not all(isinstance(v, dict) for v in exp.arms.values()):
            raise ConfigError(f"experiment file {path}: arms must map names to mappings of dotted keys")
        unknown_arms = [a for a in exp.grid.get("arm", [None]) if a not in exp.arms]
        if unknown_arms:
            raise ConfigError(f"experiment file {path}: grid.arm {unknown_arms[0]!r} is not under arms "
                              f"(arms: {', '.join(map(str, exp.arms)) or 'none'})")  # fmt: skip
    budget = exp.env_step_budget
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
        raise ConfigError(f"experiment file {path}: env_step_budget must be a positive integer, got {budget!r}")
    for spec in runs(exp):  # every run's config must load: a bad grid key fails here, naming it
        load_config(exp.base, spec.overrides)
    return exp


def _label(key: str, value) -> str:
    return f"s{value}" if key == "train.seed" else str(value).replace("/", "_")


def runs(exp: Experiment) -> list[RunSpec]:
    """One RunSpec per grid point, named by its values (`alfworld-grpo-rspo-s0`)."""
    keys = list(exp.grid)
    out = []
    for combo in itertools.product(*(exp.grid[k] for k in keys)):
        values = dict(zip(keys, combo))
        name = "-".join(_label(k, v) for k, v in values.items()) or "run"
        chosen = [(k, v) for key, value in values.items()
                  for k, v in (exp.arms[value].items() if key == "arm" else [(key, value)])]  # fmt: skip
        dotted = [
            f"{k}={json.dumps(v) if isinstance(v, (list, dict)) else v}" for k, v in [*exp.overrides.items(), *chosen]
        ]
        out.append(RunSpec(name, values, dotted))
    return out


def warm_start_key(cfg) -> str:
    """Runs with equal keys can share one SFT warm start (`cfg`: a Config or its dict)."""
    d = json.loads(json.dumps(cfg if isinstance(cfg, dict) else to_dict(cfg)))  # a copy to delete from
    for section, keys in WARM_START_IGNORED.items():
        for key in keys:
            d[section].pop(key, None)  # a run recorded before the key existed lacks it
    for (*path, key), before in WARM_START_ADDED.items():
        node = functools.reduce(dict.__getitem__, path, d)
        if node.get(key) == before:
            del node[key]
    for (*path, key), value in WARM_START_PINNED.items():
        functools.reduce(dict.__getitem__, path, d)[key] = value
    shared = {s: d[s] for s in WARM_START_SECTIONS} | {"seed": d["train"]["seed"]}
    return hashlib.sha1(json.dumps(shared, sort_keys=True).encode()).hexdigest()[:10]


def commit_hash(ignore: str | Path | None = None) -> str:
    """HEAD's hash, with "+dirty" if a tracked file differs from it, except under `ignore`
    (the sweep's own results folder, which it rewrites after every run)."""

    def git(*args: str) -> list[str]:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.splitlines()

    try:
        head, top = git("rev-parse", "HEAD", "--show-toplevel")
        changed = [Path(top, line[3:]).resolve() for line in git("status", "--porcelain", "--untracked-files=no")]
    except (OSError, ValueError, subprocess.CalledProcessError):
        return "unknown"
    skip = Path(ignore).resolve() if ignore else None
    dirty = [p for p in changed if not (skip and p.is_relative_to(skip))]
    return head + ("+dirty" if dirty else "")


def weights_sha256(model_dir: str | Path) -> str | None:
    """sha256 over a model directory's weight files (`*.safetensors`, by name), or None."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _launch(launcher: str, args: list[str], log: Path, threads: int) -> int:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    prefix = shlex.split(launcher) if launcher else [sys.executable, "-m"]
    with open(log, "a") as f:
        return subprocess.run([*prefix, "rspo", *args], stdout=f, stderr=subprocess.STDOUT, env=env).returncode


def _in_process(command: str, cfg) -> None:
    if command == "sft":
        from rspo.sft import sft_command

        sft_command(cfg)
    else:
        from rspo.train import train

        train(cfg)


SUMMARY_KEYS = (
    "before",
    "after",
    "difference",
    "env_steps",
    "curve",
    "before_tasks",
    "after_tasks",
    "trace",
    "final_at",
)


PER_RUN_KEYS = ("model.init_from", "train.output_dir", "train.resume")  # what the sweep sets when it launches


def _leaves(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out |= _leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v}
    return out


def config_drift(exp: Experiment, spec: RunSpec, recorded: dict | None) -> list[str]:
    """How a finished run's recorded config differs from what the grid asks of that run now
    (`train.steps 30 -> 60`): a run of another setting must not be reported under this name.
    Keys one side lacks (added to or removed from rspo since the run) are not compared."""
    if not recorded:
        return []
    now = json.loads(json.dumps(to_dict(load_config(exp.base, spec.overrides))))  # as JSON records it: lists
    old, new = _leaves(recorded), _leaves(now)
    return [f"{k} {old[k]!r} -> {new[k]!r}" for k in sorted(old.keys() & new.keys())
            if k not in PER_RUN_KEYS and old[k] != new[k]]  # fmt: skip


def stale_runs(exp: Experiment) -> dict[str, list[str]]:
    """The finished run directories whose config differs from the grid's (name -> the keys)."""
    out = {}
    for spec in runs(exp):
        meta = spec.dir(exp) / "run.json"
        if (spec.dir(exp) / "eval_summary.json").is_file() and meta.is_file():
            drift = config_drift(exp, spec, json.loads(meta.read_text()).get("config"))
            if drift:
                out[spec.name] = drift
    return out


def restore(exp: Experiment, progress=print) -> list[str]:
    """Put back the finished runs that the committed results.json records but whose run
    directories are gone (a fresh clone, another machine): their eval_summary.json and
    run.json, so that they count as finished and a grid continues instead of rerunning.
    A recorded run whose config is not the grid's any more stays out (it runs again)."""
    path = Path(exp.results_dir) / "results.json"
    if not path.is_file():
        return []
    names = {spec.name: spec for spec in runs(exp)}
    restored = []
    for r in json.loads(path.read_text())["runs"]:
        d = Path(exp.output_dir) / r["name"]
        if r["name"] in names and not (d / "eval_summary.json").exists():
            drift = config_drift(exp, names[r["name"]], r.get("config"))
            if drift:
                progress(f"sweep: not restoring {r['name']} from {path}: it ran with another config "
                         f"({'; '.join(drift)})")  # fmt: skip
                continue
            d.mkdir(parents=True, exist_ok=True)
            meta = {k: r.get(k) for k in ("config", "commit", "wall_s", "warm_start")}
            write_json(d / "run.json", meta | {"restored_from": str(path)})
            write_json(d / "eval_summary.json", {k: r[k] for k in SUMMARY_KEYS if r.get(k) is not None})
            restored.append(r["name"])
    return restored


def select(specs: list[RunSpec], only: str) -> list[RunSpec]:
    """The grid points `--only` names, in grid order: comma-separated items, each a run's whole
    name (that run alone: `s1-grpo-e8` is not `s1-grpo-e8-shaped`) or a part of names (every
    run that contains it: `s1-`); "" selects all."""
    chosen = set()
    for item in only.split(",") if only else [""]:
        exact = [s.name for s in specs if s.name == item]
        matched = exact or [s.name for s in specs if item in s.name]
        if not matched:
            raise ConfigError(f"--only {item}: matches no run (runs: {', '.join(s.name for s in specs)})")
        chosen.update(matched)
    return [s for s in specs if s.name in chosen]


def execute(exp: Experiment, only: str = "", progress=print) -> list[RunSpec]:
    """Run every unfinished grid point (warm starts first); returns the runs selected."""
    restored = restore(exp, progress)
    if restored:
        progress(f"sweep: {len(restored)} finished run(s) restored from {exp.results_dir}/results.json")
    selected = select(runs(exp), only)
    names = {s.name for s in selected}
    stale = {name: drift for name, drift in stale_runs(exp).items() if name in names}
    if stale:
        name, drift = next(iter(stale.items()))
        raise ConfigError(f"{exp.output_dir}/{name} finished with another config than the grid's now "
                          f"({'; '.join(drift)}){f' and {len(stale) - 1} more' if len(stale) > 1 else ''}: "
                          "move it aside to run it again")  # fmt: skip
    threads = max(1, (os.cpu_count() or 1) // max(exp.parallel, 1))
    warm: dict[str, list[str]] = {}  # warm-start dir -> overrides that build it
    plan = []
    for spec in selected:
        if (spec.dir(exp) / "eval_summary.json").exists():
            continue  # finished: needs no warm start either
        cfg = load_config(exp.base, spec.overrides)
        ws = Path(exp.output_dir) / "warmstart" / warm_start_key(cfg)
        if cfg.sft.episodes > 0 and not cfg.model.init_from:
            warm.setdefault(str(ws), spec.overrides + [f"train.output_dir={ws}"])
            spec_overrides = [f"model.init_from={ws / 'sft'}"]
        else:
            spec_overrides = []
        plan.append((spec, spec_overrides))

    def job(command: str, overrides: list[str], out: Path, done: Path, label: str) -> tuple[str, int]:
        if done.exists():
            return label, 0
        out.mkdir(parents=True, exist_ok=True)
        progress(f"sweep: {command} {label} -> {out}")
        t0, commit = time.time(), commit_hash(exp.results_dir)  # the code the run starts with
        if exp.parallel == 0:
            _in_process(command, load_config(exp.base, overrides))
            code = 0
        else:
            launcher = exp.launcher if command == "train" else ""  # the warm start is one process
            code = _launch(launcher, [command, "--config", exp.base, *overrides], out / f"{command}.log", threads)
        if code == 0 and command == "train":
            cfg = load_config(exp.base, overrides)
            start = weights_sha256(cfg.model.init_from) if cfg.model.init_from else None  # what it started from
            write_json(out / "run.json", {"config": to_dict(cfg), "commit": commit, "wall_s": time.time() - t0,
                                          "overrides": overrides, "warm_start": start})  # fmt: skip
        status = "done" if code == 0 else f"FAILED (exit {code}, see {out})"
        progress(f"sweep: {label} {status} in {time.time() - t0:.0f}s")
        return label, code

    def run_all(jobs: list[tuple]) -> list[str]:
        if exp.parallel <= 1:
            results = [job(*j) for j in jobs]
        else:
            with ThreadPoolExecutor(exp.parallel) as pool:
                results = list(pool.map(lambda j: job(*j), jobs))
        return [label for label, code in results if code != 0]

    failed = run_all([("sft", ov, Path(ws), Path(ws) / "sft" / "config.json", f"warm start {Path(ws).name}")
                      for ws, ov in warm.items()])  # fmt: skip
    for message in warm_start_mismatches(exp, [Path(ws) for ws in warm]):
        progress(message)
    train_jobs = []
    for spec, extra in plan:
        out = spec.dir(exp)
        overrides = spec.overrides + extra + [f"train.output_dir={out}", "train.resume=auto"]
        train_jobs.append(("train", overrides, out, out / "eval_summary.json", spec.name))
    failed += run_all(train_jobs)
    if failed:
        raise RuntimeError(f"{len(failed)} sweep job(s) failed: {', '.join(failed)}")
    return selected


def warm_start_mismatches(exp: Experiment, built: list[Path]) -> list[str]:
    """A warning for each warm start built here whose weights differ from the start that
    finished runs of the same key recorded (a rebuild on another machine or thread count):
    the new runs will not pair with those in the same-start table."""
    recorded: dict[str, dict[str, list[str]]] = {}  # key -> sha256 -> finished runs that started from it
    for spec in runs(exp):
        meta = spec.dir(exp) / "run.json"
        if meta.is_file() and (spec.dir(exp) / "eval_summary.json").is_file():
            m = json.loads(meta.read_text())
            if m.get("warm_start") and m.get("config"):
                cfg = m["config"] | {"model": m["config"]["model"] | {"init_from": ""}}  # as before its warm start
                recorded.setdefault(warm_start_key(cfg), {}).setdefault(m["warm_start"], []).append(spec.name)
    out = []
    for ws in built:
        here = weights_sha256(ws / "sft")
        for sha, names in recorded.get(ws.name, {}).items():
            if here and sha != here:
                out.append(
                    f"sweep: WARNING: warm start {ws.name} built here (sha256 {here[:12]}) differs from the one "
                    f"{', '.join(names)} started from ({sha[:12]}): new runs will not pair with them"
                )
    return out


def load_runs(exp) -> list[dict]:
    """Every finished run: grid values, config, commit, wall time, warm-start hash, eval summary."""
    out = []
    for spec in runs(exp):
        d = spec.dir(exp)
        if not (d / "eval_summary.json").is_file():
            continue
        meta = json.loads((d / "run.json").read_text()) if (d / "run.json").is_file() else {}
        drift = config_drift(exp, spec, meta.get("config"))
        if drift:
            print(f"sweep: {spec.name} left out of the results: it ran with another config ({'; '.join(drift)})")
            continue
        summary = json.loads((d / "eval_summary.json").read_text())
        cfg = meta.get("config") or to_dict(load_config(exp.base, spec.overrides))
        out.append({"name": spec.name, "values": spec.values, "env": cfg["env"]["name"],
                    "algo": cfg["algo"]["name"], "mode": spec.values.get("arm", cfg["reward"]["mode"]),
                    "seed": cfg["train"]["seed"],
                    "commit": meta.get("commit", "unknown"), "wall_s": meta.get("wall_s"),
                    "warm_start": meta.get("warm_start"), "config": cfg, **summary})  # fmt: skip
    return out


def collect(exp: Experiment) -> dict:
    """The experiment's report (`rspo.results.write_results`) from its finished runs, the
    committed ones restored first (`restore`); returns the table."""
    restore(exp)
    all_runs = load_runs(exp)
    if not all_runs:
        raise RuntimeError(f"no finished runs under {exp.output_dir}")
    return write_results(all_runs, exp.results_dir, exp.env_step_budget)


def sweep_command(path: str, only: str = "", collect_only: bool = False, parallel: int | None = None) -> None:
    exp = load_experiment(path)
    if parallel is not None:
        exp.parallel = parallel
    if not collect_only:
        execute(exp, only)
    collect(exp)
    print((Path(exp.results_dir) / "results.md").read_text())
