"""The rollout engine on the tiny model and in-process WebShop: masks, log-probs, batching."""

import pytest
import torch
from conftest import small_config

from rspo.batch import EXPERT, EXPLORER, TARGET
from rspo.envs import make_env
from rspo.envs.pool import EnvPool
from rspo.policy_io import build_policy
from rspo.prompts import parse_action
from rspo.rollout import EXPERT_PLAN, Plan, collect, generate
from rspo.sft import demo_corpus


@pytest.fixture(scope="module")
def setup():
    cfg = small_config()
    pool = EnvPool(cfg.env, 8)
    torch.manual_seed(0)
    policy = build_policy(cfg.model, demo_corpus(cfg, pool, episodes=8), adapters=["target", "explorer"])
    yield cfg, pool, policy
    pool.close()


@pytest.fixture(scope="module")
def rollout(setup):
    cfg, pool, policy = setup
    torch.manual_seed(1)
    plans = [Plan("target", 2, TARGET), Plan("explorer", 1, EXPLORER)]
    return collect(
        policy,
        pool,
        "webshop",
        [("train", 3), ("train", 7)],
        plans,
        cfg.rollout,
        temperature=1.0,
        max_turns=3,
        progress=False,
    )


def test_batch_layout(rollout):
    b, trajs = rollout.batch, rollout.trajectories
    assert len(trajs) == 6  # 2 tasks x (2 target + 1 explorer)
    assert [t.source for t in trajs] == [TARGET, TARGET, EXPLORER] * 2
    assert [t.group_id for t in trajs] == [0, 0, 0, 1, 1, 1]
    assert sum(t.turns for t in trajs) == len(b)
    # Rows sorted by (traj_id, turn), turns counted from 0, `last` on each trajectory's final row.
    key = b.traj_id * 100 + b.turn
    assert torch.equal(key, key.sort().values)
    assert int(b.last.sum()) == len(trajs)
    assert torch.equal(b.turn[b.last] + 1, torch.tensor([t.turns for t in trajs]))
    assert torch.equal(b.group_id, torch.tensor([trajs[i].group_id for i in b.traj_id.tolist()]))
    assert torch.equal(b.task_index, torch.tensor([(3, 7)[trajs[i].group_id] for i in b.traj_id.tolist()]))


def test_masks_cover_only_generated_tokens(rollout, setup):
    _, _, policy = setup
    b = rollout.batch
    R, P = b.response_mask.shape[1], b.prompt_len
    assert torch.equal(b.attention_mask[:, P:].float(), b.response_mask)  # response part: real tokens only
    assert (b.response_mask.sum(1) >= 1).all()
    # Everything masked in is a sampled token; masked-out response slots hold padding.
    pad = policy.tokenizer.pad_token_id
    assert (b.input_ids[:, P:][b.response_mask == 0] == pad).all()
    assert (b.behavior_logprobs[b.response_mask == 0] == 0).all()
    assert (b.behavior_logprobs[b.response_mask == 1] <= 0).all()
    max_new = small_config().rollout.max_new_tokens
    assert max_new >= R


def test_behavior_logprobs_equal_a_fresh_forward(rollout, setup):
    _, _, policy = setup
    b = rollout.batch
    for adapter, source in (("target", TARGET), ("explorer", EXPLORER)):
        rows = b.source == source
        with torch.no_grad(), policy.use(adapter):
            fresh, _ = policy.logprobs(b.input_ids[rows], b.attention_mask[rows], b.response_mask.shape[1])
        m = b.response_mask[rows]
        torch.testing.assert_close(fresh * m, b.behavior_logprobs[rows], atol=1e-4, rtol=0)


def test_rewards_and_anchors(rollout):
    b, trajs = rollout.batch, rollout.trajectories
    for t in trajs:
        rows = b.traj_id == t.traj_id
        assert b.outcome[rows].sum().item() == pytest.approx(t.outcome)
        assert b.process[rows].sum().item() == pytest.approx(t.process, abs=1e-6)
    # Same task, same seed: every trajectory's first turn sees the same observation -> same anchor.
    first = b.turn == 0
    for g in (0, 1):
        assert len(set(b.anchor[first & (b.group_id == g)].tolist())) == 1
    assert b.anchor[first & (b.group_id == 0)][0] != b.anchor[first & (b.group_id == 1)][0]


def test_untrained_model_outputs_never_crash(rollout):
    # A nearly random model mostly emits garbage: those turns are invalid, nothing raises.
    trajs = rollout.trajectories
    assert sum(t.invalid for t in trajs) == int((~rollout.batch.valid).sum())


def test_noops_are_the_turns_the_env_rejected(rollout, setup):
    # Replay each trajectory's actions in a fresh env: `noop` counts the steps it did not
    # apply (EnvState.valid False), a superset of the unparsable (`invalid`) turns.
    env = make_env(setup[0].env)
    for t in rollout.trajectories:
        env.reset(t.split, t.task_index)
        rejected = sum(not env.step(parse_action(response)[0]).valid for _, response in t.transcript)
        assert t.noop == rejected >= t.invalid
    assert sum(t.noop for t in rollout.trajectories) > 0  # the garbage turns, at least


def test_left_padded_batch_acts_like_one_at_a_time_greedy(setup):
    _, _, policy = setup
    tok = policy.tokenizer
    prompts = [
        tok(t, add_special_tokens=False)["input_ids"]
        for t in ["Instruction: buy a red shirt", "WebShop [SEP] Search", "click[buy now] and then search for shoes"]
    ]
    batched, batched_lp = generate(policy, prompts, 8, temperature=0.0, top_p=1.0)
    for p, r, lp in zip(prompts, batched, batched_lp):
        alone, alone_lp = generate(policy, [p], 8, temperature=0.0, top_p=1.0)
        assert alone[0] == r
        torch.testing.assert_close(torch.tensor(alone_lp[0]), torch.tensor(lp), atol=1e-4, rtol=0)


def test_sampler_logprobs_equal_a_second_forward(setup):
    # rollout.behavior_logprobs=sampler reads the sampling pass's own logits instead of a second forward.
    _, _, policy = setup
    tok = policy.tokenizer
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ["Instruction: buy a red shirt", "WebShop"]]
    torch.manual_seed(3)
    resp_f, lp_f = generate(policy, prompts, 10, temperature=1.0, top_p=1.0, logprobs_from="forward")
    torch.manual_seed(3)
    resp_s, lp_s = generate(policy, prompts, 10, temperature=1.0, top_p=1.0, logprobs_from="sampler")
    assert resp_f == resp_s
    for a, b in zip(lp_f, lp_s):
        torch.testing.assert_close(torch.tensor(b), torch.tensor(a), atol=1e-4, rtol=0)


def test_merged_adapter_samples_the_same_distribution(setup):
    # rollout.merge_adapter: sampling with the adapter merged into the base; the sampler's
    # log-probs then come from the merged weights, equal to the adapter's forward up to rounding.
    _, _, policy = setup
    tok = policy.tokenizer
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ["Instruction: buy a red shirt", "WebShop"]]
    torch.manual_seed(3)
    resp_f, lp_f = generate(policy, prompts, 10, 1.0, 1.0, logprobs_from="forward", merge_adapter=True)
    torch.manual_seed(3)
    resp_s, lp_s = generate(policy, prompts, 10, 1.0, 1.0, logprobs_from="sampler", merge_adapter=True)
    assert resp_f == resp_s  # the same merged sampling pass
    for a, b in zip(lp_f, lp_s):
        torch.testing.assert_close(torch.tensor(b), torch.tensor(a), atol=1e-4, rtol=0)


def test_sampling_is_seeded(setup):
    cfg, pool, policy = setup
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        ro = collect(
            policy,
            pool,
            "webshop",
            [("train", 1)],
            [Plan("target", 2, TARGET)],
            cfg.rollout,
            temperature=1.0,
            max_turns=2,
            progress=False,
        )
        runs.append(ro.batch)
    assert torch.equal(runs[0].input_ids, runs[1].input_ids)


def record_generate(monkeypatch) -> list[tuple[list, list | None]]:
    """The (prompts, rows' policies or None) of every `generate` call `collect` makes from now on."""
    import rspo.rollout as rollout_module

    calls, inner = [], rollout_module.generate

    def recording(policy, prompts, *args, **kwargs):
        calls.append((prompts, args[-1]))
        return inner(policy, prompts, *args, **kwargs)

    monkeypatch.setattr(rollout_module, "generate", recording)
    return calls


def test_chunks_hold_prompts_sorted_by_length(setup, monkeypatch):
    # 8 envs in chunks of 3: each policy's generate calls of a turn see its prompts in order
    # of length, so a chunk pads to a near length; every row still lands on its own env
    cfg, pool, policy = setup
    recorded = record_generate(monkeypatch)
    monkeypatch.setattr(cfg.rollout, "micro_batch", 3)
    tasks, plans = [("train", 3), ("train", 9)], [Plan("target", 4, TARGET)]
    ro = collect(policy, pool, "webshop", tasks, plans, cfg.rollout, temperature=1.0, max_turns=2, progress=False)
    calls = [prompts for prompts, _ in recorded]
    assert [len(c) for c in calls[:3]] == [3, 3, 2]  # turn 0: 8 prompts in chunks of 3
    lengths = [len(p) for c in calls[:3] for p in c]
    assert lengths == sorted(lengths)
    b = ro.batch
    P, rows = b.prompt_len, (b.turn == 0).nonzero().squeeze(1).tolist()
    first = [b.input_ids[i, :P][b.attention_mask[i, :P].bool()].tolist() for i in rows]
    groups = [int(b.group_id[i]) for i in rows]
    for g in (0, 1):  # the 4 envs of a task share its first prompt, the other task's differs
        assert len({tuple(p) for p, gg in zip(first, groups) if gg == g}) == 1
    assert first[groups.index(0)] != first[groups.index(1)]


def test_mixed_adapter_passes_equal_one_pass_per_policy(setup, monkeypatch):
    # rollout.mixed_adapters: target and explorer rows share each generate / forward pass,
    # each row with its own LoRA adapter. Greedy, it must play exactly as one pass per policy.
    cfg, pool, policy = setup
    lora_b = [p for name, p in policy.peft_model.named_parameters() if "lora_B" in name]
    saved = [p.detach().clone() for p in lora_b]
    torch.manual_seed(0)
    for p in lora_b:  # LoRA B starts at 0: make the policies differ (restored at the end)
        p.data.normal_(0, 0.5)
    try:
        check_mixed_equals_unmixed(cfg, pool, policy, monkeypatch)
    finally:
        for p, s in zip(lora_b, saved):
            p.data.copy_(s)


def check_mixed_equals_unmixed(cfg, pool, policy, monkeypatch):
    tok = policy.tokenizer
    prompt = [tok("WebShop [SEP] Search", add_special_tokens=False)["input_ids"]]
    greedy = {}
    for name in ("target", "explorer"):
        with policy.use(name):
            greedy[name] = generate(policy, prompt, 6, temperature=0.0, top_p=1.0)
    assert greedy["target"] != greedy["explorer"]  # so a pass that ran one adapter for all rows would fail

    recorded = record_generate(monkeypatch)
    monkeypatch.setattr(cfg.rollout, "micro_batch", 3)
    tasks, plans = [("train", 3), ("train", 9)], [Plan("target", 2, TARGET), Plan("explorer", 2, EXPLORER)]
    runs = {}
    for mixed in (False, True):
        monkeypatch.setattr(cfg.rollout, "mixed_adapters", mixed)
        recorded.clear()
        runs[mixed] = collect(
            policy, pool, "webshop", tasks, plans, cfg.rollout, temperature=0.0, max_turns=2, progress=False
        )
        passes = [rows for _, rows in recorded]  # the rows' policies (None: the active one's)
        if mixed:  # turn 0: 8 envs, 4 per policy, in 3 passes of <= 3 rows (2 + 2 unmixed)
            assert [len(rows) for rows in passes[:3]] == [3, 3, 2]
            assert sorted(r for rows in passes[:3] for r in rows) == ["explorer"] * 4 + ["target"] * 4
        else:
            assert passes[:4] == [None] * 4
    a, b = runs[False].batch, runs[True].batch
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.response_mask, b.response_mask)
    torch.testing.assert_close(b.behavior_logprobs, a.behavior_logprobs, atol=1e-4, rtol=0)
    assert [t.source for t in runs[True].trajectories] == [TARGET, TARGET, EXPLORER, EXPLORER] * 2


def test_expert_plan_plays_the_envs_expert_in_its_groups_only(setup):
    # RSPO's ceiling: the expert plays task 1 only (groups=(1,)); the target plays both tasks
    cfg, pool, policy = setup
    torch.manual_seed(2)
    plans = [Plan("target", 1, TARGET), Plan(EXPERT_PLAN, 1, EXPERT, groups=(1,))]
    ro = collect(policy, pool, "webshop", [("train", 3), ("train", 7)], plans, cfg.rollout,
                 temperature=1.0, max_turns=10, progress=False)  # fmt: skip
    assert [(t.group_id, t.source) for t in ro.trajectories] == [(0, TARGET), (1, TARGET), (1, EXPERT)]
    expert = ro.trajectories[2]
    assert expert.won and expert.invalid == 0 and expert.noop == 0  # WebShop's oracle buys the goal's item
    b = ro.batch
    rows = b.source == EXPERT
    assert torch.equal(b.behavior_logprobs[rows], torch.zeros_like(b.behavior_logprobs[rows]))  # probability 1
    assert bool(b.valid[rows].all()) and int(b.outcome[rows].sum()) == 1
    first = b.select(rows.nonzero()[0])  # its first turn: the answer written as the prompt asks, the search
    text = policy.tokenizer.decode(first.input_ids[0, first.prompt_len :][first.response_mask[0].bool()])
    assert text.startswith("<action>search[") and text.endswith("]</action>")


def test_expert_rows_scored_by_the_target(setup):
    # `Plan.scored_by` (rspo.expert_behavior=target): the expert's behaviour log-probs are the
    # target's own of its tokens, what the update's forward pass computes for those rows
    cfg, pool, policy = setup
    plans = [Plan("target", 1, TARGET), Plan(EXPERT_PLAN, 1, EXPERT, groups=(1,), scored_by="target")]
    ro = collect(policy, pool, "webshop", [("train", 3), ("train", 7)], plans, cfg.rollout,
                 temperature=1.0, max_turns=10, progress=False)  # fmt: skip
    b = ro.batch.select((ro.batch.source == EXPERT).nonzero().squeeze(1)).trim()
    with policy.use("target"):
        logp, _ = policy.logprobs(b.input_ids, b.attention_mask, b.response_mask.shape[1])
    mask = b.response_mask.bool()
    assert bool((b.behavior_logprobs[mask] < 0).all())  # not probability 1
    torch.testing.assert_close(b.behavior_logprobs[mask], logp[mask].float())
