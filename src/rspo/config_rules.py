"""What a valid config is beyond its types, and which keys a resumed run may change.

`rspo.config` builds a typed `Config` and turns the first problem found here into a
`ConfigError` (one line naming the key; exit code 2 in the CLI). This module works on
the config as a nested dict (`config.to_dict`) and returns messages, so it imports
nothing of rspo's.

- `problem`: the rules that tie keys together (a key's own range and choices stand with
  its field in `rspo.config`, `knob`; `within` reads a range).
- `EVAL_SPLITS`: the split names each env has; `HELD_OUT`, those evaluated by default.
- `PATHS`: keys naming a file or a directory that must (or may) exist.
- `MAY_CHANGE`: keys a run may change when it resumes (`train.resume`); every other key
  changes what is trained and must match the run's recorded config. The same keys stay
  out of the default output directory's name (`default_output_dir`).
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Any

EVAL_SPLITS = {
    "alfworld": ["train", "eval_in_distribution", "eval_out_of_distribution"],
    "webshop": ["train", "test"],
}
HELD_OUT = {"alfworld": EVAL_SPLITS["alfworld"][1:], "webshop": ["test"]}  # `eval.splits` when unset

# key -> "file" | "dir", and whether it must exist when set ("dir?": only if it exists).
PATHS = {
    "model.init_from": "dir",
    "env.alfworld.data_dir": "dir",
    "env.alfworld.games_dir": "dir?",
    "env.webshop.real_file_path": "file",
    "train.output_dir": "dir?",
    "train.resume": "dir",  # besides "" and "auto"
}

# Keys a resumed run may change: how long it runs and how it is watched, saved and run,
# never what it learns. A dotted prefix ending in "." covers a section.
MAY_CHANGE = (
    "train.steps",
    "train.save_every",
    "train.output_dir",
    "train.resume",
    "train.max_skipped_updates",
    "train.micro_batch",  # gradient accumulation: the same update, in other slices
    "rollout.micro_batch",  # sequences per generate / forward call
    "train.threads",  # CPU threads: the same computation
    "model.allow_hub",
    "model.allow_pickle_adapters",
    "model.gradient_checkpointing",
    "env.num_workers",
    "env.step_timeout",
    "eval.",
    "log.",
)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = value
    return out


def within(value: float, spec: str) -> bool:
    """Whether `value` is finite and in `spec`: ">= a", "> a", or an interval "[a, b]",
    "(a, b]" or "[a, b)" (a field's `bounds`, `rspo.config.knob`)."""
    if not math.isfinite(value):
        return False
    if spec.startswith(">="):
        return value >= float(spec[2:])
    if spec.startswith(">"):
        return value > float(spec[1:])
    low, high = (float(x) for x in spec[1:-1].split(","))
    above = low < value if spec[0] == "(" else low <= value
    below = value < high if spec[-1] == ")" else value <= high
    return above and below


def problem(flat: dict[str, Any]) -> str | None:
    """The first problem with a config's values (`flatten`ed) across keys: rules that tie keys
    together, split names, paths; as one line. (Each key's own range and choices:
    `rspo.config.knob`.)"""
    for t in flat["eval.final_temperatures"]:
        if not within(t, ">= 0"):
            return f"eval.final_temperatures: every temperature must be >= 0, got {t!r}"
    if flat["algo.dual_clip"] and flat["algo.dual_clip"] <= 1:
        return f"algo.dual_clip: must be 0 (off) or > 1, got {flat['algo.dual_clip']!r}"
    if flat["model.tiny.hidden_size"] % flat["model.tiny.num_heads"]:
        return (
            f"model.tiny.hidden_size: must be a multiple of model.tiny.num_heads={flat['model.tiny.num_heads']}, "
            f"got {flat['model.tiny.hidden_size']}"
        )
    if flat["env.webshop.num_test_goals"] >= flat["env.webshop.num_goals"]:
        return (
            f"env.webshop.num_test_goals: must be < env.webshop.num_goals={flat['env.webshop.num_goals']} "
            f"(the rest are the train split), got {flat['env.webshop.num_test_goals']}"
        )
    mode = flat["reward.mode"]
    if mode == "rspo" and flat["rspo.explorer_rollouts"] < 1:
        return f"rspo.explorer_rollouts: must be >= 1 with reward.mode=rspo, got {flat['rspo.explorer_rollouts']}"
    if flat["rspo.expert_fraction"] > 0 and mode != "rspo":
        return (
            "rspo.expert_fraction: the expert plays explorer rows, which only reward.mode=rspo has "
            f"(got reward.mode={mode}); set it 0"
        )
    if flat["rspo.expert_fraction"] > 0 and flat["env.name"] == "webshop" and flat["env.webshop.backend"] == "real":
        return "rspo.expert_fraction: the real WebShop backend has no expert; set it 0"
    if flat["rollout.mixed_adapters"] and not flat["model.lora.enabled"]:
        return "rollout.mixed_adapters: needs LoRA adapters (model.lora.enabled=true); set it false"
    valid = EVAL_SPLITS[flat["env.name"]]
    if not flat["eval.splits"]:
        return (
            f"eval.splits: empty; name at least one split (valid for env.name={flat['env.name']}: {', '.join(valid)})"
        )
    for split in flat["eval.splits"]:
        if split not in valid:
            return f"eval.splits: unknown split {split!r} for env.name={flat['env.name']} (valid: {', '.join(valid)})"
    return _path_problem(flat)


def _path_problem(flat: dict[str, Any]) -> str | None:
    for key, kind in PATHS.items():
        value = flat[key]
        if not value or (key == "train.resume" and value == "auto"):
            continue
        path = Path(value).expanduser()
        if kind == "file" and path.is_dir():
            return f"{key}={value}: is a directory, expected a file"
        if kind != "file" and path.exists() and not path.is_dir():
            return f"{key}={value}: is a file, expected a directory"
        if not kind.endswith("?") and not path.exists():
            return f"{key}={value}: no such {'file' if kind == 'file' else 'directory'}"
    return None


def may_change(key: str) -> bool:
    """Whether a resumed run may give `key` (dotted) another value than the run had."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in MAY_CHANGE)


def resume_mismatches(recorded: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The keys that change what is trained whose values differ, as `key: run's -> new`."""
    a, b = flatten(recorded), flatten(new)
    return [
        f"{k}: {a.get(k)!r} -> {b.get(k)!r}"
        for k in dict.fromkeys([*a, *b])
        if not may_change(k) and a.get(k) != b.get(k)
    ]


def default_output_dir(config_path: str | Path | None, overrides: list[tuple[str, str]]) -> str:
    """`train.output_dir` when neither the config file nor an override sets it:
    `runs/<config file's stem>` (`runs/defaults` without one), followed by the overrides
    of keys that change what is trained, sorted, as `,key=value`. So `--config
    configs/default.yaml algo.name=gigpo reward.mode=rspo` trains in
    `runs/default,algo.name=gigpo,reward.mode=rspo`, and the same command again finds
    that run (to resume). Characters other than letters, digits and `._=+,-` become `_`;
    a name over 120 characters is cut and ends with a hash of the whole."""
    last = {key: raw for key, raw in overrides if not may_change(key)}  # the last value of each key wins
    name = ",".join(
        [Path(config_path).stem if config_path else "defaults", *sorted(f"{k}={v}" for k, v in last.items())]
    )
    name = re.sub(r"[^A-Za-z0-9._=+,-]", "_", name)
    if len(name) > 120:
        name = name[:111] + "," + hashlib.sha1(name.encode()).hexdigest()[:8]
    return str(Path("runs") / name)
