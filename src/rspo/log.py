"""Metrics: TensorBoard scalars with namespaced keys (`rollout/…`, `loss/…`, `perf/…`,
`eval/…`), a console line per step, and sample trajectories as text."""

from __future__ import annotations

import json
from pathlib import Path


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
        print(f"step {step}/{total} " + " ".join(parts), flush=True)

    def close(self) -> None:
        if self.writer:
            self.writer.close()


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
