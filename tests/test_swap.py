"""The RSPO reward swap as the trainer runs it (the RSPO mode's learner data, then the base
estimator on each learner's view): hand example, loop agreement, invariants (Hypothesis),
and the per-turn routing."""

import pytest
import torch
from bench_swap import CONFIG, loop_reference, make_batch, trainer_path  # benchmarks/ is on pytest's path (setup.cfg)
from hypothesis import given, settings
from hypothesis import strategies as st

from rspo.algorithms import Turns
from rspo.algorithms.grpo import grpo_advantages
from rspo.config import load_config
from rspo.rewards.modes import Rspo
from rspo.rewards.swap import (
    flat_groups,
    flat_groups_loop,
    joining_rows,
    joining_rows_loop,
    swap_rewards,
    swap_rewards_loop,
)

T, E, R = 0, 1, 2
CONFIGS = {norm: load_config(None, [*CONFIG, f"algo.norm={norm}", "algo.name=grpo"]) for norm in ("mean_std", "mean")}


def rspo_grpo(outcome, process, source, group, norm="mean_std"):
    """(target_adv (N,), explorer_adv (N,), 0 off the explorer's rows) of one-turn
    trajectories, through the trainer's own calls (`bench_swap.trainer_path`)."""
    n = outcome.numel()
    _, batch = make_batch(n, 1)
    batch.outcome, batch.process, batch.source, batch.group_id = outcome, process, source, group
    cfg = CONFIGS[norm]
    target, explorer = trainer_path(Rspo(cfg), batch, cfg)
    return target, torch.zeros_like(target).masked_scatter(source == E, explorer)


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
    tgt, exp = rspo_grpo(outcome, process, source, group, norm="mean")
    torch.testing.assert_close(tgt, torch.tensor([0.4, -0.6, 0.4, -0.6, 0.4, -0.5, 0.5, 0.0]))
    torch.testing.assert_close(exp, torch.tensor([0, 0, 0.15, -0.15, 0, 0, 0, 0]))
    # "mean_std": group 0 var (3 * .16 + 2 * .36) / 4 = 0.3, std 0.547723 -> .4/.547723 = .730297, -1.095445
    #   group 1 std sqrt(.5) = .707107 -> -+.707107;  explorer std sqrt(2 * .15^2) = .212132 -> +-.707107
    #   (eps = 1e-6 moves these by under 2e-6)
    tgt, exp = rspo_grpo(outcome, process, source, group, norm="mean_std")
    a, b, c = 0.730297, -1.095445, 0.707107
    torch.testing.assert_close(tgt, torch.tensor([a, b, a, b, a, -c, c, 0.0]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(exp, torch.tensor([0, 0, c, -c, 0, 0, 0, 0]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["mean_std", "mean"])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_loop(norm, seed):
    turns, batch = make_batch(480, 60, seed)
    cfg = CONFIGS[norm]
    for got, want in zip(trainer_path(Rspo(cfg), batch, cfg), loop_reference(turns, batch, norm)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_matches_loop_cuda():
    turns, batch = make_batch(4800, 400, 2)
    cfg = CONFIGS["mean_std"]
    got = trainer_path(Rspo(cfg), batch.to("cuda"), cfg)
    for g, w in zip(got, loop_reference(turns, batch, "mean_std")):
        torch.testing.assert_close(g.cpu(), w, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- properties

values = st.integers(-40, 40).map(lambda v: v / 4)  # exact binary fractions: sums are order-independent


@st.composite
def groups(draw, sources=(T, E, R)):
    n = draw(st.integers(1, 30))
    col = lambda s: torch.tensor(draw(st.lists(s, min_size=n, max_size=n)))  # noqa: E731
    return (col(values).double(), col(values).double(), col(st.sampled_from(sources)), col(st.integers(0, 4)))


def close(a, b):  # the trainer's estimators run in float32 (`turns_from_batch`)
    torch.testing.assert_close(a.double(), b.double(), atol=1e-6, rtol=1e-5)


@settings(max_examples=60, deadline=None)
@given(groups(), st.sampled_from(["mean_std", "mean"]), st.integers(0, 2**31))
def test_channels_do_not_mix(case, norm, seed):
    outcome, process, source, group = case
    other = torch.randn(outcome.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    tgt, exp = rspo_grpo(outcome, process, source, group, norm)
    close(rspo_grpo(outcome, other, source, group, norm)[0], tgt)  # target never reads process
    close(rspo_grpo(other, process, source, group, norm)[1], exp)  # explorer never reads outcome


@settings(max_examples=60, deadline=None)
@given(groups(), st.sampled_from(["mean_std", "mean"]))
def test_groups_are_independent(case, norm):
    outcome, process, source, group = case
    tgt, exp = rspo_grpo(outcome, process, source, group, norm)
    g0 = group == group[0]
    # rewrite every value and source in row 0's group: other groups' outputs are unchanged
    outcome2, process2, source2 = outcome.clone(), process.clone(), source.clone()
    outcome2[g0], process2[g0], source2[g0] = outcome[g0] * 3 + 1, -process[g0], E
    tgt2, exp2 = rspo_grpo(outcome2, process2, source2, group, norm)
    assert torch.equal(tgt2[~g0], tgt[~g0]) and torch.equal(exp2[~g0], exp[~g0])


@settings(max_examples=60, deadline=None)
@given(groups(), st.sampled_from(["mean_std", "mean"]), st.randoms(use_true_random=False))
def test_permutation_equivariant(case, norm, rnd):
    perm = list(range(case[0].numel()))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    out = rspo_grpo(*case, norm)
    out_p = rspo_grpo(*(x[perm] for x in case), norm)
    close(out_p[0], out[0][perm])
    close(out_p[1], out[1][perm])


@settings(max_examples=60, deadline=None)
@given(groups(sources=(T, R)), st.sampled_from(["mean_std", "mean"]))
def test_no_explorer_rows_is_plain_grpo(case, norm):
    outcome, process, source, group = case
    tgt, exp = rspo_grpo(outcome, process, source, group, norm)
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


def test_swap_rewards_matches_loop():
    g = torch.Generator().manual_seed(0)
    outcome, process = torch.randn(200, generator=g), torch.randn(200, generator=g)
    source = torch.randint(0, 3, (200,), generator=g)
    for got, want in zip(swap_rewards(outcome, process, source), swap_rewards_loop(outcome, process, source)):
        assert torch.equal(got, want)


# ---------------------------------------------------------------- rspo.join and the per-group swap

X = 3  # the expert (RSPO's ceiling)


def test_joining_rows_hand_example():
    # Two-turn trajectories (outcome on the last turn); rows listed by trajectory:
    #   traj 0 T g0 lost | traj 1 E g0 won | traj 2 X g0 won | traj 3 T g1 won | traj 4 E g1 won | traj 5 R g1 lost
    # g0: the target never won, so traj 1 and 2 are rescues; g1: the target won, traj 4 is a success, no rescue
    outcome = torch.tensor([0.0, 0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0])
    traj = torch.arange(6).repeat_interleave(2)
    source = torch.tensor([T, E, X, T, E, R]).repeat_interleave(2)
    group = torch.tensor([0, 0, 0, 1, 1, 1]).repeat_interleave(2)
    want = {  # per trajectory: whether it trains the target
        "all": [1, 1, 1, 1, 1, 1],
        "successes": [1, 1, 1, 1, 1, 0],  # target rows always; the replayed loss drops out
        "rescues": [1, 1, 1, 1, 0, 0],  # g1's explorer win joins no more: the target won g1 itself
    }
    for rule, per_traj in want.items():
        expected = torch.tensor(per_traj, dtype=torch.bool).repeat_interleave(2)
        assert torch.equal(joining_rows(outcome, source, traj, group, rule), expected), rule
        assert torch.equal(joining_rows_loop(outcome, source, traj, group, rule), expected), rule
    with pytest.raises(ValueError, match="rspo.join"):
        joining_rows(outcome, source, traj, group, "some")


def random_groups(seed: int, n: int = 120):
    """Random per-turn rows: trajectories of 1-4 turns in 6 groups, outcome 0/0.5/1 on any turn."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 5, (n // 2,), generator=g)
    traj = torch.arange(len(lengths)).repeat_interleave(lengths)
    group = torch.randint(0, 6, (len(lengths),), generator=g)[traj]
    source = torch.randint(0, 4, (len(lengths),), generator=g)[traj]
    outcome = torch.tensor([0.0, 0.5, 1.0])[torch.randint(0, 3, (len(traj),), generator=g)]
    outcome = outcome * (torch.rand(len(traj), generator=g) < 0.3)
    return outcome, source, traj, group


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("rule", ["all", "successes", "rescues"])
def test_joining_rows_matches_loop(seed, rule):
    outcome, source, traj, group = random_groups(seed)
    assert torch.equal(
        joining_rows(outcome, source, traj, group, rule), joining_rows_loop(outcome, source, traj, group, rule)
    )


def test_flat_groups_hand_example():
    # g0: returns 0, 0 (flat);  g1: 1, 0 (signal);  g2: 1, 1 (flat, all won);  g3: one trajectory (flat)
    outcome = torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    traj = torch.tensor([0, 1, 2, 3, 4, 5, 6])
    group = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    want = torch.tensor([True, True, False, False, True, True, True])
    assert torch.equal(flat_groups(outcome, traj, group), want)
    assert torch.equal(flat_groups_loop(outcome, traj, group), want)


@pytest.mark.parametrize("seed", range(20))
def test_flat_groups_matches_loop(seed):
    outcome, _, traj, group = random_groups(seed)
    keep = traj % 3 != 1  # ids with gaps (a selected view) are fine
    outcome, traj, group = outcome[keep], traj[keep], group[keep]
    assert torch.equal(flat_groups(outcome, traj, group), flat_groups_loop(outcome, traj, group))
