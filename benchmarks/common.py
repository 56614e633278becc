"""Helpers shared by the benchmarks: timing, and the README's default model config."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rspo.config import Config, load_config

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


def default_model_config(*overrides: str) -> Config:
    """The README's default config (its tiny model: `model.*` of configs/default.yaml) with
    `overrides`; everything the benchmark sets itself goes in the overrides."""
    return load_config(DEFAULT_CONFIG, list(overrides))


def timed(fn: Callable[[], object], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    """Best (minimum) wall time of `fn` over `repeats` calls, in seconds, after one warm-up call.

    The minimum is the least noisy estimate on a shared machine (as `timeit` advises).
    """
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)
