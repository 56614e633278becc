"""The WebShop environment: catalog, page text, actions, determinism, expert (reward: test_webshop_reward.py)."""

from __future__ import annotations

import itertools
import random
import re
import sys
import types
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rspo.config import ConfigError, EnvConfig, WebshopConfig, load_config
from rspo.envs import make_env
from rspo.envs.webshop import SEP, Session, WebshopEnv, clickables, parse_action, render
from rspo.envs.webshop_catalog import PRICE_RANGE, generate_catalog, make_goal, product_reviews
from rspo.envs.webshop_real import RealWebshopEnv
from rspo.envs.webshop_reward import fuzzy_match, normalize_color
from rspo.envs.webshop_taxonomy import PRODUCT_TYPES

CFG = WebshopConfig(num_products=2000, num_goals=600, num_test_goals=100)


@pytest.fixture(scope="module")
def env() -> WebshopEnv:
    return WebshopEnv(CFG)


# ---- catalog and goals -------------------------------------------------------------------


def test_catalog_is_deterministic_by_seed():
    a, b, c = generate_catalog(300, 7), generate_catalog(300, 7), generate_catalog(300, 8)
    assert [vars(p) for p in a] == [vars(p) for p in b]
    assert [p.asin for p in a] != [p.asin for p in c]
    env1, env2 = WebshopEnv(replace(CFG, seed=3)), WebshopEnv(replace(CFG, seed=3))
    assert env1.reset("train", 5).observation == env2.reset("train", 5).observation


def test_catalog_fields_and_prices():
    products = generate_catalog(2000, 0)
    assert len({p.asin for p in products}) == 2000
    assert all(re.fullmatch(r"B0[A-Z0-9]{8}", p.asin) for p in products)
    assert {p.category for p in products} == {"beauty", "food", "fashion", "furniture", "electronics"}
    ranges = [p for p in products if len(p.pricing) == 2]
    assert 0.1 < len(ranges) / len(products) < 0.4
    assert all(p.pricing[0] <= p.price <= p.pricing[1] for p in ranges)
    assert replace(products[0], pricing=(8.5, 12.0)).price_text == "$8.5 to $12.0"
    assert replace(products[0], pricing=(45.99,)).price_text == "$45.99"


def test_pools_do_not_fuzzy_match_each_other():
    """Distinct attributes / option values of a type must not count as each other (WebShop
    matches every option value against every goal value, whatever the option's name)."""
    for t in PRODUCT_TYPES:
        for a, b in itertools.combinations(t.attributes, 2):
            assert not fuzzy_match(a, b), (t.name, a, b)
        values = [normalize_color(v) for _, pool in t.options for v in pool]
        assert len(set(values)) == len(values), t.name
        for a, b in itertools.combinations(values, 2):
            assert not fuzzy_match(a, b), (t.name, a, b)


def test_products_text_does_not_name_foreign_attributes():
    pools = {}
    for t in PRODUCT_TYPES:
        pools.setdefault(t.category, set()).update(t.attributes)
    for p in generate_catalog(2000, 0):
        text = " ".join([p.title, *p.bullets, p.description]).lower()
        assert all(a in p.attributes or a not in text for a in pools[p.category]), p.asin


def test_goals_follow_webshop(env):
    for i in range(50):
        g = env.make_goal("test", i)
        p = env.shop.products[g.product_index]
        assert set(g.attributes) <= set(p.attributes) and 1 <= len(g.attributes) <= 3
        assert all(v in p.options[k] for k, v in g.options.items()) and set(g.options) == set(p.options)
        above = [x for x in PRICE_RANGE if x > p.price][:4]
        assert g.price_upper in above[1:]  # the larger of two draws: never the first multiple
        opts = "".join(f" with {k}: {v}" if j == 0 else f", and {k}: {v}" for j, (k, v) in enumerate(g.options.items()))
        assert g.instruction_text.endswith(f"{opts}, and price lower than {g.price_upper:.2f} dollars")
        assert make_goal(p, g.index, CFG.seed).instruction_text == g.instruction_text


def test_splits(env):
    assert env.num_tasks("test") == 100 and env.num_tasks("train") == 500
    with pytest.raises(ValueError, match="valid splits: train, test"):
        env.num_tasks("eval_in_distribution")
    with pytest.raises(IndexError):
        env.reset("test", 100)
    assert env.reset("train", 0).task == env.make_goal("train", 0).instruction_text
    assert env.make_goal("train", 0).index == 100


# ---- pages -------------------------------------------------------------------------------


def test_page_texts(env):
    s = env.reset("test", 3)
    g = env.goal
    assert s.observation == f"WebShop [SEP] Instruction: [SEP] {g.instruction_text} [SEP] Search"
    assert s.admissible == ["search[...]"] and s.task_type == g.category
    s = env.step(f"search[{g.query}]")
    results = env.session.results
    assert 10 < len(results) <= 50
    head = f"Instruction: [SEP] {g.instruction_text} [SEP] Back to Search [SEP] Page 1 (Total results: {len(results)})"
    first = env.shop.products[results[0]]
    assert s.observation.startswith(
        head + f" [SEP] Next > [SEP] {first.asin} [SEP] {first.title} [SEP] {first.price_text}"
    )
    assert s.observation.count(SEP + "B0") == 10
    assert s.admissible[:3] == ["click[back to search]", "click[next >]", f"click[{first.asin.lower()}]"]
    s = env.step("click[next >]")
    assert "Page 2 (Total results:" in s.observation and "[SEP] < Prev [SEP] Next >" in s.observation
    s = env.step("click[< prev]")
    s = env.step(f"click[{first.asin}]")  # upper case is fine: the argument is lowercased
    options = "".join(f" [SEP] {k} [SEP] " + " [SEP] ".join(vs) for k, vs in first.options.items())
    assert s.observation == (
        f"Instruction: [SEP] {g.instruction_text} [SEP] Back to Search [SEP] < Prev{options} [SEP] {first.title}"
        f" [SEP] Price: {first.price_text} [SEP] Rating: {first.rating} [SEP] Description [SEP] Features"
        " [SEP] Reviews [SEP] Buy Now"
    )
    sub_head = f"Instruction: [SEP] {g.instruction_text} [SEP] Back to Search [SEP] < Prev [SEP] "
    assert first.description and first.bullets  # generated products have both
    assert env.step("click[description]").observation == sub_head + first.description
    assert env.step("click[< prev]").observation.endswith("Buy Now")
    assert env.step("click[features]").observation == sub_head + " [SEP] ".join(first.bullets)
    env.step("click[< prev]")
    assert env.step("click[reviews]").observation.startswith(sub_head)
    env.step("click[< prev]")
    s = env.step("click[buy now]")
    assert s.done and s.observation == (
        "Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] (Paste it in your MTurk interface.)"
        f" [SEP] Your score (min 0.0, max 1.0) [SEP] {s.score}"
    )
    assert s.admissible == []


def test_item_page_actions_in_webshops_order(env):
    """WebShop's get_available_actions lists the buttons in page order, then the option values
    (its radio inputs), although the page shows the options above the title."""
    p = replace(env.shop.products[0], options={"color": ("black", "navy blue"), "size": ("small",)})
    shop = SimpleNamespace(products=[p])
    assert clickables(shop, Session(page="item", item=0)) == [
        "back to search", "< prev", "description", "features", "reviews", "buy now",  # the buttons
        "black", "navy blue", "small",  # then the options
    ]  # fmt: skip


def test_descriptions_are_stripped(env):
    """WebShop strips a product's description; rspo's ended in a space when a generated one
    had no filler sentence (425 of the 2,000 default products did)."""
    products = generate_catalog(2000, 0)
    assert all(p.description == p.description.strip() for p in products)
    s = env.reset("test", 0)
    s = env.step(f"search[{env.goal.query}]")
    env.step(s.admissible[2])  # the first listed item
    assert not env.step("click[description]").observation.endswith(" ")


def test_empty_sub_pages_show_nothing(env):
    """As in WebShop's templates: no placeholder text for an empty description, features or reviews."""
    p = env.shop.products[0]
    head = "Instruction: [SEP] goal [SEP] Back to Search [SEP] < Prev"
    bare = replace(p, description="", bullets=())
    shop = replace(env.shop, products=[bare, *env.shop.products[1:]])
    for page in ("description", "features"):
        assert render(shop, Session(page=page, item=0), "goal") == head
    without_reviews = next(q for q in env.shop.products if not product_reviews(q))
    assert render(env.shop, Session(page="reviews", item=without_reviews.index), "goal") == head


def test_next_is_on_every_results_page(env):
    """WebShop's results template always shows 'Next >'; past the last page the listing is empty."""
    env.reset("test", 0)
    s = env.step(f"search[{env.goal.query}]")
    assert len(env.session.results) == 50
    for _ in range(5):
        s = env.step("click[next >]")
        assert s.valid
    assert s.observation.endswith("Page 6 (Total results: 50) [SEP] < Prev [SEP] Next >")
    assert s.admissible == ["click[back to search]", "click[< prev]", "click[next >]"]
    env.step("click[back to search]")
    s = env.step("search[zzzz qqqq]")
    assert s.valid and s.observation.endswith("(Total results: 0) [SEP] Next >")
    assert s.admissible == ["click[back to search]", "click[next >]"]


def test_search_works_on_every_page(env):
    """WebShop's text env runs a search from any page; the admissible list offers it where
    the page has a search bar (the start page) only."""
    env.reset("test", 0)
    env.step(f"search[{env.goal.query}]")
    env.step(env.expert_action())  # open an item
    env.step("click[description]")
    s = env.step("search[running shoes]")
    assert s.valid and env.session.page == "results" and env.session.item is None and env.session.options == {}
    assert "search[...]" not in s.admissible and s.observation.count("Page 1 (Total results:") == 1


# ---- actions, episode end, rewards ----------------------------------------------------------


def test_invalid_actions_are_no_ops(env):
    s0 = env.reset("test", 1)
    bad_actions = ["click[buy now]", "search[]", "click[", "buy", "", "click[search]", None, 42]
    bad_actions += ["Search[lipstick]", " search[lipstick]", "search [lipstick]", "search[a [b]]"]
    for bad in bad_actions:
        s = env.step(bad)
        assert not s.valid and s.observation == s0.observation and s.outcome == 0 and s.process == 0
    s = env.step("search[lipstick]")
    assert s.valid
    for bad in ["click[b0xxxxxxxx]", "click[buy now]", "click[description]", "click[ next >]", "x" * 10_000]:
        s2 = env.step(bad)
        assert not s2.valid and s2.observation == s.observation
    assert not env.step("click[< prev]").valid  # page 1 has no '< Prev'
    for query in ["x" * 10_000, "ünïcødé 👟 \x00 ( )", "the a of", "   "]:  # long, odd, stop words, spaces
        env.reset("test", 1)
        s = env.step(f"search[{query}]")
        assert s.valid and "Page 1 (Total results:" in s.observation


def test_parse_action_is_webshops():
    r"""re.match(r"(.+)\[(.+)\]"): a greedy prefix match; the name must be exactly search / click."""
    assert parse_action("click[Buy Now]") == ("click", "buy now")  # the argument is lower-cased
    assert parse_action("search[  red shoes ]") == ("search", "  red shoes ")  # not stripped
    assert parse_action("click[x] trailing") == ("click", "x")  # a prefix match
    assert parse_action("search[a [b] c]") is None  # greedy: the name is 'search[a '
    assert parse_action(" Search[Red Shoes] ") is None and parse_action("CLICK[x]") is None
    assert parse_action("search[]") is None and parse_action(b"click[x]") is None


def test_step_cap_and_steps_after_done(env):
    s = env.reset("test", 2)
    for _ in range(CFG.max_steps):
        assert not s.done
        s = env.step("click[nothing]")
    assert s.done and s.score == 0 and s.outcome == 0 and not s.won
    after = env.step(env.expert_action() or "search[x]")
    assert after.done and not after.valid and after.process == 0
    assert env.expert_action() == ""


def test_outcome_modes():
    for mode in ["success", "score"]:
        e = WebshopEnv(replace(CFG, outcome=mode))
        e.reset("test", 0)
        while e.session.page != "item":
            e.step(e.expert_action())
        s = e.step("click[buy now]")  # no options selected: a partial score
        assert s.done and s.info["reward_info"]["n_option"] == 0 and 0 < s.score < 1 and not s.won
        assert s.outcome == (0.0 if mode == "success" else s.score)


def test_process_rewards_sum_to_the_score(env):
    rng = random.Random(0)
    for episode in range(60):
        s = env.reset("test", episode % 100)
        total = 0.0
        while not s.done:  # a noisy expert: a random admissible action 40 % of the time
            action = rng.choice(s.admissible) if rng.random() < 0.4 else env.expert_action()
            if action == "search[...]":
                action = f"search[{env.goal.query}]"
            s = env.step(action)
            total += s.process
            assert s.info["phi"] == pytest.approx(env.potential() if not s.done else s.score)
        assert total == pytest.approx(s.score), episode


def test_process_reward_tracks_options(env):
    env.reset("test", 0)
    while env.session.page != "item":
        env.step(env.expert_action())
    phi = env.potential()
    s = env.step(env.expert_action())  # selects a goal option: one more match
    g = env.goal
    assert s.process == pytest.approx(1 / (len(g.attributes) + len(g.options) + 1))
    assert env.potential() == pytest.approx(phi + s.process)
    phi_item = env.potential()
    s = env.step("click[back to search]")  # off the item page: Φ drops to 0
    assert s.process == pytest.approx(-phi_item) and env.potential() == 0.0


def test_expert_success_rate(env):
    wins = 0
    for i in range(100):
        s = env.reset("test", i)
        while not s.done:
            s = env.step(env.expert_action())
            assert s.valid
        wins += s.won
    assert wins / 100 >= 0.95


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.text(max_size=300), st.builds(lambda a, b: f"{a}[{b}]", st.sampled_from(["click", "search"]), st.text())
    )
)
def test_arbitrary_actions_never_crash(action):
    e = WebshopEnv(CFG)
    e.reset("test", 4)
    e.step("search[running shoes]")
    for _ in range(3):
        s = e.step(action)
        assert isinstance(s.observation, str) and s.observation
        assert s.valid or (s.outcome == 0 and s.process == 0)
        e.step(e.expert_action())


# ---- config and the real-WebShop adapter ------------------------------------------------------


def test_make_env_and_config():
    e = make_env(EnvConfig(name="webshop", webshop=CFG))
    assert isinstance(e, WebshopEnv) and e.max_steps == 15
    with pytest.raises(ConfigError, match="valid choices: generated, real"):
        load_config(overrides=["env.webshop.backend=fake"])


def test_real_backend_without_webshop_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "web_agent_site", None)
    with pytest.raises(ImportError, match="princeton-nlp/WebShop"):
        make_env(EnvConfig(name="webshop", webshop=replace(CFG, backend="real")))


class FakeTextEnv:
    """Just enough of web_agent_site's WebAgentTextEnv: a start page and one item page."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        goal = {"instruction_text": "i need red shoes", "category": "fashion"}
        self.server = SimpleNamespace(
            goals=[goal] * 3, user_sessions={}, product_item_dict={"A1": {}}, product_prices={"A1": 5.0}
        )
        self.browser = SimpleNamespace(current_url="")

    def reset(self, session):
        self.session, self.browser.current_url = str(session), "/s"
        self.server.user_sessions[self.session] = {"asin": None, "options": {}}
        self.observation = "WebShop [SEP] Instruction: [SEP] i need red shoes [SEP] Search"

    def get_available_actions(self):
        on_item = "item_page" in self.browser.current_url
        return {"has_search_bar": not on_item, "clickables": ["buy now"] if on_item else ["search"]}

    def step(self, action):
        if action.startswith("search"):
            self.browser.current_url = "/item_page/A1"
            self.server.user_sessions[self.session]["asin"] = "A1"
            return "item", 0.0, False, None
        return "done", 0.75, True, None


def test_real_backend_adapter(monkeypatch):
    fake_goal = types.ModuleType("web_agent_site.engine.goal")
    fake_goal.get_reward = lambda product, goal, price, options: 0.5
    fake_env = types.ModuleType("web_agent_site.envs.web_agent_text_env")
    fake_env.WebAgentTextEnv = FakeTextEnv
    for name in ["web_agent_site", "web_agent_site.engine", "web_agent_site.envs"]:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "web_agent_site.engine.goal", fake_goal)
    monkeypatch.setitem(sys.modules, "web_agent_site.envs.web_agent_text_env", fake_env)
    e = make_env(EnvConfig(name="webshop", webshop=replace(CFG, backend="real", num_test_goals=1, outcome="score")))
    assert isinstance(e, RealWebshopEnv) and e.num_tasks("test") == 1 and e.num_tasks("train") == 2
    s = e.reset("train", 0)
    assert s.admissible == ["search[...]"] and s.task == "i need red shoes" and s.task_type == "fashion"
    assert not e.step("click[buy now]").valid
    s = e.step("search[red shoes]")
    assert s.valid and s.process == 0.5 and s.admissible == ["click[buy now]"]
    s = e.step("click[buy now]")
    assert s.done and s.score == 0.75 and s.outcome == 0.75 and s.process == pytest.approx(0.25)
