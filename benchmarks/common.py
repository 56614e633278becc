"""Helpers shared by the benchmarks: timing, the allocator, and the README's default model config."""

from __future__ import annotations

import ctypes
import ctypes.util
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


def keep_freed_memory() -> str:
    """Stop glibc from returning freed heap memory to the OS between calls; say what was done.

    By default glibc trims the heap top once 128 KiB+ is free, so the next call's tensors
    fault their pages in again. Whether that happens depends on where earlier allocations
    landed: the same code measured 0.9 ms in one process and 1.4 ms in the next (0 vs ~400
    page faults per call). Raising M_TRIM_THRESHOLD makes the timings repeatable; it is the
    same for both sides of every ratio. (jemalloc or tcmalloc, which PyTorch's CPU tuning
    guide suggests, do the same for a whole training run.)
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        ok = libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD = 1 GiB
    except (OSError, TypeError, AttributeError):
        ok = 0
    return "glibc heap trimming off (M_TRIM_THRESHOLD 1 GiB)" if ok == 1 else "default allocator"
