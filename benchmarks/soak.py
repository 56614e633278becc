"""Soak: train the tiny model for N iterations with every fault rspo claims to survive
injected at random; report faults injected vs survived and whether anything was lost.

    PYTHONPATH=src python benchmarks/soak.py [--iterations 12] [--seed 0] [--out DIR]

The run is `rspo train` on a small WebShop (tests/support.py's SMALL with 2 env worker
processes, env.step_timeout=3 s, TensorBoard on, a checkpoint every iteration), warm-started
first by a short SFT (no faults there). It runs as a child process, rerun with
`train.resume=auto` after every crash until it finishes. The faults come from a plan drawn
from --seed, every kind at least once; each fires once (a step redone after a crash does
not fire it again):

  env_raise       an env's step raises inside its worker      -> that trajectory fails, counted
  env_hang        a worker sleeps past env.step_timeout        -> replaced; its trajectories fail
  env_die         a worker SIGKILLs itself mid-step            -> replaced; its trajectories fail
  nan_reward, nan_advantage, nan_loss, inf_gradient           -> the iteration's updates skipped
  invalid_output  a response with no valid action (fuzz text)  -> an invalid-action turn
  disk_full       ENOSPC writing a checkpoint's trainer.pt     -> a clear OSError, exit 1; rerun
  kill_in_save    SIGKILL half-way through a checkpoint write  -> rerun resumes from the one before
  kill            the driver SIGKILLs the trainer at a random time (every attempt until one
                  is killed, then at random)                    -> rerun resumes from the latest

No hook in rspo: the child is `python -c CHILD`, which monkeypatches rspo functions as
tests/test_faults.py and tests/test_crash.py do, and starts env workers through
`faulty_worker` (spawn pickles the target by name), which patches the step handler inside
the worker. The child appends every injection, finished iteration and written checkpoint to
<out>/ledger.jsonl; the driver then judges each injection:

  survived   env faults: that iteration's logged `rollout/env_faults` equals the trajectories
             hit and `EnvPool.restarts` grew by one per hang/death; numeric faults: every
             update of the iteration skipped (`train/skipped_updates`), target weights bitwise
             unchanged; invalid outputs: the logged invalid-action rate equals the invalid
             turns the child saw; crashes: the rerun resumed from the latest complete checkpoint
             (a disk-full exit also named it and left no temp dir).
  cut short  the trainer was killed before that iteration's metrics were logged.
  lost       a checkpoint the ledger saw written, or any step 1..N, missing or unloadable at the
             end; an iteration's TensorBoard scalars missing (each attempt writes its own event
             file, named by its pid: it must hold every iteration from its resume point up to its
             last checkpoint, and iterations 0..N-1 must all be logged); eval_summary.json
             without before/after; non-finite final weights or optimizer state; a process left
             behind by a killed trainer.
Exit code 1 if anything was lost or a fault not survived. Numbers: README, "Reliability".
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support import POISONS, SMALL, WARM_SFT, poison  # noqa: E402

CONFIG = [  # the tests' small WebShop with real worker processes, the logs on and a checkpoint each step
    *SMALL, "env.num_workers=2", "env.step_timeout=3", "eval.num_tasks=2", "log.tensorboard=true",
    "log.sample_every=0", "train.minibatches=2", "train.save_every=1", "train.resume=auto",
]  # fmt: skip
ENV_FAULTS = ("env_raise", "env_hang", "env_die")
NUMERIC_FAULTS = POISONS
SAVE_FAULTS = ("disk_full", "kill_in_save")
KINDS = (*ENV_FAULTS, *NUMERIC_FAULTS, "invalid_output", *SAVE_FAULTS, "kill")
RATES = {"env": 0.35, "numeric": 0.25, "invalid_output": 0.3, "disk_full": 0.08, "kill_in_save": 0.05}
KILL_RATE, MAX_KILLS = 0.35, 4  # per attempt: the driver SIGKILLs the trainer at a random time
RAISE, HANG, DIE = "\x00soak:raise", "\x00soak:hang", "\x00soak:die"  # actions only the soak sends
GARBAGE = ["", "<action></action>", "<action>buy now", "</action>click[", "\x00\x07\u202e🙂", "search[" * 2000]
CHILD = "import sys; sys.path.insert(0, sys.argv[1]); import soak; soak.child(sys.argv[2:])"


def plan(iterations: int, turns: int, seed: int) -> list[dict]:
    """Faults by iteration (`step`) or checkpoint (`ckpt`, 1..N), every kind at least once."""
    rng, events = random.Random(seed), []
    for s in range(iterations):
        if rng.random() < RATES["env"]:
            events.append({"kind": rng.choice(ENV_FAULTS), "step": s, "turn": rng.randrange(turns)})
        if rng.random() < RATES["numeric"]:
            events.append({"kind": rng.choice(NUMERIC_FAULTS), "step": s})
        if rng.random() < RATES["invalid_output"]:
            events += [{"kind": "invalid_output", "step": s, "call": c} for c in rng.sample(range(4), 2)]
        for kind in SAVE_FAULTS:
            if rng.random() < RATES[kind]:
                events.append({"kind": kind, "ckpt": s + 1})
    drawn = {e["kind"] for e in events}
    ckpts = rng.sample(range(1, iterations + 1), min(2, iterations))
    for i, kind in enumerate(k for k in KINDS[:-1] if k not in drawn):  # coverage: the first turn
        if kind in SAVE_FAULTS:
            events.append({"kind": kind, "ckpt": ckpts[SAVE_FAULTS.index(kind) % len(ckpts)]})
        else:
            events.append({"kind": kind, "step": (i + rng.randrange(iterations)) % iterations, "turn": 0, "call": 0})
    for i, e in enumerate(events):
        e |= {"id": i, "pick": rng.randrange(1 << 16)}
    return events


# -- the child: rspo train with faults patched in ---------------------------------------------


def read_ledger(out: Path) -> list[dict]:
    path, rows = out / "ledger.jsonl", []
    for line in path.read_text().splitlines() if path.is_file() else []:
        with contextlib.suppress(ValueError):  # a line cut by a SIGKILL
            rows.append(json.loads(line))
    return rows


def digest(params) -> str:
    return hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in params)).hexdigest()


def faulty_worker(conn, cfg, num_envs: int) -> None:
    """An env worker whose step handler obeys the soak's actions (raise / hang / die)."""
    from rspo.envs import pool

    real = pool.EnvGroup.step

    def engine_failure(action):
        raise RuntimeError("soak: injected engine failure")

    def step(group, items):
        actions = [a for _, a in items]
        if DIE in actions:
            os.kill(os.getpid(), signal.SIGKILL)
        if HANG in actions:
            time.sleep(2 * cfg.step_timeout + 5)  # killed by the pool after step_timeout
        raising = [i for i, a in items if a == RAISE]
        for i in raising:
            group.envs[i].step = engine_failure  # shadows the method for this call only
        try:
            return real(group, items)
        finally:
            for i in raising:
                del group.envs[i].step

    pool.EnvGroup.step = step
    pool._worker_main(conn, cfg, num_envs)


class Injector:
    """Fires the planned faults in this attempt and writes what happened to the ledger."""

    def __init__(self, out: Path, attempt: int) -> None:
        fired = {r["event"] for r in read_ledger(out) if r["type"] == "inject"}
        self.pending = [e for e in json.loads((out / "plan.json").read_text()) if e["id"] not in fired]
        path = out / "ledger.jsonl"
        torn = path.is_file() and path.stat().st_size and not path.read_bytes().endswith(b"\n")
        self.ledger = path.open("a")
        self.ledger.write("\n" if torn else "")  # a line cut by a SIGKILL stays on its own line
        self.attempt, self.step = attempt, None  # step: the iteration running (None: setup, eval)

    def write(self, record: str, **fields) -> None:
        self.ledger.write(json.dumps({"type": record, "attempt": self.attempt, **fields}) + "\n")
        self.ledger.flush()

    def take(self, kinds, **where) -> dict | None:
        """The first pending event of `kinds` matching `where` (a callable or a value per key)."""
        for e in self.pending:
            if e["kind"] in kinds and all(v(e.get(k)) if callable(v) else e.get(k) == v for k, v in where.items()):
                self.pending.remove(e)
                return e
        return None

    def fire(self, event: dict, **fields) -> None:
        self.write("inject", event=event["id"], kind=event["kind"], step=self.step, ckpt=event.get("ckpt"), **fields)

    def install(self) -> None:
        import torch

        import rspo.envs.pool as pool
        import rspo.rollout
        import rspo.train
        import rspo.update
        from rspo import checkpoint

        pool._worker_main = faulty_worker  # every worker, replacements too
        self.real = {}  # label -> the function patched over
        for label, owner, name, wrapper in [
            ("pool_step", pool.EnvPool, "step", lambda pool, actions: self.pool_step(pool, actions)),
            ("rl_step", rspo.train, "rl_step", self.rl_step),
            ("parse_action", rspo.rollout, "parse_action", self.parse_action),
            ("count_skip", rspo.update, "count_skip", self.count_skip),
            ("checkpoint_save", checkpoint, "save", self.checkpoint_save),
            ("torch_save", torch, "save", self.torch_save),  # `checkpoint.torch.save`
        ]:
            self.real[label] = getattr(owner, name)
            setattr(owner, name, wrapper)

    def rl_step(self, run):
        self.step, self.turn, self.calls = run.step, 0, 0
        self.seen = Counter()  # turns, invalid turns, target updates, skipped ones
        params = run.policy.parameters_of("target")
        restarts, before = run.pool.restarts, digest(params)
        undo = []
        while event := self.take(NUMERIC_FAULTS, step=run.step):
            self.fire(event)
            undo.append(poison(event["kind"], run))
        try:
            metrics = self.real["rl_step"](run)
        finally:
            for u in undo:
                u()
            self.step = None
        restarts = run.pool.restarts - restarts
        self.write("step", step=run.step, restarts=restarts, unchanged=digest(params) == before, **self.seen)
        return metrics

    def pool_step(self, pool, actions):
        if self.step is not None:
            event = self.take(ENV_FAULTS, step=self.step, turn=lambda t: t <= self.turn)
            active = [e for e, a in enumerate(actions) if a is not None]
            if event and active:
                e, actions = active[event["pick"] % len(active)], list(actions)
                actions[e] = {"env_raise": RAISE, "env_hang": HANG, "env_die": DIE}[event["kind"]]
                worker = [x for x in active if pool._owner[x][0] == pool._owner[e][0]]
                self.fire(event, turn=self.turn, expected_faults=1 if event["kind"] == "env_raise" else len(worker))
            self.turn += 1
        return self.real["pool_step"](pool, actions)

    def parse_action(self, text: str):
        if self.step is None:
            return self.real["parse_action"](text)
        event = self.take(["invalid_output"], step=self.step, call=self.calls)
        if event:
            text = GARBAGE[event["pick"] % len(GARBAGE)]
        action, valid = self.real["parse_action"](text)
        if event:
            self.fire(event, valid=valid)
        self.calls += 1
        self.seen.update(turns=1, invalid=not valid)
        return action, valid

    def count_skip(self, learner, skipped: bool, limit: int) -> int:
        if self.step is not None and learner.name == "target":
            self.seen.update(updates=1, skipped=bool(skipped))
        return self.real["count_skip"](learner, skipped, limit)

    def torch_save(self, obj, path, *args, **kwargs):
        found = re.fullmatch(r"\.tmp_step_(\d+)", Path(path).parent.name)
        event = found and Path(path).name == "trainer.pt" and self.take(SAVE_FAULTS, ckpt=int(found[1]))
        if event:
            self.fire(event)
            Path(path).write_bytes(b"half")  # a partial file first, as a full disk or a kill leaves
            if event["kind"] == "disk_full":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.kill(os.getpid(), signal.SIGKILL)
        return self.real["torch_save"](obj, path, *args, **kwargs)

    def checkpoint_save(self, output_dir, step, *args, **kwargs):
        path = self.real["checkpoint_save"](output_dir, step, *args, **kwargs)
        self.write("saved", ckpt=step, path=str(path))
        return path


def child(argv: list[str]) -> None:
    """`python -c CHILD <benchmarks dir> OUT ATTEMPT rspo-args...`"""
    out, attempt, rspo_args = Path(argv[0]), int(argv[1]), argv[2:]
    injector = Injector(out, attempt)
    injector.install()
    injector.write("start", pid=os.getpid())
    from rspo.cli import main

    main(rspo_args)


# -- the driver: run, kill, rerun ---------------------------------------------------------------


@dataclass
class Attempt:
    """One start of the trainer (the first, or a rerun with train.resume=auto)."""

    index: int
    start: str  # the latest complete checkpoint when it started ("" = none)
    pid: int = 0
    rc: int = 0
    killed: bool = False  # by the driver
    seconds: float = 0.0
    log: str = ""
    left_behind: int = 0  # its processes still alive well after it ended (then killed)
    temp_dirs: list = field(default_factory=list)  # .tmp_/.old_ checkpoint dirs right after it ended
    step_times: list = field(default_factory=list)  # seconds after start of each `step k/N` line


def warm_start(out: Path, episodes: int) -> list[str]:
    """A short SFT warm start (no faults), so rollouts have varied rewards and updates move weights."""
    if not episodes:
        return []
    warm = out / "warm"
    if not (warm / "sft" / "config.json").is_file():
        args = [*CONFIG, f"sft.episodes={episodes}", *WARM_SFT, f"train.output_dir={warm}"]
        subprocess.run([sys.executable, "-m", "rspo", "sft", *args], check=True, capture_output=True, env=child_env())
    return [f"model.init_from={warm / 'sft'}"]


def child_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


def session_processes(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`: the trainer and the env workers it started."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, _, session = stat.read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, IndexError, ValueError):
            continue
        if int(session) == sid and state != "Z":
            pids.append(int(stat.parent.name))
    return pids


def reap(sid: int, grace: float) -> int:
    """Wait up to `grace` s for a finished trainer's workers to exit (a killed trainer's
    workers must notice on their own); kill and count any left."""
    deadline = time.monotonic() + grace
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(left)


def step_of(checkpoint_path) -> int:
    return int(Path(checkpoint_path).name.removeprefix("step_")) if checkpoint_path else 0


def run_attempts(out: Path, run_dir: Path, args: list[str], iterations: int, seed: int, max_attempts: int):
    """Start the trainer, maybe SIGKILL it at a random moment, rerun until it finishes."""
    from rspo import checkpoint

    rng, attempts = random.Random(seed + 1), []
    startup, per_step = 20.0, 3.0  # first guesses (s); then measured
    while len(attempts) < max_attempts:
        latest = checkpoint.latest(run_dir)
        kills = sum(a.killed for a in attempts)
        kill = kills < MAX_KILLS and (rng.random() < KILL_RATE or not kills)  # at least one kill
        # when: after `after` of its iteration lines, a random part of an iteration (or of the
        # start-up) later; counted in iterations, so a load spike does not push it past the end
        after = rng.randrange(max(iterations - step_of(latest), 1)) if kill else -1
        delay = rng.uniform(0.05, 1.0) * (startup if after == 0 else per_step)
        a = Attempt(len(attempts), str(latest or ""))
        log, t0 = out / f"attempt_{a.index}.log", time.monotonic()
        with log.open("w") as f:
            cmd = [sys.executable, "-c", CHILD, str(Path(__file__).parent), str(out), str(a.index), "train", *args]
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=child_env())
            a.pid = proc.pid
            while proc.poll() is None:
                since = a.step_times[after - 1] if 0 < after <= len(a.step_times) else 0.0
                if 0 <= after <= len(a.step_times) and time.monotonic() - t0 - since > delay:
                    proc.send_signal(signal.SIGKILL)
                    a.killed, after = True, -1
                time.sleep(0.2)
                lines = sum(line.startswith("step ") for line in log.read_text(errors="replace").splitlines())
                a.step_times += [time.monotonic() - t0] * (lines - len(a.step_times))
        a.rc, a.seconds = proc.returncode, time.monotonic() - t0
        a.killed = a.killed and a.rc == -signal.SIGKILL
        a.log = log.read_text(errors="replace")
        a.left_behind = reap(proc.pid, grace=20.0)
        a.temp_dirs = sorted(p.name for p in checkpoint.checkpoint_dir(run_dir).glob(".*"))
        if a.step_times:
            startup = a.step_times[0]
            gaps = [y - x for x, y in zip(a.step_times, a.step_times[1:])]
            per_step = sorted(gaps)[(len(gaps) - 1) // 2] if gaps else per_step  # the lower median
        attempts.append(a)
        print(f"attempt {a.index}: rc={a.rc}{' (killed by the driver)' if a.killed else ''}, {a.seconds:.0f} s, "
              f"{len(a.step_times)} iterations, started from {a.start or 'scratch'}", flush=True)  # fmt: skip
        if a.rc == 0 or end_of(a, read_ledger(out)) == "unexpected":
            break
    return attempts


def end_of(a: Attempt, ledger: list[dict]) -> str:
    """How an attempt ended: finished, one of the crash faults, or unexpected."""
    fired = {r["kind"] for r in ledger if r["type"] == "inject" and r["attempt"] == a.index}
    if a.rc == 0:
        return "finished"
    if a.rc == -signal.SIGKILL and "kill_in_save" in fired:
        return "kill_in_save"
    if a.rc == -signal.SIGKILL and a.killed:
        return "kill"
    if a.rc == 1 and "disk_full" in fired and "No space left on device" in a.log:
        return "disk_full"
    return "unexpected"


# -- the verdict ----------------------------------------------------------------------------------

CORE = ("rollout/success_rate", "rollout/env_faults", "rollout/invalid_action_rate", "train/skipped_updates")
EVAL = "eval/test/success_rate"


def tensorboard_scalars(tb_dir: Path, attempt_of_pid: dict[int, int]) -> dict:
    """{attempt: {step: {tag: value}}} from each attempt's own event file (named by its pid)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict = defaultdict(lambda: defaultdict(dict))
    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        attempt = attempt_of_pid.get(int(path.name.split(".")[-2]), -1)
        for tag in acc.Tags()["scalars"]:
            for event in acc.Scalars(tag):
                out[attempt][event.step][tag] = event.value
    return out


def iteration_problems(row: dict, logged: dict, injected: list[dict]) -> list[str]:
    """What in one finished, logged iteration disagrees with the faults injected into it."""
    why, env = [], [r for r in injected if r["kind"] in ENV_FAULTS]
    faults, want = round(logged["rollout/env_faults"]), sum(r["expected_faults"] for r in env)
    if faults != want:
        why.append(f"rollout/env_faults={faults}, {want} trajectories hit")
    if row["restarts"] != sum(r["kind"] != "env_raise" for r in env):
        why.append(f"{row['restarts']} worker restarts for {len(env)} env faults")
    numeric = any(r["kind"] in NUMERIC_FAULTS for r in injected)
    updates, skipped = row.get("updates", 0), round(logged["train/skipped_updates"])
    if not updates or skipped != row.get("skipped", 0) or skipped != (updates if numeric else 0):
        why.append(f"{skipped} of {updates} updates skipped, numeric fault: {numeric}")
    if numeric and not row["unchanged"]:
        why.append("target weights changed in an iteration whose updates were all skipped")
    rate = row.get("invalid", 0) / max(row.get("turns", 0), 1)
    if abs(logged["rollout/invalid_action_rate"] - rate) > 1e-5:
        why.append(f"rollout/invalid_action_rate={logged['rollout/invalid_action_rate']:.4f}, seen {rate:.4f}")
    if any(r["valid"] for r in injected if r["kind"] == "invalid_output"):
        why.append("a response with no valid action parsed as valid")
    return why


def checkpoint_problem(path: Path, step: int) -> str:
    """ "" if `path` is a complete, loadable checkpoint of `step` with finite weights and optimizer."""
    import torch
    from safetensors.torch import load_file

    if not (path / "trainer.pt").is_file():
        return "missing"
    try:
        state = torch.load(path / "trainer.pt", weights_only=False)
        tensors = [t for f in path.glob("policy/**/*.safetensors") for t in load_file(f).values()]
    except Exception as e:  # unloadable, whatever the reason
        return f"unloadable ({type(e).__name__}: {e})"
    if state["step"] != step or not tensors:
        return f"holds step {state['step']} and {len(tensors)} weight tensors"

    def walk(x):
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, dict | list | tuple):
            for v in x.values() if isinstance(x, dict) else x:
                yield from walk(v)

    if not all(bool(t.isfinite().all()) for t in [*tensors, *walk(state["target"])] if t.is_floating_point()):
        return "non-finite weights or optimizer state"
    return ""


def judge(out: Path, run_dir: Path, iterations: int, attempts: list[Attempt]) -> dict:
    """Every injection survived / cut short / not survived, and everything lost."""
    ledger = read_ledger(out)
    tb = tensorboard_scalars(run_dir / "tb", {a.pid: a.index for a in attempts})
    rows = {(r["attempt"], r["step"]): r for r in ledger if r["type"] == "step"}
    injects = [r for r in ledger if r["type"] == "inject"]
    ends = [end_of(a, ledger) for a in attempts]
    verdicts, lost = {}, []  # event id -> verdict; what was lost or not survived

    by_iteration = defaultdict(list)
    for r in injects:
        if r["step"] is not None and r["kind"] in (*ENV_FAULTS, *NUMERIC_FAULTS, "invalid_output"):
            by_iteration[(r["attempt"], r["step"])].append(r)
    for key in sorted(set(rows) | set(by_iteration)):
        logged = tb[key[0]].get(key[1]) if key[0] in tb else None
        if key not in rows or logged is None or not set(CORE) <= set(logged):
            cut = ends[key[0]] in (*SAVE_FAULTS, "kill") and key[1] >= max(saved_by(ledger, key[0]), default=0)
            verdict, why = ("cut short", []) if cut else ("not survived", [f"iteration {key[1]} not logged"])
        else:
            why = iteration_problems(rows[key], logged, by_iteration[key])
            verdict = "not survived" if why else "survived"
        for r in by_iteration[key]:
            verdicts[r["event"]] = verdict
        if why:
            kinds = ", ".join(r["kind"] for r in by_iteration[key]) or "none"
            lost.append(f"attempt {key[0]}, iteration {key[1]} (faults: {kinds}): {'; '.join(why)}")

    for a, end in zip(attempts, ends):  # a crash is survived when the rerun resumes from the latest checkpoint
        if end == "finished":
            continue
        if end == "unexpected":
            lost.append(f"attempt {a.index} ended unexpectedly (rc={a.rc}): {a.log.strip()[-600:]}")
            continue
        why = crash_problems(a, end, attempts, ledger)
        fired = [r for r in injects if r["attempt"] == a.index and r["kind"] == end]
        if end == "kill":
            fired = [{"event": f"kill-{a.index}", "kind": "kill", "attempt": a.index}]
            injects.append(fired[0])
        for r in fired:
            verdicts[r["event"]] = "not survived" if why else "survived"
        if why:
            lost.append(f"{end} ending attempt {a.index}: {'; '.join(why)}")
    table = {k: Counter() for k in KINDS}
    for r in injects:  # a save fault in an attempt that ended otherwise (killed just after it) is cut short
        table[r["kind"]]["injected"] += 1
        table[r["kind"]][verdicts.get(r["event"], "cut short")] += 1
    lost += lost_problems(run_dir, iterations, attempts, ledger, tb)
    return {"table": table, "problems": lost, "ledger": ledger, "tb": tb, "ends": ends}


def saved_by(ledger: list[dict], attempt: int) -> list[int]:
    return [r["ckpt"] for r in ledger if r["type"] == "saved" and r["attempt"] == attempt]


def resumed_from(a: Attempt) -> tuple[str, int] | None:
    found = re.search(r"^resumed from (\S+) at step (\d+)$", a.log, re.M)
    return (found[1], int(found[2])) if found else None


def got_to_resume(a: Attempt) -> bool:
    """Whether `a` ran far enough to have resumed (a rerun killed while starting up did not)."""
    return bool(resumed_from(a) or a.step_times or a.rc == 0 or not a.start)


def crash_problems(a: Attempt, end: str, attempts: list[Attempt], ledger: list[dict]) -> list[str]:
    """Why the crash that ended `a` was not survived: the first rerun that got that far did not
    resume from the latest complete checkpoint (or a save fault left the checkpoints wrong)."""
    reruns = [b for b in attempts[a.index + 1 :] if got_to_resume(b)]
    if not reruns:
        return ["no rerun got as far as resuming"]
    rerun, latest, why = reruns[0], attempts[a.index + 1].start, []
    got = resumed_from(rerun)
    if (got[0] if got else "") != rerun.start:
        why.append(f"the rerun resumed from {got and got[0] or 'scratch'}, the latest is {rerun.start or 'none'}")
    if end in SAVE_FAULTS:
        k = next(r["ckpt"] for r in ledger if r["type"] == "inject" and r["attempt"] == a.index and r["kind"] == end)
        if step_of(latest) >= k:
            why.append(f"the half-written checkpoint {k} was taken as complete")
    if end == "disk_full":
        kept = f"the latest complete one, {latest}, is intact" if latest else "no earlier checkpoint"
        if f"checkpoint of step {k} not written (No space left on device); {kept}" not in a.log:
            why.append("the OSError does not name the step and the intact checkpoint")
        if f".tmp_step_{k:06d}" in a.temp_dirs:
            why.append(f"left its temp dir .tmp_step_{k:06d}")
    return why


def lost_problems(run_dir: Path, iterations: int, attempts: list[Attempt], ledger: list[dict], tb: dict):
    """Checkpoints, log lines, the eval summary and processes that should be there (or not)."""
    lost, ckpts = [], run_dir / "checkpoints"
    for k in sorted({r["ckpt"] for r in ledger if r["type"] == "saved"} | set(range(1, iterations + 1))):
        if problem := checkpoint_problem(ckpts / f"step_{k:06d}", k):
            lost.append(f"checkpoint {k}: {problem}")
    if left := sorted(p.name for p in ckpts.glob(".*")):
        lost.append(f"temp dirs left in {ckpts}: {left}")
    for a in attempts:  # every iteration from its resume point to its last checkpoint is in its own log
        start = resumed_from(a)[1] if resumed_from(a) else 0
        missing = [s for s in range(start, max(saved_by(ledger, a.index), default=0)) if s not in tb.get(a.index, {})]
        if missing:
            lost.append(f"attempt {a.index}: iterations {missing} checkpointed but not in its TensorBoard log")
        if a.left_behind:
            lost.append(f"attempt {a.index}: {a.left_behind} processes still running 20 s after it ended")
    logged = {s for steps in tb.values() for s, tags in steps.items() if set(CORE) <= set(tags)}
    if missing := sorted(set(range(iterations)) - logged):
        lost.append(f"iterations {missing} in no TensorBoard log")
    evals = {s for steps in tb.values() for s, tags in steps.items() if EVAL in tags}
    if not {0, iterations} <= evals:
        lost.append(f"{EVAL} logged at steps {sorted(evals)}, not at 0 and {iterations}")
    summary = run_dir / "eval_summary.json"
    data = json.loads(summary.read_text()) if summary.is_file() else {}
    if not (data.get("before") and data.get("after") and data["curve"][-1]["step"] == iterations):
        lost.append("eval_summary.json missing or without its before/after evals")
    return lost


# -- report -------------------------------------------------------------------------------------


def numbers(result: dict, attempts: list[Attempt], iterations: int, run_dir: Path) -> dict:
    """The headline numbers beside the fault table."""
    ledger, tb, ends = result["ledger"], result["tb"], result["ends"]
    rows = {(r["attempt"], r["step"]): r for r in ledger if r["type"] == "step"}
    logged = {k: tb[k[0]][k[1]] for k in rows if k[1] in tb.get(k[0], {}) and set(CORE) <= set(tb[k[0]][k[1]])}
    env = [
        r for r in ledger if r["type"] == "inject" and r["kind"] in ENV_FAULTS and (r["attempt"], r["step"]) in logged
    ]
    numeric = {(r["attempt"], r["step"]) for r in ledger if r["type"] == "inject" and r["kind"] in NUMERIC_FAULTS}
    return {
        "iterations logged (with reruns)": len(logged),
        "updates skipped": round(sum(m["train/skipped_updates"] for m in logged.values())),
        "updates skipped, expected": sum(rows[k].get("updates", 0) for k in logged if k in numeric),
        "env faults injected (logged iterations)": len(env),
        "trajectories they hit": sum(r["expected_faults"] for r in env),
        "rollout/env_faults counted by rspo": round(sum(m["rollout/env_faults"] for m in logged.values())),
        "worker restarts (EnvPool.restarts)": sum(rows[k]["restarts"] for k in logged),
        "worker restarts, expected (hangs + deaths)": sum(r["kind"] != "env_raise" for r in env),
        "attempts": len(attempts),
        "attempt ends": dict(Counter(ends)),
        "reruns that resumed from the latest checkpoint": "{} of {} (the rest killed while starting)".format(
            sum((resumed_from(b) or ("",))[0] == b.start for b in attempts[1:] if got_to_resume(b)), len(attempts) - 1
        ),
        "checkpoints present and loadable": sum(
            not checkpoint_problem(run_dir / "checkpoints" / f"step_{k:06d}", k) for k in range(1, iterations + 1)
        ),
        "processes left behind by a killed trainer": sum(a.left_behind for a in attempts),
    }


def print_report(result: dict, facts: dict, iterations: int, seconds: float) -> None:
    print(f"\nsoak: {iterations} iterations, {seconds:.0f} s wall")
    print(f"{'fault':<16}{'injected':>9}{'survived':>10}{'cut short':>11}{'not survived':>14}")
    for kind, c in result["table"].items():
        print(f"{kind:<16}{c['injected']:>9}{c['survived']:>10}{c['cut short']:>11}{c['not survived']:>14}")
    width = max(map(len, facts))
    for key, value in facts.items():
        print(f"{key:<{width}}  {value}")
    for problem in result["problems"]:
        print(f"PROBLEM: {problem}")
    print("nothing lost, every fault judged survived" if not result["problems"] else "FAILED")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=12, help="RL iterations of the run")
    p.add_argument("--seed", type=int, default=0, help="draws the fault plan and the kill times")
    p.add_argument("--out", default="", help="an empty directory (default: a new temporary one)")
    p.add_argument("--sft-episodes", type=int, default=40, help="warm-start demonstrations (0: random init)")
    p.add_argument("--max-attempts", type=int, default=0, help="reruns allowed (default: iterations + 12)")
    args = p.parse_args(argv)
    import tempfile

    out = Path(args.out or tempfile.mkdtemp(prefix="rspo-soak-")).resolve()
    if (out / "ledger.jsonl").exists():
        p.error(f"--out {out} holds an earlier soak; choose an empty directory")
    out.mkdir(parents=True, exist_ok=True)
    t0, run_dir = time.monotonic(), out / "run"
    print(f"soak: {args.iterations} iterations, seed {args.seed}, in {out}", flush=True)
    init = warm_start(out, args.sft_episodes)
    events = plan(args.iterations, turns=3, seed=args.seed)  # turns: CONFIG's rollout.max_turns
    (out / "plan.json").write_text(json.dumps(events, indent=1))
    overrides = [*CONFIG, *init, f"train.steps={args.iterations}", f"train.output_dir={run_dir}"]
    max_attempts = args.max_attempts or args.iterations + 12
    attempts = run_attempts(out, run_dir, overrides, args.iterations, args.seed, max_attempts)
    (out / "attempts.json").write_text(json.dumps([dataclasses.asdict(a) for a in attempts], indent=1))
    result = judge(out, run_dir, args.iterations, attempts)
    facts = numbers(result, attempts, args.iterations, run_dir)
    seconds = time.monotonic() - t0
    print_report(result, facts, args.iterations, seconds)
    report = {"faults": result["table"], "problems": result["problems"], "numbers": facts, "seconds": seconds}
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
