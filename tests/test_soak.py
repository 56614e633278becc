"""The soak benchmark at its smallest: 3 iterations of the tiny model (random
init, no warm start) with every fault kind injected at least once — env workers that raise,
hang and die, NaN/inf rewards, advantages, losses and gradients, responses with no valid
action, a full disk and a SIGKILL during a checkpoint write, a SIGKILL at a random time —
and nothing lost: every fault survived or cut short by a later kill, every checkpoint
loadable, every iteration in the TensorBoard log. About 3 minutes on a loaded 2-core machine."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from soak_faults import KINDS  # every fault kind the soak injects (benchmarks/ is on pytest's path: setup.cfg)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # a few training processes in a row

SOAK = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"


def test_soak_injects_every_fault_and_loses_nothing(tmp_path):
    out = tmp_path / "soak"
    cmd = [sys.executable, str(SOAK), "--iterations", "3", "--sft-episodes", "0", "--seed", "0", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["problems"] == []
    faults = report["faults"]
    # each planned fault fires once; the driver's kill is timed, so it may miss a fast attempt
    assert all(faults[k]["injected"] >= 1 for k in KINDS if k != "kill"), faults
    assert all(faults[k].get("not survived", 0) == 0 for k in KINDS), faults
    numbers = report["numbers"]
    assert numbers["rollout/env_faults counted by rspo"] == numbers["trajectories they hit"]
    assert numbers["updates skipped"] == numbers["updates skipped, expected"]
    assert numbers["checkpoints present and loadable"] == 3
    assert numbers["processes left behind by a killed trainer"] == 0
