"""A generated WebShop catalog and its goals, deterministic by seed.

WebShop's 1.18M scraped Amazon products cannot be downloaded here, so rspo generates a
catalog with the same fields: ASIN, title, category path (`product_category`), the search
query the product was "scraped" with (its product type), attributes, options (colour,
size, flavor, scent, length), a price or a price range (shown `$8.5 to $12.0`; the price
paid is a hidden draw inside the range, as in WebShop), description, feature bullets,
rating and reviews.

Distractors: about 40 % of products are near-copies of an earlier product that differ in
exactly one attribute, one option value or the price, so an agent has to compare results
and read item pages. A title names one attribute (`title_attributes` more) and the
description only some; the feature bullets name all (WebShop's index sees just the first
bullet), so search alone cannot tell a match from a near-miss. On the default shop,
searching the instruction, buying the first result with the goal's options wins about half
the test goals; the expert wins all of them.

A product's `nouns` are its title's nouns, known by construction (`title_nouns`): WebShop
gets them from a spaCy parse; `benchmarks/webshop_agreement.py --spacy-model` measures how
often the two agree.

Goals follow WebShop's synthetic goals: a target product, a subset of its attributes, one
value per option type, and `price_upper` drawn from the multiples of 10 above its price.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass

import bm25s
import numpy as np

from rspo.envs.webshop_taxonomy import BRANDS, CATEGORY_ROOTS, MAX_OPTION_TYPES, NOT_NOUNS, PRODUCT_TYPES

VARIANT_FRACTION = 0.4  # share of products that are one-change copies of an earlier product
RANGE_FRACTION = 0.25  # share of products priced as a range
PRICE_RANGE = [10.0 * i for i in range(1, 100)]  # WebShop's candidate price bounds
NO_PRICE_BOUND = 1_000_000.0


@dataclass(frozen=True, eq=False)
class Product:
    index: int
    asin: str  # 'B0' + 8 upper-case letters/digits
    title: str
    category: str  # beauty | food | fashion | furniture | electronics
    query: str  # the product type, e.g. 'hair dryer' (WebShop: the scraping query)
    product_category: str  # 'Beauty & Personal Care › Hair Care › Hair Dryers'
    nouns: tuple[str, ...]  # the title's nouns, lower-cased (r_type), see `title_nouns`
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]  # option name -> values, in page order
    pricing: tuple[float, ...]  # (price,) or (low, high)
    price: float  # the price paid (hidden; inside the range for ranges)
    description: str
    bullets: tuple[str, ...]
    rating: str  # '4.5' or 'N.A.'

    @property
    def price_text(self) -> str:
        return " to ".join(f"${p}" for p in self.pricing)


@dataclass(frozen=True, eq=False)
class Goal:
    index: int
    asin: str  # the target product
    product_index: int
    category: str
    query: str
    product_category: str
    nouns: tuple[str, ...]  # the target title's nouns
    name: str  # the target's title
    attributes: tuple[str, ...]
    options: dict[str, str]  # option name -> wanted value
    price_upper: float
    instruction_text: str


@dataclass(frozen=True)
class Level:
    """What a generated catalog depends on: its size, seed and difficulty (the defaults are
    the shop the fidelity measurements use). Fewer product types and fewer near-copies make
    the target easier to find; fewer option types leave fewer options to select."""

    num_products: int
    seed: int = 0
    num_product_types: int = 0  # the first k of an even spread over PRODUCT_TYPES; 0 = all
    max_option_types: int = MAX_OPTION_TYPES  # option types a product keeps (its type's first ones)
    variant_fraction: float = VARIANT_FRACTION  # share of one-change copies of an earlier product
    title_attributes: int = 1  # attributes a title names (its first ones; more = all of them)

    def type_ids(self) -> list[int]:
        """The product types drawn from: k spread evenly over the categories' order."""
        n, k = len(PRODUCT_TYPES), self.num_product_types or len(PRODUCT_TYPES)
        return sorted({i * n // k for i in range(k)})

    def name(self) -> str:
        """The cache directory's name: seed and size, then each setting off its default."""
        parts = [f"seed{self.seed}", f"n{self.num_products}"]
        parts += [f"t{self.num_product_types}"] * bool(self.num_product_types)
        parts += [f"o{self.max_option_types}"] * (self.max_option_types != MAX_OPTION_TYPES)
        parts += [f"v{self.variant_fraction:g}"] * (self.variant_fraction != VARIANT_FRACTION)
        parts += [f"a{self.title_attributes}"] * (self.title_attributes != 1)
        return "-".join(parts)


@dataclass
class _Spec:
    """The random choices behind one product; text is rendered from it."""

    type_id: int
    brand: str
    descriptor: str
    attributes: list[str]
    options: dict[str, list[str]]
    pricing: tuple[float, ...]
    price: float


def _round_price(x: float, rng: random.Random) -> float:
    return round(int(x) + rng.choice([0.99, 0.49, 0.0, 0.95]), 2)


def _draw_price(base: float, rng: random.Random) -> tuple[tuple[float, ...], float]:
    """(pricing shown, price paid) around `base`; a quarter are ranges, paid inside the range."""
    low = _round_price(base, rng)
    if rng.random() >= RANGE_FRACTION:
        return (low,), low
    high = round(low * rng.uniform(1.2, 1.8), 1)
    return (low, high), round(rng.uniform(low, high), 2)


def _fresh_spec(rng: random.Random, level: Level) -> _Spec:
    types = level.type_ids()
    type_id = types[rng.randrange(len(types))]
    ptype = PRODUCT_TYPES[type_id]
    attributes = rng.sample(ptype.attributes, rng.randint(2, min(4, len(ptype.attributes))))
    pools = ptype.options[: level.max_option_types]
    options = {name: rng.sample(pool, rng.randint(2, min(4, len(pool)))) for name, pool in pools}
    pricing, price = _draw_price(rng.uniform(*ptype.price), rng)
    brand = rng.choice(BRANDS[ptype.category])
    return _Spec(type_id, brand, rng.choice(ptype.descriptors), attributes, options, pricing, price)


def _variant_spec(parent: _Spec, rng: random.Random) -> _Spec:
    """A copy of `parent` that differs in one attribute, one option value or the price."""
    ptype = PRODUCT_TYPES[parent.type_id]
    spec = _Spec(**{**vars(parent), "attributes": list(parent.attributes), "options": {}})
    spec.options = {k: list(v) for k, v in parent.options.items()}
    kind = rng.choice(["attribute", "option", "price"])
    spare = [a for a in ptype.attributes if a not in spec.attributes]
    droppable = sorted(name for name, values in spec.options.items() if len(values) > 1)
    if kind == "attribute" and spare:
        spec.attributes[rng.randrange(len(spec.attributes))] = rng.choice(spare)
    elif kind == "option" and droppable:
        values = spec.options[rng.choice(droppable)]
        values.pop(rng.randrange(len(values)))  # the goal may want exactly this one
    else:
        base = min(parent.price * rng.uniform(1.5, 3.0), 3 * ptype.price[1])  # chains must not run away
        spec.pricing, spec.price = _draw_price(base, rng)
    return spec


def title_nouns(title: str) -> tuple[str, ...]:
    """The nouns of a generated title, lower-cased: every word but `NOT_NOUNS` (see taxonomy)."""
    return tuple(w for w in re.findall(r"[a-z0-9]+", title.lower()) if w not in NOT_NOUNS)


def _render(index: int, asin: str, spec: _Spec, rng: random.Random, title_attributes: int = 1) -> Product:
    """Write a product's title, texts and options from its spec."""
    ptype = PRODUCT_TYPES[spec.type_id]
    kind = ptype.name.title()
    head = ", ".join(a.title() for a in spec.attributes[:title_attributes])
    title = f"{spec.brand} {spec.descriptor} {kind}, {head}"
    # the description names only some attributes; the bullets name all (WebShop indexes
    # just the first bullet, so search cannot see every attribute: item pages must be read)
    named = rng.sample(spec.attributes[1:], rng.randint(0, len(spec.attributes) - 1))
    highlights = f"Highlights: {', '.join(named)}. " if named else ""
    filler = " ".join(rng.sample(ptype.blurbs, rng.randint(0, 4)))
    description = (  # stripped, as WebShop strips its descriptions (else 1 in 5 ends in a space)
        f"Made for everyday use: the {spec.descriptor.lower()} {ptype.name} by {spec.brand}. {highlights}{filler}"
    ).strip()
    bullets = tuple(f"{a.upper()}: {rng.choice(ptype.blurbs)}" for a in spec.attributes) + (
        "SATISFACTION GUARANTEE: contact us with any question and we will help.",
    )
    options = {name: tuple(values) for name, values in spec.options.items()}
    rating = "N.A." if rng.random() < 0.4 else f"{rng.choice([3.5, 4.0, 4.2, 4.5, 4.7, 5.0])}"
    return Product(
        index=index,
        asin=asin,
        title=title,
        category=ptype.category,
        query=ptype.name,
        product_category=f"{CATEGORY_ROOTS[ptype.category]} › {ptype.path}",
        nouns=title_nouns(title),
        attributes=tuple(spec.attributes),
        options=options,
        pricing=spec.pricing,
        price=spec.price,
        description=description,
        bullets=bullets,
        rating=rating,
    )


def _asins(n: int, rng: random.Random) -> list[str]:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    seen: set[str] = set()
    out = []
    while len(out) < n:
        asin = "B0" + "".join(rng.choices(alphabet, k=8))
        if asin not in seen:
            seen.add(asin)
            out.append(asin)
    return out


def generate_catalog(num_products: int, seed: int, **level: float) -> list[Product]:
    """`num_products` products, the same for the same seed and level (`Level`'s other fields)."""
    if num_products < 1:
        raise ValueError(f"num_products must be >= 1, got {num_products}")
    lv = Level(num_products, seed, **level)
    rng = random.Random(f"webshop-catalog/{seed}")
    specs: list[_Spec] = []
    for i in range(num_products):
        if i > 0 and rng.random() < lv.variant_fraction:
            specs.append(_variant_spec(specs[rng.randrange(i)], rng))
        else:
            specs.append(_fresh_spec(rng, lv))
    asins = _asins(num_products, rng)
    return [_render(i, asins[i], spec, rng, lv.title_attributes) for i, spec in enumerate(specs)]


# ---- goals ---------------------------------------------------------------------------

INSTRUCTION_TEMPLATES = (
    "i need {a_kind} {kind} that is {attrs}",
    "i'm looking for {a_attrs} {attrs} {kind}",
    "find me {a_attrs} {attrs} {kind}",
    "i want to buy {a_kind} {kind} which is {attrs}",
    "i am searching for {a_attrs} {attrs} {kind}",
    "show me {a_kind} {kind} that's {attrs}",
)


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _join_attrs(attrs: list[str]) -> str:
    return attrs[0] if len(attrs) == 1 else ", ".join(attrs[:-1]) + " and " + attrs[-1]


def price_upper_for(price: float, rng: random.Random) -> float:
    """WebShop's bound: the larger of 2 draws from the first 4 multiples of 10 above `price`."""
    above = [p for p in PRICE_RANGE if p > price][:4]
    return max(rng.sample(above, 2)) if len(above) >= 2 else NO_PRICE_BOUND


@functools.lru_cache(maxsize=8)
def _target_order(num_products: int, seed: int, lap: int) -> tuple[int, ...]:
    order = list(range(num_products))
    random.Random(f"webshop-targets/{seed}/{lap}").shuffle(order)
    return tuple(order)


def goal_target(index: int, num_products: int, seed: int) -> int:
    """The target product of goal `index`: a seeded walk over all products, then repeat."""
    lap, pos = divmod(index, num_products)
    return _target_order(num_products, seed, lap)[pos]


def make_goal(product: Product, index: int, seed: int) -> Goal:
    """Goal `index` for `product`: 2-3 of its attributes, one value per option, a price bound."""
    rng = random.Random(f"webshop-goal/{seed}/{index}")
    n = len(product.attributes)
    attrs = rng.sample(product.attributes, rng.randint(min(2, n), min(3, n)))
    options = {name: rng.choice(values) for name, values in sorted(product.options.items())}
    price_upper = price_upper_for(product.price, rng)
    kind, attr_text = product.query, _join_attrs(attrs)
    template = rng.choice(INSTRUCTION_TEMPLATES)
    text = template.format(kind=kind, attrs=attr_text, a_kind=_article(kind), a_attrs=_article(attr_text))
    if options:
        text += " with " + ", and ".join(f"{k}: {v}" for k, v in options.items())
    if price_upper < NO_PRICE_BOUND:
        text += f", and price lower than {price_upper:.2f} dollars"
    return Goal(
        index=index,
        asin=product.asin,
        product_index=product.index,
        category=product.category,
        query=product.query,
        product_category=product.product_category,
        nouns=product.nouns,
        name=product.title,
        attributes=tuple(attrs),
        options=options,
        price_upper=price_upper,
        instruction_text=text,
    )


# ---- reviews (rendered on demand: only the Reviews page shows them) -------------------

_REVIEWS = (
    ("Works as described", 5, "Exactly what the listing says. Would buy again."),
    ("Good value", 4, "Does the job for the price; shipping took a while."),
    ("Not for me", 2, "It was fine, but not what I expected from the photos."),
    ("Love it", 5, "My second one already, and it still holds up well."),
    ("Okay", 3, "Average quality. Nothing special, nothing wrong."),
)


def product_reviews(product: Product) -> list[tuple[str, int, str]]:
    """0-3 (title, stars, body) reviews, fixed per product."""
    rng = random.Random(f"webshop-reviews/{product.asin}")
    return rng.sample(_REVIEWS, rng.randint(0, 3))


# ---- search ---------------------------------------------------------------------------

SEARCH_RETURN_N = 50  # WebShop returns at most 50 results


def _stem(word: str) -> str:
    """A light plural stemmer ('shoes' -> 'shoe', 'batteries' -> 'battery')."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def search_text(product: Product) -> str:
    """What the index sees, as in WebShop: title, description, first bullet, options."""
    options = ", and ".join(f"{k}: {', '.join(v)}" for k, v in product.options.items())
    return " ".join([product.title, product.description, product.bullets[0], options])


class SearchIndex:
    """BM25 (`bm25s`, Lucene scoring) over the catalog, standing in for WebShop's pyserini index."""

    def __init__(self, products: list[Product]):
        self._tokenizer = bm25s.tokenization.Tokenizer(stopwords="en", stemmer=_stem)
        corpus = self._tokenizer.tokenize([search_text(p) for p in products], return_as="tuple", show_progress=False)
        self._bm25 = bm25s.BM25()
        self._bm25.index(corpus, show_progress=False)
        self._num_docs = len(products)

    def save(self, path: str) -> None:
        """Write the index and its vocabulary to the directory `path` (`SearchIndex.load` reads them)."""
        self._bm25.save(path, show_progress=False)
        self._tokenizer.save_vocab(path)

    @classmethod
    def load(cls, path: str, num_docs: int) -> SearchIndex:
        index = cls.__new__(cls)
        index._tokenizer = bm25s.tokenization.Tokenizer(stopwords="en", stemmer=_stem)
        index._tokenizer.load_vocab(path)
        index._bm25 = bm25s.BM25.load(path, show_progress=False)
        index._num_docs = num_docs
        return index

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        """Indices of the best `k` products with a positive score, best first (ties: lower index)."""
        ids = self._tokenizer.tokenize([query], update_vocab=False, return_as="ids", show_progress=False)[0]
        if not ids:
            return []
        scores = self._bm25.get_scores_from_ids(ids)  # (num_docs,)
        k = min(k, self._num_docs)
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.lexsort((top, -scores[top]))]
        return [int(i) for i in top if scores[i] > 0]
