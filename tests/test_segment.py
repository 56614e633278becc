"""Segment reductions: both layouts agree, equal values normalize to exactly 0, the scan."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rspo.algorithms.grpo import group_normalize, group_normalize_loop
from rspo.segment import Segments, discounted_cumsum, segment_discounted_cumsum_loop


def blocks(num: int, size: int) -> torch.Tensor:
    return torch.arange(num).repeat_interleave(size)  # [0]*size + [1]*size + ...


def test_layout_detection():
    assert Segments.of(blocks(5, 3)).block == 3
    assert Segments.of(blocks(5, 1)).block == 1  # every row its own segment
    assert Segments.of(torch.tensor([0, 0, 1, 1, 1])).block is None  # unequal sizes
    assert Segments.of(torch.tensor([1, 1, 0, 0])).block is None  # blocks out of id order
    assert Segments.of(torch.tensor([0, 1, 0, 1])).block is None  # interleaved
    assert Segments.of(torch.tensor([0, 0, 2, 2])).block is None  # id 1 unused: S = 3 does not divide N


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("norm", ["mean_std", "mean"])
def test_blocks_and_scattered_layouts_agree(masked, norm):
    g = torch.Generator().manual_seed(0)
    ids = blocks(50, 6)
    x = torch.randn(300, generator=g)
    mask = torch.rand(300, generator=g) < 0.5 if masked else None
    fast = Segments.of(ids)
    slow = Segments(ids, 50)  # the same segments, forced to the scattered layout
    assert fast.block == 6 and slow.block is None
    a = group_normalize(x, fast, norm, mask=mask)
    b = group_normalize(x, slow, norm, mask=mask)
    torch.testing.assert_close(a, b)
    strided = torch.stack([x, -x], 1)[:, 0]  # the same values, not contiguous
    torch.testing.assert_close(group_normalize(strided, fast, norm, mask=mask), a)
    torch.testing.assert_close(a, group_normalize_loop(x, ids, norm, mask=mask), atol=1e-5, rtol=1e-5)


@settings(max_examples=200, deadline=None)
@given(
    st.floats(-1e4, 1e4, allow_nan=False, width=32),
    st.integers(2, 300),
    st.booleans(),
    st.sampled_from(["blocks", "scattered"]),
)
def test_equal_values_normalize_to_exactly_zero(value, size, masked, layout):
    # k equal float32 values: x - mean must be exactly 0, or 1 / (std + eps) would blow a
    # rounding ulp up into a visible advantage (in one float32 pass, k * x / k can miss x).
    # Masked: other rows hold a different value and must not disturb the masked group.
    ids = blocks(3, size)
    x = torch.full((3 * size,), value, dtype=torch.float32)
    mask = None
    if masked:
        mask = torch.arange(3 * size) % 3 != 1
        x[~mask] = 7.25
    seg = Segments.of(ids) if layout == "blocks" else Segments(ids, 3)
    out = group_normalize(x, seg, "mean_std", mask=mask)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("coef", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("extra", [0, 37])
def test_scan_matches_loop_long_runs(coef, extra):
    # runs of 1..99 rows; max_len exactly the longest run, or more (any bound is valid)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 100, (40,), generator=g)
    ids = torch.repeat_interleave(torch.arange(40), lengths)
    x = torch.randn(ids.numel(), generator=g, dtype=torch.float64)
    link = torch.zeros_like(x)
    link[:-1] = (ids[1:] == ids[:-1]).double() * coef  # coef inside a run, 0 at its last row
    y = discounted_cumsum(x, link, max_len=int(lengths.max()) + extra)
    torch.testing.assert_close(y, segment_discounted_cumsum_loop(x, coef, ids))
