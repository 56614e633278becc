"""Checkpoints that resume exactly, written atomically, and that run no code when loaded.

Layout of `<output_dir>/checkpoints/step_000010/`:
  policy/          the policy's weights as safetensors (LoRA: one stock peft adapter dir per
                   policy, so `PeftModel.from_pretrained(base, policy/target)` loads it; full
                   fine-tuning: `save_pretrained` per policy), tokenizer, value head
  trainer.pt       optimizer and scheduler states, RNG states, step, replay buffer, eval
                   curve and trace: tensors and plain containers (dict, list, tuple, str,
                   int, float, bool, None) only, in `torch.save`'s zip archive
  config.yaml      the resolved config
The directory is written under a temporary name and renamed when complete, so a killed
run never leaves a half-written checkpoint that `train.resume=auto` would pick up.

Loading builds no Python object a file names (`rspo.safe_load.load_data`: `torch.load(weights_only=True)`,
after every record of the archive passed its CRC check; safetensors hold no code). A file
that holds pickled objects, is truncated or corrupted, or is a trainer.pt of the old format
(rspo's earlier versions pickled numpy's RNG state) is refused with one line naming it.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from rspo.config import ConfigError, load_config, to_dict
from rspo.config_rules import resume_mismatches
from rspo.policy_io import check_weights
from rspo.safe_load import load_data, pickled_objects
from rspo.sft import run_base

PREFIX = "step_"
COMPLETE = ("trainer.pt", "config.yaml", "policy/policy.json")  # what every checkpoint holds


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


def require(path: str | Path) -> Path:
    """`rspo eval --checkpoint PATH`: PATH must be one complete checkpoint (weights, trainer
    state, recorded config), else a ConfigError naming what is wrong, before anything is written."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"--checkpoint {path}: no such directory")
    if latest(path) is not None:
        raise ConfigError(f"--checkpoint {path}: a run's directory, not a checkpoint; its latest is {latest(path)}")
    missing = [f for f in COMPLETE if not (path / f).is_file()]
    if missing:
        raise ConfigError(f"--checkpoint {path}: not a complete checkpoint (missing {', '.join(missing)})")
    return path


def weights_digest(directory: Path) -> str:
    """A short hash of every file under `directory` (names and bytes): which weights these are."""
    h = hashlib.sha256()
    for f in sorted(p for p in directory.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(directory)).encode() + b"\0")
        with open(f, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:12]


def rng_state() -> dict:
    """This process's RNG states, as tensors and plain containers: Python's (version, 625
    ints, gauss), numpy's in its dict form with the key as a list of ints, torch's tensors."""
    numpy_state = np.random.get_state(legacy=False)
    numpy_state["state"]["key"] = numpy_state["state"]["key"].tolist()  # (624,) uint32
    return {
        "python": random.getstate(),
        "numpy": numpy_state,
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    """Restore `rng_state()`'s states exactly (tuples may come back as lists)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(state["numpy"])  # numpy takes the key as a list
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def check_output_dir(output_dir: str | Path, resume: str) -> None:
    """Before a run builds anything: `train.output_dir` must be writable, and must not hold
    another run's checkpoints or results unless `train.resume` continues it."""
    out = Path(output_dir)
    if not resume and (latest(out) is not None or (out / "eval_summary.json").exists()):
        raise FileExistsError(
            f"train.output_dir={out} already holds a run: continue it with train.resume=auto, start another"
            f" with train.output_dir=<a new dir>, or delete {out} to start it over"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write_test_{os.getpid()}"  # one per process: ranks check at once
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise OSError(f"train.output_dir={out} is not writable: {e.strerror or e}") from None


def check_resume(cfg) -> None:
    """Before a resumed run builds anything: the checkpoint's recorded `config.yaml` must
    agree with `cfg` on every key that changes what is trained, and its files must load as
    data (its trainer.pt, its policy's weights). Only the keys in
    `rspo.config_rules.MAY_CHANGE` (how long, how watched, where saved) may differ."""
    path = resolve(cfg.train.resume, cfg.train.output_dir)
    if path is None:
        return
    new = to_dict(cfg)
    new["model"]["init_from"] = run_base(cfg)  # as `train.setup` will set it
    differ = resume_mismatches(to_dict(load_config(path / "config.yaml", validate=False)), new)
    if differ:
        raise ConfigError(
            f"train.resume: {path} was trained with other values ({'; '.join(differ)}): resume it with the run's"
            " values, or start a new run in another train.output_dir"
        )
    load_trainer_state(path, mmap=True)  # its files load as data (`load_data`), reading no tensors
    check_weights(path / "policy", cfg.model.allow_pickle_adapters)


def save(
    output_dir: str | Path, step: int, write_policy: Callable[[Path], None], trainer_state: dict, config_yaml: str
) -> Path:
    """Write checkpoint `step` atomically (temp dir + rename); returns its path. A failed
    write (a full disk) removes its temp dir and leaves the earlier checkpoints as they were.
    `write_policy(dir)` writes the policy's weights (`rspo.policy_io.save_policy`)."""
    root = checkpoint_dir(output_dir)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp_{PREFIX}{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        write_policy(tmp / "policy")
        torch.save({**trainer_state, "step": step, "rng": rng_state()}, tmp / "trainer.pt")
        objects = pickled_objects(tmp / "trainer.pt")
        if objects:  # a bug: this run could not resume from it
            raise TypeError(f"trainer state holds objects that `load_data` refuses: {', '.join(objects)}")
        (tmp / "config.yaml").write_text(config_yaml)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        kept = latest(output_dir)
        raise OSError(
            f"checkpoint of step {step} not written ({e.strerror or e}); "
            + (f"the latest complete one, {kept}, is intact" if kept else "no earlier checkpoint")
        ) from None
    replace_dir(tmp, final)  # rewriting a step replaces it
    return final


def replace_dir(tmp: Path, final: Path) -> None:
    """Rename the complete directory `tmp` to `final`. An existing `final` is renamed away
    first and then deleted, never deleted in place (a half-deleted dir would look complete)."""
    if final.exists():
        old = final.with_name(f".old_{final.name}")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)


def load_trainer_state(path: Path, mmap: bool = False) -> dict:
    """Checkpoint `path`'s trainer.pt (`load_data`). `mmap`: map its tensors onto the CPU,
    not read them (a check that it loads, before a resumed run builds anything). An
    old-format trainer.pt (numpy's RNG state pickled) is a ConfigError that says so and the
    ways forward."""
    file = Path(path) / "trainer.pt"
    try:
        return load_data(file, mmap=mmap, map_location="cpu" if mmap else None)
    except ConfigError:
        objects = pickled_objects(file)
        if objects and all(name.startswith("numpy.") for name in objects):
            raise ConfigError(
                f"{file}: an rspo checkpoint of the old format (it pickles numpy's RNG state), refused since "
                f"loading a pickle can run code; its weights still evaluate (rspo eval --checkpoint {path}), and "
                "the rspo version that wrote it resumes it"
            ) from None
        raise
