"""Typed configuration: one flat YAML per experiment plus dotted `key=value` overrides.

Every field below is read somewhere in the code; grep for its dotted name's last part
(e.g. `cfg.rollout.group_size`) to find where. A field's default, comment, range and
choices stand together (`knob`); rules that tie keys together are `config_rules.problem`'s.
A bad key, type or value raises `ConfigError`, whose one-line message names the key, the
bad value and the valid choices; the CLI turns it into exit code 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rspo import config_rules
from rspo.algorithms import ALGORITHMS
from rspo.algorithms.offpolicy import METHODS


def cache_dir() -> Path:
    """Root of rspo's cache (models, generated games): `$RSPO_CACHE`, else `~/.cache/rspo`."""
    return Path(os.environ.get("RSPO_CACHE") or "~/.cache/rspo").expanduser()


ALFWORLD_TASK_TYPES = [
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
]


ALFWORLD_MAX_RECEPTACLES = 12  # generated rooms' default size (rspo.envs.alfworld_gen)


class ConfigError(ValueError):
    """A config problem, phrased as one line for the user."""


def knob(default: Any = None, *, factory: Any = None, bounds: str = "", choices: list[str] | None = None) -> Any:
    """A config field whose valid values stand beside its default: `bounds`, a number's range
    (">= a", "> a", "[a, b]", "(a, b]" or "[a, b)"; every number must also be finite), or
    `choices`, the values a string (or each string of a list) may take. `factory` makes a
    list default. `RANGES` and `CHOICES` are read from these fields."""
    meta = {"bounds": bounds, "choices": choices}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class LoraConfig:
    enabled: bool = True  # False = full fine-tuning
    r: int = knob(8, bounds=">= 1")
    alpha: int = knob(16, bounds="> 0")
    dropout: float = knob(0.0, bounds="[0, 1)")
    # module names (the default: every linear layer of a Llama / Qwen2 block), or [all-linear]:
    # every linear layer but the LM head, in any architecture (peft's shorthand)
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


@dataclass
class TinyModelConfig:
    """Size of the `model.name=tiny` model (a Llama-config model built offline)."""

    hidden_size: int = knob(64, bounds=">= 1")
    num_layers: int = knob(2, bounds=">= 1")
    num_heads: int = knob(4, bounds=">= 1")
    vocab_size: int = knob(1024, bounds=">= 1")  # BPE vocabulary trained on environment text
    # bpe: byte-level BPE with GPT-2's splits (letters and digits apart, so an id like
    # WebShop's "b0kp3g4uox" is 7 pieces); words: letters and digits together, so with a
    # vocab_size large enough every word of the corpus (ids included) is one token, which
    # a tiny model can copy from the observation; anything else still encodes, as bytes
    tokenizer: str = knob("bpe", choices=["bpe", "words"])


@dataclass
class ModelConfig:
    name: str = "tiny"  # tiny | smollm2-135m | a local path or hub id
    dtype: str = knob("float32", choices=["float32", "bfloat16"])
    allow_hub: bool = False  # False: never touch the network (local files / cache only)
    init_from: str = ""  # a checkpoint directory to start from (e.g. `rspo sft` output)
    # load peft's pickle-format adapter_model.bin (as tensors only) where a saved policy has no
    # adapter_model.safetensors; off: such a file is refused, as a pickle can hide code
    allow_pickle_adapters: bool = False
    gradient_checkpointing: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)


@dataclass
class AlfworldConfig:
    data_dir: str = ""  # official data root (has json_2.1.1/); empty: $ALFWORLD_DATA, else generated games
    games_dir: str = ""  # where generated games are written; empty: the rspo cache
    num_train: int = knob(600, bounds=">= 1")  # generated split sizes (official: 3553 / 140 / 134)
    num_eval_in_distribution: int = knob(140, bounds=">= 1")
    num_eval_out_of_distribution: int = knob(134, bounds=">= 1")
    task_types: list[str] = knob(factory=lambda: list(ALFWORLD_TASK_TYPES), choices=ALFWORLD_TASK_TYPES)
    max_steps: int = knob(50, bounds=">= 1")
    seed: int = knob(0, bounds=">= 0")
    # generated rooms' size (the task's own 1-4 always included): fewer = easier
    max_receptacles: int = knob(ALFWORLD_MAX_RECEPTACLES, bounds=">= 1")


@dataclass
class WebshopConfig:
    num_products: int = knob(2000, bounds=">= 1")
    num_goals: int = knob(2500, bounds=">= 2")  # goals 0..num_test_goals-1 are the test split, the rest train
    num_test_goals: int = knob(500, bounds=">= 1")
    outcome: str = knob("success", choices=["success", "score"])  # outcome reward channel: success (score == 1) | score
    max_steps: int = knob(15, bounds=">= 1")
    seed: int = knob(0, bounds=">= 0")
    # difficulty of the generated shop (defaults: the original's); each level's catalog is
    # generated once into the rspo cache (rspo.envs.webshop_cache)
    # product types the catalog draws from (of 30); 0 = all. Fewer: fewer look-alikes
    num_product_types: int = knob(0, bounds="[0, 30]")
    # option types (colour, size, ...) a product keeps (2 = all); 0 = none to select
    max_option_types: int = knob(2, bounds="[0, 2]")
    # share of near-copies differing in one attribute, option or price
    variant_fraction: float = knob(0.4, bounds="[0, 1)")
    # attributes a product's title names (4 = all); the rest only on its item page
    title_attributes: int = knob(1, bounds=">= 1")
    page_size: int = knob(10, bounds=">= 1")  # results per page
    # the expert of the SFT demonstrations: oracle (knows the goal's item: opens it at once) |
    # reader (acts only on what the pages show: the best-named title under the price, its options)
    expert: str = knob("oracle", choices=["oracle", "reader"])
    # generated (our catalog) | real (princeton-nlp's web_agent_site, if installed)
    backend: str = knob("generated", choices=["generated", "real"])
    real_file_path: str = ""  # real backend: its products file; empty = web_agent_site's default
    real_num_products: int = knob(0, bounds=">= 0")  # real backend: 0 = all; its indexes exist for 100, 1000, 100000
    real_human_goals: bool = True  # real backend: human-written goals (else its synthetic ones)


@dataclass
class EnvConfig:
    name: str = knob("alfworld", choices=["alfworld", "webshop"])
    num_workers: int = knob(2, bounds=">= 0")  # worker processes stepping envs; 0 = in-process
    # seconds a worker may take to step its envs; a hung worker is replaced
    step_timeout: float = knob(60.0, bounds="> 0")
    alfworld: AlfworldConfig = field(default_factory=AlfworldConfig)
    webshop: WebshopConfig = field(default_factory=WebshopConfig)


@dataclass
class RolloutConfig:
    num_tasks: int = knob(8, bounds=">= 1")  # B: tasks per iteration
    group_size: int = knob(4, bounds=">= 1")  # G: target trajectories per task (same env seed)
    max_turns: int = knob(0, bounds=">= 0")  # 0 = the env's own step cap
    history_length: int = knob(2, bounds=">= 0")  # past observation/action pairs shown in the prompt
    max_prompt_tokens: int = knob(1024, bounds=">= 1")  # oldest history is dropped first to fit
    max_new_tokens: int = knob(48, bounds=">= 1")
    temperature: float = knob(1.0, bounds=">= 0")
    top_p: float = knob(1.0, bounds="(0, 1]")
    micro_batch: int = knob(32, bounds=">= 1")  # sequences per generate / forward call
    require_think: bool = False  # ask for <think>...</think> before <action>
    # forward (a second pass, exact) | sampler (the sampling pass's logits)
    behavior_logprobs: str = knob("forward", choices=["forward", "sampler"])
    # LoRA: sample with the adapter merged into the base weights (one matmul a layer, not
    # three; the distribution equal up to float rounding, so not the same samples bit for bit)
    merge_adapter: bool = False
    # LoRA: the target's and explorer's envs share each generate / forward pass, a row per
    # adapter (peft's mixed-adapter batches) instead of one pass per policy
    mixed_adapters: bool = False
    invalid_action_penalty: float = knob(0.1, bounds=">= 0")


@dataclass
class AlgoConfig:
    name: str = knob("grpo", choices=list(ALGORITHMS))
    norm: str = knob("mean_std", choices=["mean_std", "mean"])  # group normalization: mean_std | mean
    gamma: float = knob(0.95, bounds="[0, 1]")  # discount for GiGPO step returns and PPO's GAE
    gae_lambda: float = knob(0.95, bounds="[0, 1]")  # PPO
    step_weight: float = knob(1.0, bounds=">= 0")  # GiGPO's omega
    clip_ratio: float = knob(0.2, bounds="> 0")
    dual_clip: float = knob(0.0, bounds=">= 0")  # 0 = off, else the dual-clip constant c (e.g. 3.0)
    kl_coef: float = knob(0.0, bounds=">= 0")  # low_var_kl to the reference policy
    entropy_coef: float = knob(0.0, bounds=">= 0")
    value_clip: float = knob(0.2, bounds=">= 0")  # PPO critic
    critic_lr: float = knob(1e-4, bounds="> 0")  # PPO critic
    whiten_advantages: bool = False  # PPO: normalize advantages over the batch
    # token_mean (verl / GiGPO reference) | trajectory_mean (each trajectory once)
    loss_agg: str = knob("token_mean", choices=["token_mean", "trajectory_mean"])


@dataclass
class RewardConfig:
    mode: str = knob("outcome", choices=["outcome", "process", "shaped", "rspo", "group_swap"])
    outcome_scale: float = knob(10.0, bounds="> 0")  # the GiGPO reference trains on 10 * won / success
    process_scale: float = knob(1.0, bounds=">= 0")  # scale of the dense process reward
    shaped_coef: float = knob(0.5, bounds=">= 0")  # lambda in `shaped`: outcome + lambda * process


@dataclass
class RspoConfig:
    explorer_rollouts: int = knob(4, bounds=">= 0")  # E: explorer trajectories per task
    explorer_lr: float = knob(0.0, bounds=">= 0")  # 0 = train.lr
    explorer_warmup_steps: int = knob(0, bounds=">= 0")  # iterations in which only the explorer trains
    sync_every: int = knob(0, bounds=">= 0")  # copy explorer weights into the target every k steps; 0 = never
    buffer_size: int = knob(512, bounds=">= 0")  # trajectories kept in the replay buffer
    buffer_staleness: int = knob(4, bounds=">= 0")  # drop trajectories older than this many policy versions
    replay_per_task: int = knob(2, bounds=">= 0")  # R: replayed trajectories joining a task's target group
    buffer_successes_only: bool = True
    # the target's correction for rows it did not sample (rspo.algorithms.offpolicy)
    offpolicy: str = knob("clip", choices=METHODS)
    offpolicy_clip: float = knob(2.0, bounds="> 0")  # `clip`, `positive_only`: upper bound of the importance ratio
    shaping_gamma: float = knob(0.1, bounds="> 0")  # `shaping`: f(p) = p / (p + gamma)
    # which explorer / replayed / expert trajectories join the target's task groups: all |
    # successes (won) | rescues (won, in a group where no target trajectory won)
    join: str = knob("all", choices=["all", "successes", "rescues"])
    # process | shaped (reward.outcome_scale * outcome + shaped_coef * process)
    explorer_reward: str = knob("process", choices=["process", "shaped"])
    # the ceiling: in this fraction of each iteration's tasks, one explorer row is played by the
    # env's expert (ALFWorld's planner, WebShop's shopper), behaviour probability 1 (LUFFY)
    expert_fraction: float = knob(0.0, bounds="[0, 1]")
    # the expert's behaviour log-probs: one (probability 1, LUFFY's: rho = pi_theta weighs each token
    # by its probability) | target (the target's own at rollout time: rho starts at 1, as if it had sampled them)
    expert_behavior: str = knob("one", choices=["one", "target"])


@dataclass
class SftConfig:
    episodes: int = knob(200, bounds=">= 0")  # expert demonstrations collected from the train split
    epochs: int = knob(3, bounds=">= 1")
    lr: float = knob(2e-3, bounds="> 0")
    # "cosine": from sft.lr down to 0 at the last step
    lr_schedule: str = knob("constant", choices=["constant", "cosine"])
    batch_size: int = knob(16, bounds=">= 1")
    lora: bool = False  # False: fine-tune every weight (a tiny random model needs it); True: model.lora.*


@dataclass
class TrainConfig:
    steps: int = knob(20, bounds=">= 0")  # RL iterations
    lr: float = knob(1e-4, bounds="> 0")
    weight_decay: float = knob(0.0, bounds=">= 0")
    warmup_steps: int = knob(0, bounds=">= 0")
    epochs: int = knob(1, bounds=">= 1")  # passes over each rollout batch
    minibatches: int = knob(1, bounds=">= 1")  # optimizer steps per epoch
    # sequences per forward/backward (gradient accumulation within a minibatch)
    micro_batch: int = knob(16, bounds=">= 1")
    max_grad_norm: float = knob(1.0, bounds="> 0")
    # stop after more than this many updates in a row skipped for NaN/inf
    max_skipped_updates: int = knob(10, bounds=">= 0")
    seed: int = knob(0, bounds=">= 0")
    output_dir: str = "runs/defaults"  # unset in the file and overrides: derived (config_rules.default_output_dir)
    save_every: int = knob(10, bounds=">= 0")
    resume: str = ""  # "" = fresh, "auto" = latest checkpoint in output_dir, or a checkpoint path
    fsdp: bool = False  # shard weights, gradients and optimizer state over the processes (FSDP2; Policy.shard)
    # torch's CPU threads in each training process (rollouts, updates, evals); 0 = torch's default
    threads: int = knob(0, bounds=">= 0")


@dataclass
class EvalConfig:
    every: int = knob(0, bounds=">= 0")  # evaluate every k RL steps (0 = only before and after training)
    splits: list[str] = field(default_factory=list)  # empty: the env's held-out splits (config_rules.HELD_OUT)
    num_tasks: int = knob(20, bounds=">= 1")  # tasks per split
    temperature: float = knob(0.0, bounds=">= 0")  # 0 = greedy
    # trajectories played at once; fixed, so runs with other pool sizes sample alike
    batch_size: int = knob(32, bounds=">= 1")
    # k > 1: play each task k times; a task's success is its fraction of wins
    samples_per_task: int = knob(1, bounds=">= 1")
    explorer: bool = False  # also evaluate the RSPO explorer
    final_temperatures: list[float] = field(default_factory=list)  # the final checkpoint also at these (e.g. [1.0])


@dataclass
class LogConfig:
    tensorboard: bool = True
    sample_every: int = knob(5, bounds=">= 0")  # log a sample trajectory as text every k steps (0 = never)
    progress: bool = True  # tqdm bars


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rspo: RspoConfig = field(default_factory=RspoConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)


def _leaves(cls: type, prefix: str = "") -> typing.Iterator[tuple[str, dataclasses.Field]]:
    """Every leaf field of config dataclass `cls`, by dotted key."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _leaves(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, f


# Read from the fields (`knob`). `model.name` is open: any HF path or id works.
RANGES: dict[str, str] = {key: f.metadata["bounds"] for key, f in _leaves(Config) if f.metadata.get("bounds")}
CHOICES: dict[str, list[str]] = {key: f.metadata["choices"] for key, f in _leaves(Config) if f.metadata.get("choices")}


def _fields(cls: type) -> dict[str, tuple[Any, bool]]:
    """Map field name -> (resolved type, is_section) for a config dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], dataclasses.is_dataclass(hints[f.name])) for f in dataclasses.fields(cls)}


def _coerce(key: str, value: Any, typ: Any) -> Any:
    """Check/convert one leaf value to its declared type; raise ConfigError naming `key`."""
    origin = typing.get_origin(typ)
    if origin is list:
        if isinstance(value, str):  # CLI: a,b,c
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(key, v, typing.get_args(typ)[0]) for v in value]
    if typ is bool:
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if typ is float:
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if typ is str:
        if value is None:
            return ""
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    raise TypeError(f"unsupported config type {typ} for {key}")


def _unknown(key: str, name: str, valid: list[str]) -> ConfigError:
    close = difflib.get_close_matches(name, valid, n=1)
    prefix = key[: -len(name)]
    hint = f"; did you mean {prefix}{close[0]}?" if close else ""
    return ConfigError(f"unknown config key {key}{hint} (valid: {', '.join(valid)})")


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested dict, validating every key on the way."""
    fields = _fields(cls)
    kwargs = {}
    for name, value in data.items():
        key = prefix + name
        if name not in fields:
            raise _unknown(key, name, list(fields))
        typ, is_section = fields[name]
        if is_section:
            if not isinstance(value, dict):
                raise ConfigError(f"{key}: is a section, expected a mapping of keys, got {value!r}")
            kwargs[name] = _build(typ, value, key + ".")
        else:
            kwargs[name] = _coerce(key, value, typ)
    return cls(**kwargs)


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {p} is a value, not a section")
    node[leaf] = value


def _validate(cfg: Config) -> None:
    """The one check of a config's values: each key's choices and range (its `knob`), then
    the rules across keys (`config_rules.problem`). Raises the first problem's ConfigError."""
    flat = to_dict(cfg)
    for key, valid in CHOICES.items():
        values = _get(flat, key)
        for v in values if isinstance(values, list) else [values]:
            if v not in valid:
                close = difflib.get_close_matches(str(v), valid, n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise ConfigError(f"{key}: invalid value {v!r}{hint} (valid choices: {', '.join(valid)})")
    flat = config_rules.flatten(flat)
    for key, spec in RANGES.items():
        if not config_rules.within(flat[key], spec):
            raise ConfigError(f"{key}: must be {spec if spec[0] == '>' else 'in ' + spec}, got {flat[key]!r}")
    if (message := config_rules.problem(flat)) is not None:  # rules across keys, split names, paths
        raise ConfigError(message)


def _get(flat: dict[str, Any], dotted: str) -> Any:
    node: Any = flat
    for part in dotted.split("."):
        node = node[part]
    return node


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=value` -> ("a.b", parsed value). Values are parsed as YAML scalars/lists."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value (e.g. algo.name=grpo)")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, validate: bool = True) -> Config:
    """Load a YAML file (or the defaults when `path` is None) and apply dotted overrides.

    `train.output_dir`, when neither sets it, follows the file's name and the overrides
    (`config_rules.default_output_dir`). `validate=False` skips the checks of values and
    paths (to read a run's recorded config, whose paths may have moved since)."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"config file {path} is a directory; pass a YAML file (e.g. configs/default.yaml)")
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path}: expected a mapping of sections, got {type(data).__name__}")
    for text in overrides or []:
        _set_dotted(data, *parse_override(text))
    cfg = _build(Config, data)
    if not (data.get("train") or {}).get("output_dir"):
        pairs = [text.split("=", 1) for text in overrides or []]
        cfg.train.output_dir = config_rules.default_output_dir(path, [(k.strip(), v) for k, v in pairs])
    cfg.eval.splits = cfg.eval.splits or list(config_rules.HELD_OUT.get(cfg.env.name, []))
    if validate:
        _validate(cfg)
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
