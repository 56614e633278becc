"""Files that load as data, never as code: `load_data` reads a `torch.save` archive with
`torch.load(weights_only=True)` (tensors and plain containers: dict, list, tuple, str, int,
float, bool, None) after every record passed its CRC check, and names what it refuses.
Checkpoints' trainer.pt and peft's pickle-format adapters (`model.allow_pickle_adapters`)
load through it.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from rspo.config import ConfigError


def load_data(file: Path, **kwargs) -> Any:
    """`torch.load(file, weights_only=True)`: tensors and plain containers, never a pickled
    object (building one can run any code). `file` must be a `torch.save` zip archive whose
    every record passes its CRC check. Else a ConfigError naming the file and why: the
    objects it pickles, or that it is truncated or corrupted."""
    damage = damaged(file)
    if damage:
        raise ConfigError(f"{file}: {damage}")
    try:
        return torch.load(file, weights_only=True, **kwargs)
    except Exception as e:  # a malformed pickle raises about anything: struct.error, KeyError, ...
        objects = pickled_objects(file)
        if objects:
            raise ConfigError(
                f"{file}: refused: it pickles Python objects ({', '.join(objects)}), and building them can run code;"
                " rspo loads tensors and plain containers only"
            ) from None
        if isinstance(e, pickle.UnpicklingError) and e.__context__:  # torch's wrapper: advice, then the cause
            e = e.__context__
        raise ConfigError(f"{file}: its pickle does not load as tensors and plain containers ({e})") from None


def damaged(file: Path) -> str:
    """Why `file` is not a whole `torch.save` zip archive, or "" when it is (every record
    read and checked against its CRC-32)."""
    try:
        with zipfile.ZipFile(file) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError) as e:
        return f"not a complete torch.save archive: truncated or corrupted ({e})"
    return f"corrupted: its record {bad} fails its CRC check" if bad else ""


def pickled_objects(file: Path) -> list[str]:
    """The Python objects (`module.name`) that `file`'s pickle names beyond tensors and plain
    containers, read without unpickling; [] when there are none or the pickle is malformed.
    For messages only: `torch.load(weights_only=True)` is what refuses them."""
    try:
        return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(file))
    except Exception:  # malformed (struct.error, EOFError, ...): `load_data` says so
        return []
