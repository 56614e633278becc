"""Checkpoints that resume exactly, written atomically.

Layout of `<output_dir>/checkpoints/step_000010/`:
  policy/          the policy's weights (LoRA: one stock peft adapter dir per policy, so
                   `PeftModel.from_pretrained(base, policy/target)` loads it; full
                   fine-tuning: `save_pretrained` per policy), tokenizer, value head
  trainer.pt       optimizer and scheduler states, RNG states, step, replay buffer
  config.yaml      the resolved config
The directory is written under a temporary name and renamed when complete, so a killed
run never leaves a half-written checkpoint that `train.resume=auto` would pick up.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

PREFIX = "step_"


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def latest(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    root = checkpoint_dir(output_dir)
    done = sorted(p for p in root.glob(f"{PREFIX}*") if p.is_dir() and (p / "trainer.pt").is_file())
    return done[-1] if done else None


def resolve(resume: str, output_dir: str | Path) -> Path | None:
    """`train.resume`: "" → None, "auto" → latest (or None), else that path (must exist)."""
    if not resume:
        return None
    if resume == "auto":
        return latest(output_dir)
    path = Path(resume)
    if not (path / "trainer.pt").is_file():
        raise FileNotFoundError(f"train.resume: {path} is not a checkpoint (no trainer.pt)")
    return path


def rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def check_output_dir(output_dir: str | Path, resume: str) -> None:
    """Before a run builds anything: `train.output_dir` must be writable, and must not hold
    another run's checkpoints or results unless `train.resume` continues it."""
    out = Path(output_dir)
    if not resume and (latest(out) is not None or (out / "eval_summary.json").exists()):
        raise FileExistsError(
            f"train.output_dir={out} already holds a run; set train.resume=auto to continue it,"
            " or choose another train.output_dir"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write_test_{os.getpid()}"  # one per process: ranks check at once
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise OSError(f"train.output_dir={out} is not writable: {e.strerror or e}") from None


def save(
    output_dir: str | Path, step: int, policy, trainer_state: dict, config_yaml: str, weights: dict | None = None
) -> Path:
    """Write checkpoint `step` atomically (temp dir + rename); returns its path. A failed
    write (a full disk) removes its temp dir and leaves the earlier checkpoints as they were.
    `weights`: the policy's `state_dicts()`, when gathered beforehand (FSDP)."""
    root = checkpoint_dir(output_dir)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp_{PREFIX}{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        policy.save(tmp / "policy", weights)
        torch.save({**trainer_state, "step": step, "rng": rng_state()}, tmp / "trainer.pt")
        (tmp / "config.yaml").write_text(config_yaml)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        kept = latest(output_dir)
        raise OSError(
            f"checkpoint of step {step} not written ({e.strerror or e}); "
            + (f"the latest complete one, {kept}, is intact" if kept else "no earlier checkpoint")
        ) from None
    if final.exists():  # rewriting a step: rename, never delete in place (a half-deleted dir would look complete)
        old = root / f".old_{PREFIX}{step:06d}"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)
    return final


def load_trainer_state(path: Path) -> dict:
    return torch.load(path / "trainer.pt", weights_only=False)
