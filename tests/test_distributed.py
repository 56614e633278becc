"""Two processes through `accelerate launch` on CPU (gloo): gradients synchronize, under
DDP and under rspo's own FSDP (`train.fsdp=true`).

The launch uses the shipped configs/accelerate/ddp.yaml (with ACCELERATE_USE_CPU=true).
accelerate's launch traps are silent: `--cpu --num_processes 2` starts ONE process, and
`--multi_gpu` without ACCELERATE_USE_CPU starts two that each think they are alone. So
the test checks the process count and that both ranks hold identical weights after a step.

accelerate's own FSDP is not tried here: on CPU it ignores it (`--use_fsdp` or the FSDP
config with ACCELERATE_USE_CPU=true give DistributedType.MULTI_CPU, i.e. DDP). rspo shards
with torch's FSDP2 itself (`Policy.shard`), which runs on CPU, so the FSDP test launches
the DDP config with `train.fsdp=true`.

Two machines are two launches on this host (`--num_machines 2 --machine_rank 0|1`), each in
its own working directory with its own $RSPO_CACHE, as machines with separate disks.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import SMALL, free_port

from rspo.checkpoint import weights_digest

HERE = Path(__file__).resolve().parent
ACCELERATE_CONFIGS = HERE.parent / "configs" / "accelerate"


@pytest.mark.parametrize("name, engine", [("ddp", "MULTI_GPU"), ("fsdp", "FSDP"), ("deepspeed_zero2", "DEEPSPEED")])
def test_shipped_accelerate_configs_load(name, engine):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(ACCELERATE_CONFIGS / f"{name}.yaml"))
    assert cfg.distributed_type.name == engine and cfg.num_machines == 1
    assert cfg.mixed_precision == "no"  # precision comes from model.dtype


def accelerate_launch(*args: str) -> tuple[list[str], dict]:
    """The command and environment of `accelerate launch` on two CPU processes with the
    shipped DDP config; `args`: more launch flags, the script and its arguments."""
    env = {
        **os.environ,
        "ACCELERATE_USE_CPU": "true",
        "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CONFIGS / "ddp.yaml")]
    return [*launch, "--num_processes", "2", *args], env


def ddp_check(out: Path, *overrides: str) -> list[str]:
    """ddp_check.py and its arguments: it writes its JSON to `out`."""
    return [
        str(HERE / "ddp_check.py"),
        str(out),
        "train.minibatches=2",
        "rspo.buffer_successes_only=false",  # fill the replay buffer, to check it survives a resume
        "algo.entropy_coef=0.01",  # a gradient even when every sampled reward is equal (zero advantages)
        *overrides,
    ]


def read_check(out: Path) -> dict:
    """ddp_check.py's JSON, ranks sorted."""
    result = json.loads(out.read_text())
    assert result["num_processes"] == 2
    result["ranks"].sort(key=lambda r: r["rank"])
    return result


def launch(warm_model, out: Path, *overrides: str) -> dict:
    """Run ddp_check.py on two CPU processes; returns its JSON, ranks sorted."""
    cmd, env = accelerate_launch(*ddp_check(out, f"model.init_from={warm_model}", *overrides))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_check(out)


def check_synchronized(a: dict, b: dict) -> None:
    """Both ranks' step trained the same weights, and the checkpoint restored them."""
    assert a["tasks"] != b["tasks"]  # each rank plays its own share of the tasks
    assert a["before"] == b["before"]  # same initialization
    assert a["after"] != a["before"], a["metrics"]  # the step changed the weights...
    assert a["after"] == pytest.approx(b["after"], rel=0, abs=1e-9)  # ...identically on both ranks
    assert a["finite"] and b["finite"]
    assert a["resumed"] == b["resumed"] == a["after"]  # the checkpoint restored the trained weights...
    assert a["moments"][0] != 0 and a["moments"][1] == a["moments"][0]  # ...and Adam's moments


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["outcome", "rspo"])
def test_two_cpu_processes_keep_identical_weights(warm_model, tmp_path, mode):
    a, b = launch(warm_model, tmp_path / "ddp.json", f"reward.mode={mode}")["ranks"]
    check_synchronized(a, b)
    if mode == "rspo":  # each rank keeps, saves and resumes its own replay buffer
        assert a["buffer"] and b["buffer"] and a["buffer"] != b["buffer"]
        assert (a["restored"], b["restored"]) == (a["buffer"], b["buffer"])


@pytest.mark.slow
@pytest.mark.parametrize("lora", [True, False])
def test_fsdp_trains_as_ddp(warm_model, tmp_path, lora):
    """FSDP2 (weights, gradients and Adam state sharded; gathered for each rollout and
    minibatch) takes the step DDP takes, for both RSPO policies and their PPO critics, and
    its checkpoint (gathered whole, resharded on resume) restores it. With LoRA the
    policies are adapters of one sharded module; with full fine-tuning each is its own
    sharded copy, and the KL term's reference stays whole."""
    run = ("reward.mode=rspo", "algo.name=ppo", *([] if lora else ["model.lora.enabled=false", "algo.kl_coef=0.01"]))
    ddp = launch(warm_model, tmp_path / "ddp.json", *run)["ranks"]
    fsdp = launch(warm_model, tmp_path / "fsdp.json", *run, "train.fsdp=true")["ranks"]
    check_synchronized(*fsdp)
    assert [r["tasks"] for r in fsdp] == [r["tasks"] for r in ddp]
    assert fsdp[0]["before"] == ddp[0]["before"]  # rank 0's initialization, on every rank
    # each rank holds about half of Adam's moments (uneven shards: a (1, H) head is not halved)
    assert [r["moment_bytes"] for r in fsdp] == pytest.approx([ddp[0]["moment_bytes"] / 2] * 2, rel=0.05)
    # the same samples and updates; only the gradients' reduction order differs (seen: the
    # weights' checksums equal to 15 digits, the gradient norms to 8)
    assert fsdp[0]["after"] == pytest.approx(ddp[0]["after"], rel=1e-6)
    for key in ("loss/policy", "loss/value", "explorer/loss/policy", "loss/grad_norm"):
        assert fsdp[0]["metrics"][key] == pytest.approx(ddp[0]["metrics"][key], rel=1e-5)


Results = list[tuple[int | None, str]]  # each machine's exit code (None: killed) and log


def run_machines(homes: list[Path], *args: str, timeout: float = 280, grace: float = 60) -> Results:
    """`accelerate launch` on two machines, one process each (`args`: the script and
    its arguments), each in its own working directory `home` with its own $RSPO_CACHE.
    Once one machine has failed, the other must stop within `grace` seconds (not wait for
    it in a collective); both within `timeout` (under pytest's 300 s, so that none is left
    running). A machine still running then is killed: its exit code reads None."""
    assert len(homes) == 2  # accelerate_launch's --num_processes: one process a machine
    port, procs = str(free_port()), []
    for rank, home in enumerate(homes):
        home.mkdir(exist_ok=True)
        # the README's two-machine command (section "Multi-node"), one process a machine here
        flags = ["--num_machines", "2", "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1",
                 "--main_process_port", port]  # fmt: skip
        cmd, env = accelerate_launch(*flags, *args)
        with open(home / "log", "w") as log:
            procs.append(subprocess.Popen(cmd, cwd=home, env=env | {"RSPO_CACHE": str(home / "cache")}, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip
    deadline, failed = time.monotonic() + timeout, False
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if not failed and any(p.poll() not in (None, 0) for p in procs):
            deadline, failed = min(deadline, time.monotonic() + grace), True
        time.sleep(0.2)
    codes = [p.poll() for p in procs]
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    return [(code, (home / "log").read_text()) for code, home in zip(codes, homes, strict=True)]


def tails(results: Results) -> str:
    return "\n".join(f"machine {i} (exit {code}): ...{log[-1500:]}" for i, (code, log) in enumerate(results))


@pytest.mark.slow
def test_two_machines_with_separate_disks(tmp_path):
    """Two machines (two `accelerate launch` process groups on this host, one process each,
    gloo) that share no disk: each its own working directory, so its own relative
    `train.output_dir`, and its own $RSPO_CACHE. The warm start is built on machine 0 and
    sent to machine 1; an RSPO step trains the same weights on both; the checkpoint, written
    on machine 0 only, is sent to machine 1 when the run resumes and restores both."""
    out, homes = tmp_path / "two.json", [tmp_path / "machine0", tmp_path / "machine1"]
    warm = ["sft.episodes=8", "sft.epochs=2", "sft.batch_size=8"]  # a small warm start: it only has to exist
    results = run_machines(homes, *ddp_check(out, "reward.mode=rspo", "train.output_dir=run", *warm))
    assert [code for code, _ in results] == [0, 0], tails(results)
    a, b = read_check(out)["ranks"]
    check_synchronized(a, b)
    assert a["buffer"] and b["buffer"] and (a["restored"], b["restored"]) == (a["buffer"], b["buffer"])
    # machine 1 now holds the main's warm start and checkpoint, the same files
    for sub in ("sft", "checkpoints/step_000000"):
        assert weights_digest(homes[1] / "run" / sub) == weights_digest(homes[0] / "run" / sub)


@pytest.mark.slow
@pytest.mark.parametrize(
    "on_disk_0, override, line, failed",
    [
        ("warm/", "model.init_from=warm", "rspo: config error: model.init_from=warm: no such directory", 1),
        ("run/eval_summary.json", "train.output_dir=run", "rspo: error: FileExistsError: train.output_dir=run already "
         "holds a run: continue it with train.resume=auto", 0),
    ],
)  # fmt: skip
def test_a_check_failing_on_one_machine_stops_every_machine(tmp_path, on_disk_0, override, line, failed):
    """A start check that fails on one machine's disk only: a path only machine 0 has (the
    config check fails on machine 1), a run directory that holds a run on machine 0 only
    (`rspo train`'s check fails on machine 0). Every machine stops with the failing one's
    line, instead of waiting for it at the rendezvous (rspo.multinode.checked_everywhere)."""
    homes = [tmp_path / "machine0", tmp_path / "machine1"]
    made = homes[0] / on_disk_0
    made.mkdir(parents=True) if on_disk_0.endswith("/") else (made.parent.mkdir(parents=True), made.write_text("{}"))
    results = run_machines(homes, str(HERE.parent / "train.py"), *SMALL, override)
    assert [code for code, _ in results] == [1, 1], tails(results)  # torchrun's exit code for a failed process
    assert f"\n{line}" in "\n" + results[failed][1], tails(results)
    assert f"{line}" in results[1 - failed][1] and f"[on process {failed}]" in results[1 - failed][1], tails(results)


def test_unshardable_setups_stop_at_start_naming_the_fix(monkeypatch):
    from accelerate import Accelerator
    from accelerate.utils import DistributedType
    from conftest import small_config

    from rspo.config import ConfigError
    from rspo.train import setup

    with pytest.raises(ConfigError, match="train.fsdp=true.*accelerate launch --num_processes"):
        setup(small_config("train.fsdp=true"))  # one process: nothing to shard over
    # DeepSpeed is not installed here: stand in for its launch by the type accelerate reports
    monkeypatch.setattr(Accelerator, "distributed_type", property(lambda self: DistributedType.DEEPSPEED))
    with pytest.raises(ConfigError, match="DeepSpeed is not supported.*fsdp.yaml"):
        setup(small_config())


END_PROCESS_SCRIPT = """
import atexit, sys
import torch.distributed as dist
from rspo.cli import end_process

end_process(5)  # no process group yet: returns
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
atexit.register(lambda: print("teardown ran"))
print("work done", end="")  # buffered: end_process must flush it
end_process(3)
print("not reached")
"""


def test_end_process_exits_with_its_code_and_skips_the_teardown(tmp_path):
    """A process of a multi-process launch ends through `end_process`: its output flushed,
    its exit code kept, and no teardown (atexit, the process group's destructor) run, since
    gloo's teardown can deadlock or abort (rspo.cli.end_process)."""
    script = tmp_path / "end.py"
    script.write_text(END_PROCESS_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stdout == "work done"
