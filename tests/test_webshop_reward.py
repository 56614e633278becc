"""WebShop's purchase reward: hand-computed cases, and agreement with a reading of the original.

score = r_type * (n_attr + n_option + [price <= upper]) / (n_goal_attrs + n_goal_options + 1)
The stand-in goal below has 2 attributes + 2 options + 1 price term: the denominator is 5.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
from rapidfuzz import fuzz

from rspo.envs.webshop_catalog import title_nouns
from rspo.envs.webshop_reward import fuzzy_match, fuzzy_score, get_reward, normalize_color, type_reward

LIPSTICK = "Beauty & Personal Care › Makeup › Lips › Lipstick"


def product(**kw):
    """A hand-written product: a lipstick with two attributes."""
    base = dict(
        title="Velora Matte Lipstick",
        bullets=["Smooth finish."],
        description="A lipstick for every day.",
        query="lipstick",
        product_category=LIPSTICK,
        nouns=("velora", "matte", "lipstick"),
        attributes=("long lasting", "cruelty free"),
        price=15.0,
    )
    return SimpleNamespace(**{**base, **kw})


def goal(**kw):
    base = dict(
        query="lipstick",
        product_category=LIPSTICK,
        nouns=("velora", "matte", "lipstick"),
        attributes=("long lasting", "cruelty free"),
        options={"color": "wine red", "size": "xl"},
        price_upper=20.0,
    )
    return SimpleNamespace(**{**base, **kw})


# ---- the whole formula ---------------------------------------------------------------------


def test_perfect_purchase_scores_one():
    score, info = get_reward(product(), goal(), {"color": "wine red", "size": "xl"})
    assert info["r_type"] == 1.0 and score == 1.0  # same query; 1 * (2 + 2 + 1) / 5


def test_wrong_and_missing_options_and_price():
    assert get_reward(product(), goal(), {"color": "black", "size": "xl"})[0] == pytest.approx(0.8)  # (2+1+1)/5
    assert get_reward(product(), goal(), {})[0] == pytest.approx(0.6)  # (2+0+1)/5: nothing selected
    score, info = get_reward(product(price=25.0), goal(), {"color": "wine red", "size": "xl"})
    assert not info["r_price"] and score == pytest.approx(0.8)  # (2+2+0)/5


# ---- 1. option matching: thefuzz processing and rounding, every option fuzzy, no text ------


def test_fuzzy_score_is_thefuzz_processed_and_rounded():
    # '33.8 fl oz' -> tokens {33, 8, fl, oz} contain {8, fl, oz}: the token-set ratio is 100
    assert fuzzy_score("33.8 fl oz", "8 fl oz") == 100
    # '2 fl oz' vs '8 fl oz': intersection 'fl oz'; 'fl oz 2' vs 'fl oz 8' share 6 of 7 + 7
    # characters: 2 * 6 / 14 = 85.71 -> 86 > 85, a match
    assert fuzz.token_set_ratio("2 fl oz", "8 fl oz") == pytest.approx(600 / 7)
    assert fuzzy_score("2 fl oz", "8 fl oz") == 86 and fuzzy_match("2 fl oz", "8 fl oz")
    # rounding: 23 shared of 27 + 27 characters: 2 * 23 / 54 = 85.19 > 85 unrounded, 85 rounded: no match
    a, b = "a" * 23 + "bbbb", "a" * 23 + "cccc"
    assert fuzz.token_set_ratio(a, b) == pytest.approx(4600 / 54) and fuzzy_score(a, b) == 85
    assert not fuzzy_match(a, b)
    # processing: case and punctuation go before matching ('Non-GMO' -> 'non gmo')
    assert fuzz.token_set_ratio("Non-GMO", "non gmo") < 85 and fuzzy_score("Non-GMO", "non gmo") == 100


def test_sizes_match_fuzzily_like_every_option():
    g = goal(options={"size": "8 fl oz"})  # denominator 2 + 1 + 1 = 4
    # bought 33.8 fl oz for a goal of 8 fl oz: WebShop counts the option (score 100): (2+1+1)/4
    assert get_reward(product(), g, {"size": "33.8 fl oz"})[0] == 1.0
    assert get_reward(product(), g, {"size": "2 fl oz"})[1]["n_option"] == 1  # 86 > 85
    # 'x-large' vs 'xx-large': 'large x' vs 'large xx', 2 * 7 / 15 = 93 -> a match, size or not
    assert get_reward(product(), goal(options={"size": "x-large"}), {"size": "xx-large"})[1]["n_option"] == 1


def test_options_loop_over_the_goal_values_whatever_the_name():
    # each goal value counts once when any chosen value matches it, under any option name:
    # 'black' vs 'black' and 'black' vs 'black matte' (token subset) both score 100 -> 2
    g = goal(options={"color": "black", "style": "black matte"})
    assert get_reward(product(), g, {"finish": "black"})[1]["n_option"] == 2


def test_options_are_not_looked_up_in_the_product_text():
    # the description names the goal's colour, but nothing is chosen: 0 options -> (2+0+1)/5
    text = product(description="A wine red lipstick, size xl.")
    assert get_reward(text, goal(), {})[1]["n_option"] == 0
    # a chosen 'black' found in the title does not count either: (2+0+1)/5
    assert get_reward(product(title="Velora Black Lipstick"), goal(), {"color": "black"})[0] == pytest.approx(0.6)


def test_colour_normalisation_is_webshops_first_listed_colour():
    # WebShop's list is alphabetical and matched as substrings: the first colour found wins
    assert normalize_color("navy blue") == "blue"  # 'blue' < 'navy'
    assert normalize_color("light pink") == "light" and normalize_color("charcoal gray") == "charcoal"
    assert normalize_color("sandalwood") == "sand" and normalize_color("xx-large") == "xx-large"
    # 'dark red' -> 'dark' ('dark' < 'red'), 'wine red' -> 'red': no match -> (2+1+1)/5
    assert get_reward(product(), goal(), {"color": "dark red", "size": "xl"})[0] == pytest.approx(0.8)
    # 'ruby red' and 'wine red' both -> 'red': a match -> (2+2+1)/5
    assert get_reward(product(), goal(), {"color": "ruby red", "size": "xl"})[0] == 1.0


# ---- attributes -----------------------------------------------------------------------------


def test_attribute_fuzzy_or_in_one_of_the_texts():
    in_text = product(attributes=("long lasting",), description="Cruelty free and vegan.")
    assert get_reward(in_text, goal(), {"color": "wine red", "size": "xl"})[0] == 1.0  # found in the description
    missing = product(attributes=("long lasting",))
    assert get_reward(missing, goal(), {"color": "wine red", "size": "xl"})[0] == pytest.approx(0.8)  # (1+2+1)/5
    # each text on its own: 'lipstick smooth' spans the title's end and the first bullet, so no
    spans = goal(attributes=("long lasting", "lipstick smooth"))
    assert get_reward(product(), spans, {})[1]["n_attr"] == 1


# ---- 2. r_type from the whole title's nouns -------------------------------------------------


def test_title_nouns_are_every_title_word_but_function_and_number_words():
    assert title_nouns("Hearthwood Two Drawer Nightstand, Solid Wood") == (
        "hearthwood",
        "drawer",
        "nightstand",
        "solid",
        "wood",
    )
    assert title_nouns("Northway Trail Running Shoes, Lace Up") == ("northway", "trail", "running", "shoes", "lace")


def test_r_type_counts_descriptor_and_attribute_nouns():
    # goal 'Two Drawer Nightstand, Solid Wood' -> nouns {drawer, nightstand, solid, wood};
    # bought 'Lift Top Coffee Table, Solid Wood' shares {solid, wood}: 2 / 4 = 0.5 > 0.2 -> 1,
    # though the query and the category path (1 shared level: 'Furniture') differ
    g = goal(
        query="nightstand",
        product_category="Furniture › Nightstands",
        nouns=title_nouns("Two Drawer Nightstand, Solid Wood"),
        attributes=("solid wood", "storage space"),
        options={"color": "black"},
        price_upper=200.0,
    )
    bought = product(
        title="Lift Top Coffee Table, Solid Wood",
        query="coffee table",
        product_category="Furniture › Coffee Tables",
        nouns=title_nouns("Lift Top Coffee Table, Solid Wood"),
        attributes=("solid wood", "easy assemble"),
        price=150.0,
    )
    info = type_reward(bought, g)
    assert info["title_score"] == 0.5 and info["r_type"] == 1.0
    # score = 1 * (1 attribute + 1 option + 1 price) / (2 + 1 + 1) = 0.75
    assert get_reward(bought, g, {"color": "black"})[0] == 0.75


def test_r_type_levels():
    five = ("velora", "matte", "lipstick", "stick", "set")
    other = dict(query="eyeliner", product_category="Beauty & Personal Care › Eyes › Eyeliner")
    # 1 of the goal's 5 nouns (0.2, not > 0.2), another query, 1 shared path level -> 0.5
    info = type_reward(product(nouns=("velora", "pencil"), **other), goal(nouns=five))
    assert (info["title_score"], info["r_type"]) == (0.2, 0.5)
    # score = 0.5 * (2 + 2 + 1) / 5 = 0.5
    assert get_reward(product(nouns=("velora", "pencil"), **other), goal(nouns=five), goal().options)[0] == 0.5
    # 1 of 11 nouns (0.09 < 0.1) -> 0.1
    eleven = five + ("a", "b", "c", "d", "e", "f")
    assert type_reward(product(nouns=("velora",), **other), goal(nouns=eleven))["r_type"] == 0.1
    # no shared noun -> 0, whatever else matches: score 0
    assert get_reward(product(nouns=("kohl", "pencil")), goal(), goal().options)[0] == 0.0
    # same 1-of-5 nouns but >= 2 shared category levels -> the type counts as matched (1.0)
    near = dict(query="lip gloss", product_category="Beauty & Personal Care › Makeup › Lip Gloss")
    assert type_reward(product(nouns=("velora", "gloss"), **near), goal(nouns=five))["r_type"] == 1.0
    # no goal nouns: title_score = 0.2, so only a query or category match gives 1
    assert type_reward(product(**other), goal(nouns=()))["r_type"] == 0.5


# ---- 4. agreement with the reading of the original ------------------------------------------


def _agreement_module():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "webshop_agreement.py"
    spec = importlib.util.spec_from_file_location("webshop_agreement", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_thefuzz_reading_hand_cases():
    bench = _agreement_module()
    # difflib on 'fl oz 2' / 'fl oz 8': one 6-character block: 2 * 6 / 14 -> 86, as rapidfuzz
    assert bench.thefuzz_token_set_ratio("2 fl oz", "8 fl oz") == 86
    assert bench.thefuzz_token_set_ratio("33.8 fl oz", "8 fl oz") == 100
    assert bench.thefuzz_token_set_ratio("", "x") == 0 and bench.original_color("navy blue") == "blue"


def test_agrees_with_the_original_on_1000_generated_cases():
    bench = _agreement_module()
    result = bench.agreement(bench.cases(num_goals=250))  # 4 cases a goal
    assert result["cases"] == 1000
    assert result["agree"] == 1.0, result


def test_the_dict_goal_form_reading():
    """WebShop's synthetic goals pass `goal_options.items()`: a (name, value) pair is
    colour-normalised by membership and fuzzy-matched as `str(pair)`. rspo passes values."""
    bench = _agreement_module()
    assert bench.original_color(("scent", "sandalwood")) == ("scent", "sandalwood")  # 'sand' is no member
    assert bench.original_color(("color", "black")) == "black"  # an exact colour word is
    # 'sandalwood' -> 'sand' (a colour word inside it) vs 'scent sandalwood': no common token,
    # difflib 'sand' / 'sandalwood scent': 2 * 4 / (4 + 16) = 0.4 -> 40 <= 85, no match
    assert bench.thefuzz_token_set_ratio("sand", ("scent", "sandalwood")) == 40
    # 'navy blue' -> 'blue' vs 'color navy blue': 'blue' is in both, so the set ratio is 100
    assert bench.thefuzz_token_set_ratio("blue", ("color", "navy blue")) == 100
    p = SimpleNamespace(
        query="candle", product_category="a › b", title="Sandalwood Candle", attributes=(), bullets=(),
        description="", price=5.0,
    )  # fmt: skip
    g = SimpleNamespace(
        query="candle", product_category="a › b", name="Sandalwood Candle", attributes=(),
        options={"scent": "sandalwood"}, price_upper=10.0,
    )  # fmt: skip
    nouns = bench.title_nouns
    # list: 'sand' = 'sand': (0 attributes + 1 option + 1 price) / (0 + 1 + 1) = 1.0
    assert bench.original_reward(p, g, {"scent": "sandalwood"}, nouns, "list")["score"] == 1.0
    # dict: the option no longer matches: (0 + 0 + 1) / 2 = 0.5
    assert bench.original_reward(p, g, {"scent": "sandalwood"}, nouns, "dict")["score"] == 0.5


def test_spacy_nouns_without_a_pipeline_is_none():
    """Without spaCy or the named pipeline the benchmark falls back to rspo's nouns."""
    assert _agreement_module().spacy_nouns("/no/such/spacy/pipeline") is None
