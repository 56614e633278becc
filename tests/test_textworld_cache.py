"""ALFWorld's engine as rspo runs it (TextWorld's parses memoized, `rspo.envs.textworld_cache`;
the expert's plan made only when asked) says exactly what the stock engine says."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("alfworld")

from rspo.config import AlfworldConfig  # noqa: E402
from rspo.envs import alfworld, textworld_cache  # noqa: E402
from rspo.envs.alfworld import AlfworldEnv  # noqa: E402

SIZES = {"num_train": 4, "num_eval_in_distribution": 1, "num_eval_out_of_distribution": 1}


def play(env: AlfworldEnv, seed: int, expert: bool) -> list[tuple]:
    """Every game of the train split twice (a reset of the game loaded, then of another):
    random actions (inadmissible ones too), alternating with the expert's if `expert`
    (which then is asked at every state); everything the env says."""
    rng, log = random.Random(seed), []
    for index in [i for i in range(env.num_tasks("train")) for _ in range(2)]:
        state = env.reset("train", index)
        log.append((state.observation, state.admissible, state.task, expert and env.expert_action()))
        for step in range(6):
            action = env.expert_action() if expert and step % 2 else rng.choice([*state.admissible, "jump"])
            state = env.step(action)
            log.append((state.observation, state.admissible, state.process, state.won, state.valid))
            log.append(expert and env.expert_action())
            if state.done:
                break
    return log


def stock_engine():
    """ALFWorld's engine stack as TextWorld ships it: every parse made, the plan made each step."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs import PddlEnv

    infos = textworld.EnvInfos(won=True, admissible_commands=True, policy_commands=True)
    return AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))


class StockExpert(AlfworldEnv):
    def expert_action(self) -> str:
        plan = self._game_state["policy_commands"] or []
        return plan[0] if plan else "look"


@pytest.fixture
def cfg(tmp_path, monkeypatch) -> AlfworldConfig:
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    return AlfworldConfig(games_dir=str(tmp_path), **SIZES)


@pytest.mark.parametrize("expert", [True, False])
def test_rspo_engine_says_exactly_what_the_stock_engine_says(cfg, monkeypatch, expert):
    import textworld.envs.pddl.textgen as textgen

    with monkeypatch.context() as m:
        textworld_cache.uninstall()  # AlfworldEnv installs it in every process that plays
        m.setattr(alfworld, "make_engine", stock_engine)
        stock = StockExpert(cfg)
        expected = play(stock, seed=0, expert=expert)
        stock.close()
    env = AlfworldEnv(cfg)
    assert play(env, seed=0, expert=expert) == expected
    env.close()
    assert textgen._parse_and_convert.cache_info().hits > 0  # the cache was on the path
