"""WebShop's purchase reward (`web_agent_site/engine/goal.py`, `get_reward`), re-implemented.

    score = r_type * (n_attr + n_option + [price <= price_upper])
                   / (n_goal_attrs + n_goal_options + 1)

Fuzzy matching is thefuzz's `token_set_ratio` as WebShop calls it: both strings
lower-cased with punctuation replaced by spaces (rapidfuzz `utils.default_process`), the
ratio rounded to an integer (Python `round`, as thefuzz does), a match when it is > 85.

- n_attr: goal attributes that fuzzy-match one of the product's attributes, else occur
  (as a substring) in its lower-cased title, in its bullets joined by spaces, or in its
  description;
- n_option: goal option *values* that fuzzy-match any chosen option value, whatever the
  option's name, both colour-normalised first (`normalize_color`); no size is compared
  exactly and the product's text is not searched;
- r_type: 1 when the query matches, >= 2 category-path levels are shared, or > 20 % of the
  goal title's nouns are in the bought title's nouns (`title_score`); else 0.5; then 0.1
  when title_score < 0.1 and 0 when it is 0. With no goal nouns, title_score = 0.2.

Departures from WebShop (measured by `benchmarks/webshop_agreement.py`):
- title nouns come from `Product.nouns` (rspo generates its titles, so it knows them by
  construction: `webshop_catalog.title_nouns`) instead of a spaCy `en_core_web_lg` parse;
- WebShop calls `get_option_reward` with `goal_options.items()` when goal options are a
  dict (its synthetic goals), i.e. (name, value) pairs; rspo passes the values, as WebShop
  does for its human goals (a list of values);
- thefuzz's `force_ascii` (dropping Latin-1 letters before matching) is not reproduced:
  the generated catalog is ASCII.

The functions take any objects with the fields they read (`Product`, `Goal` from
`webshop_catalog`, or stand-ins in tests); they are pure and print nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from rapidfuzz import fuzz, utils

FUZZY_THRESHOLD = 85  # a fuzzy match needs a rounded token_set_ratio > 85
CATEGORY_SEP = "›"

# WebShop's colour words (engine/normalize.py), in its order: a value normalises to the
# first of them that it contains as a substring ('navy blue' -> 'blue', 'light pink' ->
# 'light', 'sandalwood' -> 'sand'), and stays as it is when it contains none.
_COLOR_WORDS = """
    alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown burgundy
    camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac copper coral
    cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite grape graphite grass
    gray green grey heather indigo ivory ivy khaki lavender lemon leopard light lilac lime magenta maroon
    mauve merlot midnight mint mocha multicolor mushroom mustard natural navy nude olive orange peach pewter
    pink plum purple rainbow red rose royal rust sand sapphire seashell silver skull slate steel stone
    stonewash sunflower tan taupe teal tiger turquoise violet walnut wheat white wine yellow
"""
WEBSHOP_COLORS = tuple(_COLOR_WORDS.split())


@functools.lru_cache(maxsize=65536)
def normalize_color(value: str) -> str:
    """The first WebShop colour word found in `value` ('navy blue' -> 'blue'), else `value`."""
    return next((color for color in WEBSHOP_COLORS if color in value), value)


@functools.lru_cache(maxsize=65536)
def fuzzy_score(a: str, b: str) -> int:
    """thefuzz's `token_set_ratio(a, b)`: processed strings, rounded to an int in 0..100."""
    return round(fuzz.token_set_ratio(a, b, processor=utils.default_process))


def fuzzy_match(a: str, b: str) -> bool:
    return fuzzy_score(a, b) > FUZZY_THRESHOLD


def type_reward(product, goal) -> dict:
    """r_type and its parts: query match, category-path match, title-noun share."""
    query_match = product.query == goal.query
    bought_path = {x.strip() for x in product.product_category.split(CATEGORY_SEP)}
    goal_path = {x.strip() for x in goal.product_category.split(CATEGORY_SEP)}
    category_match = len(bought_path & goal_path) >= 2
    goal_nouns = set(goal.nouns)
    title_score = len(set(product.nouns) & goal_nouns) / len(goal_nouns) if goal_nouns else 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": title_score}


def attribute_matches(product, goal_attributes: Iterable[str]) -> int:
    """How many goal attributes the product has (fuzzy on its attributes, else in one of its texts)."""
    texts = [product.title.lower(), " ".join(product.bullets).lower(), product.description.lower()]
    n = 0
    for g in goal_attributes:
        n += any(fuzzy_match(p, g) for p in product.attributes) or any(g in text for text in texts)
    return n


def option_matches(goal_values: Iterable[str], chosen_values: Iterable[str]) -> int:
    """How many goal option values some chosen value fuzzy-matches (both colour-normalised)."""
    chosen = [normalize_color(v) for v in chosen_values]
    return sum(any(fuzzy_match(p, normalize_color(g)) for p in chosen) for g in goal_values)


def get_reward(product, goal, options: dict[str, str], price: float | None = None) -> tuple[float, dict]:
    """WebShop's score for buying `product` with the chosen `options` under `goal`.

    `price` defaults to the product's (hidden) sale price. Returns (score, info) with the
    score's parts in `info`.
    """
    price = product.price if price is None else price
    info = type_reward(product, goal)
    n_attr = attribute_matches(product, goal.attributes)
    n_option = option_matches(goal.options.values(), options.values())
    r_price = price <= goal.price_upper
    n_goal = len(goal.attributes) + len(goal.options) + 1
    score = info["r_type"] * (n_attr + n_option + r_price) / n_goal
    info.update(n_attr=n_attr, n_option=n_option, r_price=r_price, n_goal=n_goal)
    return score, info
