"""The warm start's batching: length-grouped, every sample once, little padding."""

import random

from hypothesis import given
from hypothesis import strategies as st

from rspo.sft import length_grouped_batches


def padding(batches):
    """Padded cells / all cells, for right-padded batches as sft_loss builds them."""
    total = sum(len(b) * max(len(p) + len(r) for p, r in b) for b in batches)
    real = sum(len(p) + len(r) for b in batches for p, r in b)
    return 1 - real / total


@given(st.lists(st.integers(1, 700), min_size=1, max_size=300), st.integers(1, 20), st.integers(0, 10**6))
def test_every_sample_exactly_once_in_batches_of_the_size(lengths, batch_size, seed):
    samples = [([0] * n, [i]) for i, n in enumerate(lengths)]  # the response id names the sample
    batches = length_grouped_batches(samples, batch_size, random.Random(seed))
    assert sorted(r[0] for b in batches for _, r in b) == list(range(len(samples)))
    assert all(1 <= len(b) <= batch_size for b in batches)
    assert sum(len(b) < batch_size for b in batches) <= -(-len(samples) // (batch_size * 16))  # one short per pool


def test_grouping_cuts_padding_and_keeps_the_order_random():
    rng = random.Random(0)
    samples = [([0] * rng.randint(150, 700), [1, 2, 3]) for _ in range(2000)]
    shuffled = samples[:]
    rng.shuffle(shuffled)
    at_random = [shuffled[i : i + 16] for i in range(0, len(shuffled), 16)]
    grouped = length_grouped_batches(samples, 16, random.Random(1))
    assert padding(grouped) < 0.05 < 0.25 < padding(at_random)
    widths = [max(len(p) for p, _ in b) for b in grouped]
    assert widths != sorted(widths) and widths != sorted(widths, reverse=True)  # batches are shuffled
