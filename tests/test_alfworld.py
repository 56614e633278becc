"""ALFWorld: generated games played by the real TextWorld engine (alfworld==0.4.2).

Tiny generated splits in a temporary directory; every game is played by the real engine.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("alfworld")
pytest.importorskip("textworld")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rspo.cli import main  # noqa: E402
from rspo.config import AlfworldConfig  # noqa: E402
from rspo.envs import alfworld  # noqa: E402
from rspo.envs import alfworld_gen as gen  # noqa: E402
from rspo.envs.alfworld import NOTHING, AlfworldEnv, Facts, generated_root, goal_progress, potential  # noqa: E402

SPLITS = list(gen.SPLIT_DIRS)
SIZES = {"num_train": 12, "num_eval_in_distribution": 6, "num_eval_out_of_distribution": 6}
RESET = re.compile(
    r"-= Welcome to TextWorld, ALFRED! =-\n\n"
    r"You are in the middle of a room\. Looking quickly around you, you see (a [a-z]+ \d+, )+and a [a-z]+ \d+\.\n\n"
    r"Your task is to: (?P<task>[a-z ]+)\."
)
FEEDBACK = {  # command verb -> the engine's answer (TextWorld's ALFRED feedback)
    "go": r"You arrive at [a-z]+ \d+\. "
    r"(The [a-z]+ \d+ is closed|The [a-z]+ \d+ is open\. In it, you see .+|On the [a-z]+ \d+, you see .+)\.",
    "open": r"You open the [a-z]+ \d+\. The [a-z]+ \d+ is open\. In it, you see .+\.",
    "take": r"You pick up the [a-z]+ \d+ from the [a-z]+ \d+\.",
    "move": r"You move the [a-z]+ \d+ to the [a-z]+ \d+\.",
    "heat": r"You heat the [a-z]+ \d+ using the microwave \d+\.",
    "cool": r"You cool the [a-z]+ \d+ using the fridge \d+\.",
    "clean": r"You clean the [a-z]+ \d+ using the [a-z]+ \d+\.",
    "use": r"You turn on the desklamp \d+\.",
}


@pytest.fixture(scope="module", autouse=True)
def no_official_data():
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("ALFWORLD_DATA", raising=False)
        yield


@pytest.fixture(scope="module")
def cfg(tmp_path_factory) -> AlfworldConfig:
    return AlfworldConfig(games_dir=str(tmp_path_factory.mktemp("games")), **SIZES)


@pytest.fixture(scope="module")
def env(cfg) -> AlfworldEnv:
    env = AlfworldEnv(cfg)
    yield env
    env.close()


def play_expert(env: AlfworldEnv, split: str, index: int) -> tuple:
    """Reset, follow the expert to the end; (first state, [(action, state)])."""
    first = env.reset(split, index)
    steps = []
    state = first
    while not state.done:
        action = env.expert_action()
        state = env.step(action)
        steps.append((action, state))
    return first, steps


def one_per_type(env: AlfworldEnv, split: str) -> list[int]:
    seen = {}
    for i, path in enumerate(env.games(split)):
        seen.setdefault(json.loads((path.parent / "traj_data.json").read_text())["task_type"], i)
    return sorted(seen.values())


# -- generator ------------------------------------------------------------------------


def test_generate_layout_types_and_scenes(tmp_path):
    for split in SPLITS:
        paths = gen.generate(tmp_path, split, 6, seed=3, task_types=gen.TASK_TYPES)
        assert len(paths) == 6 and paths == sorted(paths)
        types = set()
        for path in paths:
            assert path.parent.parent.parent == tmp_path / "json_2.1.1" / gen.SPLIT_DIRS[split]
            traj = json.loads((path.parent / "traj_data.json").read_text())
            game = json.loads(path.read_text())
            assert set(game) == {"pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough"}
            assert "UNKNOWN GOAL" not in game["grammar"] and game["solvable"] is True
            assert {"object_target", "parent_target", "toggle_target"} <= set(traj["pddl_params"])
            types.add(traj["task_type"])
            held_out = traj["scene"]["scene_num"] in gen.constants().TEST_SCENE_NUMBERS
            assert held_out == (split == "eval_out_of_distribution")
        assert types == set(gen.TASK_TYPES)  # six games, the six types


def test_max_receptacles_bounds_the_room_and_keeps_what_the_task_needs():
    def room_size(max_receptacles, index):  # receptacles declared in the PDDL problem
        problem = gen.make_game(0, "train", index, gen.TASK_TYPES, max_receptacles)[2]["pddl_problem"]
        return len(re.findall(r"^\s+[^\s?]\S* - receptacle$", problem, re.MULTILINE))  # not the goal's `?r`

    for i in range(12):  # two games of each task type
        assert room_size(gen.MAX_RECEPTACLES, i) <= gen.MAX_RECEPTACLES
        assert 1 <= room_size(6, i) <= 6
        # never fewer than the task needs, whatever the bound: 2 (a start and a goal
        # receptacle), 1 for look_at_obj_in_light when the lamp stands where the object starts
        assert room_size(1, i) >= (1 if i % 6 == 1 else 2)
    assert gen.make_game(0, "train", 0, gen.TASK_TYPES, 6) != gen.make_game(0, "train", 0, gen.TASK_TYPES)


def test_generation_is_deterministic(tmp_path):
    a = gen.generate(tmp_path / "a", "train", 6, seed=1, task_types=gen.TASK_TYPES)
    b = gen.generate(tmp_path / "b", "train", 6, seed=1, task_types=gen.TASK_TYPES)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    with pytest.raises(FileExistsError, match="already holds games"):
        gen.generate(tmp_path / "a", "train", 2, seed=0, task_types=gen.TASK_TYPES)
    assert gen.make_game(2, "train", 0, gen.TASK_TYPES)[2] != gen.make_game(1, "train", 0, gen.TASK_TYPES)[2]
    assert (
        gen.make_game(1, "train", 0, gen.TASK_TYPES)[2]
        != gen.make_game(1, "eval_in_distribution", 0, gen.TASK_TYPES)[2]
    )


def test_cli_writes_a_tree_the_env_reads_as_official_data(tmp_path, env, capsys):
    assert main(["alfworld-gen", "--out", str(tmp_path), "--split", "train", "--num", "12", "--seed", "0"]) == 0
    official = AlfworldEnv(AlfworldConfig(data_dir=str(tmp_path)))
    assert official.num_tasks("train") == 12
    assert official.reset("train", 5).observation == env.reset("train", 5).observation  # same seed, same games
    for bad, says in [(["--task-types", "pick_three"], "pick_three"), (["--num", "-1"], "--num must be >= 0")]:
        with pytest.raises(SystemExit) as e:  # argparse's usage error: exit 2, the reason on stderr
            main(["alfworld-gen", "--out", str(tmp_path / "other"), *bad])
        assert e.value.code == 2 and says in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the same directory again: old games would mix with the new
        main(["alfworld-gen", "--out", str(tmp_path), "--split", "train", "--num", "1"])
    assert "already holds games" in capsys.readouterr().err


def test_stock_alfworld_loader_reads_the_layout(env, cfg):
    from alfworld.agents.environment import get_environment

    for split in SPLITS:
        env.games(split)  # generate
    root = generated_root(cfg)
    data = {s: str(root / "json_2.1.1" / d) for s, d in gen.SPLIT_DIRS.items()}
    config = {
        "env": {"goal_desc_human_anns_prob": 0, "task_types": [1, 2, 3, 4, 5, 6]},
        "dataset": {
            "data_path": data["train"],
            "eval_id_data_path": data["eval_in_distribution"],
            "eval_ood_data_path": data["eval_out_of_distribution"],
            "num_train_games": -1,
            "num_eval_games": -1,
        },
    }
    for split in SPLITS:
        stock = get_environment("AlfredTWEnv")(config, train_eval=split)
        assert sorted(map(Path, stock.game_files)) == env.games(split)


# -- the environment ------------------------------------------------------------------


def test_reset_observation_and_admissible_commands(env):
    for split in SPLITS:
        state = env.reset(split, 0)
        match = RESET.fullmatch(state.observation)
        assert match, state.observation
        assert state.task == match["task"] and state.task_type in gen.TASK_TYPES
        assert state.admissible == sorted(state.admissible)
        assert {"help", "inventory", "look"} <= set(state.admissible)
        assert any(a.startswith("go to ") for a in state.admissible)
        assert not state.done and state.process == 0.0 and state.outcome == 0.0


@pytest.mark.parametrize("split", SPLITS)
def test_expert_wins_every_task_type_with_monotone_process_reward(env, split):
    indices = one_per_type(env, split)
    assert len(indices) == 6
    for index in indices:
        first, steps = play_expert(env, split, index)
        *before, (_, last) = steps
        assert last.won and last.done and last.outcome == 1.0 and last.score == 1.0
        assert all(not s.won and s.outcome == 0.0 and s.valid for _, s in before)
        phis = [first.info["phi"]] + [s.info["phi"] for _, s in steps]
        assert all(b >= a for a, b in zip(phis, phis[1:])), (first.task_type, phis)  # non-decreasing
        assert phis[-1] == 1.0 and max(phis[:-1]) < 1.0  # the max exactly at the win
        assert sum(s.process for _, s in steps) == pytest.approx(1.0 - phis[0])
        for action, state in steps:
            assert re.fullmatch(FEEDBACK[action.split()[0]], state.observation), (action, state.observation)


def test_same_seed_same_observations(env, cfg, tmp_path):
    twin = AlfworldEnv(AlfworldConfig(games_dir=str(tmp_path), **SIZES))  # same seed, other directory
    index = one_per_type(env, "train")[-1]
    assert [p.read_bytes() for p in twin.games("train")] == [p.read_bytes() for p in env.games("train")]
    first_a, steps_a = play_expert(env, "train", index)
    first_b, steps_b = play_expert(twin, "train", index)
    assert first_a.observation == first_b.observation
    assert [(a, s.observation, s.admissible) for a, s in steps_a] == [
        (a, s.observation, s.admissible) for a, s in steps_b
    ]


def test_invalid_actions_are_noops(env):
    start = env.reset("train", 0)
    for action in [
        "jump",
        "",
        "   ",
        "x" * 10_000,
        "gö tö 🍎 1",
        "GO TO " + start.admissible[0][6:],
        None,
        42,
        b"look",
    ]:
        state = env.step(action)
        assert state.observation == NOTHING and not state.valid and state.process == 0.0
        assert state.admissible == start.admissible
    assert env.step(" look ").valid  # the engine strips, as here
    while not state.done:
        state = env.step(env.expert_action())
    assert state.won


@pytest.fixture(scope="module")
def long_env(cfg) -> AlfworldEnv:
    """An env with room for many steps in one episode."""
    env = AlfworldEnv(dataclasses.replace(cfg, max_steps=100_000))
    env.reset("train", 1)
    return env


@settings(max_examples=60, deadline=None)
@given(action=st.one_of(st.text(max_size=200), st.binary(max_size=20), st.integers(), st.none()))
def test_any_non_admissible_input_is_an_invalid_step(long_env, action):
    admissible = long_env.step("look").admissible  # `look` changes nothing
    state = long_env.step(action)
    if isinstance(action, str) and action.strip() in admissible:
        assert state.valid
    else:
        assert state.observation == NOTHING and not state.valid and not state.done and state.process == 0.0
        assert state.admissible == admissible


def test_max_steps_ends_the_episode(cfg):
    env = AlfworldEnv(dataclasses.replace(cfg, max_steps=3))
    env.reset("train", 0)
    states = [env.step("look") for _ in range(3)]
    assert [s.done for s in states] == [False, False, True] and not states[-1].won
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look")


# -- bad input ------------------------------------------------------------------------


def test_bad_configuration_and_tasks_raise_clear_errors(env, cfg, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown ALFWorld split 'test'.*eval_in_distribution"):
        env.num_tasks("test")
    with pytest.raises(IndexError, match="out of range"):
        env.reset("train", 10_000)
    with pytest.raises(ValueError, match="pick_and_place_simple"):
        AlfworldEnv(AlfworldConfig(task_types=["pick_three_obj"]))
    with pytest.raises(FileNotFoundError, match="data_dir.*json_2.1.1"):
        AlfworldEnv(AlfworldConfig(data_dir=str(tmp_path / "missing")))
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA"):
        AlfworldEnv(AlfworldConfig())


def test_corrupt_game_files_raise_naming_the_file(tmp_path):
    paths = gen.generate(tmp_path, "train", 2, seed=0, task_types=gen.TASK_TYPES)
    game = json.loads(paths[1].read_text())
    paths[1].write_text(json.dumps({**game, "pddl_problem": "(define (problem broken"}))
    env = AlfworldEnv(AlfworldConfig(data_dir=str(tmp_path)))
    with pytest.raises(ValueError, match=f"corrupt ALFWorld game file {re.escape(str(paths[1]))}"):
        env.reset("train", 1)
    paths[0].write_text("{not json")  # after the index was read: reset still names the file
    with pytest.raises(ValueError, match=f"corrupt ALFWorld game file {re.escape(str(paths[0]))}"):
        env.reset("train", 0)
    other = gen.generate(tmp_path / "other", "train", 2, seed=0, task_types=gen.TASK_TYPES)
    other[0].write_text("{not json")  # before: reading the index names it
    with pytest.raises(ValueError, match=f"corrupt ALFWorld game file {re.escape(str(other[0]))}"):
        AlfworldEnv(AlfworldConfig(data_dir=str(tmp_path / "other"))).num_tasks("train")


def test_the_game_index_is_read_once_per_process(tmp_path):
    """Every env of a worker process shares one index of a split (the official train split
    has 3,553 games, two JSON files each)."""
    gen.generate(tmp_path, "train", 3, seed=0, task_types=gen.TASK_TYPES)
    alfworld._index_split.cache_clear()
    envs = [AlfworldEnv(AlfworldConfig(data_dir=str(tmp_path))) for _ in range(4)]
    assert {e.num_tasks("train") for e in envs} == {3}
    info = alfworld._index_split.cache_info()
    assert (info.misses, info.hits) == (1, 3)


# -- the potential on hand-written facts ----------------------------------------------


def facts(*props: str) -> list:
    """`"holds agent1 apple1"` -> a fact object shaped like TextWorld's Proposition."""
    out = []
    for text in props:
        name, *args = text.split()
        out.append(SimpleNamespace(name=name, arguments=[SimpleNamespace(name=a) for a in args]))
    return out


ROOM = ("objecttype apple1 appletype", "objecttype apple2 appletype", "receptacletype table1 diningtabletype")


def test_heat_potential_counts_the_chain_per_object():
    params = {"object_target": "Apple", "parent_target": "DiningTable", "toggle_target": ""}

    def phi(*props: str, won: bool = False) -> float:
        return potential("pick_heat_then_place_in_recep", facts(*ROOM, *props), won, params)

    assert phi() == 0.0
    assert phi("holds agent1 apple1") == pytest.approx(1 / 3)  # holding
    assert phi("holds agent1 apple1", "ishot apple1") == pytest.approx(2 / 3)  # + hot
    assert phi("inreceptacle apple1 table1") == pytest.approx(1 / 3)  # placed, not hot: only "picked"
    assert phi("ishot apple2", "inreceptacle apple1 table1") == pytest.approx(1 / 3)  # two halves, no object has 2
    assert phi("ishot apple1", "inreceptacle apple1 table1") == pytest.approx(2 / 3)  # all met but no win: capped
    assert phi("ishot apple1", "inreceptacle apple1 table1", won=True) == 1.0


def test_two_object_and_light_potentials():
    two = facts(*ROOM, "receptacletype table2 diningtabletype", "inreceptacle apple1 table1", "holds agent1 apple2")
    assert goal_progress("pick_two_obj_and_place", Facts(two), "Apple", "DiningTable", "") == (3, 4)  # 2*1 + 1
    apart = facts(
        *ROOM, "receptacletype table2 diningtabletype", "inreceptacle apple1 table1", "inreceptacle apple2 table2"
    )
    assert goal_progress("pick_two_obj_and_place", Facts(apart), "Apple", "DiningTable", "") == (2, 4)  # not together
    light = facts(*ROOM, "objecttype lamp1 desklamptype", "istoggled lamp1", "holds agent1 apple1")
    assert goal_progress("look_at_obj_in_light", Facts(light), "Apple", "", "DeskLamp") == (2, 3)
