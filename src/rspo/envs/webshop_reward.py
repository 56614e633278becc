"""WebShop's purchase reward (`get_reward`), re-implemented from its public description.

    score = r_type * (n_attr_match + n_option_match + [price <= price_upper])
                   / (n_goal_attrs + n_goal_options + 1)

- attributes: a goal attribute matches when `fuzz.token_set_ratio` against one of the
  product's attributes is > 85, else when it occurs in the title, bullets or description;
- options: each *chosen* option value, colour-normalised, matches when it equals a goal
  option value (`size` options: exact) or fuzzy-matches one (> 85, other options), else
  when it occurs in the product's text;
- r_type: 1 when the purchased product has the goal's query, shares >= 2 category-path
  levels, or shares > 20 % of the goal title's nouns; 0.5 otherwise; 0.1 when that noun
  share is < 0.1; 0 when it is 0. The noun share is always computed, so a product of the
  wrong type scores 0 even inside the right category.

Departures from WebShop: title nouns come from the catalog's metadata (`Product.nouns`:
the brand and the product-type words) instead of a spaCy part-of-speech parse, and the
colour normaliser uses our own table of base colours. Matching is otherwise WebShop's,
quirks included (e.g. a token-set ratio of 100 whenever one token set contains the other).

The functions take any objects with the fields they read (`Product`, `Goal` from
`webshop_catalog`, or stand-ins in tests); they are pure and print nothing.
"""

from __future__ import annotations

import functools
import re

from rapidfuzz import fuzz

FUZZY_THRESHOLD = 85  # WebShop: a fuzzy match needs token_set_ratio > 85
EXACT_MATCH_OPTIONS = ("size",)  # option names compared exactly, not fuzzily
CATEGORY_SEP = "›"

# Base colour words; a shade name maps to the last base colour it mentions.
BASE_COLORS = (
    "beige",
    "black",
    "blue",
    "brown",
    "gold",
    "green",
    "grey",
    "ivory",
    "khaki",
    "navy",
    "orange",
    "pink",
    "purple",
    "red",
    "silver",
    "tan",
    "teal",
    "white",
    "yellow",
)
COLOR_SYNONYMS = {"gray": "grey", "golden": "gold", "crimson": "red", "maroon": "red", "turquoise": "teal"}
_WORD = re.compile(r"[a-z]+")


@functools.lru_cache(maxsize=65536)
def normalize_color(value: str) -> str:
    """Map a colour shade to its base colour ('navy blue' -> 'blue'); other text unchanged."""
    words = [COLOR_SYNONYMS.get(w, w) for w in _WORD.findall(value.lower())]
    bases = [w for w in words if w in BASE_COLORS]
    return bases[-1] if bases else value


def _text(product) -> str:
    """The product text WebShop searches for a goal word: title, bullets, description."""
    return " ".join([product.title, *product.bullets, product.description]).lower()


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


def attribute_matches(product, goal_attributes) -> int:
    """How many goal attributes the product has (fuzzy on its attributes, else in its text)."""
    text = _text(product)
    n = 0
    for g in goal_attributes:
        fuzzy = any(fuzz.token_set_ratio(p, g) > FUZZY_THRESHOLD for p in product.attributes)
        n += fuzzy or g in text
    return n


def option_matches(product, goal_values, chosen: dict[str, str]) -> int:
    """How many chosen option values match a goal option value (colour-normalised)."""
    goal_values = [normalize_color(v) for v in goal_values]
    text = _text(product)
    n = 0
    for name, value in chosen.items():
        value = normalize_color(value)
        if name.lower() in EXACT_MATCH_OPTIONS:
            matched = value in goal_values
        else:
            matched = any(fuzz.token_set_ratio(g, value) > FUZZY_THRESHOLD for g in goal_values)
        n += matched or value in text
    return n


def get_reward(product, goal, options: dict[str, str], price: float | None = None) -> tuple[float, dict]:
    """WebShop's score for buying `product` with the chosen `options` under `goal`.

    `price` defaults to the product's (hidden) sale price. Returns (score, info) with the
    score's parts in `info`.
    """
    price = product.price if price is None else price
    info = type_reward(product, goal)
    n_attr = attribute_matches(product, goal.attributes)
    n_option = option_matches(product, list(goal.options.values()), options)
    r_price = price <= goal.price_upper
    n_goal = len(goal.attributes) + len(goal.options) + 1
    score = info["r_type"] * (n_attr + n_option + r_price) / n_goal
    info.update(n_attr=n_attr, n_option=n_option, r_price=r_price, n_goal=n_goal)
    return score, info
