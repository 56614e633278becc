"""Segment reductions: statistics of rows grouped by an integer id, with no Python loop.

Every estimator in rspo reduces per-row values over *segments* (a task group, an anchor
group, a trajectory). These helpers do it with `index_add_` (one pass, any row order)
and, for per-trajectory recurrences, a log-depth scan over contiguous runs. The same
code runs on CPU and CUDA.

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


def num_segments(ids: Tensor) -> int:
    """S = max id + 1 (0 for no rows). One host sync on CUDA."""
    return int(ids.max()) + 1 if ids.numel() else 0


def segment_sum(x: Tensor, ids: Tensor, num: int) -> Tensor:
    """out[s] = sum_{i: ids[i] = s} x[i]  -> (S,)."""
    return x.new_zeros(num).index_add_(0, ids, x)


def segment_mean_std(x: Tensor, ids: Tensor, num: int, mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Per-segment mean, unbiased std and row count over the rows where `mask` is true.

    Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which cancels
    catastrophically when the spread is small next to the mean.

        n_s    = sum_i w_i [ids_i = s]                 w_i = mask_i (1 when mask is None)
        mu_s   = sum_i w_i x_i [ids_i = s] / n_s
        sd_s^2 = sum_i w_i (x_i - mu_s)^2 [ids_i = s] / (n_s - 1)

    Returns (mean (S,), std (S,), count (S,)); segments with n_s < 2 get std 0 (and mean 0
    when n_s = 0).
    """
    w = None if mask is None else mask.to(x.dtype)  # (N,)
    count = segment_sum(torch.ones_like(x) if w is None else w, ids, num)  # (S,)
    mean = segment_sum(x if w is None else w * x, ids, num) / count.clamp(min=1)  # (S,)
    dev = x - mean.index_select(0, ids)  # (N,)
    if w is not None:
        dev = dev * w  # 0 outside the mask
    var = segment_sum(dev * dev, ids, num) / (count - 1).clamp(min=1)  # (S,)
    return mean, var.sqrt(), count


def run_lengths(ids: Tensor) -> Tensor:
    """Lengths of the runs of equal consecutive ids (e.g. turns per trajectory) -> (runs,)."""
    return torch.unique_consecutive(ids, return_counts=True)[1]


def segment_discounted_cumsum(x: Tensor, coef: float | Tensor, ids: Tensor, max_len: int | None = None) -> Tensor:
    """Reverse discounted cumulative sum inside each run of equal consecutive `ids`.

        y_t = x_t + c_t * y_{t+1}     while row t+1 belongs to row t's run, else y_t = x_t
            = sum_{k>=0} (prod_{j<k} c_{t+j}) x_{t+k}   (for constant c: sum_k c^k x_{t+k})

    Rows of a run must be contiguous and in time order (a `TurnBatch` sorted by
    (traj_id, turn)). Used for discounted returns (c = gamma) and GAE (c = gamma*lambda).

    Vectorized as a Hillis-Steele scan of the affine recurrence: keep (a_t, b_t) with
    y_t = b_t + a_t * y_{t+s}; doubling s composes two links,
        b_t <- b_t + a_t * b_{t+s},   a_t <- a_t * a_{t+s},
    so ceil(log2 max_len) steps of O(N) tensor ops (shifted slices, no gathers) finish
    every run. a_t is 0 once the chain leaves the run, so whatever lies at t+s then
    (another run, or the zero padding past the end) contributes nothing.
    `max_len` (the longest run) saves one host sync when the caller knows it.
    Loop reference: `segment_discounted_cumsum_loop`.
    """
    n = x.numel()
    if n == 0:
        return x.clone()
    cont = torch.zeros(n, dtype=torch.bool, device=x.device)  # (N,) row t+1 continues row t's run
    cont[:-1] = ids[1:] == ids[:-1]
    a = cont.to(x.dtype) * torch.as_tensor(coef, dtype=x.dtype, device=x.device)  # (N,) c_t, 0 at run ends
    b = x.detach().clone()  # (N,) advantages and returns are constants: no gradient flows
    if max_len is None:
        max_len = int(run_lengths(ids).max())
    s = 1
    while s < max_len and s < n:
        # rows t < N - s; rows t >= N - s have t + s past the end, where a_{t+s} = b_{t+s} = 0
        b[:-s] += a[:-s] * b[s:]  # b_t + a_t b_{t+s}  (the right side is computed before the write)
        a[:-s] = a[:-s] * a[s:]  # a_t a_{t+s}
        a[-s:] = 0
        s *= 2
    return b


def segment_discounted_cumsum_loop(x: Tensor, coef: float | Tensor, ids: Tensor) -> Tensor:
    """Loop reference for `segment_discounted_cumsum`: walk each run backwards."""
    xs, ids_l = x.tolist(), ids.tolist()
    cs = [float(coef)] * len(xs) if not torch.is_tensor(coef) or coef.dim() == 0 else coef.tolist()
    y = [0.0] * len(xs)
    for t in reversed(range(len(xs))):
        same_run = t + 1 < len(xs) and ids_l[t + 1] == ids_l[t]
        y[t] = xs[t] + (cs[t] * y[t + 1] if same_run else 0.0)
    return torch.tensor(y, dtype=x.dtype, device=x.device)
