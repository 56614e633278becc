"""Is a setting's policy gradient signal or noise? Per-group gradients of a warm start, on TRAINING tasks only.

    .venv/bin/python benchmarks/gradient_signal.py --config configs/webshop_cpu.yaml --tasks 48
    .venv/bin/python benchmarks/gradient_signal.py --config configs/default.yaml --tasks 48
    .venv/bin/python benchmarks/gradient_signal.py --checkpoint RUN/checkpoints/step_000060

Plays `--tasks` training tasks as RL's first iterations would (`rollout.group_size`
trajectories each at `rollout.temperature`; the warm start, or `--checkpoint`'s trained
target, as `sparse_probe.py` builds them). Each task's trajectories are split in two halves,
each its own group for the advantages, and the gradient of the trainer's own policy loss
(`rspo.update.micro_loss`: the config's advantages, clip and aggregation, on the outcome
reward less the invalid-action penalty, as the outcome arm trains) with respect to the
parameters RL trains is taken for each half. Halves whose returns are all equal carry no
advantage and are left out. It reports the mean cosine between two halves' gradients, with
95% intervals (tasks resampled):

  same task        two halves of one task: does the reward point one way on a task?
  different tasks  halves of two tasks: does what one task's reward asks help another's?
                   Only this shared part can move held-out tasks.
  null             the same with each half's advantages shuffled among its trajectories:
                   the reward's information removed, what a cosine is for noise alone.

If each half's gradient is a shared direction mu plus independent noise, the different-task
cosine is c = |mu|^2 / (|mu|^2 + sigma^2), and the mean of n halves' gradients has cosine
sqrt(n c / (1 + (n - 1) c)) with mu: printed for the n of one update (an iteration's halves
with signal / train.minibatches) and larger n. A cosine at the null's says an update's step
is noise, whatever the learning rate.

`--steps 0.01,0.03` then asks whether the shared direction raises success at all: for each
size, one sign step along the mean of every half's gradient (what an Adam step is on its
first update: each parameter moves by the size against its gradient's sign; 0.01 is ten
consistent steps at train.lr=1e-3), and a control step of the largest size with random signs;
each policy plays `--probe-tasks` other training tasks (another draw), success against the
unstepped policy's on the same tasks (paired by task, 95% interval).
No eval split is read.
"""

from __future__ import annotations

import numpy as np
import torch
from sparse_probe import draw_tasks, play, probe_config, probe_parser, probe_policy
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from rspo.algorithms import turns_from_batch
from rspo.envs.pool import EnvPool
from rspo.rewards.modes import MODES
from rspo.stats import bootstrap_mean
from rspo.update import learner_advantages, loss_settings, micro_loss, row_weights


def pair_cosine(grads: np.ndarray) -> np.ndarray:
    """(K, K) cosine between rows of `grads` (K, P)."""
    unit = grads / np.linalg.norm(grads, axis=1, keepdims=True)
    return unit @ unit.T


def mean_cosines(cos: np.ndarray, task: np.ndarray, pick: np.ndarray | None = None) -> tuple[float, float]:
    """(same task, different tasks): the mean of cos[i, j] over pairs of half-groups of one
    task, and over pairs of two different tasks. `pick`: the tasks to use (a resample may
    repeat one; a repeat's copies are neither pair kind with each other)."""
    pick = np.unique(task) if pick is None else pick
    rows = np.concatenate([np.flatnonzero(task == t) for t in pick])
    copy = np.concatenate([np.full((task == t).sum(), k) for k, t in enumerate(pick)])  # which draw
    sub, t = cos[np.ix_(rows, rows)], task[rows]
    same = (t[:, None] == t[None, :]) & (copy[:, None] == copy[None, :]) & ~np.eye(len(rows), dtype=bool)
    other = t[:, None] != t[None, :]
    return tuple(float(sub[m].mean()) if m.any() else float("nan") for m in (same, other))


def bootstrap_cosines(cos: np.ndarray, task: np.ndarray, n: int = 1000, seed: int = 0) -> np.ndarray:
    """(2, 2): the 95% interval [lo, hi] of (same task, different tasks), tasks resampled."""
    rng, tasks = np.random.default_rng(seed), np.unique(task)
    stats = np.array([mean_cosines(cos, task, rng.choice(tasks, len(tasks))) for _ in range(n)])
    return np.nanquantile(stats, [0.025, 0.975], axis=0).T


def batch_cosine(c: float, n: int) -> float:
    """cos(mean of n gradients, mu) when each is mu + independent noise and two of them have cosine c."""
    return float(np.sqrt(n * c / (1 + (n - 1) * c))) if c > 0 else 0.0


def half_gradients(policy, cfg, batch, shuffle: bool, gen: torch.Generator) -> tuple[list, list]:
    """(flat gradients, their task) of the target's loss on each half of each task group
    (its trajectories split in two, each half its own group of G/2 for the advantages);
    halves whose returns are all equal carry no gradient and are left out."""
    traj_group = {int(t): int(g) for t, g in zip(batch.traj_id, batch.group_id)}
    members: dict[int, list[int]] = {}  # group -> its trajectories in id order: first half, second half
    for t in sorted(traj_group):
        members.setdefault(traj_group[t], []).append(t)
    rank = {t: k for trajs in members.values() for k, t in enumerate(trajs)}
    G = max(len(trajs) for trajs in members.values())
    half = torch.tensor([2 * traj_group[int(t)] + (rank[int(t)] >= G // 2) for t in batch.traj_id])
    reward = MODES["outcome"](cfg).learner_data(batch, 0)["target"].reward  # as training: outcome - penalty
    turns = turns_from_batch(batch, reward)
    turns.group_id = half
    adv, _ = learner_advantages(turns, cfg.algo)
    if shuffle:  # permute trajectories' advantages within each half: same values, no information
        adv = adv.clone()
        for h in half.unique():
            trajs = batch.traj_id[half == h].unique()
            values = [adv[batch.traj_id == t][0] for t in trajs]
            for t, k in zip(trajs, torch.randperm(len(trajs), generator=gen)):
                adv[batch.traj_id == t] = values[k]
    weights = row_weights(batch, cfg.algo.loss_agg)
    params = policy.parameters_of("target")
    grads, task = [], []
    for h in half.unique():
        rows = torch.nonzero(half == h).squeeze(1)
        if adv[rows].abs().max() == 0:
            continue
        x = batch.select(rows).trim().to(policy.device)
        loss, _ = micro_loss(policy, "target", x, adv[rows], weights[rows], None, **loss_settings(cfg.algo))
        g = torch.autograd.grad(loss, params, allow_unused=True)
        flat = [(d if d is not None else torch.zeros_like(p)).flatten() for d, p in zip(g, params)]
        grads.append(torch.cat(flat).double().cpu().numpy())
        task.append(int(h) // 2)
    return grads, task


def task_success(policy, pool, cfg, tasks) -> np.ndarray:
    """(len(tasks),) each task's success rate over its group."""
    out = []
    for _, ro in play(policy, pool, cfg, tasks):
        by_group: dict[int, list[bool]] = {}
        for t in ro.trajectories:
            by_group.setdefault(t.group_id, []).append(t.won)
        out += [np.mean(by_group[g]) for g in sorted(by_group)]
    return np.array(out)


@torch.no_grad()
def step_probe(policy, pool, cfg, tasks, mean_grad: np.ndarray, sizes: str, gen: torch.Generator) -> None:
    """Success on `tasks` after one sign step of each size along -mean_grad (and a random-sign
    control at the largest), against the unstepped policy's; the weights are put back after each."""
    params = policy.parameters_of("target")
    saved = parameters_to_vector(params)
    sign = torch.from_numpy(np.sign(mean_grad)).to(saved)
    sizes = [float(x) for x in sizes.split(",")]
    steps = [(f"step {x:g}", x, sign) for x in sizes]
    shuffled = sign[torch.randperm(len(sign), generator=gen)]  # random signs, as many of each
    steps.append((f"random-sign step {max(sizes):g}", max(sizes), shuffled))
    torch.manual_seed(cfg.train.seed)
    base = task_success(policy, pool, cfg, tasks)
    print(f"  one sign step along the mean gradient; success on {len(tasks)} other train tasks "
          f"(95% interval, tasks resampled): unstepped {base.mean():.3f}")  # fmt: skip
    for label, size, direction in steps:
        vector_to_parameters(saved - size * direction, params)
        torch.manual_seed(cfg.train.seed)
        after = task_success(policy, pool, cfg, tasks)
        mean, lo, hi = bootstrap_mean([after - base])
        print(f"    {label:24s} {after.mean():.3f}, minus unstepped {mean:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        vector_to_parameters(saved, params)


def report(found: dict, wins: list, source, num_tasks: int, cfg) -> None:
    """Print the cosines (as trained and null) and what they imply for one update."""
    T, G = cfg.rollout.temperature, cfg.rollout.group_size
    print(f"{source}: {num_tasks} train tasks x {G} at T={T}, success {np.mean(wins):.3f}, "
          f"{len(found[False][0])} of {2 * num_tasks} half-groups with signal")  # fmt: skip
    print("  mean cosine between two half-groups' gradients (95% interval, tasks resampled):")
    print("                                     same task                  different tasks")
    cross = {}
    for shuffle, (grads, task) in found.items():
        cos, task = pair_cosine(np.stack(grads)), np.array(task)
        (same, other), ((slo, shi), (olo, ohi)) = mean_cosines(cos, task), bootstrap_cosines(cos, task)
        cross[shuffle] = other
        label = "advantages shuffled (null)" if shuffle else "the loss as trained        "
        print(f"  {label}  {same:+.4f} [{slo:+.4f}, {shi:+.4f}]  {other:+.4f} [{olo:+.4f}, {ohi:+.4f}]")
    per_update = max(1, round(len(found[False][0]) / (num_tasks / cfg.rollout.num_tasks) / cfg.train.minibatches))
    print("  the mean of n halves' gradients, cosine with their shared direction: "
          + ", ".join(f"n={n}{' (one update)' if n == per_update else ''} {batch_cosine(cross[False], n):.3f}"
                      for n in sorted({per_update, 16, 64, 256})))  # fmt: skip


def main() -> None:
    ap = probe_parser(__doc__.splitlines()[0])
    ap.add_argument("--steps", default="", help="sign-step sizes along the mean gradient to probe, e.g. 0.01,0.03")
    ap.add_argument("--probe-tasks", type=int, default=48, help="other train tasks each stepped policy plays")
    args = ap.parse_args()
    cfg, checkpoint = probe_config(args)
    gen = torch.Generator().manual_seed(cfg.train.seed)
    policy, source = probe_policy(cfg, checkpoint)
    found = {False: ([], []), True: ([], [])}  # shuffled? -> (gradients, tasks)
    wins = []
    with EnvPool(cfg.env, cfg.rollout.num_tasks * cfg.rollout.group_size) as pool:
        tasks = draw_tasks(pool, args.tasks, args.task_seed)
        for start, ro in play(policy, pool, cfg, tasks):
            wins += [t.won for t in ro.trajectories]
            for shuffle, (grads, task) in found.items():
                g, t = half_gradients(policy, cfg, ro.batch, shuffle, gen)
                grads += g
                task += [start + k for k in t]  # tasks are numbered across rollouts
        report(found, wins, source, args.tasks, cfg)
        if args.steps:
            others = draw_tasks(pool, args.probe_tasks, args.task_seed + 1)  # other tasks than the gradients'
            step_probe(policy, pool, cfg, others, np.mean(found[False][0], axis=0), args.steps, gen)


if __name__ == "__main__":
    main()
