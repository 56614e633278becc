"""Config: YAML + dotted overrides round-trip, and every error path is one clear line."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rspo.config import CHOICES, RANGES, Config, ConfigError, dump, load_config, to_dict
from rspo.config_rules import flatten, may_change, resume_mismatches

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_and_overrides():
    cfg = load_config(
        None,
        [
            "algo.name=gigpo",
            "env.name=webshop",
            "rollout.group_size=8",
            "model.lora.enabled=false",
            "eval.splits=test",
            "reward.shaped_coef=1",
        ],
    )
    assert cfg.algo.name == "gigpo"
    assert cfg.rollout.group_size == 8
    assert cfg.model.lora.enabled is False
    assert cfg.eval.splits == ["test"]
    assert cfg.reward.shaped_coef == 1.0 and isinstance(cfg.reward.shaped_coef, float)


def test_yaml_round_trip(tmp_path):
    cfg = load_config(None, ["env.name=webshop", "model.lora.target_modules=[q_proj, v_proj]"])
    path = tmp_path / "c.yaml"
    path.write_text(dump(cfg))
    again = load_config(path)
    assert to_dict(again) == to_dict(cfg)
    assert again.model.lora.target_modules == ["q_proj", "v_proj"]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    assert isinstance(load_config(path), Config)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("algo.nmae=grpo", "unknown config key algo.nmae; did you mean algo.name?"),
        ("algo.name=grpoo", "algo.name: invalid value 'grpoo'; did you mean grpo? (valid choices: grpo, ppo, gigpo)"),
        ("rollout.group_size=abc", "rollout.group_size: expected an integer, got 'abc'"),
        ("rollout.group_size=0", "rollout.group_size: must be >= 1, got 0"),
        ("algo.clip_ratio=big", "algo.clip_ratio: expected a number, got 'big'"),
        ("model.lora.enabled=maybe", "model.lora.enabled: expected true or false, got 'maybe'"),
        ("modle.name=tiny", "unknown config key modle; did you mean model?"),
        ("model=tiny", "model: is a section, expected a mapping of keys"),
        ("algo.name", "expected key=value"),
        ("env.alfworld.task_types=pick_and_place", "env.alfworld.task_types: invalid value 'pick_and_place'"),
        ("reward.mode=rspo rspo.explorer_rollouts=0", "rspo.explorer_rollouts: must be >= 1"),
        ("env.step_timeout=0", "env.step_timeout: must be > 0, got 0.0"),
        ("env.step_timeout=.nan", "env.step_timeout: must be > 0, got nan"),
        ("rollout.mixed_adapters=true model.lora.enabled=false", "rollout.mixed_adapters: needs LoRA adapters"),
        ("train.max_skipped_updates=-1", "train.max_skipped_updates: must be >= 0, got -1"),
        # issue 26: every number's sign and range, checked before anything is built
        ("train.lr=-1", "train.lr: must be > 0, got -1.0"),
        ("train.steps=-3", "train.steps: must be >= 0, got -3"),
        ("sft.episodes=-1", "sft.episodes: must be >= 0, got -1"),
        ("algo.clip_ratio=-0.2", "algo.clip_ratio: must be > 0, got -0.2"),
        ("rollout.temperature=-1", "rollout.temperature: must be >= 0, got -1.0"),
        ("eval.temperature=.inf", "eval.temperature: must be >= 0, got inf"),
        ("rollout.top_p=0", "rollout.top_p: must be in (0, 1], got 0.0"),
        ("algo.gamma=1.5", "algo.gamma: must be in [0, 1], got 1.5"),
        ("model.lora.dropout=1", "model.lora.dropout: must be in [0, 1), got 1.0"),
        ("model.lora.r=0", "model.lora.r: must be >= 1, got 0"),
        ("train.seed=-1", "train.seed: must be >= 0, got -1"),
        ("train.max_grad_norm=0", "train.max_grad_norm: must be > 0, got 0.0"),
        ("algo.dual_clip=0.5", "algo.dual_clip: must be 0 (off) or > 1, got 0.5"),
        ("model.tiny.hidden_size=65", "model.tiny.hidden_size: must be a multiple of model.tiny.num_heads=4, got 65"),
        ("env.webshop.num_test_goals=2500", "env.webshop.num_test_goals: must be < env.webshop.num_goals=2500"),
        (
            "eval.splits=test",
            "eval.splits: unknown split 'test' for env.name=alfworld (valid: train, "
            "eval_in_distribution, eval_out_of_distribution)",
        ),  # fmt: skip
        ("env.name=webshop eval.splits=eval_in_distribution", "valid: train, test)"),
    ],
)
def test_errors_name_the_key(override, expected):
    with pytest.raises(ConfigError) as e:
        load_config(None, override.split(" "))
    assert expected in str(e.value)
    assert "\n" not in str(e.value)


def test_eval_splits_default_to_the_envs_held_out_splits():
    assert load_config(None, []).eval.splits == ["eval_in_distribution", "eval_out_of_distribution"]
    assert load_config(None, ["env.name=webshop"]).eval.splits == ["test"]
    assert load_config(None, ["env.name=webshop", "eval.splits=train,test"]).eval.splits == ["train", "test"]


def test_temperature_zero_is_greedy_and_allowed():
    cfg = load_config(None, ["rollout.temperature=0", "eval.temperature=0"])
    assert cfg.rollout.temperature == 0.0 and cfg.eval.temperature == 0.0


def test_every_number_has_a_range():
    # A new numeric key must say its range where it is declared (`knob(..., bounds=...)`).
    numbers = {
        k for k, v in flatten(to_dict(Config())).items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    assert numbers == set(RANGES)  # and only numbers have one


def test_choices_are_the_registries():
    # The registries' keys are the choices (config.py builds them from the first two; the reward
    # modes' registry imports the config, so its list is written out there and checked here)
    from rspo.algorithms import ALGORITHMS
    from rspo.algorithms.offpolicy import METHODS
    from rspo.rewards.modes import MODES

    assert CHOICES["algo.name"] == list(ALGORITHMS) and CHOICES["rspo.offpolicy"] == METHODS
    assert CHOICES["reward.mode"] == list(MODES)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.init_from={d}/none", "model.init_from={d}/none: no such directory"),
        ("model.init_from={d}/file", "model.init_from={d}/file: is a file, expected a directory"),
        ("train.output_dir={d}/file", "train.output_dir={d}/file: is a file, expected a directory"),
        ("train.resume={d}/file", "train.resume={d}/file: is a file, expected a directory"),
        ("env.alfworld.data_dir={d}/none", "env.alfworld.data_dir={d}/none: no such directory"),
        ("env.webshop.real_file_path={d}", "env.webshop.real_file_path={d}: is a directory, expected a file"),
    ],
)
def test_paths_must_be_files_or_directories(tmp_path, override, expected):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError) as e:
        load_config(None, [override.format(d=tmp_path)])
    assert str(e.value) == expected.format(d=tmp_path)


def test_resume_mismatches_skip_the_keys_a_run_may_change():
    run = {"algo": {"name": "grpo"}, "train": {"steps": 30, "lr": 0.001}, "eval": {"num_tasks": 96}}
    new = {"algo": {"name": "gigpo"}, "train": {"steps": 60, "lr": 0.001}, "eval": {"num_tasks": 8}}
    assert resume_mismatches(run, new) == ["algo.name: 'grpo' -> 'gigpo'"]  # steps and eval may change
    assert may_change("eval.splits") and may_change("log.progress") and may_change("env.num_workers")
    assert not may_change("evaluation.x") and not may_change("rspo.explorer_lr") and not may_change("sft.lr")


def test_default_output_dir_follows_the_config_and_the_training_overrides():
    assert load_config(ROOT / "configs/default.yaml").train.output_dir == "runs/default"
    assert load_config(None).train.output_dir == "runs/defaults"
    second = ["reward.mode=rspo", "algo.name=gigpo", "eval.num_tasks=8", "log.progress=false"]
    # sorted, and keys that may change on resume (eval.*, log.*) stay out of the name
    assert load_config(ROOT / "configs/default.yaml", second).train.output_dir == (
        "runs/default,algo.name=gigpo,reward.mode=rspo"
    )
    assert load_config(None, ["model.name=/models/qwen"]).train.output_dir == "runs/defaults,model.name=_models_qwen"
    assert load_config(None, ["algo.name=ppo", "train.output_dir=elsewhere"]).train.output_dir == "elsewhere"
    long = load_config(None, [f"train.seed={i}" for i in range(3)] + ["model.lora.target_modules=" + "q" * 200])
    assert len(Path(long.train.output_dir).name) == 120  # 111 characters, a comma, an 8-digit hash


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=f"config file {tmp_path} is a directory; pass a YAML file"):
        load_config(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(bad)
    bad.write_text(yaml.safe_dump({"train": {"stepz": 3}}))
    with pytest.raises(ConfigError, match="train.stepz; did you mean train.steps"):
        load_config(bad)


def test_choices_cover_real_keys():
    flat = to_dict(Config())
    for key in CHOICES:
        node = flat
        for part in key.split("."):
            assert part in node, f"CHOICES names {key}, which is not a config key"
            node = node[part]


def test_cli_exit_code_2_and_one_line():
    # The acceptance check, through the real console entry point.
    proc = subprocess.run(
        [sys.executable, "-m", "rspo", "train", "--config", str(ROOT / "configs/default.yaml"), "algo.nmae=grpo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "algo.nmae" in lines[0] and "algo.name" in lines[0]


def _leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield prefix + k


def attribute_reads(files) -> set[str]:
    """Every attribute name the code reads (`x.name` in a load, or `getattr(x, "name")`), by
    walking the syntax trees: exact names, so a key is not "read" by a longer one (`.r` by `.reward`)."""
    reads = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                reads.add(node.attr)
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) > 1:
                reads.add(getattr(node.args[1], "value", None))  # a constant's name; None otherwise
    return reads


def dead_keys(keys: list[str], reads: set[str]) -> list[str]:
    return [key for key in keys if key.split(".")[-1] not in reads]


def test_every_config_key_is_read():
    # No dead keys: each leaf is read as an attribute (`cfg.section.key`, `x.key`) outside
    # config.py and config_rules.py, which name every key; reading one is elsewhere.
    rules = ("config.py", "config_rules.py")
    reads = attribute_reads(p for p in (ROOT / "src/rspo").rglob("*.py") if p.name not in rules)
    keys = list(_leaves(to_dict(Config())))
    assert dead_keys(keys, reads) == []
    # the check can fail: a key nothing reads, even one whose name starts another's (`.r` / `.reward`)
    assert dead_keys([*keys, "rspo.never_read", "model.lora.re"], reads) == ["rspo.never_read", "model.lora.re"]
