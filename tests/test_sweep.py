"""The experiment harness at toy size: a 2-run grid of 1 step each, collected into a table,
plots and JSON; finished runs are not rerun; bad experiment files fail naming the key."""

import json
import shutil

import pytest
import yaml
from conftest import SMALL

from rspo.config import ConfigError, load_config
from rspo.sweep import collect, execute, load_experiment, runs, warm_start_key


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
    assert rspo["env_steps"] > outcome["env_steps"]  # the explorer's rollouts cost env steps too
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert {r["name"] for r in results["runs"]} == {"outcome-s0", "rspo-s0"}
    for r in results["runs"]:
        assert r["wall_s"] > 0 and r["commit"] and r["config"]["train"]["steps"] == 1
        assert [p["step"] for p in r["curve"]] == [0, 1]  # eval before RL and after the one step
    md = (tmp_path / "results" / "results.md").read_text()
    assert "| grpo | rspo | 1 |" in md and "at equal environment steps" in md and "gain in success" in md
    assert (tmp_path / "results" / "curves_webshop_grpo.png").stat().st_size > 1000
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
    # what the demonstrations or the SFT model depend on does not
    assert key("rollout.history_length=1") != base
    assert key("train.seed=1") != base
    assert key("sft.episodes=10") != base
