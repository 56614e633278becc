"""WebShop difficulty levels (`env.webshop.*`): what each key changes, the cache, validation."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from rspo.config import RANGES, ConfigError, WebshopConfig, load_config
from rspo.envs import webshop_cache
from rspo.envs.webshop import WebshopEnv, best_score, expert_query, offers, reading_order
from rspo.envs.webshop_cache import level_dir, level_of, load_level
from rspo.envs.webshop_catalog import Level, generate_catalog
from rspo.envs.webshop_taxonomy import MAX_OPTION_TYPES, PRODUCT_TYPES
from rspo.policy_io import save_policy

EASY = WebshopConfig(
    num_products=60, num_goals=80, num_test_goals=20, num_product_types=5, max_option_types=1, page_size=3
)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every test here writes its levels to its own empty cache."""
    monkeypatch.setenv("RSPO_CACHE", str(tmp_path))
    load_level.cache_clear()
    yield tmp_path
    load_level.cache_clear()


def test_default_level_is_the_original_catalog():
    """The defaults are the original's: every type, both option types, 40% near-copies (the
    random stream draws a type with one `randrange` whatever the level, so the default catalog
    is the one rspo always generated); the default level's cache name carries no setting."""
    default = Level(300, 7)
    assert [vars(p) for p in generate_catalog(300, 7)] == [
        vars(p) for p in generate_catalog(300, 7, num_product_types=0, max_option_types=2, variant_fraction=0.4)
    ]
    assert default.name() == "seed7-n300" and level_of(WebshopConfig()) == Level(2000, 0)
    assert max(len(t.options) for t in PRODUCT_TYPES) == MAX_OPTION_TYPES  # "2 = all" in the config


def test_product_types_spread_over_the_categories():
    # 30 types, 6 a category in order: k = 5 takes types 0, 6, 12, 18, 24 (i * 30 // 5)
    assert Level(10, num_product_types=5).type_ids() == [0, 6, 12, 18, 24]
    products = generate_catalog(200, 0, num_product_types=5)
    assert {p.query for p in products} == {PRODUCT_TYPES[i].name for i in (0, 6, 12, 18, 24)}
    assert {p.category for p in products} == {"beauty", "food", "fashion", "furniture", "electronics"}
    assert {p.query for p in generate_catalog(50, 0, num_product_types=1)} == {PRODUCT_TYPES[0].name}


def test_option_types_are_capped():
    for k in (0, 1):
        products = generate_catalog(300, 0, max_option_types=k)
        assert max(len(p.options) for p in products) == k
        type_of = {t.name: t for t in PRODUCT_TYPES}
        assert all(list(p.options) == [n for n, _ in type_of[p.query].options[:k]] for p in products)
    env = WebshopEnv(replace(EASY, max_option_types=0))
    s = env.reset("test", 0)
    assert " with " not in env.goal.instruction_text and env.goal.options == {}
    while not s.done:
        s = env.step(env.expert_action())
    assert s.won  # no options to select: search, click, buy


def test_variant_fraction_controls_near_copies():
    """A near-copy changing an option or the price (2 in 3 of them) keeps its parent's title and
    attributes; two fresh products almost never share both."""

    def copies(products) -> int:
        keys = [(p.title, frozenset(p.attributes)) for p in products]
        return len(keys) - len(set(keys))

    # 400 products at 0.4: ~160 near-copies, 2 in 3 of them keep title and attributes (112 here);
    # fresh products share both only by chance (same type, brand, descriptor and attribute set: 5 here)
    assert copies(generate_catalog(400, 0)) > 60
    assert copies(generate_catalog(400, 0, variant_fraction=0.0)) <= 10


def test_title_attributes_name_more_of_a_product_in_its_title():
    """A title names its product's first `title_attributes` attributes; nothing else changes
    (the same random stream), except the title's nouns."""
    one = generate_catalog(200, 0, num_product_types=5)
    every = generate_catalog(200, 0, num_product_types=5, title_attributes=4)  # products have 2-4
    for a, b in zip(one, every):
        assert a.title.endswith(", " + a.attributes[0].title())  # "Brand Descriptor Type, Attribute"
        assert b.title == ", ".join([a.title, *(x.title() for x in a.attributes[1:])])
        assert {k: v for k, v in vars(a).items() if k not in ("title", "nouns")} == {
            k: v for k, v in vars(b).items() if k not in ("title", "nouns")
        }
    assert Level(100, title_attributes=2).name() == "seed0-n100-a2" and level_of(EASY).name().endswith("-o1")
    # and the results page gets decisive: benchmarks/webshop_ceiling.py's rules on training goals
    from webshop_ceiling import RULES, picks  # benchmarks/ is on pytest's path (setup.cfg)

    wins = {}
    for k in (1, 4):
        env = WebshopEnv(replace(EASY, title_attributes=k))
        wins[k] = dict.fromkeys(RULES, 0)
        for index in range(60):
            env.reset("train", index)
            env.step(f"search[{expert_query(env.goal)}]")
            verdict = picks(env)
            assert all(verdict[r] <= verdict["any listed can win"] for r in RULES)  # no rule beats the page
            for r in RULES:
                wins[k][r] += verdict[r]
    assert wins[4]["best title and price"] > wins[1]["best title and price"] + 10


def test_page_size():
    env = WebshopEnv(EASY)
    env.reset("test", 1)
    s = env.step(f"search[{env.goal.query}]")
    results = env.session.results
    assert len(results) > 3 and s.observation.count(" [SEP] B0") == 3  # 3 listed: ASIN, title, price each
    s = env.step("click[next >]")
    assert env.session.listed() == results[3:6]
    wins = 0
    for i in range(20):
        s = env.reset("test", i)
        while not s.done:
            s = env.step(env.expert_action())
        wins += s.won
    assert wins >= 19  # the expert pages 3 at a time and still finds the target


def test_levels_are_generated_once_into_the_cache(cache):
    level = level_of(EASY)
    root = level_dir(level)
    assert root == cache / "webshop" / f"v{webshop_cache.VERSION}-seed0-n60-t5-o1"
    shop = load_level(level)
    assert (root / "catalog.json").is_file() and (root / "index").is_dir()
    load_level.cache_clear()
    again = load_level(level)  # read back from disk, not generated
    assert again is not shop and [vars(p) for p in again.products] == [vars(p) for p in shop.products]
    for query in ("shampoo lavender", "running shoes black", "sulfate free", "nothing matches zzz"):
        assert again.index.search(query) == shop.index.search(query)
    assert level_dir(replace(level, variant_fraction=0.0)).name.endswith("-t5-o1-v0")  # another level, another dir


def test_a_level_is_the_same_bytes_in_every_cache(cache, monkeypatch):
    """Each machine of a multi-node run builds its own shop (rspo.multinode): from the config
    alone, so two caches must hold the same files, byte for byte."""
    load_level(level_of(EASY))
    other = cache / "machine1"
    monkeypatch.setenv("RSPO_CACHE", str(other))
    load_level.cache_clear()
    load_level(level_of(EASY))

    def files(root):
        return {f.relative_to(root): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}

    first, second = files(cache / "webshop"), files(other / "webshop")
    assert len(first) >= 3 and first == second  # catalog.json, the index's files, the lock


def test_a_corrupt_cache_names_the_directory(cache):
    root = level_dir(level_of(EASY))
    load_level(level_of(EASY))
    (root / "catalog.json").write_text("[{")
    load_level.cache_clear()
    with pytest.raises(ValueError, match=f"corrupt WebShop cache {root}.*delete the directory"):
        load_level(level_of(EASY))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.webshop.num_product_types=31", "env.webshop.num_product_types: must be in [0, 30], got 31"),
        ("env.webshop.max_option_types=3", "env.webshop.max_option_types: must be in [0, 2], got 3"),
        ("env.webshop.variant_fraction=1", "env.webshop.variant_fraction: must be in [0, 1), got 1.0"),
        ("env.webshop.page_size=0", "env.webshop.page_size: must be >= 1, got 0"),
        ("env.webshop.title_attributes=0", "env.webshop.title_attributes: must be >= 1, got 0"),
        ("env.webshop.max_steps=0", "env.webshop.max_steps: must be >= 1, got 0"),
    ],
)
def test_bad_levels_are_config_errors(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["env.name=webshop", override])
    assert str(e.value) == message


def test_ranges_agree_with_the_taxonomy():
    assert RANGES["env.webshop.num_product_types"] == f"[0, {len(PRODUCT_TYPES)}]"
    assert RANGES["env.webshop.max_option_types"] == f"[0, {MAX_OPTION_TYPES}]"


def test_sparse_probe_names_where_a_trajectory_ended():
    """benchmarks/sparse_probe.py replays a trajectory and names the furthest stage it reached
    with the goal's item; each stage played here by hand on one task."""
    from sparse_probe import webshop_stage  # benchmarks/ is on pytest's path (setup.cfg)

    env = WebshopEnv(EASY)

    def replay(index: int, actions: list[str]) -> tuple[str, dict]:
        play = WebshopEnv(EASY)  # plays the actions; `webshop_stage` replays them in `env`
        play.reset("test", index)
        won = any(play.step(a).won for a in actions)
        transcript = [("", f"<action>{a}</action>") for a in actions]  # (observation, response) per turn
        return webshop_stage(env, SimpleNamespace(split="test", task_index=index, won=won, transcript=transcript))

    def stage(index: int, actions: list[str]) -> str:
        return replay(index, actions)[0]

    # a task whose goal has an option to select and whose item the goal's own words list first
    for index in range(20):
        env.reset("test", index)
        search = f"search[{expert_query(env.goal)}]"
        env.step(search)
        listed = env.session.listed()
        if env.goal.options and listed[0] == env.goal.product_index:
            break
    else:
        pytest.fail("no task among the first 20 to play the stages on")
    goal, other = (env.shop.products[i].asin.lower() for i in listed[:2])
    unlisted = next(p.asin.lower() for i, p in enumerate(env.shop.products) if i not in listed)
    assert stage(index, ["click[b0nothere0]"]) == "never listed"  # an unlisted click: a no-op
    # no-op turns by kind: a catalog item this results page does not list, anything the item
    # page does not offer, the rest (a click on the start page, a malformed action)
    actions = ["click[b0nothere0]", "oops", search, f"click[{unlisted}]", f"click[{goal}]", "click[nothing]"]
    assert replay(index, actions)[1] == {"other": 2, "an unlisted item": 1, "on an item page": 1}
    assert stage(index, [search, "click[back to search]"]) == "listed, not opened"
    assert stage(index, [search, f"click[{goal}]"]) == "opened, not bought"
    assert stage(index, [search, f"click[{other}]", "click[buy now]"]) == "other item bought"
    assert stage(index, [search, f"click[{goal}]", "click[buy now]"]) == "item bought, not won"  # no option chosen
    play, expert = WebshopEnv(EASY), []
    state = play.reset("test", index)
    while not state.done:
        expert.append(play.expert_action())
        state = play.step(expert[-1])
    assert stage(index, expert) == "won"


def test_sparse_probe_plays_a_checkpoints_trained_policy(warm_model, tmp_path):
    """`sparse_probe.py --checkpoint`: the policy it plays is the run's saved target on the
    run's own base (the warm start): saved again, its files are the checkpoint's byte for
    byte; and it is not the warm start's untrained adapter."""
    from conftest import small_config
    from sparse_probe import probe_policy

    from rspo.checkpoint import weights_digest
    from rspo.train import train

    run = small_config(f"model.init_from={warm_model}", f"train.output_dir={tmp_path}", "train.steps=1",
                       "train.save_every=1")  # fmt: skip
    train(run)
    last = tmp_path / "checkpoints/step_000001"
    policy, source = probe_policy(load_config(last / "config.yaml"), last)
    save_policy(policy, tmp_path / "probed")
    assert source == last and weights_digest(tmp_path / "probed") == weights_digest(last / "policy")
    fresh, _ = probe_policy(load_config(last / "config.yaml", ["sft.episodes=0"]))  # the base, a new adapter
    save_policy(fresh, tmp_path / "fresh")
    assert weights_digest(tmp_path / "fresh") != weights_digest(last / "policy")


def test_reader_expert_tries_items_in_reading_order_and_buys_one_that_offers_the_options():
    """`env.webshop.expert=reader` acts on what the pages show: it opens the listed item whose
    title names the most goal attributes under the price bound, goes back when that item's
    page lacks the goal's option, opens the next, selects the option and buys. Played on a
    task where the first candidate lacks the option and the second has it."""
    reader = WebshopEnv(replace(EASY, expert="reader"))
    shop = reader.shop
    for index in range(reader.num_tasks("train")):
        state = reader.reset("train", index)
        goal = reader.goal
        state = reader.step(reader.expert_action())
        assert state.info["page"] == "results"
        order = reading_order(shop, goal, reader.session.listed())
        has = [offers(shop.products[i], goal) for i in order[:2]]
        if goal.options and has == [False, True]:
            break
    else:
        pytest.fail("no train task whose first candidate lacks the goal's option and whose second has it")
    first, second = (shop.products[i] for i in order[:2])
    # the reading order: priced under the bound, the most goal attributes named first
    named = [sum(a in p.title.lower() for a in goal.attributes) for p in (first, second)]
    assert named[0] >= named[1] and max(first.pricing[0], second.pricing[0]) <= goal.price_upper
    (value,) = goal.options.values()  # one option type at this level
    played = [reader.expert_action()]
    while not (state := reader.step(played[-1])).done:
        played.append(reader.expert_action())
    assert played == [f"click[{first.asin.lower()}]", "click[< prev]", f"click[{second.asin.lower()}]",
                      f"click[{value}]", "click[buy now]"]  # fmt: skip
    assert reader.session.opened == [order[0], order[1]]
    # the oracle, on the same task, opens an item that can win at once: it knows which can
    oracle = WebshopEnv(EASY)
    oracle.reset("train", index)
    oracle.step(oracle.expert_action())
    oracle.step(oracle.expert_action())
    assert oracle.session.opened == [oracle.session.item] and best_score(shop.products[oracle.session.item], goal) == 1
