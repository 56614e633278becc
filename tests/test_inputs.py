"""Bad input and a hostile machine: each gives one clear line on stderr and a
nonzero exit code, never a traceback, and leaves no half-written output behind."""

import errno
import json
import random
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SMALL, small_config

from rspo import checkpoint
from rspo.cli import main
from rspo.config import ConfigError, dump


def rspo(capsys, *args: str) -> tuple[int, str]:
    """Run the `rspo` CLI in-process; return its exit code and its one line of stderr."""
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return exit_.value.code, err.strip().splitlines()[0]


def test_missing_model_path(capsys, tmp_path):
    code, line = rspo(capsys, "train", *SMALL, "model.name=/no/such/model", f"train.output_dir={tmp_path}")
    assert code == 2 and "model.name='/no/such/model': no such local model directory" in line
    assert not any(tmp_path.iterdir())  # failed before writing anything


def test_missing_or_malformed_alfworld_data(capsys, tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()  # exists, but has no json_2.1.1/
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "data"))
    code, line = rspo(capsys, "train", "env.num_workers=0", "sft.episodes=0", f"train.output_dir={tmp_path / 'run'}")
    assert code == 1 and f"$ALFWORLD_DATA={tmp_path / 'data'}: no json_2.1.1/ directory there" in line


def test_unwritable_output_dir(capsys, tmp_path):
    (tmp_path / "file").write_text("a file, not a directory")  # root can write anywhere; not under a file
    code, line = rspo(capsys, "train", *SMALL, f"train.output_dir={tmp_path / 'file' / 'run'}")
    assert code == 1 and f"train.output_dir={tmp_path / 'file' / 'run'} is not writable" in line


def test_existing_run_dir_without_resume(capsys, tmp_path):
    done = tmp_path / "checkpoints" / "step_000003"
    done.mkdir(parents=True)
    (done / "trainer.pt").write_bytes(b"")
    code, line = rspo(capsys, "train", *SMALL, f"train.output_dir={tmp_path}")
    assert code == 1 and line.endswith(  # the three ways forward
        f"already holds a run: continue it with train.resume=auto, start another with train.output_dir=<a new dir>, "
        f"or delete {tmp_path} to start it over"
    )
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["checkpoints", "step_000003", "trainer.pt"]
    checkpoint.check_output_dir(tmp_path, "auto")  # continuing it is fine
    checkpoint.check_output_dir(tmp_path / "fresh", "")  # so is a new dir


def test_eval_refuses_what_is_not_a_complete_checkpoint(capsys, tmp_path):
    # Issue 26: each of these evaluated the base model, created the folder and wrote eval.json there.
    run = tmp_path / "run"
    step = run / "checkpoints" / "step_000003"
    step.mkdir(parents=True)
    (step / "trainer.pt").write_bytes(b"")
    cases = {
        tmp_path / "does_not_exist": "no such directory",
        run: f"a run's directory, not a checkpoint; its latest is {step}",
        step: "not a complete checkpoint (missing config.yaml, policy/policy.json)",
    }
    for path, expected in cases.items():
        code, line = rspo(capsys, "eval", "--checkpoint", str(path))
        assert code == 2 and line == f"rspo: config error: --checkpoint {path}: {expected}"
    code, line = rspo(capsys, "eval", "--checkpoint", str(step), "--config", "configs/default.yaml")
    assert code == 2 and "reads the checkpoint's own config.yaml" in line
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "run", "run/checkpoints", "run/checkpoints/step_000003", "run/checkpoints/step_000003/trainer.pt"
    ]  # fmt: skip


def test_weights_digest_follows_names_and_bytes(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name / "target").mkdir(parents=True)
        (tmp_path / name / "target" / "w.safetensors").write_bytes(b"weights")
    assert checkpoint.weights_digest(tmp_path / "a") == checkpoint.weights_digest(tmp_path / "b")
    assert len(checkpoint.weights_digest(tmp_path / "a")) == 12
    (tmp_path / "b" / "target" / "w.safetensors").write_bytes(b"weightz")
    assert checkpoint.weights_digest(tmp_path / "a") != checkpoint.weights_digest(tmp_path / "b")
    (tmp_path / "b" / "target" / "w.safetensors").rename(tmp_path / "b" / "target" / "v.safetensors")
    (tmp_path / "b" / "target" / "v.safetensors").write_bytes(b"weights")  # same bytes, another name
    assert checkpoint.weights_digest(tmp_path / "a") != checkpoint.weights_digest(tmp_path / "b")


def recorded_run(out, *overrides: str):
    """A finished run's last checkpoint as `train.resume` reads it: trainer.pt and config.yaml."""
    step = out / "checkpoints" / "step_000002"
    step.mkdir(parents=True)
    torch.save({"step": 2}, step / "trainer.pt")
    cfg = small_config(f"train.output_dir={out}", *overrides)
    (step / "config.yaml").write_text(dump(cfg))
    return step


def test_resume_refuses_to_relabel_a_run(capsys, tmp_path):
    # Issue 26: a GRPO run resumed with algo.name=gigpo "resumed" and its config then said GiGPO;
    # with reward.mode=rspo it died with KeyError 'explorer'.
    step = recorded_run(tmp_path, "algo.name=grpo")
    code, line = rspo(capsys, "train", *SMALL, f"train.output_dir={tmp_path}", "train.resume=auto",
                      "algo.name=gigpo", "reward.mode=rspo")  # fmt: skip
    assert code == 2
    assert line == (
        f"rspo: config error: train.resume: {step} was trained with other values (algo.name: 'grpo' -> 'gigpo'; "
        "reward.mode: 'outcome' -> 'rspo'): resume it with the run's values, or start a new run in another "
        "train.output_dir"
    )
    code, line = rspo(capsys, "train", *SMALL, f"train.output_dir={tmp_path}", f"train.resume={step}", "train.seed=1")
    assert code == 2 and "(train.seed: 0 -> 1)" in line
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["checkpoints", "config.yaml", "step_000002", "trainer.pt"]


def test_resume_may_change_how_long_and_how_watched(tmp_path):
    recorded_run(tmp_path, "sft.episodes=4")  # its warm start: model.init_from=<output_dir>/sft, set by setup
    (tmp_path / "sft").mkdir()
    step = tmp_path / "checkpoints" / "step_000002"
    text = (step / "config.yaml").read_text().replace("init_from: ''", f"init_from: {tmp_path / 'sft'}")
    (step / "config.yaml").write_text(text)
    same = [f"train.output_dir={tmp_path}", "train.resume=auto", "sft.episodes=4"]
    checkpoint.check_resume(small_config(*same, "train.steps=40", "train.save_every=5", "eval.num_tasks=9",
                                         "eval.every=2", "log.tensorboard=true", "env.num_workers=3"))  # fmt: skip
    with pytest.raises(ConfigError, match=r"\(rollout.temperature: 1.0 -> 0.5\)"):
        checkpoint.check_resume(small_config(*same, "rollout.temperature=0.5"))


def write_policy(path):
    """Stands in for the policy's writer in `checkpoint.save`: a small weights file."""
    path.mkdir(parents=True)
    (path / "weights.bin").write_bytes(b"w" * 16)


def test_full_disk_during_a_checkpoint_write(tmp_path, monkeypatch):
    first = checkpoint.save(tmp_path, 1, write_policy, {"optimizer": {"lr": 1.0}}, "a: 1\n")

    def disk_full(obj, path):
        path.write_bytes(b"half")  # a partial file, then ENOSPC, as a full disk does
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(OSError, match=f"checkpoint of step 2 not written .No space left on device.; the latest "
                                      f"complete one, {first}, is intact"):  # fmt: skip
        checkpoint.save(tmp_path, 2, write_policy, {"optimizer": {"lr": 2.0}}, "a: 2\n")
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]  # no temp dir left
    monkeypatch.undo()
    assert checkpoint.latest(tmp_path) == first
    assert checkpoint.load_trainer_state(first)["optimizer"] == {"lr": 1.0}


def test_rewriting_a_step_replaces_it_whole(tmp_path):
    checkpoint.save(tmp_path, 1, write_policy, {"v": 1}, "a: 1\n")
    path = checkpoint.save(tmp_path, 1, write_policy, {"v": 2}, "a: 2\n")
    assert checkpoint.load_trainer_state(path)["v"] == 2 and (path / "config.yaml").read_text() == "a: 2\n"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]


def test_malformed_config_file_names_it(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [steps: 1\n")  # unclosed flow sequence
    code, line = rspo(capsys, "train", "--config", str(bad))
    assert code == 2 and str(bad) in line


def test_resuming_across_engines_names_the_setting():
    """An FSDP checkpoint's optimizer state is keyed by parameter name, an unsharded one's
    by position: loading one into the other stops with the setting that fits."""
    from rspo.update import Learner

    param = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([param])
    learner = Learner("target", "", opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))
    fsdp_state = {"state": {}, "param_groups": [{**opt.state_dict()["param_groups"][0], "params": ["lm.w"]}]}
    with pytest.raises(ValueError, match="saved by an FSDP run; resume it with train.fsdp=true"):
        learner.load_state_dict({"optimizer": fsdp_state, "scheduler": learner.scheduler.state_dict()})
    learner.sharded = {"optimizer": torch.nn.Linear(2, 2)}
    with pytest.raises(ValueError, match="saved by an unsharded run; resume it with train.fsdp=false"):
        learner.load_state_dict({"optimizer": opt.state_dict(), "scheduler": learner.scheduler.state_dict()})


# Issue 48: checkpoints a stranger can hand you. Before, trainer.pt was unpickled with
# torch.load(weights_only=False): resuming ran whatever code the file carried.


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def test_trainer_state_is_data_and_restores_every_rng_exactly(tmp_path):
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([param], lr=0.1)
    param.sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    record = {"split": "test", "task_index": 3, "task_type": "buy", "won": True, "score": 0.5}
    state = {  # what `train.save` puts in, but the replay buffer (tests/test_buffer.py)
        "target": {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()},
        "env_steps": 12,
        "before": ({"eval/success_rate": 0.5}, [record]),
        "curve": [{"step": 0, "env_steps": 0, "eval/success_rate": 0.5, "tasks": [record]}],
        "trace": [{"step": 0, "env_steps": 12, "rollout/success_rate": 0.25}],
    }
    seed_all(1)
    np.random.randn()  # numpy now holds a cached gauss, part of its state
    path = checkpoint.save(tmp_path, 1, write_policy, {**state, "rank_rng": [checkpoint.rng_state()]}, "a: 1\n")
    expected = random.random(), np.random.randn(3), torch.rand(3)

    saved = torch.load(path / "trainer.pt", weights_only=True)  # tensors and plain containers only
    assert saved["before"] == state["before"] and saved["curve"] == state["curve"] and saved["trace"] == state["trace"]
    assert torch.equal(saved["target"]["optimizer"]["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    for rng in (saved["rng"], saved["rank_rng"][0]):
        plain = {k: json.loads(json.dumps(v)) for k, v in rng.items() if k in ("python", "numpy")}  # tuples -> lists
        for restore in (rng, rng | plain):
            seed_all(9)
            checkpoint.set_rng_state(restore)
            drawn = random.random(), np.random.randn(3), torch.rand(3)
            assert drawn[0] == expected[0] and np.array_equal(drawn[1], expected[1])
            assert torch.equal(drawn[2], expected[2])


def test_a_trainer_state_that_would_not_load_is_never_saved(tmp_path):
    # a numpy float among the metrics pickles numpy's scalar type: caught at the save, not at the resume
    with pytest.raises(TypeError, match="objects that `load_data` refuses: numpy"):
        checkpoint.save(tmp_path, 1, write_policy, {"curve": [{"eval/success_rate": np.float64(0.5)}]}, "a: 1\n")
    assert checkpoint.latest(tmp_path) is None


class Touch:
    """Unpickled, creates the file `path`: the code a hostile trainer.pt carries."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


def resume_line(capsys, out) -> tuple[int, str]:
    """`rspo train ... train.resume=auto` in `out`; its exit code and line. Fails if it wrote anything."""
    before = sorted(out.rglob("*"))
    code, line = rspo(capsys, "train", *SMALL, f"train.output_dir={out}", "train.resume=auto")
    assert sorted(out.rglob("*")) == before
    return code, line


def test_resume_refuses_a_pickled_object_and_never_builds_it(capsys, tmp_path):
    trainer = recorded_run(tmp_path / "run") / "trainer.pt"
    torch.save({"step": 2, "optimizer": Touch(tmp_path / "pwned")}, trainer)
    code, line = resume_line(capsys, tmp_path / "run")
    assert code == 2 and line == (
        f"rspo: config error: {trainer}: refused: it pickles Python objects (builtins.getattr, pathlib.Path, "
        "pathlib.PosixPath), and building them can run code; rspo loads tensors and plain containers only"
    )
    assert not (tmp_path / "pwned").exists()
    torch.load(trainer, weights_only=False)  # what resuming did before: the payload is live
    assert (tmp_path / "pwned").exists()


def flip_a_tensor_byte(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[data.index(torch.full((8,), 7.0).numpy().tobytes())] ^= 0xFF
    file.write_bytes(data)


def malform_the_pickle(file: Path) -> None:
    """Cut `file`'s pickle short, writing the archive again with valid CRCs."""
    records = {}
    with zipfile.ZipFile(file) as archive:
        records = {name: archive.read(name) for name in archive.namelist()}
    with zipfile.ZipFile(file, "w") as archive:
        for name, data in records.items():
            archive.writestr(name, data[:20] if name.endswith("data.pkl") else data)


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda f: f.write_bytes(f.read_bytes()[: f.stat().st_size // 2]), "not a complete torch.save archive: "
         "truncated or corrupted (File is not a zip file)"),
        (lambda f: f.write_bytes(b""), "not a complete torch.save archive: truncated or corrupted (File is not a zip "
         "file)"),
        (flip_a_tensor_byte, "corrupted: its record trainer/data/0 fails its CRC check"),
        (malform_the_pickle, "its pickle does not load as tensors and plain containers ("),
    ],
    ids=["truncated", "empty", "flipped_byte", "malformed_pickle"],
)  # fmt: skip
def test_resume_refuses_a_truncated_or_corrupted_trainer_state(capsys, tmp_path, damage, reason):
    trainer = recorded_run(tmp_path) / "trainer.pt"
    torch.save({"step": 2, "optimizer": {"exp_avg": torch.full((8,), 7.0)}}, trainer)
    damage(trainer)
    code, line = resume_line(capsys, tmp_path)
    assert code == 2 and line.startswith(f"rspo: config error: {trainer}: {reason}")


def test_resume_names_a_checkpoint_of_the_old_format(capsys, tmp_path):
    step = recorded_run(tmp_path)
    torch.save({"step": 2, "rng": {"python": random.getstate(), "numpy": np.random.get_state()}}, step / "trainer.pt")
    code, line = resume_line(capsys, tmp_path)
    assert code == 2 and line == (
        f"rspo: config error: {step / 'trainer.pt'}: an rspo checkpoint of the old format (it pickles numpy's RNG "
        f"state), refused since loading a pickle can run code; its weights still evaluate (rspo eval --checkpoint "
        f"{step}), and the rspo version that wrote it resumes it"
    )


def test_resume_refuses_a_bad_safetensors_header_and_a_pickle_format_adapter(capsys, tmp_path):
    adapter = recorded_run(tmp_path) / "policy" / "target"
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes((9).to_bytes(8, "little") + b"not json!")
    code, line = resume_line(capsys, tmp_path)
    assert code == 2 and line == (
        f"rspo: config error: {adapter / 'adapter_model.safetensors'}: truncated or corrupted (Error while "
        "deserializing header: invalid JSON in header: expected ident at line 1 column 2)"
    )
    (adapter / "adapter_model.safetensors").unlink()
    torch.save({"base_model.model.lora_A.weight": torch.zeros(2, 2)}, adapter / "adapter_model.bin")
    code, line = resume_line(capsys, tmp_path)
    assert code == 2 and line == (
        f"rspo: config error: {adapter / 'adapter_model.bin'}: refused: a pickle-format adapter; convert it to "
        "adapter_model.safetensors, or load it as tensors with model.allow_pickle_adapters=true if you trust where "
        "it comes from"
    )
    allowed = ("model.allow_pickle_adapters=true", f"train.output_dir={tmp_path}", "train.resume=auto")
    checkpoint.check_resume(small_config(*allowed))  # opted in: it loads (as tensors only)
