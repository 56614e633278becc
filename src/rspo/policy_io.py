"""Policies on disk, and building one: `save_policy`, `load_policy`, `build_policy` (plain
functions of a `rspo.policy.Policy`; the policy knows nothing of files).

Layout of a saved policy directory (`save_policy`):
  LoRA     stock peft adapter dirs, `<dir>/<name>/` for every policy and critic
           (`PeftModel.from_pretrained(base, dir / "target")` loads one)
  full FT  `save_pretrained` dirs `<dir>/<name>/`, each with the tokenizer (standalone models)
  both     the tokenizer in `<dir>/`, each critic's value head in
           `<dir>/<critic>/value_head.safetensors`, and `<dir>/policy.json`
           ({"lora", "policies", "critic"}, and with LoRA "base": the base model's
           `base_fingerprint`, so adapters never load onto another base than their own)
Weights are read as safetensors; peft's pickle-format `adapter_model.bin` only with
`model.allow_pickle_adapters`, and then as tensors only (`rspo.safe_load.load_data`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path

import peft
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import PreTrainedModel

from rspo.config import ConfigError, ModelConfig
from rspo.models import Corpus, load_base
from rspo.policy import Policy, critic_name
from rspo.safe_load import load_data

VALUE_HEAD_FILE = "value_head.safetensors"
ADAPTER_FILE, PICKLED_ADAPTER_FILE = "adapter_model.safetensors", "adapter_model.bin"  # peft's, per adapter dir


def state_dicts(policy: Policy) -> dict[str, dict[str, Tensor]]:
    """Each policy's module's state dict, for `save_policy`. Sharded: gathered whole onto the
    main rank's CPU (a collective: every rank calls it, the others get empty dicts); with
    LoRA only the trainable weights are gathered, not the frozen base."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=policy.lora)
    states = {id(net): get_model_state_dict(net, options=opts) if policy.sharded else net.state_dict()
              for net in policy.unique_modules()}  # fmt: skip
    return {name: states[id(net)] for name, net in policy.raw_nets.items()}


def save_policy(policy: Policy, directory: str | Path, state: dict[str, dict[str, Tensor]] | None = None) -> None:
    """Write every policy to `directory/<name>/` and the tokenizer to `directory/`.

    LoRA: stock peft adapter dirs (`PeftModel.from_pretrained(base, directory/"target")`
    loads one). Full FT: `save_pretrained` dirs (with the tokenizer: standalone models).
    Each critic's value head goes to `directory/<critic>/value_head.safetensors`.
    `state`: `state_dicts(policy)` (required when sharded: gathered on every rank, written by one).
    """
    if state is None:
        if policy.sharded:
            raise RuntimeError("a sharded Policy saves state_dicts(policy) gathered on every rank: pass it as state")
        state = state_dicts(policy)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    policy.tokenizer.save_pretrained(directory)
    if policy.lora:
        lm = _part(state["target"], "lm.")
        policy.peft_model.save_pretrained(directory, selected_adapters=policy.all_names(), state_dict=lm)
    else:
        for name in policy.all_names():
            policy.raw_nets[name].lm.save_pretrained(directory / name, state_dict=_part(state[name], "lm."))
            policy.tokenizer.save_pretrained(directory / name)
    for critic in policy.critics:
        save_file(_part(state[critic], f"value_heads.{critic}."), directory / critic / VALUE_HEAD_FILE)
    meta = {"lora": policy.lora, "policies": policy.names, "critic": bool(policy.critics)}
    if policy.lora:
        meta["base"] = policy.base_fingerprint
    (directory / "policy.json").write_text(json.dumps(meta, indent=2) + "\n")


def load_policy(policy: Policy, directory: str | Path, names: Iterable[str] | None = None) -> list[str]:
    """Load weights saved by `save_policy` into `policy` in place; returns the names loaded.

    `names=None` loads every policy of `policy` that `directory/policy.json` lists.
    A missing `policy.json`, policy directory or weights file is an error, never a skip.
    """
    directory = Path(directory)
    meta_file = directory / "policy.json"
    if not meta_file.is_file():  # a missing or incomplete checkpoint: never load nothing silently
        raise FileNotFoundError(f"{directory}: no saved policy there (no policy.json)")
    meta = json.loads(meta_file.read_text())
    if meta["lora"] != policy.lora:
        raise ValueError(f"{directory} was saved with lora.enabled={not policy.lora}, this run has {policy.lora}")
    if policy.lora and meta.get("base", policy.base_fingerprint) != policy.base_fingerprint:  # older saves lack it
        raise ValueError(
            f"{directory}: its LoRA adapters were trained on another base model (fingerprint {meta['base']}, "
            f"this one's {policy.base_fingerprint}); build the base they were trained on (its run's "
            "model.init_from, the warm start) or evaluate the checkpoint with `rspo eval --checkpoint`"
        )
    if names is None:  # what policy.json says `save_policy` wrote, of the policies `policy` has
        written = meta["policies"] + ([critic_name(n) for n in meta["policies"]] if meta["critic"] else [])
        names = [n for n in policy.all_names() if n in written]
    names = list(names)
    for name in names:
        sub = directory / name
        if not sub.is_dir():
            raise FileNotFoundError(f"{sub} does not exist (saved policies: {_saved(directory)})")
        if policy.lora:
            state = read_weights(adapter_file(sub, policy.allow_pickle_adapters), str(policy.device))
            result = peft.set_peft_model_state_dict(policy.peft_model, state, adapter_name=name)
            if result.unexpected_keys:
                raise ValueError(f"{sub}: weights that do not fit this model: {result.unexpected_keys[:3]}")
        else:
            _load_safetensors(policy.raw_nets[name].lm, sub)
        if name in policy.critics:
            head = policy.raw_nets[name].value_heads[name]
            head.load_state_dict(read_weights(sub / VALUE_HEAD_FILE, str(policy.device)))
    return names


def merged_target(policy: Policy) -> PreTrainedModel:
    """A plain HF model of the target policy (LoRA merged into a copy of the base)."""
    if not policy.lora:
        return copy.deepcopy(policy.raw_nets["target"].lm)
    model = copy.deepcopy(policy.peft_model)
    model.set_adapter("target")
    for name in policy.all_names():
        if name != "target":
            model.delete_adapter(name)
    return model.merge_and_unload()


def build_policy(
    cfg: ModelConfig,
    corpus: Corpus | None = None,
    adapters: Iterable[str] = ("target",),
    critic: bool = False,
    reference: bool = False,
    device: torch.device | str | None = None,
) -> Policy:
    """`load_base` + `Policy`, then weights from `cfg.init_from` if set.

    `init_from` is either a full Hugging Face model directory (e.g. the `rspo sft` warm
    start, which saves a merged model): it replaces the base model, and fresh adapters go
    on top; or a policy directory written by `save_policy` (a checkpoint's `policy/`):
    its weights load into the policies. Policies that checkpoint lacks start as copies of
    its target; a critic it lacks starts fresh.
    """
    if cfg.init_from and not Path(cfg.init_from).is_dir():
        raise FileNotFoundError(f"model.init_from={cfg.init_from}: no such directory")
    if cfg.init_from and (Path(cfg.init_from) / "config.json").is_file():  # a full HF model
        cfg = dataclasses.replace(cfg, name=cfg.init_from, init_from="")
    model, tokenizer = load_base(cfg, corpus)
    policy = Policy(cfg, model, tokenizer, adapters=adapters, critic=critic, reference=reference)
    if device is not None:
        policy.to(device)
    if cfg.init_from:
        loaded = load_policy(policy, cfg.init_from)
        if "target" not in loaded:
            raise FileNotFoundError(f"model.init_from={cfg.init_from}: no target policy saved there")
        for name in policy.names:
            if name not in loaded:
                policy.copy_weights("target", name)
    return policy


def _load_safetensors(model: nn.Module, directory: Path) -> None:
    """Load a (maybe sharded) `save_pretrained` directory into `model` in place."""
    files = sorted(directory.glob("model*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors weights")
    device = str(next(model.parameters()).device)
    missing = set(model.state_dict())
    for f in files:
        result = model.load_state_dict(read_weights(f, device), strict=False)
        if result.unexpected_keys:
            raise ValueError(f"{f}: weights that do not fit this model: {result.unexpected_keys[:3]}")
        missing &= set(result.missing_keys)
    tied = {n for n in missing if n.endswith("lm_head.weight")}  # tied to the embeddings, not saved
    if missing - tied:
        raise ValueError(f"{directory}: weights missing: {sorted(missing - tied)[:3]}")


def adapter_file(directory: Path, allow_pickle: bool) -> Path:
    """The weights file of peft adapter dir `directory`: its safetensors file, else its
    pickle-format `adapter_model.bin` when `allow_pickle` (`model.allow_pickle_adapters`)."""
    if (directory / ADAPTER_FILE).is_file():
        return directory / ADAPTER_FILE
    if not (directory / PICKLED_ADAPTER_FILE).is_file():
        raise FileNotFoundError(f"{directory}: no adapter weights ({ADAPTER_FILE})")
    if not allow_pickle:
        raise ConfigError(
            f"{directory / PICKLED_ADAPTER_FILE}: refused: a pickle-format adapter; convert it to {ADAPTER_FILE}, or "
            "load it as tensors with model.allow_pickle_adapters=true if you trust where it comes from"
        )
    return directory / PICKLED_ADAPTER_FILE


def read_weights(file: Path, device: str, header_only: bool = False) -> dict[str, Tensor]:
    """The tensors in weights file `file`: safetensors, or a pickle-format adapter read as
    tensors only (`load_data`). A truncated or corrupted file is a ConfigError naming it.
    `header_only`: check that it would load, reading no tensors (returns {})."""
    if file.suffix != ".safetensors":
        state = load_data(file, map_location=device, mmap=header_only)
        return {} if header_only else state
    try:
        if header_only:
            with safe_open(file, "pt"):  # parses the header, checks it against the file's size
                return {}
        return load_file(file, device=device)
    except SafetensorError as e:
        raise ConfigError(f"{file}: truncated or corrupted ({e})") from None


def check_weights(directory: Path, allow_pickle: bool) -> None:
    """Before a run that will load saved policy `directory` builds anything: each weights file
    that `load_policy` would read loads (`read_weights`, reading no tensors), else the
    ConfigError naming the first that does not."""
    for f in sorted(directory.rglob("*.safetensors")):
        read_weights(f, "cpu", header_only=True)
    for sub in sorted({f.parent for f in directory.rglob(PICKLED_ADAPTER_FILE)}):
        read_weights(adapter_file(sub, allow_pickle), "cpu", header_only=True)


def _part(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The entries of `state` under `prefix`, with the prefix removed."""
    return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}


def _saved(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.is_dir())
