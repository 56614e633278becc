"""The GPU configs' code path, on the CPU: one RSPO iteration of
configs/gpu_qwen_alfworld_rspo.yaml end to end, so that a user's first GPU run cannot fail
on wiring the rest of the suite never exercises together: a Qwen2 model in bf16 under bf16
autocast, LoRA on every linear layer, gradient checkpointing, the KL reference, the entropy
bonus, dual-clip, and target and explorer sharing each generate (`rollout.mixed_adapters`).

Only sizes change (`OVERRIDES`): the model (`random-qwen2-tiny`: Qwen2 at hidden size 64,
built offline), the batch, the turns, the prompt and response lengths, generated ALFWorld
games in-process. Every other key is the GPU config's, and the test checks that it is.
`rollout.mixed_adapters` is the one switch turned on: the path a GPU run would take to
share passes (the config's default, one pass per policy, is the rest of the suite's).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState
from torch import nn

from rspo.config import load_config, to_dict
from rspo.train import rl_step, setup

pytest.importorskip("alfworld")

MLP = ("gate_proj", "up_proj", "down_proj")
CONFIG = Path(__file__).resolve().parents[1] / "configs/gpu_qwen_alfworld_rspo.yaml"
OVERRIDES = {
    "model.name": "random-qwen2-tiny",
    "env.num_workers": 0,
    "env.alfworld.num_train": 1,
    "env.alfworld.num_eval_in_distribution": 1,
    "env.alfworld.num_eval_out_of_distribution": 1,
    "rollout.num_tasks": 1,
    "rollout.group_size": 2,
    "rollout.max_turns": 3,  # a random model's actions are all invalid: GiGPO's step groups
    "rollout.max_new_tokens": 8,  # still differ (the same "Nothing happens." at turns 1 and 2)
    "rollout.max_prompt_tokens": 128,
    "rollout.micro_batch": 4,
    "rollout.mixed_adapters": True,
    "rspo.explorer_rollouts": 2,
    "train.micro_batch": 4,
    "train.minibatches": 2,
    "eval.num_tasks": 1,
    "log.progress": False,
    "log.tensorboard": False,
}


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out |= flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v}
    return out


@pytest.fixture()
def gpu_run(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)  # generated games, in tmp_path
    paths = {"env.alfworld.games_dir": str(tmp_path / "games"), "train.output_dir": str(tmp_path / "run")}
    cfg = load_config(CONFIG, [f"{k}={v}" for k, v in (OVERRIDES | paths).items()])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bf16 on a CPU shared with other jobs: a second thread spin-waits (measured:
    # an iteration took 27 s on one thread, 97 s on two). accelerate's state is one per process and
    # refuses another mixed precision: earlier tests' float32 runs set it to "no"
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        torch.manual_seed(0)
        run = setup(cfg)
        yield run
        run.pool.close()
    finally:
        torch.set_num_threads(threads)
        AcceleratorState._reset_state(reset_partial_state=True)


def test_one_rspo_iteration_on_the_gpu_configs_path(gpu_run):
    run, cfg = gpu_run, gpu_run.cfg
    shipped = flat(to_dict(load_config(CONFIG)))
    differ = {k for k, v in flat(to_dict(cfg)).items() if v != shipped[k]}
    assert differ <= set(OVERRIDES) | {"env.alfworld.games_dir", "train.output_dir"}
    # what the GPU config asks for, and this run has
    assert run.acc.mixed_precision == "bf16"
    peft_model = run.policy.peft_model
    base = peft_model.base_model.model
    assert type(base).__name__ == "Qwen2ForCausalLM" and base.dtype == torch.bfloat16
    assert any(getattr(m, "gradient_checkpointing", False) for m in base.modules())
    adapted = {n for n, m in base.named_modules() if hasattr(m, "lora_A")}  # LoRA wraps a linear layer
    assert {n.rsplit(".", 1)[-1] for n in adapted} == {"q_proj", "k_proj", "v_proj", "o_proj", *MLP}
    assert len(adapted) == 7 * base.config.num_hidden_layers
    bare = [n for n, m in base.named_modules() if isinstance(m, nn.Linear) and ".layers." in n and "lora_" not in n]
    assert all(n.endswith(".base_layer") for n in bare)  # no linear layer of a block left without LoRA
    trainable = {name: run.policy.parameters_of(name) for name in ("target", "explorer")}
    assert all(p.dtype == torch.float32 for ps in trainable.values() for p in ps)  # peft: float32 adapters
    lora_b = {
        name: {n: p.detach().clone() for n, p in peft_model.named_parameters() if f"lora_B.{name}." in n}
        for name in trainable
    }
    frozen = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" not in n}

    metrics = rl_step(run)

    assert all(math.isfinite(v) for v in metrics.values()), metrics
    for prefix in ("", "explorer/"):  # both learners: a signal, a gradient, every loss term
        assert metrics[f"{prefix}adv/abs_mean"] > 0 and metrics[f"{prefix}loss/grad_norm"] > 0
        assert {f"{prefix}loss/kl", f"{prefix}loss/entropy", f"{prefix}policy/dual_clip_frac"} <= set(metrics)
        assert metrics[f"{prefix}train/skipped_updates"] == 0
    for name, before in lora_b.items():  # B starts at 0, where weight decay cannot move it: gradients did
        after = dict(peft_model.named_parameters())
        assert len(before) == len(adapted) and all(not after[n].equal(b) for n, b in before.items()), name
    assert all(p.equal(frozen[n]) for n, p in peft_model.named_parameters() if n in frozen)  # the base stays
