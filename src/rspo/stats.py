"""Uncertainty for eval numbers: a success rate's interval, and a difference's.

A success rate from n tasks gets a 95% Wilson score interval (good at small n and near
0 or 1, where the normal approximation fails). A difference between two arms evaluated
on the *same* tasks (before vs after RL; RSPO vs a baseline) gets a percentile bootstrap
that resamples tasks jointly for both arms (the pairing removes the tasks' own
difficulty from the noise) and, when an arm has several runs (seeds), resamples its runs
too, so seed-to-seed variation widens the interval as it should.
"""

from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion `successes / n` ((0, 1) when n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    lo = 0.0 if successes <= 0 else max(0.0, centre - half)  # exact at the ends (no 1e-18 residue)
    hi = 1.0 if successes >= n else min(1.0, centre + half)
    return lo, hi


def bootstrap_diff(a, b, resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(mean(b) - mean(a), lo, hi): the difference of two arms and its percentile interval.

    `a` is (Ra, T) and `b` is (Rb, T): per-task values (1/0 success, or a score) of Ra and
    Rb runs on the same T tasks, in the same task order; a 1-D array is one run. Each
    resample draws T tasks with replacement (the same draw for both arms) and, per arm,
    its runs with replacement. Deterministic in `seed`.
    """
    a, b = np.atleast_2d(np.asarray(a, dtype=float)), np.atleast_2d(np.asarray(b, dtype=float))
    if a.shape[1] != b.shape[1] or a.shape[1] == 0:
        raise ValueError(f"both arms need the same, non-zero number of tasks; got {a.shape[1]} and {b.shape[1]}")
    rng = np.random.default_rng(seed)
    tasks = rng.integers(0, a.shape[1], (resamples, 1, a.shape[1]))

    def resampled_means(x: np.ndarray) -> np.ndarray:
        runs = rng.integers(0, x.shape[0], (resamples, x.shape[0], 1))
        return x[runs, tasks].mean(axis=(1, 2))

    mean_a = resampled_means(a)  # draws a's runs before b's, as the loop reference does
    diffs = resampled_means(b) - mean_a
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(diffs, [tail, 100 - tail])
    return float(b.mean() - a.mean()), float(lo), float(hi)


def bootstrap_mean(x, resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(mean(x), lo, hi): the mean of (R, T) per-task values of R runs (e.g. paired
    differences, or success at one eval point) and its percentile interval, runs and tasks
    resampled as in `bootstrap_diff` (it is that function against an arm of zeros)."""
    x = np.atleast_2d(np.asarray(x, dtype=float))
    return bootstrap_diff(np.zeros_like(x), x, resamples, seed, level)


def bootstrap_diff_loop(a, b, resamples: int = 10_000, seed: int = 0, level: float = 0.95):
    """The readable reference of `bootstrap_diff`: one resample at a time, same random draws."""
    a, b = np.atleast_2d(np.asarray(a, dtype=float)), np.atleast_2d(np.asarray(b, dtype=float))
    rng = np.random.default_rng(seed)
    num_tasks = a.shape[1]
    tasks = rng.integers(0, num_tasks, (resamples, 1, num_tasks))
    runs_a = rng.integers(0, a.shape[0], (resamples, a.shape[0], 1))
    runs_b = rng.integers(0, b.shape[0], (resamples, b.shape[0], 1))
    diffs = []
    for r in range(resamples):
        picked_tasks = tasks[r, 0]
        mean_a = np.mean([a[run, t] for run in runs_a[r, :, 0] for t in picked_tasks])
        mean_b = np.mean([b[run, t] for run in runs_b[r, :, 0] for t in picked_tasks])
        diffs.append(mean_b - mean_a)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(diffs, [tail, 100 - tail])
    return float(b.mean() - a.mean()), float(lo), float(hi)


def fmt_interval(value: float, lo: float, hi: float, signed: bool = False, sci: bool = False) -> str:
    """`0.312 [0.225, 0.414]`; `+0.156 [+0.063, +0.250]` with `signed`; `3.3e-04 [2.1e-04, 4.6e-04]`
    with `sci`, for quantities (a KL, say) that three decimals would print as 0.000."""
    f = "{:" + "+" * signed + (".1e}" if sci else ".3f}")
    return f"{f.format(value)} [{f.format(lo)}, {f.format(hi)}]"
