"""Intervals for eval numbers (rspo.stats): hand-computed cases and the bootstrap's loop reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rspo.stats import bootstrap_diff, bootstrap_diff_loop, fmt_interval, wilson


def test_wilson_hand_computed():
    # p = 2/10, z^2 = 3.8415: centre = (0.2 + 3.8415/20) / (1 + 0.38415) = 0.39207 / 1.38415 = 0.28326
    # half = 1.96/1.38415 * sqrt(0.16/10 + 3.8415/400) = 1.41602 * sqrt(0.025604) = 0.22658
    lo, hi = wilson(2, 10)
    assert lo == pytest.approx(0.28326 - 0.22658, abs=1e-4)  # 0.0567
    assert hi == pytest.approx(0.28326 + 0.22658, abs=1e-4)  # 0.5098
    # 0/n: lower bound exactly 0, upper bound z^2/(n+z^2) = 3.8415/99.8415 = 0.03848 for n = 96
    assert wilson(0, 96) == (0.0, pytest.approx(0.03848, abs=1e-4))
    assert wilson(0, 0) == (0.0, 1.0)


@given(st.integers(1, 500), st.data())
def test_wilson_contains_the_rate(n, data):
    k = data.draw(st.integers(0, n))
    lo, hi = wilson(k, n)
    assert 0.0 <= lo <= k / n <= hi <= 1.0


def test_bootstrap_matches_loop_reference():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 2, (3, 17)), rng.integers(0, 2, (2, 17))
    loop = bootstrap_diff_loop(a, b, resamples=300, seed=5)
    assert bootstrap_diff(a, b, resamples=300, seed=5) == pytest.approx(loop)
    one_a, one_b = rng.random(11), rng.random(11)
    loop = bootstrap_diff_loop(one_a, one_b, resamples=200)
    assert bootstrap_diff(one_a, one_b, resamples=200) == pytest.approx(loop)


def test_bootstrap_hand_computed_cases():
    # Same tasks, every task flips 0 -> 1: every resample's difference is exactly 1.
    assert bootstrap_diff([0, 0, 0, 0], [1, 1, 1, 1]) == (1.0, 1.0, 1.0)
    # Identical arms: the pairing makes every resample's difference exactly 0.
    assert bootstrap_diff([0, 1, 0, 1], [0, 1, 0, 1]) == (0.0, 0.0, 0.0)
    # 1 task of 4 improves: point +0.25; a resample has 0..4 copies of it, so the
    # difference lies in {0, .25, .5, .75, 1} and the interval is within [0, 1].
    diff, lo, hi = bootstrap_diff([0, 0, 0, 0], [1, 0, 0, 0])
    assert diff == 0.25 and lo == 0.0 and 0.5 <= hi <= 1.0


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 40), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2**31))
def test_bootstrap_interval_brackets_the_difference(tasks, runs_a, runs_b, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 2, (runs_a, tasks)), rng.integers(0, 2, (runs_b, tasks))
    diff, lo, hi = bootstrap_diff(a, b, resamples=400, seed=seed)
    assert diff == pytest.approx(b.mean() - a.mean())
    assert -1.0 <= lo <= hi <= 1.0
    assert lo - 0.2 <= diff <= hi + 0.2  # the percentile interval sits around the point estimate


def test_paired_is_tighter_than_ignoring_the_pairing():
    # Tasks differ wildly in difficulty; the after arm solves 10 more of 100. Pairing cancels
    # the task difficulty, so the interval excludes 0.
    rng = np.random.default_rng(0)
    before = (rng.random(100) < 0.3).astype(float)
    after = before.copy()
    after[np.flatnonzero(before == 0)[:10]] = 1.0
    diff, lo, hi = bootstrap_diff(before, after)
    assert diff == pytest.approx(0.10) and lo > 0.0


def test_bootstrap_rejects_mismatched_tasks():
    with pytest.raises(ValueError, match="same, non-zero number of tasks"):
        bootstrap_diff([0, 1], [0, 1, 1])


def test_fmt_interval():
    assert fmt_interval(0.3125, 0.2251, 0.4142) == "0.312 [0.225, 0.414]"
    assert fmt_interval(0.15625, 0.0625, 0.25, signed=True) == "+0.156 [+0.062, +0.250]"
    # an approx_kl of 3.3e-4 would print as 0.000 at three decimals
    assert fmt_interval(3.31e-4, 2.1e-4, 4.6e-4, sci=True) == "3.3e-04 [2.1e-04, 4.6e-04]"
