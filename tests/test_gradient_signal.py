"""benchmarks/gradient_signal.py: the cosine statistics it reports, and the half-groups it takes gradients of."""

import numpy as np
import pytest
import torch
from gradient_signal import (  # benchmarks/ is on pytest's path (setup.cfg)
    batch_cosine,
    half_gradients,
    mean_cosines,
    pair_cosine,
)


def test_mean_cosines_by_hand():
    # four half-groups: tasks 0, 0, 1, 1
    cos = np.array(
        [
            [1.0, 0.5, 0.1, 0.3],
            [0.5, 1.0, -0.1, 0.1],
            [0.1, -0.1, 1.0, 0.7],
            [0.3, 0.1, 0.7, 1.0],
        ]
    )
    task = np.array([0, 0, 1, 1])
    same, other = mean_cosines(cos, task)
    assert same == pytest.approx((0.5 + 0.7) / 2)  # pairs (0, 1) and (2, 3), each counted both ways
    assert other == pytest.approx((0.1 + 0.3 - 0.1 + 0.1) / 4)  # the 4 cross pairs
    # a resample that draws task 1 twice: its copies are not a same-task pair of each other,
    # and a copy against the other copy is not a cross pair either (same task)
    same, other = mean_cosines(cos, task, np.array([1, 1]))
    assert same == pytest.approx(0.7) and np.isnan(other)


def test_pair_cosine_is_the_cosine():
    g = np.array([[3.0, 4.0], [4.0, 3.0], [-3.0, -4.0]])
    c = pair_cosine(g)
    assert c[0, 1] == pytest.approx(24 / 25) and c[0, 2] == pytest.approx(-1.0) and c[1, 1] == pytest.approx(1.0)


def test_batch_cosine_by_hand_and_against_simulation():
    assert batch_cosine(0.2, 4) == pytest.approx(np.sqrt(4 * 0.2 / (1 + 3 * 0.2)))  # sqrt(0.8 / 1.6) = 0.707
    assert batch_cosine(0.0, 64) == 0.0 and batch_cosine(-0.01, 64) == 0.0
    # gradients mu + noise: the measured pair cosine c predicts the mean-of-n cosine with mu
    rng = np.random.default_rng(0)
    P, n = 4000, 16
    mu = rng.normal(size=P)
    draws = mu + 3.0 * rng.normal(size=(400, P))  # |mu|^2 / (|mu|^2 + 9 |mu|^2) ~ 0.1
    cos = pair_cosine(draws)
    c = cos[~np.eye(len(cos), dtype=bool)].mean()
    means = draws.reshape(-1, n, P).mean(1)
    measured = (means @ mu / np.linalg.norm(means, axis=1) / np.linalg.norm(mu)).mean()
    assert c == pytest.approx(0.1, abs=0.01)
    assert measured == pytest.approx(batch_cosine(c, n), abs=0.02)


def test_half_gradients_take_each_half_with_signal_once(warm_model):
    """On a real rollout of the tiny warm start: one gradient per half-group whose returns
    are not all equal (counted here from the trajectories themselves), each finite and
    nonzero, and at most two halves per task."""
    from conftest import small_config

    from rspo.batch import TARGET
    from rspo.envs.pool import EnvPool
    from rspo.policy_io import build_policy
    from rspo.rollout import Plan, collect

    cfg = small_config(f"model.init_from={warm_model}", "rollout.group_size=4")
    torch.manual_seed(0)
    policy = build_policy(cfg.model)
    with EnvPool(cfg.env, 4 * 4) as pool:
        tasks = [("train", i) for i in range(4)]
        ro = collect(policy, pool, cfg.env.name, tasks, [Plan("target", 4, TARGET)], cfg.rollout, temperature=1.0,
                     max_turns=pool.max_steps, progress=False)  # fmt: skip
    trajs = sorted(ro.trajectories, key=lambda t: t.traj_id)
    halves = [trajs[g * 4 : g * 4 + 2] for g in range(4)] + [trajs[g * 4 + 2 : g * 4 + 4] for g in range(4)]
    ret = [[round(t.outcome - cfg.rollout.invalid_action_penalty * t.invalid, 6) for t in h] for h in halves]
    with_signal = sum(len(set(r)) > 1 for r in ret)  # returns as the outcome arm trains on them
    grads, task = half_gradients(policy, cfg, ro.batch, shuffle=False, gen=torch.Generator().manual_seed(0))
    assert with_signal > 0 and len(grads) == len(task) == with_signal
    assert all(np.isfinite(g).all() and np.abs(g).sum() > 0 for g in grads)
    assert max(task.count(t) for t in task) <= 2


def test_step_probe_moves_the_policy_and_puts_it_back(warm_model, capsys, monkeypatch):
    """`--steps`: each stepped policy plays with its weights moved by exactly the step (one
    sign step: every trained parameter by +-size), and the weights are bitwise the warm
    start's again afterwards."""
    import gradient_signal
    from conftest import small_config

    from rspo.envs.pool import EnvPool
    from rspo.policy_io import build_policy

    cfg = small_config(f"model.init_from={warm_model}", "rollout.group_size=2")
    policy = build_policy(cfg.model)
    params = policy.parameters_of("target")
    before = [p.detach().clone() for p in params]
    grad = np.random.default_rng(0).normal(size=sum(p.numel() for p in params))  # no zero: every sign is +-1
    moved, play = [], gradient_signal.task_success

    def spy(*args):  # how far the weights are from the warm start's when each policy plays
        moved.append(max(float((p - b).abs().max()) for p, b in zip(params, before)))
        return play(*args)

    monkeypatch.setattr(gradient_signal, "task_success", spy)
    with EnvPool(cfg.env, 2 * 2) as pool:
        gradient_signal.step_probe(
            policy, pool, cfg, [("train", 0), ("train", 1)], grad, "0.01,0.03", torch.Generator()
        )
    assert moved == pytest.approx([0.0, 0.01, 0.03, 0.03], abs=1e-6)  # unstepped, two steps, random-sign control
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert "random-sign step 0.03" in capsys.readouterr().out
