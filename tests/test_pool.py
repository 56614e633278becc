"""EnvPool: worker processes give the in-process results; failures are explicit, never hangs;
a worker that dies or hangs is replaced and only its envs' episodes end."""

from __future__ import annotations

import dataclasses
import gc
import os
import signal

import pytest

pytest.importorskip("alfworld")

from rspo.config import AlfworldConfig, EnvConfig  # noqa: E402
from rspo.envs.pool import EnvPool, WorkerFault  # noqa: E402

NUM_ENVS = 3


@pytest.fixture(scope="module")
def cfg(tmp_path_factory) -> EnvConfig:
    games = tmp_path_factory.mktemp("games")
    sizes = {"num_train": 8, "num_eval_in_distribution": 2, "num_eval_out_of_distribution": 2}
    return EnvConfig(name="alfworld", num_workers=2, alfworld=AlfworldConfig(games_dir=str(games), **sizes))


@pytest.fixture(scope="module")
def pool(cfg):
    with EnvPool(cfg, NUM_ENVS, timeout=120) as pool:
        yield pool


def in_process(cfg: EnvConfig) -> EnvConfig:
    return EnvConfig(name=cfg.name, num_workers=0, alfworld=cfg.alfworld)


def rollout(pool: EnvPool) -> list:
    """Expert rollouts of three tasks with some envs idle on some turns; every state seen."""
    seen = [pool.reset([("train", 0), ("train", 3), ("eval_out_of_distribution", 1)])]
    done = [False] * NUM_ENVS
    for turn in range(30):
        actions = pool.expert_actions()
        actions = [None if d or (e == 1 and turn % 3 == 0) else a for e, (a, d) in enumerate(zip(actions, done))]
        if turn == 2:
            actions[0] = "dance wildly"  # an invalid action in the mix
        states = pool.step(actions)
        seen.append(states)
        done = [d or (s is not None and s.done) for d, s in zip(done, states)]
        if all(done):
            break
    return seen


def test_pool_matches_in_process_stepping(cfg, pool):
    pooled = rollout(pool)
    with EnvPool(in_process(cfg), NUM_ENVS) as local:
        assert rollout(local) == pooled
    final = [next(s for s in reversed(column) if s is not None) for column in zip(*pooled)]
    assert all(s.won for s in final)
    assert any(s is None for states in pooled for s in states)  # idle envs really were skipped


def test_exception_in_step_is_an_error_state(cfg, pool):
    pool.reset([None, ("train", 1), None])
    states = pool.step(["look", "look", None])  # env 0 was never reset: its step raises in the worker
    assert states[0].done and not states[0].valid and "RuntimeError" in states[0].info["error"]
    assert states[1].valid and states[2] is None

    with EnvPool(in_process(cfg), 1) as local:  # an engine failure, injected
        local.reset([("train", 0)])

        def broken(command):
            raise OSError("engine exploded")

        local._workers[0].group.envs[0]._engine.step = broken
        (state,) = local.step(["look"])
        assert state.done and not state.valid and state.info["error"] == "OSError: engine exploded"
        assert state.task and state.task_type  # kept from the last good state


def test_pool_answers_for_its_envs(pool, cfg):
    assert len(pool) == pool.num_envs == NUM_ENVS
    assert pool.max_steps == cfg.alfworld.max_steps
    assert pool.num_tasks("train") == cfg.alfworld.num_train


def test_errors_outside_step_are_raised_and_the_pool_survives(pool):
    with pytest.raises(ValueError, match="unknown ALFWorld split"):
        pool.reset([("train", 0), ("nope", 0), ("train", 0)])
    with pytest.raises(ValueError, match="expected 3 actions"):
        pool.step(["look"])
    with pytest.raises(ValueError, match="unknown ALFWorld split"):
        pool.num_tasks("valid")
    assert pool.reset([("train", 2)] * NUM_ENVS)[0].observation.startswith("-= Welcome")


def test_worker_construction_error_is_raised(cfg, tmp_path):
    bad = EnvConfig(name="alfworld", num_workers=1, alfworld=AlfworldConfig(data_dir=str(tmp_path / "none")))
    with pytest.raises(FileNotFoundError, match="json_2.1.1"):
        EnvPool(bad, 2, timeout=60)


def test_dead_worker_is_replaced_and_its_episodes_end(cfg):
    # Envs 0 and 2 live on worker 0, env 1 on worker 1 (round-robin).
    with EnvPool(cfg, NUM_ENVS, timeout=60) as pool:
        pool.reset([("train", 0), ("train", 1), ("train", 2)])
        dead = pool._workers[0].process
        os.kill(dead.pid, signal.SIGKILL)
        dead.join(10)
        with pytest.warns(RuntimeWarning, match=r"env worker 'alfworld-0' \(pid \d+\) died.*replaced it"):
            states = pool.step(["look", "look", None])  # env 2 idle this turn: its episode is lost too
        assert states[0].done and not states[0].valid and "WorkerFault" in states[0].info["error"]
        assert states[1].valid and not states[1].done and "error" not in states[1].info  # worker 1 unaffected
        assert pool.restarts == 1 and pool._workers[0].process.pid != dead.pid
        (_, _, lost) = pool.step([None, None, "look"])  # never reset on the new worker: ends too
        assert lost.done and "RuntimeError" in lost.info["error"]
        again = pool.reset([("train", 0), None, None])[0]  # training goes on: the new worker plays
        assert again == pool.reset([("train", 0), None, None])[0] and again.observation.startswith("-= Welcome")


def test_worker_dying_in_reset_is_replaced_and_the_reset_retried(cfg):
    with EnvPool(cfg, 2, timeout=60) as pool:
        expected = pool.reset([("train", 0), ("train", 1)])
        os.kill(pool._workers[1].process.pid, signal.SIGKILL)
        pool._workers[1].process.join(10)
        with pytest.warns(RuntimeWarning, match="died"):
            assert pool.reset([("train", 0), ("train", 1)]) == expected
        os.kill(pool._workers[0].process.pid, signal.SIGKILL)
        pool._workers[0].process.join(10)
        with pytest.warns(RuntimeWarning), pytest.raises(WorkerFault, match="'alfworld-0'.*need a reset"):
            pool.expert_actions()  # the episode it needs is gone
        assert pool.restarts == 2 and pool.reset([("train", 0), ("train", 1)]) == expected


def test_hung_worker_times_out_and_is_replaced(cfg):
    quick = dataclasses.replace(cfg, step_timeout=1.0)
    with EnvPool(quick, 2, timeout=60) as pool:
        pool.reset([("train", 0), ("train", 1)])
        hung = pool._workers[0].process
        os.kill(hung.pid, signal.SIGSTOP)  # alive but never answers
        with pytest.warns(RuntimeWarning, match="did not answer within 1 s"):
            states = pool.step(["look", "look"])
        assert states[0].done and "did not answer within 1 s" in states[0].info["error"]
        assert states[1].valid and "error" not in states[1].info
        hung.join(10)
        assert not hung.is_alive() and pool._workers[0].process.is_alive()


def test_shutdown_leaves_no_workers(cfg):
    with EnvPool(cfg, 2) as pool:
        processes = [w.process for w in pool._workers]
        assert all(p.is_alive() for p in processes)
    assert not any(p.is_alive() for p in processes)

    pool = EnvPool(cfg, 2)
    processes = [w.process for w in pool._workers]
    del pool
    gc.collect()
    assert not any(p.is_alive() for p in processes)  # the weakref finalizer stopped them


def test_expert_actions_skip_envs_not_in_use(cfg):
    # A pool larger than the work (e.g. sized for eval) holds envs that were never reset.
    with EnvPool(cfg, 3) as pool:
        pool.reset([("train", 0), None, ("train", 1)])
        actions = pool.expert_actions([True, False, True])
        assert actions[1] is None
        assert all(isinstance(a, str) and a for a in (actions[0], actions[2]))
