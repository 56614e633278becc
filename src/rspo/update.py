"""One learner's update: epochs × minibatches of clipped-ratio steps (`update_learner`),
each one accumulate-and-step (`step`) for the policy and, with PPO, for its critic.

A minibatch is split into micro-batches of `train.micro_batch` sequences (gradient
accumulation); each micro-batch's (weighted) token-mean loss is weighted by its share of
the minibatch's token weight, so the accumulated gradient is exactly the mean over the
whole minibatch. Sequences are trimmed to the micro-batch's own padding first.

Aggregation (`algo.loss_agg`): `token_mean` weighs every response token alike (verl's
token-mean, the GiGPO reference's). With per-turn samples that favours long
trajectories: failures run to the turn cap, so in a group whose trajectory advantages sum
to 0 the tokens' advantages do not, and the loss pushes down the sampled tokens on net
(docs/history.md, "Design decisions"). `trajectory_mean` weighs each token by 1 / its
trajectory's token count, so every trajectory counts once, as its advantage does.

Numerical faults. An *update* is one minibatch's optimizer step (and its critic's). It is
skipped — gradients dropped, weights, optimizer and scheduler state bitwise unchanged —
when the learner's rewards, advantages or critic returns hold a NaN/inf (then every update
of this learner in this iteration is), or the minibatch's loss or gradient norm is one.
Every rank takes the same decision (`optimizer_step`), at one host sync per update.
`train/skipped_updates` counts them; more than `train.max_skipped_updates` in a row stop
the run with a FloatingPointError, before the next checkpoint.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from tqdm import tqdm

from rspo.algorithms import ALGORITHMS, Turns
from rspo.algorithms.losses import low_var_kl, masked_mean, policy_loss
from rspo.algorithms.offpolicy import OffPolicy
from rspo.algorithms.ppo import value_loss, whiten
from rspo.batch import TurnBatch
from rspo.policy import critic_name
from rspo.segment import Segments
from rspo.sharding import fsdp_modules, full_optimizer_state, gradient_sync_off, load_full_optimizer_state


@dataclass
class Learner:
    """A policy being trained (target or explorer), with its optimizer and optional critic."""

    name: str  # the policy's adapter / model name
    prefix: str  # metric namespace: "" for the target, "explorer/" for the explorer
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    critic: str | None = None  # the critic's name in the policy (PPO)
    critic_optimizer: torch.optim.Optimizer | None = None
    skipped_in_a_row: int = 0  # updates skipped for NaN/inf since the last one applied
    sharded: dict[str, nn.Module] | None = None  # FSDP: the module holding each optimizer's parameters

    def state_dict(self) -> dict:
        """Optimizer and scheduler states. Sharded: the optimizers' states gathered whole
        onto the main rank's CPU (a collective: every rank calls it)."""
        state = {"optimizer": self._optimizer_state("optimizer"), "scheduler": self.scheduler.state_dict()}
        if self.critic_optimizer is not None:
            state["critic_optimizer"] = self._optimizer_state("critic_optimizer")
        return state

    def load_state_dict(self, state: dict) -> None:
        self._load_optimizer_state("optimizer", state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic_optimizer is not None:
            self._load_optimizer_state("critic_optimizer", state["critic_optimizer"])

    def _optimizer_state(self, field: str) -> dict:
        opt = getattr(self, field)
        if self.sharded is None:
            return opt.state_dict()
        return full_optimizer_state(self.sharded[field], opt.optimizer)

    def _load_optimizer_state(self, field: str, state: dict) -> None:
        opt = getattr(self, field)
        by_name = any(isinstance(p, str) for g in state["param_groups"] for p in g["params"])  # FSDP's format
        if by_name != (self.sharded is not None):
            raise ValueError(
                f"this checkpoint's optimizer state was saved by {'an FSDP' if by_name else 'an unsharded'} run; "
                f"resume it with train.fsdp={str(by_name).lower()} (its weights load either way: model.init_from)"
            )
        if self.sharded is None:
            opt.load_state_dict(state)
        else:
            load_full_optimizer_state(self.sharded[field], opt.optimizer, state)


def make_learner(acc, policy, cfg, name: str, lr: float) -> Learner:
    warmup = cfg.train.warmup_steps
    opt = torch.optim.AdamW(policy.parameters_of(name), lr=lr, weight_decay=cfg.train.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (warmup + 1)))
    learner = Learner(name, "" if name == "target" else f"{name}/", acc.prepare_optimizer(opt), sched)
    if ALGORITHMS[cfg.algo.name].needs_critic:
        learner.critic = critic_name(name)
        params = policy.parameters_of(learner.critic)
        learner.critic_optimizer = acc.prepare_optimizer(torch.optim.AdamW(params, lr=cfg.algo.critic_lr))
    if policy.sharded:
        learner.sharded = {"optimizer": policy.nets[name], "critic_optimizer": policy.nets.get(learner.critic)}
    return learner


def optimized(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The parameters `optimizer` steps (under FSDP: the shards, not the gathered copies)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def chunks(rows: Tensor, size: int) -> list[Tensor]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def accumulate(acc, net, n: int, micro_batch: int):
    """Micro-batches of `n` rows, each with its gradient-sync context: under DDP (FSDP),
    gradients are all-reduced (reduce-scattered) only in the last micro-batch's backward
    (`no_sync` / `gradient_sync_off` before it), so ranks may run different counts."""
    parts = chunks(torch.arange(n), micro_batch)
    no_sync = gradient_sync_off if fsdp_modules(net) else acc.no_sync
    for i, rows in enumerate(parts):
        yield rows, contextlib.nullcontext() if i == len(parts) - 1 else no_sync(net)


def prompt_values(policy, critic: str, x: TurnBatch) -> Tensor:
    """(n,) the critic's value of each row's prompt (the turn's state)."""
    return policy.values(x.input_ids[:, : x.prompt_len], x.attention_mask[:, : x.prompt_len], critic)


@torch.no_grad()
def critic_values(policy, critic: str | None, batch: TurnBatch, micro_batch: int) -> Tensor | None:
    """(N,) the critic's value of each turn's prompt, at rollout time; None without a critic."""
    if critic is None:
        return None
    parts = chunks(torch.arange(len(batch)), micro_batch)
    with policy.gathered():
        values = [prompt_values(policy, critic, batch.select(r).trim().to(policy.device)).float() for r in parts]
    return torch.cat(values).cpu() if values else torch.zeros(0)  # a rank may hold none of a learner's rows


def learner_advantages(turns: Turns, a) -> tuple[Tensor, Tensor | None]:
    """The base algorithm's advantages (N,) over a learner's rows `turns` (with its rewards
    and, PPO, its critic's values; under RSPO the target's rows are the mixed groups),
    whitened when `algo.whiten_advantages`, and its critic returns (N,) or None.
    `a`: the `algo` config."""
    adv, returns = ALGORITHMS[a.name].advantages(
        turns, norm=a.norm, gamma=a.gamma, lam=a.gae_lambda, step_weight=a.step_weight
    )
    return (whiten(adv) if a.whiten_advantages else adv), returns


def loss_settings(a) -> dict[str, float]:
    """The numbers `micro_loss` takes from the `algo` config."""
    return {"clip_ratio": a.clip_ratio, "dual_clip": a.dual_clip, "kl_coef": a.kl_coef, "entropy_coef": a.entropy_coef}


def update_learner(
    acc, policy, learner: Learner, view: TurnBatch, reward: Tensor, adv: Tensor, returns: Tensor | None,
    values: Tensor | None, offpolicy: OffPolicy | None, cfg,
) -> dict[str, float]:  # fmt: skip
    """Epochs x minibatches of optimizer steps for `learner` on its rows `view` (N rows): their
    rewards and advantages (N,), for its critic (PPO) the `returns` and rollout-time `values`
    (N,), else None; `offpolicy`: the rows it did not sample and their correction, or None.
    Returns its metrics (averages over the updates applied)."""
    # Every rank must run the same number of synchronized backward passes (DDP all-reduces
    # in each): the minibatch count comes from the smallest rank's row count.
    num_rows = int(acc.gather(torch.tensor([len(view)], device=acc.device)).min())
    minibatches = min(cfg.train.minibatches, num_rows)
    if minibatches == 0:
        return {}
    weights = row_weights(view, cfg.algo.loss_agg)  # (N,) each row's token weight
    # CPU tensors: no device sync. A NaN/inf here skips every update below, on every rank.
    skip = not all(bool(t.isfinite().all()) for t in (reward, adv, returns) if t is not None)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    skipped = 0
    bar = tqdm(total=cfg.train.epochs * minibatches, desc=f"update {learner.name}", disable=not cfg.log.progress,
               leave=False)  # fmt: skip
    for _ in range(cfg.train.epochs):
        for mb in torch.randperm(len(view)).tensor_split(minibatches):
            x, off = view.select(mb), None if offpolicy is None else offpolicy.select(mb)
            with policy.gathered():  # FSDP: gathered anew per minibatch (the last step changed the shards)
                results = [policy_update(acc, policy, learner, x, adv[mb], weights[mb], off, cfg, skip)]
                if learner.critic:
                    results.append(critic_update(acc, policy, learner, x, values[mb], returns[mb], cfg, skip))
            for m in results:
                for k, value in (m or {}).items():
                    sums[k], counts[k] = sums.get(k, 0.0) + value, counts.get(k, 0) + 1
            skipped += count_skip(learner, None in results, cfg.train.max_skipped_updates)
            bar.update(1)
    bar.close()
    metrics = {k: v / counts[k] for k, v in sums.items()}
    return metrics | {
        "train/skipped_updates": float(skipped),
        "adv/mean": adv.mean().item(),
        "adv/abs_mean": adv.abs().mean().item(),
        "policy/sampled_nll": sampled_nll(view, offpolicy).item(),
        "reward/turn_mean": reward.mean().item(),
    }


def policy_update(
    acc, policy, learner: Learner, x: TurnBatch, adv: Tensor, weights: Tensor, off: OffPolicy | None, cfg, skip: bool
) -> dict[str, float] | None:
    """One optimizer step of the learner's policy on minibatch `x` (n rows; `adv`, `weights`
    (n,): advantages and token weights). Each micro-batch's token-mean loss counts by its
    share of the minibatch's token weight. Metrics, or None when skipped."""
    tokens = x.response_mask.sum(1) * weights  # (n,) each row's share before normalizing
    total = tokens.sum().clamp(min=1e-12)
    settings = loss_settings(cfg.algo)

    def terms(xr: TurnBatch, r: Tensor):
        return micro_loss(
            policy, learner.name, xr, adv[r], weights[r], None if off is None else off.select(r), **settings
        )

    m = step(acc, policy, learner.name, learner.optimizer, x, terms, lambda r: float(tokens[r].sum() / total),
             cfg.train, skip, "loss/grad_norm")  # fmt: skip
    if m is not None:
        learner.scheduler.step()
        m["train/lr"] = learner.scheduler.get_last_lr()[0]
    return m


def critic_update(
    acc, policy, learner: Learner, x: TurnBatch, values: Tensor, returns: Tensor, cfg, skip: bool
) -> dict[str, float] | None:
    """One optimizer step of the learner's critic on minibatch `x` (n rows; `values` (n,) at
    rollout time, `returns` (n,) its targets), each micro-batch's loss counting by its rows."""

    def terms(xr: TurnBatch, r: Tensor):
        return critic_loss(policy, learner.critic, xr, values[r], returns[r], cfg.algo.value_clip)

    return step(acc, policy, learner.critic, learner.critic_optimizer, x, terms, lambda r: len(r) / len(x),
                cfg.train, skip, "critic/grad_norm")  # fmt: skip


def sampled_nll(batch: TurnBatch, offpolicy: OffPolicy | None) -> Tensor:
    """Mean -log p of the tokens the learner sampled itself, as recorded at sampling (0-dim):
    at temperature 1 a Monte Carlo estimate of its per-token entropy (rising: the policy
    spreads out). Off-policy rows (RSPO's explorer, replayed and expert turns in the
    target's batch) are left out: their log-probs are another policy's. 0 when every row is
    off-policy."""
    own = batch.response_mask if offpolicy is None else batch.response_mask * (~offpolicy.rows)[:, None]
    return masked_mean(-batch.behavior_logprobs, own)


def row_weights(batch: TurnBatch, loss_agg: str) -> Tensor:
    """(N,) each row's token weight: 1 (`token_mean`), or 1 / the response-token count of
    the row's trajectory (`trajectory_mean`)."""
    if loss_agg == "token_mean":
        return torch.ones(len(batch))
    seg = Segments.of(batch.traj_id)
    tokens = seg.rows(batch.response_mask.sum(1).float())  # each row's response tokens
    per_trajectory = seg.expand(seg.sum(tokens)).expand_as(tokens)  # its trajectory's total, per row
    return 1.0 / seg.flat(per_trajectory).clamp(min=1.0)


def micro_loss(
    policy, name: str, x: TurnBatch, adv: Tensor, weight: Tensor, offpolicy: OffPolicy | None, *,
    clip_ratio: float, dual_clip: float, kl_coef: float, entropy_coef: float,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """Weighted token-mean loss of one micro-batch (`weight` (n,): each row's token weight):
    clipped policy loss (off-policy rows corrected), + kl_coef * KL to the reference,
    - entropy_coef * entropy. Returns (loss, metrics as detached 0-dim tensors)."""
    R = x.response_mask.shape[1]
    mask = x.response_mask * weight.to(x.response_mask)[:, None]  # (n, R)
    with policy.use(name):
        logp, entropy = policy.logprobs(x.input_ids, x.attention_mask, R, with_entropy=entropy_coef > 0)
    off = None if offpolicy is None else offpolicy.to(logp.device)
    loss, m = policy_loss(logp, x.behavior_logprobs, adv.to(logp.device), mask, clip_ratio=clip_ratio,
                          dual_clip=dual_clip, offpolicy=off)  # fmt: skip
    if kl_coef > 0:
        with torch.no_grad(), policy.reference():
            ref, _ = policy.logprobs(x.input_ids, x.attention_mask, R)
        kl = low_var_kl(logp, ref, mask)
        loss = loss + kl_coef * kl
        m["loss/kl"] = kl.detach()
    if entropy is not None:
        ent = masked_mean(entropy, mask)
        loss = loss - entropy_coef * ent
        m["loss/entropy"] = ent.detach()
    return loss, m


def critic_loss(policy, critic: str, x: TurnBatch, old_values: Tensor, returns: Tensor, clip: float):
    """The clipped value loss of one micro-batch (`rspo.algorithms.ppo.value_loss`) and its
    metrics ("loss/value", "critic/clip_frac", "critic/value_mean", "critic/return_mean")."""
    v = prompt_values(policy, critic, x)
    loss, m = value_loss(v.float(), old_values.to(v.device), returns.to(v.device), clip)
    return loss, {"loss/value": m.pop("critic/value_loss")} | m


def count_skip(learner: Learner, skipped: bool, limit: int) -> int:
    """Track `learner`'s run of skipped updates; raise once it is longer than `limit`."""
    learner.skipped_in_a_row = learner.skipped_in_a_row + 1 if skipped else 0
    if learner.skipped_in_a_row > limit:
        raise FloatingPointError(
            f"{learner.name}: {learner.skipped_in_a_row} updates in a row skipped for NaN/inf in the rewards, "
            f"advantages, loss or gradients (more than train.max_skipped_updates={limit}); stopping. "
            "Weights and the last checkpoint are untouched; check the rewards, or lower train.lr"
        )
    return int(skipped)


def step(acc, policy, net: str, optimizer, mb: TurnBatch, terms, share, train, skip: bool, norm_key: str):
    """One optimizer step of `net` on minibatch `mb`, accumulated over micro-batches of
    `train.micro_batch` rows: each micro-batch's loss (`terms(x, rows) -> (loss, metrics)`)
    weighted by its `share(rows)` of the minibatch's mean. Returns the minibatch's metrics
    and the gradient norm (under `norm_key`), or None when the step was skipped
    (`optimizer_step`; `skip`: the inputs hold a NaN/inf)."""
    sums: dict[str, Tensor] = {}  # loss terms, weighted sums on the device
    for rows, sync in accumulate(acc, policy.nets[net], len(mb), train.micro_batch):
        x = mb.select(rows).trim().to(policy.device)
        part = share(rows)  # a Python float: no device sync
        with sync:
            loss, m = terms(x, rows)
            acc.backward(loss * part)
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + v * part  # stays on the device
    host = optimizer_step(
        acc, optimizer, optimized(optimizer), train.max_grad_norm, skip, torch.stack(list(sums.values()))
    )
    if host is None:
        return None
    grad_norm, *values = host
    return dict(zip(sums, values)) | {norm_key: grad_norm}


def optimizer_step(
    acc, optimizer: torch.optim.Optimizer, params, max_norm: float, skip: bool, terms: Tensor
) -> list[float] | None:
    """Clip and apply the accumulated gradients; returns [grad norm, *terms] as Python
    numbers, or None when skipped. `terms` (k,): the minibatch's loss terms, on the device.

    Skipped when any rank saw a NaN/inf (`skip`: in its inputs; or in its `terms`) or the
    norm is one (it is the all-reduced gradients' norm, the same on every rank): the
    gradients are dropped and neither weights nor optimizer state change. The flags, the
    norm and the terms reach the host together: the minibatch's one host sync.
    """
    norm = acc.clip_grad_norm_(params, max_norm)
    norm = norm.full_tensor() if isinstance(norm, DTensor) else norm  # FSDP: the shards' norm, reduced
    norm = torch.as_tensor(norm, dtype=torch.float32, device=acc.device)
    terms = terms.detach().float().to(acc.device).reshape(-1)
    bad = (~terms.isfinite()).any().float().reshape(1) + float(skip)
    flags = acc.reduce(bad, reduction="sum")  # bad ranks (a no-op on one process)
    bad_ranks, *host = torch.cat([flags, norm.reshape(1), terms]).tolist()
    if bad_ranks or not math.isfinite(host[0]):
        optimizer.zero_grad(set_to_none=True)
        return None
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return host
