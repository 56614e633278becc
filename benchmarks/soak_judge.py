"""The soak's verdict and report: each injected fault survived, cut short or not survived,
and everything lost, from the ledger (benchmarks/soak_faults.py), the run's TensorBoard
event files, eval_summary.json and checkpoints, and the driver's record of each attempt.

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
"""

from __future__ import annotations

import json
import signal
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from soak_faults import ENV_FAULTS, KINDS, NUMERIC_FAULTS, SAVE_FAULTS, read_ledger


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
    step_times: list = field(default_factory=list)  # seconds after start at which each iteration was seen done


def step_of(checkpoint_path) -> int:
    return int(Path(checkpoint_path).name.removeprefix("step_")) if checkpoint_path else 0


def end_of(a: Attempt, ledger: list[dict]) -> str:
    """How an attempt ended: finished, one of the crash faults, or unexpected."""
    fired = {r["kind"] for r in ledger if r["type"] == "inject" and r["attempt"] == a.index}
    if a.rc == 0:
        return "finished"
    if a.rc == -signal.SIGKILL and "kill_in_save" in fired:
        return "kill_in_save"
    if a.rc == -signal.SIGKILL and a.killed:
        return "kill"
    if a.rc == 1 and "disk_full" in fired and any("No space left on device" in e for e in save_errors(ledger, a.index)):
        return "disk_full"
    return "unexpected"


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

    from rspo.checkpoint import load_trainer_state

    if not (path / "trainer.pt").is_file():
        return "missing"
    try:
        state = load_trainer_state(path)
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


def save_errors(ledger: list[dict], attempt: int) -> list[str]:
    """The messages of `attempt`'s failed checkpoint writes."""
    return [r["error"] for r in ledger if r["type"] == "save_failed" and r["attempt"] == attempt]


def resumed_from(a: Attempt, ledger: list[dict]) -> tuple[str, int] | None:
    """The checkpoint `a` resumed from and its step, or None (started from scratch)."""
    found = [r for r in ledger if r["type"] == "resumed" and r["attempt"] == a.index]
    return (found[0]["path"], found[0]["step"]) if found else None


def got_to_resume(a: Attempt, ledger: list[dict]) -> bool:
    """Whether `a` ran far enough to have resumed (a rerun killed while starting up did not)."""
    return bool(resumed_from(a, ledger) or a.step_times or a.rc == 0 or not a.start)


def crash_problems(a: Attempt, end: str, attempts: list[Attempt], ledger: list[dict]) -> list[str]:
    """Why the crash that ended `a` was not survived: the first rerun that got that far did not
    resume from the latest complete checkpoint (or a save fault left the checkpoints wrong)."""
    reruns = [b for b in attempts[a.index + 1 :] if got_to_resume(b, ledger)]
    if not reruns:
        return ["no rerun got as far as resuming"]
    rerun, latest, why = reruns[0], attempts[a.index + 1].start, []
    got = resumed_from(rerun, ledger)
    if (got[0] if got else "") != rerun.start:
        why.append(f"the rerun resumed from {got and got[0] or 'scratch'}, the latest is {rerun.start or 'none'}")
    if end in SAVE_FAULTS:
        k = next(r["ckpt"] for r in ledger if r["type"] == "inject" and r["attempt"] == a.index and r["kind"] == end)
        if step_of(latest) >= k:
            why.append(f"the half-written checkpoint {k} was taken as complete")
    if end == "disk_full":
        kept = f"the latest complete one, {latest}, is intact" if latest else "no earlier checkpoint"
        if f"checkpoint of step {k} not written (No space left on device); {kept}" not in save_errors(ledger, a.index):
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
        start = resumed_from(a, ledger)[1] if resumed_from(a, ledger) else 0
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
            sum((resumed_from(b, ledger) or ("",))[0] == b.start for b in attempts[1:] if got_to_resume(b, ledger)),
            len(attempts) - 1,
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
