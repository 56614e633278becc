"""Metrics: TensorBoard scalars with namespaced keys (`rollout/…`, `loss/…`, `perf/…`,
`eval/…`), a console line per step, sample trajectories as text, and the run's progress
bar (iteration k/N, elapsed, ETA) above the per-phase bars."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

# Per-iteration metrics every run keeps in its eval_summary.json (`trace`), with the words
# of the sweep's mechanism table and plot (`rspo.results`): training success of each
# policy, where the target's outcome signal came from (`rspo.rewards.signal`), and what the
# update cost the target (its size, its sampled tokens' -log p, the off-policy rows' share
# and importance weights).
TRACE = {
    "rollout/success_rate": "target's training success",
    "explorer/rollout/success_rate": "explorer's training success",
    "rollout/process_positive": "target trajectories with a positive process return",
    "rollout/groups_without_signal": "target groups without outcome signal",
    "rspo/groups_rescued": "failed target groups rescued by explorer or replay",  # or the expert's rows
    "rspo/explorer_only_successes": "explorer successes where the target had none (per iteration)",
    "rspo/replay_only_successes": "replayed successes where the target had none (per iteration)",
    "rspo/replayed": "replayed trajectories joining the target's groups (per iteration)",
    "policy/approx_kl": "target's update size: approximate KL from its rollout policy, on its own rows",
    "rspo/expert_only_successes": "expert successes where the target had none (per iteration)",
    "policy/sampled_nll": "target's sampled tokens' mean -log p (its own rows)",
    "loss/grad_norm": "target's gradient norm before clipping",
    "offpolicy/token_frac": "share of the target's training tokens sampled by another policy",
    "offpolicy/weight_mean": "off-policy tokens' importance weight, mean",
    "offpolicy/weight_std": "off-policy tokens' importance weight, spread (std)",
    "rollout/noop_rate": "target's turns the env did not apply",
    "explorer/rollout/invalid_action_rate": "explorer's turns with no well-formed action",
    "explorer/rollout/noop_rate": "explorer's turns the env did not apply",
}


class Logger:
    """Writes on the main process only; the other ranks get a logger that does nothing."""

    def __init__(self, log_dir: str | Path, enabled: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self.writer = None
        self.log_dir = Path(log_dir)
        if enabled and tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.log_dir))

    def scalars(self, metrics: dict[str, float], step: int) -> None:
        if not self.writer:
            return
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def text(self, tag: str, text: str, step: int) -> None:
        if self.writer:
            self.writer.add_text(tag, text.replace("\n", "  \n"), step)

    def console(self, step: int, total: int, metrics: dict[str, float], keys: list[str]) -> None:
        if not self.enabled:
            return
        label = {k: k.replace("rollout/", "").replace("loss/", "").replace("perf/", "").replace("/", "_") for k in keys}
        parts = [f"{label[k]}={metrics[k]:.3g}" for k in keys if k in metrics]
        tqdm.write(f"step {step}/{total} " + " ".join(parts))  # above the progress bars
        sys.stdout.flush()

    def close(self) -> None:
        if self.writer:
            self.writer.close()


class RunProgress:
    """One bar for the whole run, above the per-phase bars (rollout, update, eval):
    `run: iteration k/N |███  | 05:12 elapsed, ETA 07:40 (2 evals to go)`.

    The ETA counts the evals still to come at their own cost: it fits seconds ≈ a ·
    iterations + b · evals by least squares over the intervals between `update` calls (a
    fresh run's first interval is the eval before RL alone, which gives b at once), and
    while a and b cannot be told apart, both are the mean seconds per unit of work.
    Save time is folded into the iterations'. Quiet when `enabled` is False."""

    def __init__(self, total: int, step: int, evals_done: int, eval_every: int, enabled: bool = True,
                 clock: Callable[[], float] = time.perf_counter):  # fmt: skip
        later = sum(1 for s in range(step + 1, total) if eval_every and s % eval_every == 0)
        self.total, self.clock = total, clock
        self.evals_total = evals_done + (step == 0) + later + 1  # + the eval before RL, + the final one
        self.last = (step, evals_done, clock())
        self.sums = dict.fromkeys(("xx", "xy", "yy", "xs", "ys", "s", "n"), 0.0)  # x: iterations, y: evals, s: seconds
        fmt = "run: iteration {n_fmt}/{total_fmt} |{bar}| {elapsed} elapsed{postfix}"
        self.bar = tqdm(total=total, initial=step, position=0, disable=not enabled, bar_format=fmt)

    def update(self, step: int, evals_done: int) -> None:
        """Record the work done since the last call: the run is at iteration `step` with
        `evals_done` evals behind it."""
        now = self.clock()
        x, y, s = step - self.last[0], evals_done - self.last[1], now - self.last[2]
        for key, value in zip(self.sums, (x * x, x * y, y * y, x * s, y * s, s, x + y)):
            self.sums[key] += value
        self.last = (step, evals_done, now)
        eta = self.eta()
        left = self.evals_total - evals_done
        self.bar.n = step
        self.bar.set_postfix_str(
            f"ETA {'?' if eta is None else tqdm.format_interval(eta)} ({left} eval{'s' * (left != 1)} to go)"
        )

    def eta(self) -> float | None:
        """Seconds until the run ends (None before any work was timed)."""
        q = self.sums
        if not q["n"]:
            return None
        det = q["xx"] * q["yy"] - q["xy"] ** 2
        if det > 1e-9 * max(q["xx"] * q["yy"], 1e-12):  # a, b from the normal equations
            a = max(0.0, (q["yy"] * q["xs"] - q["xy"] * q["ys"]) / det)  # noise can make one negative
            b = max(0.0, (q["xx"] * q["ys"] - q["xy"] * q["xs"]) / det)
        else:
            a = b = q["s"] / q["n"]
        step, evals_done, _ = self.last
        return max(0.0, (self.total - step) * a + (self.evals_total - evals_done) * b)

    def close(self) -> None:
        self.bar.n = self.total
        self.bar.set_postfix_str("", refresh=False)  # the run is over: no ETA
        self.bar.close()


def format_transcript(traj) -> str:
    """A trajectory as readable text for TensorBoard."""
    lines = [f"task ({traj.task_type}): {traj.task}", f"won={traj.won} score={traj.score:.2f} turns={traj.turns}"]
    for i, (obs, response) in enumerate(traj.transcript):
        lines += [f"[{i}] obs: {obs}", f"[{i}] response: {response}"]
    return "\n".join(lines)


def write_json(path: str | Path, data) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
