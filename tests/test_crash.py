"""Crash and resume: SIGKILL the training process at random points and at a
checkpoint write, then rerun the same command (`train.resume=auto`) until it finishes. The
latest checkpoint always loads, and the run ends with the same weights (both RSPO adapters,
bitwise on CPU), optimizer states, replay buffer and eval results as a run never killed."""

import json
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import SMALL
from safetensors.torch import load_file

from rspo import checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # several training processes each

STEPS = 2


def command(warm_model, out) -> list[str]:
    return [sys.executable, "-m", "rspo", "train", *SMALL, f"model.init_from={warm_model}", "reward.mode=rspo",
            "rspo.explorer_rollouts=2", "rspo.buffer_successes_only=false", f"train.steps={STEPS}",
            "train.save_every=1", "eval.num_tasks=2", f"train.output_dir={out}", "train.resume=auto"]  # fmt: skip


def finished(out) -> bool:
    return (out / "eval_summary.json").is_file()


def final_state(out) -> dict:
    """Everything a finished run leaves: adapter weights, trainer state, eval results."""
    last = out / "checkpoints" / f"step_{STEPS:06d}"
    weights = {str(p.relative_to(last)): load_file(p) for p in sorted(last.glob("policy/*/*.safetensors"))}
    trainer = checkpoint.load_trainer_state(last)
    summary = json.loads((out / "eval_summary.json").read_text())
    return {"weights": weights, "trainer": trainer, "after": summary["after"], "before": summary["before"]}


def assert_same(a, b, where="") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            if not str(k).startswith("perf/"):  # wall-clock timings differ run to run
                assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b or (a != a and b != b), where  # NaN == NaN here


@pytest.fixture(scope="module")
def clean(warm_model, tmp_path_factory):
    """The run never killed: its final state and how long it took."""
    out = tmp_path_factory.mktemp("clean")
    t0 = time.time()
    subprocess.run(command(warm_model, out), check=True, capture_output=True)
    return final_state(out), time.time() - t0


def test_sigkill_anywhere_then_resume_ends_where_an_uninterrupted_run_ends(warm_model, clean, tmp_path):
    expected, duration = clean
    assert set(expected["weights"]) == {f"policy/{a}/adapter_model.safetensors" for a in ("target", "explorer")}
    assert expected["trainer"]["rank_buffer"][0]  # the replay buffer is part of what must survive

    out, rng, kills, window = tmp_path / "killed", random.Random(0), 0, duration
    for _ in range(8):  # kill at a random moment of a (re)started run, at most twice, then let it finish
        proc = subprocess.Popen(command(warm_model, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if kills < 2:
            try:
                proc.wait(timeout=rng.uniform(0.3, 0.9) * window)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                kills += 1
        assert proc.wait() in (0, -signal.SIGKILL)
        if finished(out) and not kills:  # faster than the clean run (the machine's load fell): again, sooner
            shutil.rmtree(out)
            window /= 2
        elif finished(out):
            break
    assert kills >= 1 and finished(out)
    assert_same(final_state(out), expected)


KILL_IN_CHECKPOINT_WRITE = """
import os, signal, sys
from rspo import checkpoint
from rspo.cli import main
real = checkpoint.torch.save
def save(obj, path):
    if "step_000002" in str(path):  # the second checkpoint: half of trainer.pt, then SIGKILL
        open(path, "wb").write(b"half")
        os.kill(os.getpid(), signal.SIGKILL)
    real(obj, path)
checkpoint.torch.save = save
main(sys.argv[1:])
"""


def test_sigkill_during_a_checkpoint_write_loses_nothing(warm_model, clean, tmp_path):
    out = tmp_path / "killed"
    args = command(warm_model, out)[3:]  # after `python -m rspo`
    proc = subprocess.run([sys.executable, "-c", KILL_IN_CHECKPOINT_WRITE, *args], capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    assert checkpoint.latest(out).name == "step_000001"  # the half-written step 2 is not picked up
    subprocess.run(command(warm_model, out), check=True, capture_output=True)  # resume=auto
    assert_same(final_state(out), clean[0])
