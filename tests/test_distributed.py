"""Two processes through `accelerate launch` on CPU (DDP over gloo): gradients synchronize.

The launch uses the shipped configs/accelerate/ddp.yaml (with ACCELERATE_USE_CPU=true).
STACK.md's traps are silent: `--cpu --num_processes 2` starts ONE process, and
`--multi_gpu` without ACCELERATE_USE_CPU starts two that each think they are alone. So
the test checks the process count and that both ranks hold identical weights after a step.

FSDP is not tried here: accelerate on CPU ignores it (`--use_fsdp` or the FSDP config with
ACCELERATE_USE_CPU=true give DistributedType.MULTI_CPU, i.e. DDP; without it, one process
per rank that each think they are alone), and rspo's trainer does not support it yet
(test_policy.py checks that it stops with a clear error).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ACCELERATE_CONFIGS = HERE.parent / "configs" / "accelerate"


@pytest.mark.parametrize("name, engine", [("ddp", "MULTI_GPU"), ("fsdp", "FSDP"), ("deepspeed_zero2", "DEEPSPEED")])
def test_shipped_accelerate_configs_load(name, engine):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(ACCELERATE_CONFIGS / f"{name}.yaml"))
    assert cfg.distributed_type.name == engine and cfg.num_machines == 1
    assert cfg.mixed_precision == "no"  # precision comes from model.dtype


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["outcome", "rspo"])
def test_two_cpu_processes_keep_identical_weights(warm_model, tmp_path, mode):
    out = tmp_path / "ddp.json"
    env = {
        **os.environ,
        "ACCELERATE_USE_CPU": "true",
        "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ACCELERATE_CONFIGS / "ddp.yaml"),
        "--num_processes",
        "2",
        str(HERE / "ddp_check.py"),
        str(warm_model),
        str(out),
        f"reward.mode={mode}",
        "train.minibatches=2",
        "rspo.buffer_successes_only=false",  # fill the replay buffer, to check it survives a resume
        "algo.entropy_coef=0.01",  # a gradient even when every sampled reward is equal (zero advantages)
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["num_processes"] == 2
    a, b = sorted(result["ranks"], key=lambda r: r["rank"])
    assert a["tasks"] != b["tasks"]  # each rank plays its own share of the tasks
    assert a["before"] == b["before"]  # same initialization
    assert a["after"] != a["before"], a["metrics"]  # the step changed the weights...
    assert a["after"] == pytest.approx(b["after"], rel=0, abs=1e-9)  # ...identically on both ranks
    assert a["finite"] and b["finite"]
    assert a["resumed"] == b["resumed"] == a["after"]  # the checkpoint restored the trained weights
    if mode == "rspo":  # each rank keeps, saves and resumes its own replay buffer
        assert a["buffer"] and b["buffer"] and a["buffer"] != b["buffer"]
        assert (a["restored"], b["restored"]) == (a["buffer"], b["buffer"])
