"""Segment reductions: statistics of rows grouped by an integer id, with no Python loop.

Every estimator in rspo reduces per-row values over *segments* (a task group, an anchor
group, a trajectory). `Segments` holds how rows map to segments and offers the primitives
every statistic here is built from, in one of two layouts picked by `Segments.of(ids)`:

  blocks     rows 0..L-1 are segment 0, rows L..2L-1 segment 1, ... (equal, contiguous,
             in id order: e.g. task groups of G + E trajectories). Values are viewed as
             (S, L); sums reduce dim 1 and a per-segment value broadcasts as (S, 1), so no
             gather or scatter runs.
  scattered  any other ids. Values stay (N,); sums by `index_add_`, per-segment values
             reach rows by `index_select`.

    V = seg.rows(v)      (N,) -> the layout's row shape
    seg.sum(V)           -> (S,) per-segment sums
    seg.expand(s)        (S,) -> broadcastable against V: each row gets its segment's value
    seg.flat(V)          -> (N,)

Both layouts give the same numbers (tested); blocks is several times faster on CPU. For
per-trajectory recurrences there is a log-depth scan over contiguous runs. The same code
runs on CPU and CUDA.

Notation
  N  rows (turns or trajectories)
  S  segments: ids in [0, S); ids need not be contiguous, S = max id + 1 sizes the buffers
  x  (N,) float values;  ids  (N,) long segment id of each row

Determinism: on CPU every reduction here is sequential and bit-reproducible. On CUDA,
`index_add_` accumulates with atomics (float sums may differ in the last bit from run to
run) unless the trainer sets `torch.use_deterministic_algorithms(True)`, under which
PyTorch switches to a deterministic kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor


class Segments:
    """Rows (N,) mapped to segments [0, S): `sum`, `expand` and `count` in the layout that fits.

    Build with `Segments.of(ids)`; `num` is S, `ids` the segment of each row.
    """

    def __init__(self, ids: Tensor, num: int, block: int | None = None) -> None:
        self.ids, self.num, self.block = ids, num, block  # block: L in the blocks layout, else None

    @classmethod
    def of(cls, ids: Tensor, num: int | None = None) -> Segments:
        """Segments of `ids` (N,); `num` (max id + 1) saves one host sync on CUDA."""
        n = ids.numel()
        num = num_segments(ids) if num is None else num
        block = None
        if n and n % num == 0:  # blocks layout when ids == [0]*L + [1]*L + ... + [S-1]*L
            heads = torch.arange(num, device=ids.device).unsqueeze(1)  # (S, 1)
            block = n // num if torch.equal(ids.view(num, n // num), heads.expand(num, n // num)) else None
        return cls(ids, num, block)

    def rows(self, v: Tensor) -> Tensor:
        """(N,) values in the layout's row shape: (S, L) for blocks, (N,) otherwise."""
        return v.reshape(self.num, self.block) if self.block is not None else v

    def flat(self, v: Tensor) -> Tensor:
        """Row-shaped values back to (N,)."""
        return v.reshape(-1)

    def sum(self, v: Tensor) -> Tensor:
        """out[s] = sum_{i: ids[i] = s} v[i] over row-shaped v -> (S,)."""
        if self.block is not None:  # (S, L) @ ones(L): BLAS, about twice as fast as v.sum(1) on short rows
            return v @ v.new_ones(self.block)
        return v.new_zeros(self.num).index_add_(0, self.ids, v)

    def expand(self, s: Tensor) -> Tensor:
        """Per-segment s (S,) as a row-shaped value: out[i] = s[ids[i]] ((S, 1) for blocks)."""
        if self.block is not None:
            return s.unsqueeze(1)
        return s.index_select(0, self.ids)

    def count(self, w: Tensor | None = None, dtype: torch.dtype = torch.float32) -> Tensor:
        """Rows per segment (S,), or the sum of row-shaped weights `w` when given."""
        if w is not None:
            return self.sum(w)
        if self.block is not None:
            return torch.full((self.num,), self.block, dtype=dtype, device=self.ids.device)
        return self.sum(torch.ones(self.ids.shape, dtype=dtype, device=self.ids.device))


def weights(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool mask as 0/1 floats. (Through uint8: PyTorch's CPU bool -> float copy is
    several times slower than uint8 -> float; the values are the same.)"""
    return mask.view(torch.uint8).to(dtype)


def num_segments(ids: Tensor) -> int:
    """S = max id + 1 (0 for no rows). One host sync on CUDA."""
    return int(ids.amax()) + 1 if ids.numel() else 0


def segment_mean_std(x: Tensor, seg: Segments, mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row deviation from its segment's mean, and per-segment std and row count,
    over the rows where `mask` is true.

        n_s    = sum_i w_i [ids_i = s]                 w_i = mask_i (1 when mask is None)
        mu_s   = sum_i w_i x_i [ids_i = s] / n_s
        sd_s^2 = sum_i w_i (x_i - mu_s)^2 [ids_i = s] / (n_s - 1)

    The mean takes two passes: mu' from the sums, then the mean of the shifted values
    d_i = x_i - mu'_s. For a segment of equal values x, d is one small constant c (x and mu'
    are a few ulps apart, so x - mu' is exact and has a few significant bits), its sum
    n * c is exact and so is n * c / n: the deviation d - c is exactly 0 and so is the std.
    In one pass, a float32 n * x / n can miss x by an ulp, which a later 1 / (std + eps)
    blows up into a visible advantage. The shifted second pass is also the textbook cure
    for cancellation when the spread is small next to the mean.

    Returns (dev = w_i (x_i - mu_s) in the row shape of `seg.rows`, std (S,), count (S,));
    segments with n_s < 2, or equal values, get std ~0 (see the clamp below).
    """
    x = seg.rows(x)
    w = None if mask is None else seg.rows(weights(mask, x.dtype))
    count = seg.count(w, x.dtype)  # (S,) n_s
    n = count.clamp(min=1)  # (S,) empty segments divide by 1
    mean = seg.sum(x if w is None else w * x) / n  # (S,) mu'_s
    d = x - seg.expand(mean)  # shifted values (in-place ops below reuse this buffer)
    if w is not None:
        d.mul_(w)  # 0 outside the mask
    dev = d.sub_(seg.expand(seg.sum(d) / n))  # x_i - mu_s
    if w is not None:
        dev.mul_(w)
    var = seg.sum(dev * dev) / (count - 1).clamp(min=1)  # (S,)
    # std >= sqrt(tiny) ~ 1e-19 (float32): it vanishes next to any eps, keeps 1 / std finite,
    # and keeps sqrt off exact zeros, on which PyTorch's CPU kernel is ~15x slower.
    return dev, var.clamp(min=torch.finfo(var.dtype).tiny).sqrt(), count


def discounted_cumsum(x: Tensor, link: Tensor, max_len: int) -> Tensor:
    """Reverse discounted cumulative sum along linked rows: y_t = x_t + link_t * y_{t+1}.

    link (N,) is c_t where row t + 1 continues row t's run and 0 at a run's last row, so

        y_t = sum_{k>=0} (prod_{j<k} link_{t+j}) x_{t+k}   (for constant c: sum_k c^k x_{t+k} within the run)

    `max_len` bounds the run lengths (e.g. max turn index + 1). Used for discounted returns
    (c = gamma) and GAE (c = gamma * lambda) over the rows of a `TurnBatch`, sorted by
    (traj_id, turn), with link_t = c * (1 - last_t).

    Vectorized as a Hillis-Steele scan of the affine recurrence: keep (a_t, b_t) with
    y_t = b_t + a_t * y_{t+s}; doubling s composes two links,
        b_t <- b_t + a_t * b_{t+s},   a_t <- a_t * a_{t+s},
    so ceil(log2 max_len) steps of two O(N) tensor ops (shifted slices, no gathers) finish
    every run. a_t is 0 once the chain leaves the run, so whatever lies at t+s then
    (another run, or the zero padding past the end) contributes nothing.
    Loop reference: `segment_discounted_cumsum_loop`.
    """
    n = x.numel()
    # Two buffers each for a and b (a step reads the previous step's values only), padded
    # with max_len zeros so that reading row t + s never runs off the end.
    a, b = x.new_empty(2, n + max_len), x.new_empty(2, n + max_len)
    a[:, n:], b[:, n:] = 0, 0
    a[0, :n], b[0, :n] = link, x.detach()  # advantages and returns are constants: no gradient flows
    s, cur = 1, 0
    while s < max_len:
        nxt = 1 - cur
        torch.addcmul(b[cur, :n], a[cur, :n], b[cur, s : s + n], out=b[nxt, :n])  # b_t + a_t b_{t+s}
        if 2 * s < max_len:  # the last step needs no a
            torch.mul(a[cur, :n], a[cur, s : s + n], out=a[nxt, :n])  # a_t a_{t+s}
        s, cur = 2 * s, nxt
    return b[cur, :n]


def segment_discounted_cumsum_loop(x: Tensor, coef: float, ids: Tensor) -> Tensor:
    """Loop reference for `discounted_cumsum` with link_t = coef while row t+1 has row t's id:
    walk each run of equal consecutive `ids` backwards."""
    xs, ids_l = x.tolist(), ids.tolist()
    y = [0.0] * len(xs)
    for t in reversed(range(len(xs))):
        same_run = t + 1 < len(xs) and ids_l[t + 1] == ids_l[t]
        y[t] = xs[t] + (coef * y[t + 1] if same_run else 0.0)
    return torch.tensor(y, dtype=x.dtype, device=x.device)
