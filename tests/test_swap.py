"""The RSPO reward swap: hand example, loop agreement, invariants (Hypothesis), and its
agreement with GRPO run on the target and explorer views."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rspo.algorithms import Turns
from rspo.algorithms.grpo import grpo_advantages
from rspo.rewards.swap import rspo_group_advantages, rspo_group_advantages_loop, swap_rewards

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
T, E, R = 0, 1, 2


def test_hand_example():
    # group 0: T o=1 p=.3 | T o=0 p=.1 | E o=1 p=.5 | E o=0 p=.2 | R o=1 p=.9
    # group 1: T o=0 | E o=1 p=.4          (explorer subgroup of one)
    # group 2: T o=1                        (a singleton group)
    outcome = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    process = torch.tensor([0.3, 0.1, 0.5, 0.2, 0.9, 0.0, 0.4, 0.7])
    source = torch.tensor([T, T, E, E, R, T, E, T])
    group = torch.tensor([0, 0, 0, 0, 0, 1, 1, 2])
    # target, "mean": group 0 outcomes (1,0,1,0,1) mean 0.6 -> (.4,-.6,.4,-.6,.4); group 1 (0,1) -> (-.5,.5)
    # explorer, "mean": group 0 explorer rows p = (.5, .2), mean .35 -> (.15, -.15); replay and T rows 0;
    #   group 1 explorer subgroup of one -> 0
    tgt, exp = rspo_group_advantages(outcome, process, source, group, norm="mean")
    torch.testing.assert_close(tgt, torch.tensor([0.4, -0.6, 0.4, -0.6, 0.4, -0.5, 0.5, 0.0]))
    torch.testing.assert_close(exp, torch.tensor([0, 0, 0.15, -0.15, 0, 0, 0, 0]))
    # "mean_std": group 0 var (3 * .16 + 2 * .36) / 4 = 0.3, std 0.547723 -> .4/.547723 = .730297, -1.095445
    #   group 1 std sqrt(.5) = .707107 -> -+.707107;  explorer std sqrt(2 * .15^2) = .212132 -> +-.707107
    tgt, exp = rspo_group_advantages(outcome, process, source, group, norm="mean_std", eps=0.0)
    a, b, c = 0.730297, -1.095445, 0.707107
    torch.testing.assert_close(tgt, torch.tensor([a, b, a, b, a, -c, c, 0.0]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(exp, torch.tensor([0, 0, c, -c, 0, 0, 0, 0]), atol=1e-5, rtol=1e-5)


def random_groups(n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, 2, (n,), generator=g).float() * 10,  # outcome: 0 or 10 (outcome_scale)
        torch.randn(n, generator=g),  # process
        torch.randint(0, 3, (n,), generator=g),  # source
        torch.randint(0, k, (n,), generator=g),  # group
    )


@pytest.mark.parametrize("norm", ["mean_std", "mean"])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_loop(norm, seed):
    args = random_groups(500, 60, seed)
    for got, want in zip(rspo_group_advantages(*args, norm=norm), rspo_group_advantages_loop(*args, norm=norm)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@cuda
@pytest.mark.gpu
def test_matches_loop_cuda():
    args = random_groups(5000, 400, 2)
    got = rspo_group_advantages(*(a.cuda() for a in args))
    for g, w in zip(got, rspo_group_advantages_loop(*args)):
        torch.testing.assert_close(g.cpu(), w, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- properties

values = st.integers(-40, 40).map(lambda v: v / 4)  # exact binary fractions: sums are order-independent


@st.composite
def groups(draw, sources=(T, E, R)):
    n = draw(st.integers(1, 30))
    col = lambda s: torch.tensor(draw(st.lists(s, min_size=n, max_size=n)))  # noqa: E731
    return (col(values).double(), col(values).double(), col(st.sampled_from(sources)), col(st.integers(0, 4)))


def close(a, b):
    torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-6)


@settings(max_examples=60, deadline=None)
@given(groups(), st.sampled_from(["mean_std", "mean"]), st.integers(0, 2**31))
def test_channels_do_not_mix(case, norm, seed):
    outcome, process, source, group = case
    other = torch.randn(outcome.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    tgt, exp = rspo_group_advantages(outcome, process, source, group, norm)
    close(rspo_group_advantages(outcome, other, source, group, norm)[0], tgt)  # target never reads process
    close(rspo_group_advantages(other, process, source, group, norm)[1], exp)  # explorer never reads outcome


@settings(max_examples=60, deadline=None)
@given(groups(), st.sampled_from(["mean_std", "mean"]))
def test_groups_are_independent(case, norm):
    outcome, process, source, group = case
    tgt, exp = rspo_group_advantages(outcome, process, source, group, norm)
    g0 = group == group[0]
    # rewrite every value and source in row 0's group: other groups' outputs are unchanged
    outcome2, process2, source2 = outcome.clone(), process.clone(), source.clone()
    outcome2[g0], process2[g0], source2[g0] = outcome[g0] * 3 + 1, -process[g0], E
    tgt2, exp2 = rspo_group_advantages(outcome2, process2, source2, group, norm)
    assert torch.equal(tgt2[~g0], tgt[~g0]) and torch.equal(exp2[~g0], exp[~g0])


@settings(max_examples=60, deadline=None)
@given(groups(), st.sampled_from(["mean_std", "mean"]), st.randoms(use_true_random=False))
def test_permutation_equivariant(case, norm, rnd):
    perm = list(range(case[0].numel()))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    out = rspo_group_advantages(*case, norm)
    out_p = rspo_group_advantages(*(x[perm] for x in case), norm)
    close(out_p[0], out[0][perm])
    close(out_p[1], out[1][perm])


@settings(max_examples=60, deadline=None)
@given(groups(sources=(T, R)), st.sampled_from(["mean_std", "mean"]))
def test_no_explorer_rows_is_plain_grpo(case, norm):
    outcome, process, source, group = case
    tgt, exp = rspo_group_advantages(outcome, process, source, group, norm)
    n = outcome.numel()
    one_turn = Turns(
        outcome,
        torch.arange(n),
        group,
        torch.zeros(n, dtype=torch.long),
        torch.ones(n, dtype=torch.bool),
        torch.zeros(n, dtype=torch.long),
    )
    close(tgt, grpo_advantages(one_turn, norm=norm, gamma=1.0, lam=1.0, step_weight=0.0)[0])
    assert torch.equal(exp, torch.zeros(n, dtype=exp.dtype))


# ---------------------------------------------------------------- per-turn routing


def test_swap_rewards_routing():
    outcome = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    process = torch.tensor([0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    source = torch.tensor([T, T, E, E, R, R])
    tgt, exp, rows = swap_rewards(outcome, process, source)
    assert torch.equal(tgt, outcome)  # the swap: every row, explorer and replay too, on the outcome
    assert torch.equal(exp, torch.tensor([0.0, 0.0, 0.4, 0.5, 0.0, 0.0]))
    assert torch.equal(rows, torch.tensor([False, False, True, True, False, False]))


@pytest.mark.parametrize("norm", ["mean_std", "mean"])
def test_grpo_on_the_two_views_equals_the_group_transform(norm):
    # multi-turn trajectories: outcome on the last turn, process on every turn
    g = torch.Generator().manual_seed(0)
    m = 60
    lengths = torch.randint(1, 6, (m,), generator=g)
    traj_src = torch.randint(0, 3, (m,), generator=g)
    traj_grp = torch.randint(0, 8, (m,), generator=g)
    order = torch.argsort(traj_grp, stable=True)  # any order works; group-sorted like the trainer's batch
    lengths, traj_src, traj_grp = lengths[order], traj_src[order], traj_grp[order]
    traj_id = torch.repeat_interleave(torch.arange(m), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    turn = torch.arange(traj_id.numel()) - starts[traj_id]
    last = turn == lengths[traj_id] - 1
    outcome = last * torch.randint(0, 2, traj_id.shape, generator=g).float()
    process = torch.randn(traj_id.shape, generator=g)
    source, group = traj_src[traj_id], traj_grp[traj_id]

    tgt_r, exp_r, exp_rows = swap_rewards(outcome, process, source)
    view = Turns(tgt_r, traj_id, group, turn, last, torch.zeros_like(turn))
    kw = dict(norm=norm, gamma=1.0, lam=1.0, step_weight=0.0)
    tgt_turn, _ = grpo_advantages(view, **kw)  # target view: all rows
    exp_turn, _ = grpo_advantages(Turns(exp_r, traj_id, group, turn, last, turn).select(exp_rows), **kw)

    # the same through the per-trajectory transform, broadcast back to turns
    per_traj = lambda x: torch.zeros(m).index_add_(0, traj_id, x)  # noqa: E731
    tgt_traj, exp_traj = rspo_group_advantages(per_traj(outcome), per_traj(process), traj_src, traj_grp, norm)
    torch.testing.assert_close(tgt_turn, tgt_traj[traj_id], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(exp_turn, exp_traj[traj_id][exp_rows], atol=1e-5, rtol=1e-5)
    assert torch.equal(exp_traj[traj_src != E], torch.zeros(int((traj_src != E).sum())))
