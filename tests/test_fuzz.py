"""Model-output fuzzing: whatever a policy writes — empty, untagged, nested or unclosed
tags, 10 kB, unicode, control characters, text imitating the prompt — parsing and one
step of either env turn it into a valid or an invalid-action step, never an exception."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rspo.config import AlfworldConfig, EnvConfig, WebshopConfig
from rspo.envs import make_env
from rspo.prompts import FALLBACK_CHARS, parse_action

PIECES = ["<action>", "</action>", "<think>", "</think>", "<action><action>", "</action></action>", "<", ">",
          "Admissible actions: ", "Current observation: ", "Your task is to: ", "<|im_end|>", "<|im_start|>",
          "search[", "click[", "]", "go to cabinet 1", "buy now", "\x00", "\n", "\t", "\u202e", "🙂", "é"]  # fmt: skip
responses = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=12)), max_size=30).map("".join),
    st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=5), st.integers(1000, 2500)),  # ~10 kB
)


@given(responses)
def test_parse_never_raises_and_bounds_the_fallback(text):
    action, valid = parse_action(text)
    assert isinstance(action, str) and isinstance(valid, bool)
    assert action == " ".join(action.split())  # normalized whitespace
    if valid:
        assert action and "<action>" in text.lower()
    else:
        assert len(action) <= FALLBACK_CHARS


@pytest.fixture(scope="module", params=["alfworld", "webshop"])
def env(request, tmp_path_factory):
    sizes = {"num_train": 6, "num_eval_in_distribution": 2, "num_eval_out_of_distribution": 2}
    cfg = EnvConfig(
        name=request.param,
        num_workers=0,
        alfworld=AlfworldConfig(games_dir=str(tmp_path_factory.mktemp("games")), max_steps=10_000, **sizes),
        webshop=WebshopConfig(num_products=200, num_goals=40, num_test_goals=10, max_steps=10_000),
    )
    e = make_env(cfg)
    e.reset("train", 0)
    yield e
    e.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(responses)
def test_any_response_is_one_env_step(env, text):
    action, _ = parse_action(text)
    state = env.step(action)
    assert isinstance(state.observation, str)
    assert math.isfinite(state.outcome) and math.isfinite(state.process)
    assert isinstance(state.valid, bool) and isinstance(state.done, bool)
    if state.done:
        env.reset("train", 0)
