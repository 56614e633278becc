"""End to end on the tiny model and in-process WebShop: every algorithm and reward mode
trains, resume reproduces, checkpoints load with stock peft (NaN/inf and env faults:
test_faults.py)."""

import json
import math

import peft
import pytest
import torch
from conftest import small_config

from rspo.checkpoint import weights_digest
from rspo.eval import evaluate_command
from rspo.policy import CRITIC
from rspo.train import rl_step, setup, train


def snapshot(policy, name):
    return [p.detach().clone() for p in policy.parameters_of(name)]


def moved(before, after):
    return all(not torch.equal(a, b) for a, b in zip(before, after)) and len(before) > 0


def base_weights(policy):
    return {n: p.detach().clone() for n, p in policy.peft_model.named_parameters() if "lora_" not in n}


@pytest.mark.parametrize("mode", ["outcome", "rspo"])
@pytest.mark.parametrize("algo", ["grpo", "ppo", "gigpo"])
def test_two_steps_train_every_algorithm(warm_model, tmp_path, monkeypatch, algo, mode):
    import rspo.algorithms.losses

    real, offpolicy_calls = rspo.algorithms.losses.offpolicy_token_loss, []
    monkeypatch.setattr(rspo.algorithms.losses, "offpolicy_token_loss",
                        lambda *a, **k: offpolicy_calls.append(1) or real(*a, **k))  # fmt: skip
    cfg = small_config(
        f"algo.name={algo}",
        f"reward.mode={mode}",
        f"model.init_from={warm_model}",
        f"train.output_dir={tmp_path}",
        "rspo.explorer_rollouts=2",
        "rspo.replay_per_task=1",
        "rspo.buffer_successes_only=false",
        "train.minibatches=2",
        # the warm start rarely succeeds, so returns differ by the invalid-action penalty:
        # five turns instead of three, and groups of four, give each group more chances to
        # differ (with groups of two, one machine's warm start made no invalid action in a step)
        "rollout.max_turns=5",
        "rollout.group_size=4",
    )
    torch.manual_seed(0)
    run = setup(cfg)
    try:
        learners = list(run.learners)
        assert learners == (["target", "explorer"] if mode == "rspo" else ["target"])
        before = {n: snapshot(run.policy, n) for n in learners}
        base = base_weights(run.policy)
        critic = snapshot(run.policy, CRITIC) if algo == "ppo" else None
        history = []
        for _ in range(2):
            history.append(rl_step(run))
            run.step += 1
        for name in learners:  # every trainable parameter of every learner changed
            assert moved(before[name], snapshot(run.policy, name)), name
        after = base_weights(run.policy)
        assert all(torch.equal(base[n], after[n]) for n in base)  # LoRA: the base stays frozen
        if critic is not None:
            assert moved(critic, snapshot(run.policy, CRITIC))
            assert "loss/value" in history[-1]
            critic_metrics = {"critic/clip_frac", "critic/value_mean", "critic/return_mean"}  # logged, each learner
            assert critic_metrics <= set(history[-1])
            if mode == "rspo":
                assert {f"explorer/{k}" for k in critic_metrics} <= set(history[-1])
        for metrics in history:
            assert all(math.isfinite(v) for v in metrics.values()), metrics
            assert metrics["adv/abs_mean"] > 0
            assert metrics["policy/sampled_nll"] > 0  # sampled at T = 1 from a spread-out policy: -log p > 0
        if mode == "rspo":
            assert "explorer/loss/policy" in history[-1] and "explorer/rollout/success_rate" in history[-1]
            assert len(run.mode.buffer) > 0  # explorer trajectories stored for replay
            assert history[-1]["offpolicy/token_frac"] > 0  # explorer/replayed turns in the target's loss
        else:  # a single learner samples every row it trains on: RSPO's off-policy code never runs
            assert not offpolicy_calls and not any(k.startswith("offpolicy/") for m in history for k in m)
        assert bool(offpolicy_calls) == (mode == "rspo")
    finally:
        run.pool.close()


def test_train_writes_eval_checkpoint_and_tensorboard(warm_model, tmp_path, capsys):
    cfg = small_config(
        f"model.init_from={warm_model}",
        f"train.output_dir={tmp_path}",
        "train.steps=2",
        "train.save_every=1",
        "log.tensorboard=true",
        "log.sample_every=1",
        "eval.final_temperatures=[1.0]",
    )
    out = train(cfg)
    assert set(out["before"]) == set(out["after"])
    assert "eval/test/success_rate" in out["after"] and 0 <= out["after"]["eval/test/success_rate"] <= 1
    assert any(k.startswith("eval/test/") and k.count("/") == 3 for k in out["after"])  # per product category
    summary = json.loads((tmp_path / "eval_summary.json").read_text())
    assert summary["after"] == out["after"]
    # the final weights also at temperature 1 (eval.final_temperatures): every task, its own metrics
    assert [t["task_index"] for t in summary["final_at"]["1"]["tasks"]] == [
        t["task_index"] for t in summary["after_tasks"]
    ]
    assert 0 <= summary["final_at"]["1"]["metrics"]["eval_T1/test/success_rate"] <= 1
    assert [p.name for p in sorted((tmp_path / "checkpoints").iterdir())] == ["step_000001", "step_000002"]
    assert list(tmp_path.joinpath("tb").glob("events.out.tfevents.*"))
    # The saved target adapter is a stock peft adapter on the warm-start base.
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(warm_model)
    model = peft.PeftModel.from_pretrained(base, tmp_path / "checkpoints/step_000002/policy/target")
    assert model.active_adapter == "default"
    # `rspo eval` on the final checkpoint reproduces the run's final (greedy) eval, also when
    # named by --checkpoint alone: it reads the checkpoint's config.yaml (the defaults would
    # build another model for another env) and says which weights it evaluated.
    last = tmp_path / "checkpoints/step_000002"
    assert evaluate_command(cfg) == out["after"]
    assert evaluate_command(None, checkpoint=str(last)) == out["after"]
    written = json.loads((last / "eval.json").read_text())
    assert written == {"checkpoint": str(last), "weights_sha256": weights_digest(last / "policy"),
                       "metrics": out["after"]}  # fmt: skip
    assert f"evaluated {last / 'policy'} (weights sha256 {written['weights_sha256']})" in capsys.readouterr().out


def test_eval_without_warm_start_rebuilds_the_runs_base_model(tmp_path, monkeypatch):
    # No warm start and no init_from: the tiny base is built from expert episodes, which
    # `rspo eval` must rebuild identically (its env pool is smaller than training's)
    import rspo.eval

    cfg = small_config(f"train.output_dir={tmp_path}", "train.steps=1", "train.save_every=1")
    out = train(cfg)
    run = setup(cfg)
    run.pool.close()
    built, inner = [], rspo.eval.build_policy
    monkeypatch.setattr(rspo.eval, "build_policy", lambda *a, **k: built.append(inner(*a, **k)) or built[-1])
    assert evaluate_command(cfg) == out["after"]
    assert built[0].tokenizer.get_vocab() == run.policy.tokenizer.get_vocab()
    evaluated, trained = base_weights(built[0]), base_weights(run.policy)
    assert evaluated.keys() == trained.keys() and all(torch.equal(evaluated[n], trained[n]) for n in trained)


def test_resume_reproduces_the_next_step(warm_model, tmp_path):
    common = [f"model.init_from={warm_model}", "train.save_every=1", "eval.num_tasks=1"]
    full = train(small_config(*common, f"train.output_dir={tmp_path / 'a'}", "train.steps=2"))
    train(small_config(*common, f"train.output_dir={tmp_path / 'b'}", "train.steps=1"))
    resumed = train(small_config(*common, f"train.output_dir={tmp_path / 'b'}", "train.steps=2", "train.resume=auto"))
    assert len(resumed["history"]) == 1
    drop = ("perf/",)  # wall-clock timings differ run to run; everything else must match exactly
    expect = {k: v for k, v in full["history"][1].items() if not k.startswith(drop)}
    got = {k: v for k, v in resumed["history"][0].items() if not k.startswith(drop)}
    assert got == expect


def test_rspo_explorer_warmup_then_sync(warm_model, tmp_path):
    cfg = small_config(
        f"model.init_from={warm_model}",
        f"train.output_dir={tmp_path}",
        "reward.mode=rspo",
        "rspo.explorer_warmup_steps=1",
        "rspo.sync_every=2",
        "rspo.explorer_rollouts=2",
    )
    torch.manual_seed(0)
    run = setup(cfg)
    try:
        target = snapshot(run.policy, "target")
        first = rl_step(run)  # warm-up: only the explorer samples and trains
        run.step += 1
        assert "loss/policy" not in first and "rollout/success_rate" not in first
        assert all(torch.equal(a, b) for a, b in zip(target, snapshot(run.policy, "target")))
        assert "explorer/loss/policy" in first and "explorer/rollout/success_rate" in first
        second = rl_step(run)  # both train; step 2 is a sync step: the target becomes the explorer
        assert "loss/policy" in second and "explorer/loss/policy" in second
        synced = zip(snapshot(run.policy, "target"), snapshot(run.policy, "explorer"))
        assert all(torch.equal(a, b) for a, b in synced)
    finally:
        run.pool.close()


@pytest.mark.parametrize("agg", ["token_mean", "trajectory_mean"])
def test_micro_batches_accumulate_to_the_minibatch_gradient(warm_model, tmp_path, monkeypatch, agg):
    from rspo.batch import TARGET
    from rspo.rollout import Plan, collect
    from rspo.train import sample_tasks
    from rspo.update import policy_update, row_weights

    cfg = small_config(f"model.init_from={warm_model}", f"train.output_dir={tmp_path}", f"algo.loss_agg={agg}")
    run = setup(cfg)
    try:
        batch = collect(run.policy, run.pool, cfg.env.name, sample_tasks(run), [Plan("target", 2, TARGET)],
                        cfg.rollout, temperature=1.0, max_turns=3, progress=False).batch  # fmt: skip
        learner = run.learners["target"]
        params = run.policy.parameters_of("target")
        grads = []
        monkeypatch.setattr(learner.optimizer, "step", lambda: grads.append([p.grad.clone() for p in params]))
        adv = torch.randn(len(batch), generator=torch.Generator().manual_seed(0))
        args = (batch, adv, row_weights(batch, agg), None)  # every row on-policy
        syncs = {"item": 0, "tolist": 0}  # host syncs on a GPU (.item() / .tolist() of a device tensor)
        for name in syncs:
            real = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _r=real, _n=name: syncs.__setitem__(_n, syncs[_n] + 1)
                                or _r(t, *a))  # fmt: skip
        metrics = []
        for size in (len(batch), 1, 3):  # one micro-batch, then row by row, then uneven chunks
            cfg.train.micro_batch = size
            metrics.append(policy_update(run.acc, run.policy, learner, *args, cfg, False))
        # the loss terms reach the host once per minibatch (with the grad norm), not per micro-batch
        assert syncs == {"item": 0, "tolist": 3}
        for m in metrics[1:]:
            assert m.keys() == metrics[0].keys() and all(isinstance(v, float) for v in m.values())
            assert m["loss/policy"] == pytest.approx(metrics[0]["loss/policy"], rel=1e-4, abs=1e-7)
        assert len(batch) > 3 and len(grads) == 3
        for other in grads[1:]:
            for g, h in zip(grads[0], other):
                torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-7)
    finally:
        run.pool.close()


def test_rspo_expert_ceiling_trains_the_target_on_the_experts_rows(warm_model, tmp_path):
    # One step with the expert in every task (q = 1): its wins join the target's groups,
    # off-policy, and are counted apart; the explorer trains on its own rows only.
    cfg = small_config(
        f"model.init_from={warm_model}",
        f"train.output_dir={tmp_path}",
        "reward.mode=rspo",
        "rspo.explorer_rollouts=2",
        "rspo.expert_fraction=1.0",
        "rspo.offpolicy=ppo",
        "rollout.max_turns=8",
    )
    torch.manual_seed(0)
    run = setup(cfg)
    try:
        target = snapshot(run.policy, "target")
        m = rl_step(run)
        assert m["expert/rollout/success_rate"] == 1.0  # WebShop's oracle buys the goal's item in 8 turns
        assert m["offpolicy/token_frac"] > 0 and math.isfinite(m["offpolicy/weight_std"])
        assert "rspo/expert_only_successes" in m and "explorer/loss/policy" in m
        assert not all(torch.equal(a, b) for a, b in zip(target, snapshot(run.policy, "target")))
    finally:
        run.pool.close()
