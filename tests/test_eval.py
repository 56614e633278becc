"""Eval aggregation: per-task records -> rates with intervals, paired before/after differences."""

import pytest

from rspo.config import load_config
from rspo.eval import eval_tasks, metrics_of, paired_differences, summary_table


def rec(i, won, task_type="a", split="s", score=None):
    return {"split": split, "task_index": i, "task_type": task_type, "won": won,
            "score": float(won) if score is None else score, "progress": 0.5,
            "turns": 4, "invalid": 1, "noop": 2}  # fmt: skip


def test_eval_tasks_is_a_fixed_balanced_set():
    assert eval_tasks(4, 12) == [0, 3, 6, 9]  # i * 12 // 4
    assert eval_tasks(5, 3) == [0, 1, 2]  # all tasks when asked for more than the split has
    # 96 of 140, i * 140 // 96: 0, 1 (1.46), 2 (2.92), 4 (4.38), 5 (5.83), 7 (7.29), ..., 138 (95 * 140 / 96 = 138.5)
    spread = eval_tasks(96, 140)
    assert spread[:6] == [0, 1, 2, 4, 5, 7] and spread[-1] == 138
    assert len(set(spread)) == 96 and spread == sorted(spread)  # 96 distinct tasks, none past the split


def test_metrics_of_hand_computed():
    records = [rec(0, True, "a"), rec(1, False, "a"), rec(2, True, "b"), rec(3, False, "b"), rec(4, False, "b")]
    m = metrics_of(records, "eval/")
    assert m["eval/s/success_rate"] == pytest.approx(2 / 5)
    assert m["eval/s/a/success_rate"] == 0.5 and m["eval/s/b/success_rate"] == pytest.approx(1 / 3)
    assert m["eval/s/num_tasks"] == 5.0
    assert m["eval/s/invalid_action_rate"] == pytest.approx(5 / 20)  # 1 invalid turn of 4, 5 tasks
    assert m["eval/s/noop_rate"] == pytest.approx(10 / 20)  # 2 no-op turns of 4 (the invalid one among them)
    # Wilson for 2/5 (z^2 = 3.8415): centre = (0.4 + 0.38415) / 1.76830 = 0.44345,
    # half = 1.96 / 1.76830 * sqrt(0.24/5 + 3.8415/100) = 1.10840 * 0.29394 = 0.32580
    assert m["eval/s/success_lo"] == pytest.approx(0.44345 - 0.32580, abs=1e-4)  # 0.1177
    assert m["eval/s/success_hi"] == pytest.approx(0.44345 + 0.32580, abs=1e-4)  # 0.7693


def test_paired_differences_match_tasks_by_index():
    before = [rec(i, i < 2) for i in range(8)]  # tasks 0, 1 solved
    after = [rec(i, i < 6) for i in reversed(range(8))]  # tasks 0..5 solved, listed in another order
    d = paired_differences(before, after)
    assert d["eval/s/success_diff"] == pytest.approx(4 / 8)  # 6/8 - 2/8
    assert 0.0 < d["eval/s/success_diff_lo"] <= 0.5 <= d["eval/s/success_diff_hi"] <= 1.0
    # Paired: 4 tasks flip 0 -> 1 and none the other way, so no resample can go below 0.
    nothing = paired_differences(before, before)
    assert (nothing["eval/s/success_diff_lo"], nothing["eval/s/success_diff_hi"]) == (0.0, 0.0)


def test_summary_table_shows_intervals_and_the_difference():
    before = [rec(i, i < 2) for i in range(8)]
    after = [rec(i, i < 6) for i in range(8)]
    diffs = paired_differences(before, after)
    table = summary_table(metrics_of(before), metrics_of(after), load_config(None, []), diffs)
    line = next(row for row in table.splitlines() if row.startswith("eval/s/success_rate"))
    assert "0.250 [" in line and "0.750 [" in line and "+0.500 [" in line
    assert " 8 " in line  # the number of tasks


def test_eval_samples_alike_whatever_the_pool_size(warm_model):
    """RSPO's env pool is larger than the baseline's; eval must not depend on it, or the
    arms' evals of the same weights differ by sampling noise alone."""
    from conftest import small_config

    from rspo.envs.pool import EnvPool
    from rspo.eval import evaluate_tasks
    from rspo.policy_io import build_policy

    cfg = small_config(f"model.init_from={warm_model}", "eval.num_tasks=7", "eval.batch_size=3",
                       "eval.temperature=1.0", "rollout.max_turns=4")  # fmt: skip
    policy = build_policy(cfg.model, None, adapters=["target"])
    runs = []
    for size in (3, 8):
        with EnvPool(cfg.env, size) as pool:
            runs.append(evaluate_tasks(policy, pool, cfg))
    assert len(runs[0]) == 7 and runs[0] == runs[1]


def test_samples_per_task_averages_k_trajectories_per_task(warm_model):
    """With k = 3 samples per task each task gets one record whose `won` is its fraction of
    wins (a multiple of 1/3), and its turns are the sum over its k trajectories."""
    from conftest import small_config

    from rspo.envs.pool import EnvPool
    from rspo.eval import eval_pool_size, evaluate_tasks
    from rspo.policy_io import build_policy

    cfg = small_config(f"model.init_from={warm_model}", "eval.num_tasks=5", "eval.batch_size=7",
                       "eval.samples_per_task=3", "eval.temperature=1.0", "rollout.max_turns=3")  # fmt: skip
    assert eval_pool_size(cfg) == 7  # 7 trajectories at once = 2 tasks x 3 samples (one env idle)
    policy = build_policy(cfg.model, None, adapters=["target"])
    with EnvPool(cfg.env, eval_pool_size(cfg)) as pool:
        records = evaluate_tasks(policy, pool, cfg)
    for split in cfg.eval.splits:
        mine = [r for r in records if r["split"] == split]
        assert [r["task_index"] for r in mine] == sorted({r["task_index"] for r in mine}) and len(mine) == 5
    for r in records:
        assert r["won"] * 3 == pytest.approx(round(r["won"] * 3)) and 0 <= r["won"] <= 1
        assert 3 <= r["turns"] <= 9  # 3 trajectories of 1 to 3 turns
    assert metrics_of(records)[f"eval/{cfg.eval.splits[0]}/num_tasks"] == 5
    single = small_config(f"model.init_from={warm_model}", "eval.num_tasks=5")
    assert eval_pool_size(single) == 5  # k = 1: one env per task, at most batch_size (32)
