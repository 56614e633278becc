"""Multi-turn rollouts: all active envs step in lockstep, one batched `generate` per turn.

For B tasks, each policy in the plan (e.g. G target + E explorer trajectories) plays
every task with the same env seed; the trajectories of one task form one group. Each turn:
  1. every active env's prompt is rendered (task, recent history, observation, actions);
  2. per policy, ONE left-padded `generate` over its active envs (chunked by
     `micro_batch` to bound memory, prompts sorted by length so that a chunk holds
     similar lengths: less padding), stopping at `</action>` or eos. With `rollout.mixed_adapters` (LoRA)
     every policy's envs share the passes instead, each row with its own adapter; with
     `rollout.merge_adapter` the adapter is merged into the base weights for the pass;
  3. behavior log-probs of the sampled tokens come from a forward pass over the same ids
     (`rollout.behavior_logprobs=sampler`: from the sampling pass's own logits; an
     `EXPERT_PLAN` slot runs no model: the env's expert answers, log-probs 0);
  4. the parsed actions go to the env pool, which steps all envs in parallel. An env that
     fails (raises, hangs or its worker dies) ends its trajectory as failed, with the
     reason in `Trajectory.fault`.
Each turn becomes one row of a `TurnBatch` (per-turn samples, as GiGPO does).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import warnings
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from rspo.batch import TurnBatch
from rspo.envs.base import EnvState
from rspo.prompts import Turn, add_history, format_response, parse_action, render_prompt

STOP = "</action>"


EXPERT_PLAN = "expert"  # a Plan's adapter when the env's expert plays instead of a policy


@dataclass
class Plan:
    """One policy's share of a rollout: `count` trajectories per task, sampled by `adapter`
    (`EXPERT_PLAN`: the env's expert acts, its answers written as the prompt asks; no model
    samples), in every task or only in those at `groups`. An expert's behaviour log-probs
    are 0 (probability 1, LUFFY's), or with `scored_by` that policy's log-probs of the
    expert's tokens, as if it had sampled them."""

    adapter: str
    count: int
    source: int  # TARGET / EXPLORER / EXPERT (batch.py)
    groups: tuple[int, ...] | None = None  # positions in `tasks` it plays; None: every task
    scored_by: str | None = None  # EXPERT_PLAN: the policy whose log-probs are the behaviour's

    def plays(self, group: int) -> bool:
        return self.groups is None or group in self.groups


@dataclass
class Trajectory:
    """Per-trajectory summary (for logging, eval and the replay buffer)."""

    group_id: int
    traj_id: int
    source: int
    split: str
    task_index: int
    task: str
    task_type: str
    won: bool = False
    score: float = 0.0
    outcome: float = 0.0  # sum of outcome rewards
    process: float = 0.0  # sum of process rewards
    turns: int = 0
    invalid: int = 0  # turns with no parsable <action> (the format the prompt asks for)
    noop: int = 0  # turns the env did not apply (EnvState.valid False): unparsable or inadmissible
    fault: str = ""  # why its env failed (it then ends as failed; `rspo.envs.pool`), "" if it did not
    transcript: list[tuple[str, str]] = field(default_factory=list)  # (observation, response) per turn


@dataclass
class Rollout:
    batch: TurnBatch
    trajectories: list[Trajectory]
    timing: dict[str, float]  # seconds: generate, reset, env (steps); counts: tokens, env_steps


def anchor_key(observation: str) -> int:
    """A deterministic 63-bit hash of the raw observation (GiGPO's anchor state)."""
    return int.from_bytes(hashlib.blake2b(observation.encode(), digest_size=8).digest(), "little") >> 1


def response_lengths(tokenizer, responses: torch.Tensor, eos_ids: set[int]) -> list[int]:
    """Length of each generated response: through `</action>`, else through the first eos.

    Decoding decides where `</action>` ends (it may span tokens); the pad id may equal eos
    (SmolLM2), so padding is never told apart by id alone.
    """
    lengths = []
    for row in responses.tolist():
        n = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
        if STOP in tokenizer.decode(row[:n]):
            lo, hi = 1, n  # smallest prefix whose text holds the stop string
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if STOP in tokenizer.decode(row[:mid]) else (mid + 1, hi)
            n = lo
        lengths.append(n)
    return lengths


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask), both (n, max_len), left-padded; the mask comes from lengths."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
    return ids, mask


@torch.no_grad()
def generate(
    policy,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    logprobs_from: str = "forward",
    rows: list[str] | None = None,
    merge_adapter: bool = False,
):
    """Sample one response per prompt. Returns (response ids list, behavior log-probs list).
    `rows`: the policy of each prompt (one mixed-adapter pass), else the active policy.
    `merge_adapter`: sample with the active LoRA adapter merged into the base weights
    (`Policy.merged`; not with `rows`): the same distribution up to float rounding, faster.

    Behavior log-probs are log pi(token) at temperature 1 (the policy itself, as the
    trainer scores it), from `logprobs_from`:
      forward  a separate forward pass over prompt + response: bit-for-bit what the
               update's forward computes, so the on-policy ratio starts at exactly 1;
      sampler  the logits of the sampling pass itself (KV-cached): no second prefill,
               equal up to float rounding (~1e-6 in fp32, more in bf16);
      none     not computed (zeros): evaluation reads only the responses.
    """
    tok = policy.tokenizer
    ids, mask = left_pad(prompts, tok.pad_token_id)
    ids, mask = ids.to(policy.device), mask.to(policy.device)
    # top_k=0: sample from the policy's own distribution (HF's default top_k=50 would not)
    sampling = dict(temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 else {}
    with policy.merged() if merge_adapter and rows is None else contextlib.nullcontext():
        out = policy.generate(
            ids,
            mask,
            rows,
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0,
            stop_strings=[STOP],
            tokenizer=tok,
            pad_token_id=tok.pad_token_id,
            output_logits=logprobs_from == "sampler",
            return_dict_in_generate=True,
            **sampling,
        )
    responses = out.sequences[:, ids.shape[1] :].cpu()
    lengths = response_lengths(tok, responses, policy.eos_token_ids)
    resp = [responses[i, :n].tolist() for i, n in enumerate(lengths)]
    if logprobs_from == "forward":
        return resp, score(policy, prompts, resp, rows)
    if logprobs_from == "none":
        return resp, [[0.0] * n for n in lengths]
    R = max(lengths)
    logits = torch.stack(out.logits[:R], dim=1).float()  # (n, R, V) raw logits, before temperature/top-p
    logprobs = logits.log_softmax(-1).gather(-1, responses[:, :R, None].to(logits.device)).squeeze(-1).cpu()
    return resp, [logprobs[i, :n].tolist() for i, n in enumerate(lengths)]


@torch.no_grad()
def score(policy, prompts: list[list[int]], responses: list[list[int]], rows: list[str] | None = None):
    """Log-probs (temperature 1) of each response's tokens after its prompt under the active
    policy (`rows`: each row's), from one forward pass over the left-padded prompts and
    right-padded responses: bit for bit what the update's forward computes."""
    pad = policy.tokenizer.pad_token_id
    ids, mask = left_pad(prompts, pad)
    R = max(len(r) for r in responses)
    resp = torch.tensor([r + [pad] * (R - len(r)) for r in responses], dtype=torch.long).reshape(len(responses), R)
    resp_mask = (torch.arange(R)[None, :] < torch.tensor([len(r) for r in responses])[:, None]).long()
    full_ids, full_mask = torch.cat([ids, resp], dim=1), torch.cat([mask, resp_mask], dim=1)
    logprobs, _ = policy.logprobs(full_ids.to(policy.device), full_mask.to(policy.device), R, rows=rows)
    logprobs = logprobs.float().cpu()
    return [logprobs[i, : len(r)].tolist() for i, r in enumerate(responses)]


@dataclass
class _Slot:
    """One env's trajectory in progress."""

    traj: Trajectory
    adapter: str
    state: EnvState
    history: list[tuple[str, str]] = field(default_factory=list)
    done: bool = False


def _new_slots(plans: list[Plan], tasks: list[tuple[str, int]], states: list[EnvState]) -> list[_Slot]:
    slots = []
    for group, (split, index) in enumerate(tasks):
        for plan in filter(lambda p: p.plays(group), plans):
            for _ in range(plan.count):
                state = states[len(slots)]
                traj = Trajectory(group, len(slots), plan.source, split, index, state.task, state.task_type)
                slots.append(_Slot(traj, plan.adapter, state))
    return slots


def collect(
    policy,
    pool,
    env_name: str,
    tasks: list[tuple[str, int]],
    plans: list[Plan],
    cfg,
    *,
    temperature: float,
    max_turns: int,
    progress: bool = True,
    desc: str = "rollout",
    behavior_logprobs: bool = True,
) -> Rollout:
    """Play every task with every plan's policy; return the per-turn batch.

    `cfg` is the `RolloutConfig`; `max_turns` caps the episode (the env's cap otherwise).
    `pool` must hold at least `len(tasks) * sum(p.count for p in plans)` envs.
    `behavior_logprobs=False` (evaluation) skips them: the batch's are zeros.
    """
    logprobs_from = cfg.behavior_logprobs if behavior_logprobs else "none"
    env_tasks = [t for g, t in enumerate(tasks) for p in plans if p.plays(g) for _ in range(p.count)]
    n = len(env_tasks)
    t0 = time.perf_counter()
    states = pool.reset(env_tasks + [None] * (pool.num_envs - n))[:n]
    timing = {"generate": 0.0, "reset": time.perf_counter() - t0, "env": 0.0, "tokens": 0.0, "env_steps": 0.0}
    slots = _new_slots(plans, tasks, states)
    scorer = next((p.scored_by for p in plans if p.adapter == EXPERT_PLAN), None)  # the expert's log-probs
    rows: list[dict] = []
    bar = tqdm(total=max_turns, desc=desc, disable=not progress, leave=False)
    for turn in range(max_turns):
        active = [i for i, s in enumerate(slots) if not s.done]
        if not active:
            break
        actions: list[str | None] = [None] * pool.num_envs
        t0 = time.perf_counter()
        if experts := [i for i in active if slots[i].adapter == EXPERT_PLAN]:  # no model: the env's expert
            rows += _expert_turns(policy, pool, env_name, slots, experts, turn, actions, cfg, scorer)
        active_models = [i for i in active if slots[i].adapter != EXPERT_PLAN]
        adapters = list(dict.fromkeys(slots[i].adapter for i in active_models))
        mixed = cfg.mixed_adapters and len(adapters) > 1  # one pass for every policy's rows
        for adapter in [None] if mixed else adapters:
            ids = [i for i in active_models if mixed or slots[i].adapter == adapter]
            prompts = [_prompt(policy.tokenizer, env_name, slots[i], cfg) for i in ids]
            order = sorted(range(len(ids)), key=lambda k: len(prompts[k]))  # similar lengths share a chunk
            ids, prompts = [ids[k] for k in order], [prompts[k] for k in order]
            with policy.use(adapter or "target"):
                for c in range(0, len(ids), cfg.micro_batch):
                    chunk = slice(c, c + cfg.micro_batch)
                    rows_of = [slots[i].adapter for i in ids[chunk]] if mixed else None
                    resp, logp = generate(
                        policy,
                        prompts[chunk],
                        cfg.max_new_tokens,
                        temperature,
                        cfg.top_p,
                        logprobs_from,
                        rows_of,
                        merge_adapter=cfg.merge_adapter,
                    )
                    for i, p, r, lp in zip(ids[chunk], prompts[chunk], resp, logp):
                        text = policy.tokenizer.decode(r, skip_special_tokens=True)
                        actions[i], valid = parse_action(text)
                        rows.append(
                            dict(
                                slot=i,
                                turn=turn,
                                prompt=p,
                                response=r,
                                logprobs=lp,
                                valid=valid,
                                anchor=anchor_key(slots[i].state.observation),
                                text=text,
                            )
                        )
                        timing["tokens"] += len(r)
        timing["generate"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        new_states = pool.step(actions)
        timing["env"] += time.perf_counter() - t0
        timing["env_steps"] += len(active)
        for row in rows[len(rows) - len(active) :]:
            _advance(slots[row["slot"]], row, new_states[row["slot"]], actions[row["slot"]], cfg.history_length)
        bar.update(1)
    bar.close()
    return Rollout(_assemble(rows, slots, policy.tokenizer.pad_token_id), [s.traj for s in slots], timing)


def _expert_turns(
    policy, pool, env_name: str, slots, ids: list[int], turn: int, actions: list, cfg, scorer: str | None
) -> list[dict]:
    """One turn of the expert's slots `ids`: its actions (written into `actions`) as rows
    shaped like a policy's, the answer in the prompt's format (`format_response`, as the warm
    start's demonstrations). Behaviour log-probs: 0 (no behaviour policy: probability 1), or
    policy `scorer`'s log-probs of the answer's tokens (`Plan.scored_by`)."""
    tokenizer = policy.tokenizer
    said = pool.expert_actions([i in ids for i in range(pool.num_envs)])
    texts = [format_response(said[i], cfg.require_think) for i in ids]
    responses = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    prompts = [_prompt(tokenizer, env_name, slots[i], cfg) for i in ids]
    if scorer is None:
        logprobs = [[0.0] * len(r) for r in responses]
    else:
        with policy.use(scorer):
            logprobs = score(policy, prompts, responses)
    rows = []
    for i, text, prompt, response, logp in zip(ids, texts, prompts, responses, logprobs):
        actions[i], valid = parse_action(text)
        anchor = anchor_key(slots[i].state.observation)
        rows.append(dict(slot=i, turn=turn, prompt=prompt, response=response, logprobs=logp,
                         valid=valid, anchor=anchor, text=text))  # fmt: skip
    return rows


def _prompt(tokenizer, env_name: str, slot: _Slot, cfg) -> list[int]:
    s = slot.state
    turn = Turn(s.task, s.observation, s.admissible, slot.history)
    ids = render_prompt(tokenizer, env_name, turn, cfg.require_think, cfg.max_prompt_tokens)
    if len(ids) > cfg.max_prompt_tokens:  # task + observation alone exceed the budget: keep them whole
        warnings.warn(  # shown once per run by Python's default warning filter
            f"a prompt exceeds rollout.max_prompt_tokens={cfg.max_prompt_tokens} even without history "
            "and actions (kept whole); raise the budget",
            stacklevel=2,
        )
    return ids


def _advance(slot: _Slot, row: dict, state: EnvState, action: str, history_length: int) -> None:
    """Record the env's answer to one turn in the row and the trajectory."""
    t = slot.traj
    row.update(outcome=state.outcome, process=state.process)
    t.turns += 1
    t.invalid += not row["valid"]
    t.noop += not state.valid
    t.outcome += state.outcome
    t.process += state.process
    t.transcript.append((slot.state.observation, row["text"]))
    slot.history = add_history(slot.history, slot.state.observation, action, history_length)
    slot.state = state
    if state.done:
        slot.done = True
        t.won, t.score = state.won, state.score
        t.fault = state.info.get("error", "")


def _assemble(rows: list[dict], slots: list[_Slot], pad_id: int) -> TurnBatch:
    """Pad the rows into one TurnBatch sorted by (traj_id, turn)."""
    rows = sorted(rows, key=lambda r: (r["slot"], r["turn"]))
    prompt_ids, prompt_mask = left_pad([r["prompt"] for r in rows], pad_id)
    R = max(len(r["response"]) for r in rows)
    resp = torch.full((len(rows), R), pad_id, dtype=torch.long)
    resp_mask = torch.zeros((len(rows), R))
    logp = torch.zeros((len(rows), R))
    for i, r in enumerate(rows):
        n = len(r["response"])
        resp[i, :n] = torch.tensor(r["response"], dtype=torch.long)
        resp_mask[i, :n] = 1
        logp[i, :n] = torch.tensor(r["logprobs"])
    traj = torch.tensor([r["slot"] for r in rows])
    last = torch.ones(len(rows), dtype=torch.bool)
    last[:-1] = traj[1:] != traj[:-1]

    def col(key, dtype=torch.float):
        return torch.tensor([r[key] for r in rows], dtype=dtype)

    def per_slot(fn, dtype=torch.long):
        return torch.tensor([fn(slots[r["slot"]].traj) for r in rows], dtype=dtype)

    return TurnBatch(
        input_ids=torch.cat([prompt_ids, resp], dim=1),
        attention_mask=torch.cat([prompt_mask, resp_mask.long()], dim=1),
        response_mask=resp_mask,
        behavior_logprobs=logp,
        group_id=per_slot(lambda t: t.group_id),
        traj_id=traj,
        turn=col("turn", torch.long),
        last=last,
        outcome=col("outcome"),
        process=col("process"),
        valid=col("valid", torch.bool),
        anchor=col("anchor", torch.long),
        source=per_slot(lambda t: t.source),
        task_index=per_slot(lambda t: t.task_index),
    )
