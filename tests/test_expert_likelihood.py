"""benchmarks/expert_likelihood.py: the exact drift (KL over the vocabulary) and the per-turn scores it reports."""

import math

import torch
from expert_likelihood import kl, scores  # benchmarks/ is on pytest's path (setup.cfg)


def test_kl_and_scores_by_hand():
    # one turn of two response positions over a vocabulary of 2
    #   position 0: p = (1/2, 1/2), q = (1/4, 3/4)
    #   position 1: p = q = (0.9, 0.1)
    p = [torch.tensor([[0.5, 0.5], [0.9, 0.1]]).log()]
    q = [torch.tensor([[0.25, 0.75], [0.9, 0.1]]).log()]
    # KL at 0: 1/2 ln(0.5/0.25) + 1/2 ln(0.5/0.75) = 0.5 * 0.693147 - 0.5 * 0.405465 = 0.143841; at 1: 0
    assert abs(kl(p, q)[0] - 0.143841 / 2) < 1e-6
    assert abs(kl(q, p)[0] - (0.25 * math.log(0.5) + 0.75 * math.log(1.5)) / 2) < 1e-6  # not symmetric: 0.065
    assert kl(p, p)[0] == 0
    # the response took token 1 then token 0: p = 1/2 * 0.9 = 0.45, -log p per token (ln 2 - ln 0.9) / 2
    out = scores(p, [([7, 8], [1, 0])])
    assert abs(out["prob"][0] - 0.45) < 1e-6
    assert abs(out["nll"][0] - (math.log(2) - math.log(0.9)) / 2) < 1e-6
    # entropy: ln 2 at 0; -(0.9 ln 0.9 + 0.1 ln 0.1) = 0.325083 at 1
    assert abs(out["entropy"][0] - (math.log(2) + 0.325083) / 2) < 1e-6
