"""The experiment harness at toy size: a 2-run grid of 1 step each, collected into a table,
plots and JSON; finished runs are not rerun; bad experiment files fail naming the key."""

import json
import math
import shutil
import subprocess

import pytest
import yaml
from conftest import SMALL
from mechanism_rule import choose
from mechanism_rule import table as rule_table

from rspo.config import ConfigError, load_config, to_dict
from rspo.log import write_json
from rspo.results import compare, markdown, mechanism, same_start
from rspo.sweep import (
    Experiment,
    collect,
    commit_hash,
    execute,
    load_experiment,
    load_runs,
    restore,
    runs,
    select,
    warm_start_key,
    warm_start_mismatches,
    weights_sha256,
)


def write_experiment(tmp_path, warm_model, **extra):
    base = tmp_path / "base.yaml"
    base.write_text("{}\n")
    overrides = dict(item.split("=", 1) for item in SMALL)
    overrides |= {"model.init_from": str(warm_model), "train.steps": 1, "eval.every": 1, "train.save_every": 0,
                  "rspo.explorer_rollouts": 2, "rspo.buffer_successes_only": False}  # fmt: skip
    exp = {"base": str(base), "output_dir": str(tmp_path / "runs"), "results_dir": str(tmp_path / "results"),
           "parallel": 0, "overrides": overrides,
           "grid": {"reward.mode": ["outcome", "rspo"], "train.seed": [0]}} | extra  # fmt: skip
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def test_only_that_matches_nothing_names_the_runs(tmp_path):
    # Issue 26: `rspo sweep --only nonexistent` ran nothing and exited 0.
    exp = load_experiment(write_experiment(tmp_path, warm_model=tmp_path))  # any directory: nothing runs
    with pytest.raises(ConfigError, match=r"^--only nothing: matches no run \(runs: outcome-s0, rspo-s0\)$"):
        execute(exp, only="nothing", progress=lambda _: None)
    assert not (tmp_path / "runs").exists()


def test_only_selects_whole_names_alone_and_parts_of_names():
    # `--only s1-grpo-e8` once ran s1-grpo-e8-shaped too: a whole name now selects that run alone
    exp = Experiment(base="b.yaml", output_dir="o", results_dir="r", arms={"e8": {}, "e8-shaped": {}},
                     grid={"train.seed": [0, 1], "arm": ["e8", "e8-shaped"]})  # fmt: skip
    names = lambda only: [s.name for s in select(runs(exp), only)]  # noqa: E731
    assert names("") == ["s0-e8", "s0-e8-shaped", "s1-e8", "s1-e8-shaped"]
    assert names("s1-e8") == ["s1-e8"]  # a whole name
    assert names("s1-") == ["s1-e8", "s1-e8-shaped"]  # a part of names
    assert names("s1-e8-shaped,s0-e8") == ["s0-e8", "s1-e8-shaped"]  # a list, in grid order
    with pytest.raises(ConfigError, match=r"^--only s2-: matches no run \(runs: s0-e8, "):
        names("s0-e8,s2-")


def test_sweep_runs_collects_and_resumes(warm_model, tmp_path):
    exp = load_experiment(write_experiment(tmp_path, warm_model))
    assert [s.name for s in runs(exp)] == ["outcome-s0", "rspo-s0"]
    execute(exp, progress=lambda _: None)
    table = collect(exp)
    rows = table["webshop"]["grpo"]["test"]
    assert set(rows) == {"outcome", "rspo"}
    rspo, outcome = rows["rspo"], rows["outcome"]
    for basis in ("equal_iterations", "equal_env_steps", "gain"):
        cell = rspo[f"{basis}/success"]
        assert cell["diff_lo"] <= cell["diff"] <= cell["diff_hi"]  # compared with the outcome baseline
        assert "diff" not in outcome[f"{basis}/success"]  # the baseline is not compared with itself
    for row in (rspo, outcome):  # every arm's gain has its own interval against zero
        gain = row["gain/success"]
        assert gain["lo"] <= gain["mean"] <= gain["hi"]
    assert rspo["env_steps"] > outcome["env_steps"]  # the explorer's rollouts cost env steps too
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert {r["name"] for r in results["runs"]} == {"outcome-s0", "rspo-s0"}
    for r in results["runs"]:
        assert r["wall_s"] > 0 and r["commit"] and r["config"]["train"]["steps"] == 1
        assert [p["step"] for p in r["curve"]] == [0, 1]  # eval before RL and after the one step
        assert len(r["warm_start"]) == 64  # the sha256 of the weights it started from: both runs share one
        assert [p["step"] for p in r["trace"]] == [0] and "rollout/groups_without_signal" in r["trace"][0]
        assert math.isfinite(r["trace"][0]["policy/approx_kl"])  # the update's size, every arm
    assert len({r["warm_start"] for r in results["runs"]}) == 1
    assert {m["mode"] for m in results["mechanism"] if m["metric"] == "rspo/explorer_only_successes"} == {"rspo"}
    md = (tmp_path / "results" / "results.md").read_text()
    assert "| grpo | rspo | 1 |" in md and "at equal environment steps" in md and "gain in success" in md
    for plot in ("curves_webshop_grpo.png", "mechanism_webshop_grpo.png"):
        assert (tmp_path / "results" / plot).stat().st_size > 1000
    # A second sweep finds both runs finished and reruns nothing.
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/eval_summary.json")}
    said = []
    execute(exp, progress=said.append)
    assert said == [] and {p: p.stat().st_mtime_ns for p in stamps} == stamps
    # A fresh clone has the committed results.json but no run directories: the finished runs
    # are restored from it, nothing is rerun, and the table is the same.
    shutil.rmtree(tmp_path / "runs")
    said = []
    execute(exp, progress=said.append)
    assert said == ["sweep: 2 finished run(s) restored from " + str(tmp_path / "results") + "/results.json"]
    assert not list((tmp_path / "runs").glob("*/checkpoints")) and not (tmp_path / "runs" / "warmstart").exists()
    assert collect(exp) == table


def test_bad_experiment_files_name_the_key(warm_model, tmp_path):
    with pytest.raises(ConfigError, match="unknown key grdi"):
        load_experiment(write_experiment(tmp_path, warm_model, grdi={}))
    with pytest.raises(ConfigError, match="algo.nmae"):
        load_experiment(write_experiment(tmp_path, warm_model, grid={"algo.nmae": ["grpo"]}))
    with pytest.raises(ConfigError, match="reward.mode: invalid value 'rpso'"):
        load_experiment(write_experiment(tmp_path, warm_model, grid={"reward.mode": ["rpso"]}))
    with pytest.raises(ConfigError, match="does not exist"):
        load_experiment(tmp_path / "missing.yaml")


def test_warm_start_key_follows_what_sft_learns_from():
    def key(*overrides):
        return warm_start_key(load_config("configs/default.yaml", ["model.lora.enabled=true", *overrides]))

    base = key()
    # the RL side of a grid point shares the warm start ...
    assert key("algo.name=gigpo", "reward.mode=rspo") == base
    # ... and so does how RL batches its passes (rollout.mixed_adapters was added after
    # warm starts existed: a new RL-only setting must not make every grid rebuild them)
    assert key("rollout.mixed_adapters=true") == base
    assert key("rollout.merge_adapter=false") == key("rollout.merge_adapter=true") == base
    assert key("rollout.behavior_logprobs=sampler") == key("rollout.behavior_logprobs=forward") == base
    # rollout.num_tasks (tasks an RL iteration plays) is hashed at 8 whatever it holds: SFT
    # never reads it, and the keys of warm starts built before this rule keep their names
    assert key("rollout.num_tasks=48") == base
    assert warm_start_key(load_config("configs/smoke.yaml")) == warm_start_key(
        load_config("configs/smoke.yaml", ["rollout.num_tasks=8"])
    )
    # what the demonstrations or the SFT model depend on does not
    assert key("rollout.history_length=1") != base
    assert key("train.seed=1") != base
    assert key("sft.episodes=10") != base
    # a key added after warm starts were built (the WebShop expert) leaves the key as it was
    # while it holds the value every earlier warm start had, and changes it otherwise
    before = to_dict(load_config("configs/webshop_cpu.yaml"))
    del before["env"]["webshop"]["expert"]  # the config as recorded before the key existed
    assert warm_start_key(before) == warm_start_key(
        load_config("configs/webshop_cpu.yaml", ["env.webshop.expert=oracle"])
    )
    assert warm_start_key(before) != warm_start_key(
        load_config("configs/webshop_cpu.yaml", ["env.webshop.expert=reader"])
    )
    # so an existing warm start keeps its name when rspo gains a key (model.allow_pickle_adapters
    # renamed every one once): the sparse regime's seed 0, as its runs' directories name it
    sparse = ["sft.episodes=300", "train.steps=40", "eval.every=10", "log.progress=false", "train.seed=0"]
    assert warm_start_key(load_config("configs/default.yaml", sparse)) == "f7e329f5f2"
    recorded = to_dict(load_config("configs/default.yaml", sparse))  # a run recorded before merge_adapter existed
    del recorded["rollout"]["merge_adapter"]
    assert warm_start_key(recorded) == "f7e329f5f2"


def _run(mode: str, curve: list[tuple[int, int, list[int]]], seed: int = 0, **extra) -> dict:
    """A finished run on one split of 4 tasks: curve = (step, env steps, per-task wins)."""

    def tasks(wins):
        return [{"split": "test", "task_index": i, "task_type": "t", "won": w, "score": float(w)}
                for i, w in enumerate(wins)]  # fmt: skip

    points = [{"step": s, "env_steps": e, "tasks": tasks(w)} for s, e, w in curve]
    return {"env": "alfworld", "algo": "grpo", "mode": mode, "seed": seed, "commit": "c0ffee", "wall_s": 1.0,
            "env_steps": curve[-1][1], "curve": points,
            "before_tasks": points[0]["tasks"], "after_tasks": points[-1]["tasks"]} | extra  # fmt: skip


def test_equal_env_steps_reads_each_run_within_the_budget():
    # outcome: 9,000 env steps by iteration 10, 18,000 by 20; rspo's explorer doubles its
    # env steps per iteration: 13,000 by 10, 26,000 by 20
    runs_ = [_run("outcome", [(0, 0, [0, 0, 0, 0]), (10, 9_000, [1, 0, 0, 0]), (20, 18_000, [1, 1, 0, 0])]),
             _run("rspo", [(0, 0, [0, 0, 0, 0]), (10, 13_000, [1, 1, 1, 0]), (20, 26_000, [1, 1, 1, 1])])]  # fmt: skip

    def read(budget):
        row = compare(runs_, budget)["alfworld"]["grpo"]["test"]["rspo"]
        return row["env_step_budget"], row["equal_env_steps/read_at_step"], row["equal_env_steps/success"]["diff"]

    # no budget: the smallest total, 18,000: outcome at 20 (2/4), rspo at 10 (3/4): +0.25
    assert read(None) == (18_000, [10], 0.25)
    # 27,000 covers both runs whole: outcome at 20 (2/4), rspo at 20 (4/4): +0.5, the same
    # as at equal iterations
    assert read(27_000) == (27_000, [20], 0.5)
    # 10,000: outcome at 10 (1/4), rspo only at its start (0/4): -0.25
    assert read(10_000) == (10_000, [0], -0.25)
    md = markdown(compare(runs_, 27_000), runs_)
    assert "grpo: budget 27,000 env steps (fixed by `env_step_budget`)" in md
    assert "read at iteration: outcome 20; rspo 20." in md


def test_same_start_pairs_the_seeds_whose_warm_start_is_shared():
    # seeds 0 and 1: both arms read the same before RL (a shared warm start); seed 2's
    # rspo run started elsewhere (it won task 3 before RL) and is left out of the pairs
    start, other = [0, 0, 0, 0], [0, 0, 0, 1]
    runs_ = [_run("outcome", [(0, 0, start), (20, 18_000, [1, 0, 0, 0])], seed=0),
             _run("rspo", [(0, 0, start), (10, 13_000, [1, 0, 0, 0]), (20, 26_000, [1, 1, 0, 0])], seed=0),
             _run("outcome", [(0, 0, start), (20, 18_000, [0, 0, 0, 0])], seed=1),
             _run("rspo", [(0, 0, start), (10, 13_000, [1, 1, 0, 0]), (20, 26_000, [1, 1, 1, 1])], seed=1),
             _run("outcome", [(0, 0, start), (20, 18_000, [0, 0, 0, 0])], seed=2),
             _run("rspo", [(0, 0, other), (20, 26_000, [1, 1, 1, 1])], seed=2)]  # fmt: skip
    (row,) = same_start(runs_, 20_000)
    assert (row["a"], row["b"], row["seeds"]) == ("outcome", "rspo", [0, 1])
    # equal iterations, rspo - outcome per task: seed 0 [0, 1, 0, 0], seed 1 [1, 1, 1, 1]:
    # mean (1 + 4) / 8 = 0.625 (seed 2's [1, 1, 1, 1] would have pulled it to 9 / 12 = 0.75)
    it = row["equal_iterations/test"]
    assert it["diff"] == pytest.approx(0.625) and 0 <= it["diff_lo"] <= 0.625 <= it["diff_hi"] <= 1
    # within 20,000 env steps rspo is read at iteration 10, outcome at its final eval;
    # rspo - outcome per task: seed 0 [0, 0, 0, 0], seed 1 [1, 1, 0, 0]: (0 + 2) / 8 = 0.25
    assert row["equal_env_steps/test"]["diff"] == pytest.approx(0.25)
    md = markdown(compare(runs_, 20_000), runs_, [row])
    assert "| grpo | rspo - outcome | 0, 1 | +0.625 [" in md
    assert same_start([r for r in runs_ if r["seed"] == 2]) == []  # nothing shared, no row
    # runs that also evaluated their final weights at temperature 1 (eval.final_temperatures)
    # are compared there too: rspo - outcome per task, seed 0 [0, 0, 1, 0], seed 1 [0, 0, 0, 0]: 1 / 8
    tasks = runs_[0]["after_tasks"]
    for r, wins in zip(runs_[:4], ([0, 0, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0], [1, 0, 0, 0])):
        r["final_at"] = {"1": {"tasks": [t | {"won": w} for t, w in zip(tasks, wins)]}}
    (row,) = same_start(runs_, 20_000)
    assert row["final_at_T1/test"]["diff"] == pytest.approx(0.125)
    assert "test, final at T1" in markdown(compare(runs_, 20_000), runs_, [row])


def test_same_start_pairs_by_weight_hash_when_runs_record_one():
    # equal before-RL evals but different weights (sha "a" vs "b"): not a shared start;
    # different evals cannot happen with equal weights, but the hash decides when both have one
    start, curve = [0, 0, 0, 0], [(20, 18_000, [1, 0, 0, 0])]
    runs_ = [_run("outcome", [(0, 0, start), *curve], seed=0, warm_start="a"),
             _run("rspo", [(0, 0, start), *curve], seed=0, warm_start="b"),
             _run("outcome", [(0, 0, start), *curve], seed=1, warm_start="c"),
             _run("rspo", [(0, 0, [1, 1, 1, 1]), *curve], seed=1, warm_start="c")]  # fmt: skip
    (row,) = same_start(runs_, 20_000)
    assert row["seeds"] == [1]
    # a run recorded without a hash falls back to the before-RL evals
    runs_[0]["warm_start"] = None
    (row,) = same_start(runs_, 20_000)
    assert row["seeds"] == [0, 1]


def test_mechanism_table_reads_each_arm_trace():
    # groups without signal per iteration, seed 0: .75 .5 .25 ...; seed 1: .25 .5 .75 ...
    # iteration 0: mean (.75 + .25) / 2 = .5; all iterations: seed 0 (.75 + .5 + .25) / 3 = .5, seed 1 .5 -> .5
    def trace(values, rescued=None):
        return [{"step": i, "env_steps": 100 * i, "rollout/groups_without_signal": v}
                | ({"rspo/groups_rescued": rescued[i], "policy/approx_kl": 3e-4} if rescued else {})
                for i, v in enumerate(values)]  # fmt: skip

    curve = [(0, 0, [0, 0, 0, 0]), (3, 300, [1, 0, 0, 0])]
    runs_ = [_run("outcome", curve, seed=0, trace=trace([0.75, 0.5, 0.25])),
             _run("outcome", curve, seed=1, trace=trace([0.25, 0.5, 0.75])),
             _run("rspo", curve, seed=0, trace=trace([1.0, 1.0, 0.5], rescued=[0.0, 0.5, 1.0]))]  # fmt: skip
    rows = {(m["mode"], m["metric"]): m for m in mechanism(runs_)}
    assert set(rows) == {("outcome", "rollout/groups_without_signal"), ("rspo", "rollout/groups_without_signal"),
                         ("rspo", "rspo/groups_rescued"), ("rspo", "policy/approx_kl")}  # fmt: skip
    flat = rows["outcome", "rollout/groups_without_signal"]
    assert flat["seeds"] == 2 and flat["first"]["mean"] == pytest.approx(0.5) and flat["all"]["mean"] == 0.5
    assert flat["first"]["lo"] == pytest.approx(0.25) and flat["first"]["hi"] == pytest.approx(0.75)  # the seeds' ends
    assert rows["rspo", "rspo/groups_rescued"]["all"]["mean"] == pytest.approx(0.5)  # (0 + .5 + 1) / 3
    md = markdown(compare(runs_), runs_, [], mechanism(runs_))
    assert "| grpo | rspo | 1 | failed target groups rescued by explorer or replay | 0.000 [0.000, 0.000] |" in md
    assert "| 3.0e-04 [3.0e-04, 3.0e-04] |" in md  # a KL row too small for three decimals


def test_a_rebuilt_warm_start_that_differs_is_reported(tmp_path):
    exp = Experiment(base="configs/default.yaml", output_dir=str(tmp_path / "runs"), results_dir=str(tmp_path / "r"),
                     grid={"train.seed": [0]})  # fmt: skip
    key = warm_start_key(load_config(exp.base, ["train.seed=0"]))
    built = tmp_path / "runs" / "warmstart" / key
    (built / "sft").mkdir(parents=True)
    (built / "sft" / "model.safetensors").write_bytes(b"weights rebuilt here")
    run = tmp_path / "runs" / "s0"  # a finished run that started from another build of the same key
    run.mkdir()
    (run / "eval_summary.json").write_text("{}")
    config = to_dict(load_config(exp.base, ["train.seed=0", f"model.init_from={built / 'sft'}"]))
    write_json(run / "run.json", {"config": config, "warm_start": "0" * 64})
    (said,) = warm_start_mismatches(exp, [built])
    assert f"warm start {key} built here" in said and "s0 started from (000000000000)" in said
    write_json(run / "run.json", {"config": config, "warm_start": weights_sha256(built / "sft")})
    assert warm_start_mismatches(exp, [built]) == []  # the same weights: nothing to say


def test_a_run_of_another_config_is_not_reported_under_the_grids_name(tmp_path):
    # The grid now trains 40 iterations; s0 was run (and committed) at 30, s1 at 40. s0 must
    # not be restored from results.json, collected into the table, or count as finished.
    exp = Experiment(base="configs/default.yaml", output_dir=str(tmp_path / "runs"), results_dir=str(tmp_path / "r"),
                     overrides={"train.steps": 40}, grid={"train.seed": [0, 1]})  # fmt: skip

    def recorded(seed, steps):  # what a sweep writes, the keys it sets per run included
        cfg = to_dict(load_config(exp.base, [f"train.seed={seed}", f"train.steps={steps}",
                                             f"train.output_dir={tmp_path / 'runs' / f's{seed}'}"]))  # fmt: skip
        return {"name": f"s{seed}", "config": cfg, "curve": [], "trace": []}

    write_json(tmp_path / "r" / "results.json", {"runs": [recorded(0, 30), recorded(1, 40)]})
    said = []
    assert restore(exp, said.append) == ["s1"]
    assert said == [f"sweep: not restoring s0 from {tmp_path / 'r' / 'results.json'}: it ran with another config "
                    "(train.steps 30 -> 40)"]  # fmt: skip
    assert not (tmp_path / "runs" / "s0").exists()
    # the same run left as a directory: left out of the results, and the sweep refuses to treat it as done
    write_json(tmp_path / "runs" / "s0" / "run.json", {"config": recorded(0, 30)["config"]})
    write_json(tmp_path / "runs" / "s0" / "eval_summary.json", {"curve": []})
    assert [r["name"] for r in load_runs(exp)] == ["s1"]
    with pytest.raises(ConfigError, match=r"runs/s0 finished with another config than the grid's now "
                                          r"\(train.steps 30 -> 40\): move it aside"):  # fmt: skip
        execute(exp, progress=lambda _: None)


def test_commit_hash_is_dirty_for_code_but_not_for_the_results_it_writes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    for f in ("code.py", "results/results.md"):
        (tmp_path / f).write_text("v1\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "v1"]):
        subprocess.run(git + args, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "results/results.md").write_text("v2\n")  # a sweep collected after a run
    assert commit_hash("results") == head
    assert commit_hash() == head + "+dirty"
    monkeypatch.chdir(tmp_path / "results")  # from below the top, with an absolute path
    assert commit_hash(tmp_path / "results") == head
    (tmp_path / "code.py").write_text("v2\n")  # the code itself changed
    assert commit_hash(tmp_path / "results") == head + "+dirty"


def test_env_step_budget_must_be_a_positive_integer(warm_model, tmp_path):
    for bad in (0, -5, 2.5, "27k", True):
        with pytest.raises(ConfigError, match="env_step_budget must be a positive integer"):
            load_experiment(write_experiment(tmp_path, warm_model, env_step_budget=bad))
    assert load_experiment(write_experiment(tmp_path, warm_model, env_step_budget=27_000)).env_step_budget == 27_000


def test_named_arms_expand_into_their_keys_and_name_the_runs(warm_model, tmp_path):
    arms = {"outcome": {"reward.mode": "outcome"},
            "ceiling": {"reward.mode": "rspo", "rspo.expert_fraction": 0.5, "rspo.join": "rescues"}}  # fmt: skip
    path = write_experiment(tmp_path, warm_model, arms=arms, grid={"train.seed": [0], "arm": ["outcome", "ceiling"]})
    specs = runs(load_experiment(path))
    assert [s.name for s in specs] == ["outcome-s0", "ceiling-s0"]  # grid keys in the file's order (sorted here)
    ceiling = load_config(None, specs[1].overrides)
    assert (ceiling.reward.mode, ceiling.rspo.expert_fraction, ceiling.rspo.join) == ("rspo", 0.5, "rescues")
    assert specs[1].overrides[-4:] == [
        "reward.mode=rspo",
        "rspo.expert_fraction=0.5",
        "rspo.join=rescues",
        "train.seed=0",
    ]
    bad = write_experiment(tmp_path, warm_model, arms=arms, grid={"arm": ["outcome", "ceil"]})
    with pytest.raises(ConfigError, match="grid.arm 'ceil' is not under arms"):
        load_experiment(bad)


def test_mechanism_rule_meets_costs_and_chooses_by_hand():
    # benchmarks/mechanism_rule.py, issue 45's pre-registered rule, on a hand-built table
    def arm(mode, success, explorer, nll, kl, rescued=0.12, explorer_only=1.5, replayed=0.1):
        metrics = {"rollout/success_rate": success, "explorer/rollout/success_rate": explorer,
                   "policy/sampled_nll": nll, "policy/approx_kl": kl, "rspo/groups_rescued": rescued,
                   "rspo/explorer_only_successes": explorer_only, "rspo/replayed": replayed}  # fmt: skip
        return [{"mode": mode, "metric": k, "seeds": 2, "all": {"mean": v}} for k, v in metrics.items()]

    mech = (
        arm("outcome", 0.03, 0.0, nll=0.2, kl=1e-4)
        # meets all four; cost |0.22 - 0.2| / 0.2 + |2e-4 - 1e-4| / 1e-4 = 0.1 + 1.0 = 1.1
        + arm("a", 0.03, 0.05, nll=0.22, kl=2e-4)
        # meets all four (an explorer as good as the target counts); cost 0 + 0.5 = 0.5
        + arm("b", 0.03, 0.03, nll=0.2, kl=1.5e-4)
        # no replay, explorer below the target: 2 of 4; cost 0 (the outcome arm's own numbers)
        + arm("c", 0.03, 0.02, nll=0.2, kl=1e-4, replayed=0.0)
    )
    rows = {r["mode"]: r for r in rule_table(mech)}
    assert set(rows) == {"a", "b", "c"}  # the baseline is not a candidate
    assert [rows[m]["passed"] for m in "abc"] == [4, 4, 2]
    assert [rows[m]["meets"] for m in "abc"] == [True, True, False]
    assert rows["a"]["cost"] == pytest.approx(1.1) and rows["b"]["cost"] == pytest.approx(0.5)
    assert rows["c"]["cost"] == 0.0  # cheapest, but it does not switch the mechanism on
    chosen, closest = choose(list(rows.values()))
    assert chosen["mode"] == "b" and closest["mode"] == "a"  # closest: 4 tests passed, a before b on ties
    chosen, closest = choose([rows["c"]])
    assert chosen is None and closest["mode"] == "c"
