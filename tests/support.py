"""What the tests and the benchmarks share: the small WebShop setting and the NaN/inf faults.

A plain module (not conftest.py), so benchmarks/soak.py and benchmarks/bench_processes.py
import it too: `sys.path.insert(0, "tests"); from support import SMALL, poison`.
"""

from __future__ import annotations

import socket

NAN, INF = float("nan"), float("inf")

# A WebShop small enough to train on in seconds: 300 products, a 1-layer 64-wide model,
# 2 tasks x 2 trajectories x 3 turns an iteration, in-process envs, no logs.
SMALL = [
    "env.name=webshop",
    "env.num_workers=0",
    "env.webshop.num_products=300",
    "env.webshop.num_goals=80",
    "env.webshop.num_test_goals=20",
    "model.tiny.hidden_size=64",
    "model.tiny.num_layers=1",
    "model.tiny.num_heads=2",
    "model.tiny.vocab_size=600",
    "rollout.max_new_tokens=40",
    "rollout.max_prompt_tokens=768",
    "rollout.num_tasks=2",
    "rollout.group_size=2",
    "rollout.max_turns=3",
    "rollout.micro_batch=3",
    "eval.splits=test",
    "eval.num_tasks=3",
    "sft.episodes=0",
    "log.progress=false",
    "log.tensorboard=false",
    "train.micro_batch=4",
    "train.lr=0.01",
]
# The warm start on SMALL (with sft.episodes=N): it acts, imperfectly, so rollouts have
# varied rewards and updates have nonzero advantages.
WARM_SFT = ["sft.epochs=12", "sft.batch_size=8", "sft.lr=0.005"]

POISONS = ("nan_reward", "nan_advantage", "nan_loss", "inf_gradient")


def poison(kind: str, run):
    """Make the target's updates see a NaN/inf until the returned undo is called (it may be
    called again). Each fault is injected into the real code path, where only one check sees it:

      nan_reward     one turn's reward, after the learner data is built
      nan_advantage  the first turn's advantage, from the algorithm's own estimator
      nan_loss       a NaN loss whose gradients are finite: only the loss check sees it
      inf_gradient   an inf gradient with a finite loss: only the gradient-norm check sees it
    """
    import rspo.update
    from rspo.algorithms import ALGORITHMS

    if kind == "inf_gradient":
        return run.policy.parameters_of("target")[0].register_hook(lambda g: g.new_full(g.shape, INF)).remove
    if kind == "nan_advantage":
        name = run.cfg.algo.name
        real_algo = ALGORITHMS[name]

        def advantages(turns, **kwargs):
            adv, returns = real_algo.advantages(turns, **kwargs)
            return adv.index_fill(0, adv.new_tensor([0], dtype=int), INF), returns

        ALGORITHMS[name] = real_algo._replace(advantages=advantages)
        return lambda: ALGORITHMS.__setitem__(name, real_algo)
    if kind == "nan_reward":  # in what the reward mode hands the target (an instance attribute shadows it)
        real_data = run.mode.learner_data

        def learner_data(batch, step):
            out = real_data(batch, step)
            out["target"].reward[out["target"].rows.nonzero()[0]] = NAN
            return out

        run.mode.learner_data = learner_data
        return lambda: vars(run.mode).pop("learner_data", None)
    if kind not in POISONS:
        raise ValueError(f"unknown fault {kind!r}; expected one of {', '.join(POISONS)}")
    real = rspo.update.micro_loss

    def poisoned(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return loss + NAN, metrics | {"loss/policy": metrics["loss/policy"] * NAN}  # a float or a tensor

    rspo.update.micro_loss = poisoned
    return lambda: setattr(rspo.update, "micro_loss", real)


def free_port() -> int:
    """A TCP port no one listens on now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
