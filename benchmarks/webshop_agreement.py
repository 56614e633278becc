"""How often rspo's WebShop reward equals a literal reading of the original `get_reward`.

    PYTHONPATH=src python benchmarks/webshop_agreement.py [--goals 500] [--spacy-model NAME_OR_PATH]

`original_reward` reads web_agent_site/engine/goal.py (`get_type_reward`,
`get_attribute_reward`, `get_option_reward`, `get_reward`) statement by statement, with the
matcher WebShop pins: thefuzz 0.19.0 without python-Levenshtein, whose `ratio` is
difflib's `SequenceMatcher` ratio (rspo uses rapidfuzz's Indel ratio, as thefuzz >= 0.20
does). Title nouns are, as WebShop takes them, the NOUN/PROPN tokens of a spaCy parse of
each title when spaCy is importable with an English pipeline (--spacy-model, a name or
path; by default the first of en_core_web_lg, which WebShop loads, and en_core_web_sm that
loads); without one, rspo's by-construction nouns (`Product.nouns`), which cannot show
that departure. spaCy is not a dependency of rspo.

Goal options are read in both of WebShop's forms: `list` (its human goals: the values) and
`dict` (its synthetic goals, which rspo's generated goals are: `get_reward` passes
`goal_options.items()`, so each goal option is a (name, value) pair; `normalize_color`
then tests the pair's membership, and thefuzz matches `str(pair)`, e.g. "color navy blue").
rspo passes the values, so the list form is the one it reproduces.

Cases, 4 per goal of the default 2,000-product shop: the target bought with the goal's
options, the target with random options, a product from the goal's search results with
random options, and a random product with random options (each option left unselected
with probability 1/4). Prints, per reading of the nouns and per goal form, the fraction of
cases whose scores agree (to 1e-9), and for the others which term differs and by how much.
"""

from __future__ import annotations

import argparse
import difflib
import random
import re

from rspo.envs.webshop import expert_query
from rspo.envs.webshop_cache import load_shop
from rspo.envs.webshop_catalog import goal_target, make_goal, title_nouns
from rspo.envs.webshop_reward import WEBSHOP_COLORS, get_reward

# ---- the reading of the original -------------------------------------------------------


def _ratio(a: str, b: str) -> int:
    """thefuzz 0.19 `fuzz.ratio`: 100 if equal, 0 if one is empty, else difflib's, rounded."""
    if a == b:
        return 100
    if not a or not b:
        return 0
    return round(100 * difflib.SequenceMatcher(None, a, b).ratio())


def thefuzz_token_set_ratio(s1: str, s2: str) -> int:
    """thefuzz 0.19 `fuzz.token_set_ratio`: processed strings (non-word characters to spaces,
    lower-cased, stripped; a non-string is first made `str`, as its `asciidammit` does),
    then the best ratio among intersection / intersection + rest."""
    p1, p2 = (re.sub(r"\W", " ", str(s)).lower().strip() for s in (s1, s2))
    if not p1 or not p2:
        return 0
    t1, t2 = set(p1.split()), set(p2.split())
    sect = " ".join(sorted(t1 & t2))
    with1 = f"{sect} {' '.join(sorted(t1 - t2))}".strip()
    with2 = f"{sect} {' '.join(sorted(t2 - t1))}".strip()
    return max(_ratio(sect, with1), _ratio(sect, with2), _ratio(with1, with2))


def original_color(value: str | tuple[str, str]) -> str | tuple[str, str]:
    """normalize_color: `color in value`, a substring test on a string, membership in a pair."""
    for color in WEBSHOP_COLORS:
        if color in value:
            return color
    return value


def original_reward(product, goal, options: dict[str, str], nouns, goal_form: str = "list") -> dict:
    """WebShop's get_reward for `product` bought with `options`; `nouns(title)` gives title nouns;
    `goal_form` list: goal options as values, dict: as (name, value) pairs (`goal_options.items()`)."""
    # get_type_reward
    query_match = product.query == goal.query
    bought_path = [x.strip() for x in product.product_category.split("›")]
    goal_path = [x.strip() for x in goal.product_category.split("›")]
    category_match = len(set(bought_path) & set(goal_path)) >= 2
    bought_nouns, goal_nouns = nouns(product.title), nouns(goal.name)
    n_intersect = len(set(bought_nouns) & set(goal_nouns))
    title_score = 0.2 if len(goal_nouns) == 0 else n_intersect / len(goal_nouns)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    # get_attribute_reward
    n_attr = 0
    for g_attr in goal.attributes:
        matched = False
        for p_attr in product.attributes:
            if thefuzz_token_set_ratio(p_attr, g_attr) > 85:
                n_attr += 1
                matched = True
                break
        texts = (product.title.lower(), " ".join(product.bullets).lower(), product.description.lower())
        if not matched and any(g_attr in text for text in texts):
            n_attr += 1
    # get_option_reward, over list(goal_options) or goal_options.items()
    purchased = [original_color(o) for o in options.values()]
    goal_options = goal.options.values() if goal_form == "list" else goal.options.items()
    n_option = 0
    for g_option in [original_color(o) for o in goal_options]:
        for p_option in purchased:
            if thefuzz_token_set_ratio(p_option, g_option) > 85:
                n_option += 1
                break
    r_price = product.price <= goal.price_upper
    total = (n_attr + n_option + r_price) / (len(goal.attributes) + len(goal.options) + 1)
    return {"score": total * r_type, "r_type": r_type, "n_attr": n_attr, "n_option": n_option}


# ---- cases and agreement ---------------------------------------------------------------------


def cases(num_goals: int, seed: int = 0, num_products: int = 2000):
    """(goal, product, options) triples, 4 per goal (see the module docstring)."""
    shop = load_shop(num_products, seed)
    products, rng = shop.products, random.Random(f"webshop-agreement/{seed}")

    def random_options(p):
        return {name: rng.choice(values) for name, values in p.options.items() if rng.random() < 0.75}

    for i in range(num_goals):
        target = products[goal_target(i, num_products, seed)]
        goal = make_goal(target, i, seed)
        found = shop.index.search(expert_query(goal)) or [target.index]
        yield goal, target, dict(goal.options)
        for p in (target, products[rng.choice(found)], rng.choice(products)):
            yield goal, p, random_options(p)


def agreement(triples, nouns=title_nouns, goal_form: str = "list") -> dict:
    """Fraction of (goal, product, options) whose rspo score equals `original_reward`'s, where
    `nouns(title)` gives the reading's title nouns (default: rspo's, by construction) and
    `goal_form` the form of the goal options (list or dict)."""
    n = agree = 0
    differ = {"r_type": 0, "n_attr": 0, "n_option": 0}
    worst = 0.0
    for goal, product, options in triples:
        ours, info = get_reward(product, goal, options)
        theirs = original_reward(product, goal, options, nouns, goal_form)
        n += 1
        agree += abs(ours - theirs["score"]) < 1e-9
        worst = max(worst, abs(ours - theirs["score"]))
        for term in differ:
            differ[term] += info[term] != theirs[term]
    return {"cases": n, "agree": agree / n, "max_abs_diff": worst, "differ": differ}


SPACY_PIPELINES = ("en_core_web_lg", "en_core_web_sm")  # WebShop loads en_core_web_lg


def spacy_nouns(model: str | None = None):
    """title -> NOUN/PROPN tokens, lower-cased, as WebShop's get_type_reward takes them, from
    `model` (else the first of SPACY_PIPELINES that loads); None without spaCy or a pipeline."""
    try:
        import spacy  # optional: only for this measurement
    except ImportError:
        return None
    nlp = None
    for name in [model] if model else SPACY_PIPELINES:
        try:
            nlp = spacy.load(name)
            break
        except OSError:
            continue
    if nlp is None:
        return None
    cache = {}

    def nouns(title: str) -> tuple[str, ...]:
        if title not in cache:
            cache[title] = tuple(t.text.lower() for t in nlp(title) if t.pos_ in ("PNOUN", "NOUN", "PROPN"))
        return cache[title]

    nouns.pipeline = f"{nlp.meta['lang']}_{nlp.meta['name']} {nlp.meta['version']}"
    return nouns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--goals", type=int, default=500, help="goals of the default shop (4 cases each)")
    parser.add_argument("--spacy-model", default=None, help="a spaCy pipeline (name or path) for title nouns")
    args = parser.parse_args()
    triples = list(cases(args.goals))
    nouns = spacy_nouns(args.spacy_model)
    if nouns is None:
        print("no spaCy pipeline (pip install spacy and an English pipeline): title nouns are rspo's")
        readings = {"rspo's title nouns": title_nouns}
    else:
        readings = {f"spaCy nouns ({nouns.pipeline})": nouns, "rspo's title nouns": title_nouns}
    for name, reading in readings.items():
        for form in ("list", "dict"):
            r = agreement(triples, reading, form)
            print(
                f"{name}, {form} goal options: {r['agree']:.4f} of {r['cases']:,} cases agree; "
                f"max |difference| {r['max_abs_diff']:.3f}; cases where a term differs: {r['differ']}"
            )


if __name__ == "__main__":
    main()
