"""The product types the generated WebShop catalog draws from (pure data).

Each type has a category path, a pool of attributes (a product gets 2-4 of them), option
pools, a price range, title descriptors and filler sentences. Pools are chosen so that no
two attributes of a type, and no two of its option values (any options) after colour
normalisation, fuzzy-match each other (rounded token-set ratio <= 85): a distractor that
lacks the goal's attribute or colour then really scores lower. `tests/test_webshop.py`
checks this. Matching is WebShop's (see `webshop_reward`): option values are compared fuzzily whatever
their name, so size pools avoid numbers that share a unit and differ in one digit
('2 fl oz' / '8 fl oz' score 86) or that contain one another ('large' / 'x-large': 100).

Titles are `<Brand> <Descriptor> <Type>, <Attribute>`, all title-cased. Their nouns (for
r_type) are known by construction: every title word except `NOT_NOUNS`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProductType:
    name: str  # the query / product type; its words are title nouns, e.g. 'hair dryer'
    category: str
    path: str  # category path below the category root
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (option name, value pool)
    price: tuple[float, float]
    descriptors: tuple[str, ...]  # adjectives for titles
    blurbs: tuple[str, ...]  # neutral filler sentences for description and bullets


# Title words that are not nouns. WebShop's r_type counts the NOUN/PROPN tokens of a spaCy
# parse of the title; spaCy tags title-cased product names almost entirely PROPN or NOUN
# (descriptors and attributes included: "Solid Wood"), so every other title word counts.
NOT_NOUNS = frozenset({"and", "up", "two"})  # 'plug and play', 'lace up', 'two drawer'

MAX_OPTION_TYPES = 2  # the most option types (colour, size, ...) any product type has

CATEGORY_ROOTS = {
    "beauty": "Beauty & Personal Care",
    "food": "Grocery & Gourmet Food",
    "fashion": "Clothing, Shoes & Jewelry",
    "furniture": "Home & Kitchen",
    "electronics": "Electronics",
}

BRANDS = {
    "beauty": ("Velora", "Lumiere", "Aveyla", "Dermique", "Sorelle", "Pura Bloom", "Kinsa", "Maison Elle"),
    "food": ("Harvest Lane", "Good Acre", "Nutrevo", "Bramble Co", "Sunfield", "Kettle Ridge", "Oaklore", "Mesa"),
    "fashion": ("Northway", "Kestrel", "Amberline", "Urban Fjord", "Solvi", "Trailmark", "Corvo", "Lune"),
    "furniture": ("Oakhaven", "Nordic Nest", "Hearthwood", "Lindell", "Casa Moda", "Birchline", "Alder", "Ferro"),
    "electronics": ("Voltix", "Auralink", "Nexon", "Zentra", "Pulsar", "Orbitel", "Kiro", "Synapse"),
}

COLORS = (
    "black",
    "white",
    "navy blue",
    "wine red",
    "olive green",
    "light pink",
    "charcoal grey",
    "beige",
    "brown",
    "purple",
    "gold",
    "silver",
    "mustard yellow",
    "teal",
    "ivory",
)
CLOTHING_SIZES = ("small", "medium", "large", "xl", "xxl")
SHOE_SIZES = ("6", "7", "8", "9", "10", "11", "12", "13")
VOLUMES = ("3.4 fl oz", "8 fl oz", "16 fl oz", "32 fl oz")
COUNTS = ("6 count", "12 count", "30 count", "48 count")
WEIGHTS = ("8 ounce", "12 ounce", "2 pound")
SCENTS = ("lavender", "unscented", "eucalyptus", "citrus", "sandalwood", "coconut", "jasmine")
LENGTHS = ("3 ft", "6 ft", "10 ft", "15 ft")

_BEAUTY = (
    "Gentle enough for daily routines.",
    "A favorite of stylists and beginners alike.",
    "Packaged in a recyclable container.",
    "Formulated and checked in small batches.",
)
_FOOD = (
    "A pantry staple for busy weeks.",
    "Enjoy it at home, at work or on the trail.",
    "Packed fresh and shipped quickly.",
    "Made by a family business since the nineties.",
)
_FASHION = (
    "Pairs well with jeans, shorts or joggers.",
    "Cut for an easy, everyday feel.",
    "A wardrobe basic for every season.",
    "Sewn with durable stitching.",
)
_FURNITURE = (
    "Fits apartments, dorms and offices.",
    "Clean lines suit many interiors.",
    "Ships flat with every tool included.",
    "Sturdy enough for years of use.",
)
_ELECTRONICS = (
    "Works with most phones, tablets and laptops.",
    "Comes with a one year warranty.",
    "A useful gift for commuters and students.",
    "Simple setup in a few minutes.",
)


def _t(name, category, path, attributes, options, price, descriptors, blurbs) -> ProductType:
    return ProductType(name, category, path, tuple(attributes), tuple(options), price, tuple(descriptors), blurbs)


PRODUCT_TYPES: tuple[ProductType, ...] = (
    # ---- beauty
    _t(
        "shampoo",
        "beauty",
        "Hair Care › Shampoo & Conditioner › Shampoos",
        ["sulfate free", "paraben free", "hair growth", "dry hair", "natural ingredients", "cruelty free"],
        [("scent", SCENTS), ("size", VOLUMES)],
        (6, 30),
        ["Moisturizing", "Clarifying", "Volumizing"],
        _BEAUTY,
    ),
    _t(
        "hair dryer",
        "beauty",
        "Hair Care › Styling Tools › Hair Dryers",
        ["fast drying", "low noise", "travel size", "ionic technology", "dry hair"],
        [("color", COLORS)],
        (20, 90),
        ["Professional", "Compact", "Salon Grade"],
        _BEAUTY,
    ),
    _t(
        "lipstick",
        "beauty",
        "Makeup › Lips › Lipstick",
        ["long lasting", "cruelty free", "paraben free", "highly pigmented", "vegan formula"],
        [("color", COLORS)],
        (5, 25),
        ["Matte", "Satin", "Velvet"],
        _BEAUTY,
    ),
    _t(
        "face moisturizer",
        "beauty",
        "Skin Care › Face › Moisturizers",
        ["sensitive skin", "dry skin", "oil free", "fragrance free", "hyaluronic acid", "anti aging"],
        [("size", VOLUMES)],
        (10, 60),
        ["Daily", "Overnight", "Hydrating"],
        _BEAUTY,
    ),
    _t(
        "nail polish",
        "beauty",
        "Makeup › Nails › Nail Polish",
        ["long lasting", "quick dry", "cruelty free", "non toxic", "chip resistant"],
        [("color", COLORS)],
        (4, 18),
        ["Glossy", "Gel Effect", "Classic"],
        _BEAUTY,
    ),
    _t(
        "body wash",
        "beauty",
        "Bath & Body › Cleansers › Body Wash",
        ["sensitive skin", "paraben free", "dry skin", "natural ingredients", "sulfate free"],
        [("scent", SCENTS), ("size", VOLUMES)],
        (5, 25),
        ["Creamy", "Refreshing", "Soothing"],
        _BEAUTY,
    ),
    # ---- food
    _t(
        "protein bar",
        "food",
        "Snack Foods › Bars › Protein Bars",
        ["gluten free", "low sugar", "high protein", "keto friendly", "non gmo", "individually wrapped"],
        [
            ("flavor", ("vanilla", "chocolate chip", "peanut butter", "strawberry", "cinnamon", "cookies and cream")),
            ("size", COUNTS),
        ],
        (12, 45),
        ["Chewy", "Crunchy", "Plant Based"],
        _FOOD,
    ),
    _t(
        "coffee beans",
        "food",
        "Beverages › Coffee › Whole Coffee Beans",
        ["fair trade", "usda organic", "single origin", "low acid", "dark roast", "non gmo"],
        [("flavor", ("hazelnut", "french vanilla", "original", "mocha", "caramel")), ("size", WEIGHTS)],
        (9, 40),
        ["Artisan", "Small Batch", "Bold"],
        _FOOD,
    ),
    _t(
        "green tea",
        "food",
        "Beverages › Tea › Green Tea",
        ["usda organic", "non gmo", "gluten free", "caffeine free", "individually wrapped"],
        [
            ("flavor", ("jasmine", "peppermint", "lemon ginger", "honey", "matcha", "original")),
            ("size", ("16 count", "40 count", "100 count")),
        ],
        (5, 25),
        ["Premium", "Loose Leaf Style", "Calming"],
        _FOOD,
    ),
    _t(
        "mixed nuts",
        "food",
        "Snack Foods › Nuts & Seeds › Mixed Nuts",
        ["gluten free", "non gmo", "high protein", "low sodium", "resealable bag", "kosher certified"],
        [("flavor", ("sea salt", "honey roasted", "unsalted", "smoked", "chili lime")), ("size", WEIGHTS)],
        (8, 35),
        ["Roasted", "Deluxe", "Savory"],
        _FOOD,
    ),
    _t(
        "olive oil",
        "food",
        "Pantry Staples › Cooking Oils › Olive Oil",
        ["extra virgin", "cold pressed", "usda organic", "non gmo", "glass bottle"],
        [("size", ("250 ml", "500 ml", "1 liter"))],
        (8, 40),
        ["Mediterranean", "Estate", "Robust"],
        _FOOD,
    ),
    _t(
        "chocolate bar",
        "food",
        "Snack Foods › Candy & Chocolate › Chocolate Bars",
        ["dairy free", "fair trade", "low sugar", "gluten free", "individually wrapped", "non gmo"],
        [("flavor", ("sea salt", "mint", "almond", "raspberry", "caramel", "espresso")), ("size", COUNTS)],
        (6, 30),
        ["Dark", "Creamy", "Gourmet"],
        _FOOD,
    ),
    # ---- fashion
    _t(
        "polo shirt",
        "fashion",
        "Men › Clothing › Shirts › Polos",
        ["machine wash", "slim fit", "short sleeve", "long sleeve", "moisture wicking", "button closure"],
        [("color", COLORS), ("size", CLOTHING_SIZES)],
        (12, 40),
        ["Classic", "Performance", "Pique"],
        _FASHION,
    ),
    _t(
        "running shoes",
        "fashion",
        "Men › Shoes › Athletic › Running",
        ["rubber sole", "lace up", "non slip", "arch support", "breathable mesh", "cushioned footbed"],
        [("color", COLORS), ("size", SHOE_SIZES)],
        (30, 120),
        ["Lightweight", "Trail", "Road"],
        _FASHION,
    ),
    _t(
        "yoga pants",
        "fashion",
        "Women › Clothing › Active › Yoga Pants",
        ["high waist", "tummy control", "moisture wicking", "machine wash", "elastic waistband"],
        [("color", COLORS), ("size", CLOTHING_SIZES)],
        (15, 45),
        ["Stretchy", "Seamless", "Flared"],
        _FASHION,
    ),
    _t(
        "rain jacket",
        "fashion",
        "Women › Clothing › Coats & Jackets › Rain Jackets",
        ["water resistant", "zipper closure", "adjustable hood", "machine wash", "quick drying"],
        [("color", COLORS), ("size", CLOTHING_SIZES)],
        (30, 120),
        ["Packable", "Hooded", "Windproof"],
        _FASHION,
    ),
    _t(
        "crew socks",
        "fashion",
        "Men › Clothing › Socks › Athletic Socks",
        ["moisture wicking", "arch support", "machine wash", "cotton spandex", "cushioned footbed"],
        [("color", COLORS), ("size", CLOTHING_SIZES)],
        (8, 25),
        ["Athletic", "Everyday", "Ribbed"],
        _FASHION,
    ),
    _t(
        "sunglasses",
        "fashion",
        "Women › Accessories › Sunglasses & Eyewear",
        ["uv protection", "polarized lens", "scratch resistant", "lightweight frame"],
        [("color", COLORS)],
        (10, 60),
        ["Oversized", "Retro", "Aviator"],
        _FASHION,
    ),
    # ---- furniture
    _t(
        "coffee table",
        "furniture",
        "Furniture › Living Room Furniture › Tables › Coffee Tables",
        ["easy assemble", "solid wood", "storage space", "living room", "mid century", "metal legs"],
        [("color", COLORS)],
        (50, 250),
        ["Modern", "Rustic", "Lift Top"],
        _FURNITURE,
    ),
    _t(
        "bookshelf",
        "furniture",
        "Furniture › Home Office Furniture › Bookcases",
        ["easy assemble", "storage space", "solid wood", "engineered wood", "wall mounted"],
        [("color", COLORS), ("size", ("3 tier", "4 tier", "5 tier"))],
        (40, 200),
        ["Open", "Ladder", "Industrial"],
        _FURNITURE,
    ),
    _t(
        "office chair",
        "furniture",
        "Furniture › Home Office Furniture › Home Office Chairs",
        ["lumbar support", "adjustable height", "easy assemble", "heavy duty", "breathable mesh", "padded armrests"],
        [("color", COLORS)],
        (60, 300),
        ["Ergonomic", "Executive", "Task"],
        _FURNITURE,
    ),
    _t(
        "bar stool",
        "furniture",
        "Furniture › Kitchen & Dining Room Furniture › Bar Stools",
        ["easy assemble", "metal legs", "swivel seat", "pu leather", "counter height"],
        [("color", COLORS), ("size", ("18 inch", "24 inch", "30 inch"))],
        (40, 180),
        ["Modern", "Farmhouse", "Backless"],
        _FURNITURE,
    ),
    _t(
        "nightstand",
        "furniture",
        "Furniture › Bedroom Furniture › Nightstands",
        ["easy assemble", "storage space", "solid wood", "soft close", "mid century"],
        [("color", COLORS)],
        (40, 160),
        ["Compact", "Two Drawer", "Floating"],
        _FURNITURE,
    ),
    _t(
        "tv stand",
        "furniture",
        "Furniture › Living Room Furniture › TV Stands",
        ["storage space", "easy assemble", "cable management", "engineered wood", "living room"],
        [("color", COLORS), ("size", ("43 inch", "55 inch", "70 inch"))],
        (60, 280),
        ["Low Profile", "Farmhouse", "Corner"],
        _FURNITURE,
    ),
    # ---- electronics
    _t(
        "wireless earbuds",
        "electronics",
        "Headphones, Earbuds & Accessories › Earbuds",
        ["noise cancelling", "fast charging", "water resistant", "long battery life", "touch control"],
        [("color", COLORS)],
        (20, 150),
        ["True Wireless", "Sport", "Compact"],
        _ELECTRONICS,
    ),
    _t(
        "wall charger",
        "electronics",
        "Cell Phones & Accessories › Chargers › Wall Chargers",
        ["fast charging", "overheat protection", "compact design", "dual port"],
        [("color", COLORS), ("length", LENGTHS)],
        (10, 45),
        ["Foldable", "Travel", "Rapid"],
        _ELECTRONICS,
    ),
    _t(
        "portable speaker",
        "electronics",
        "Portable Audio & Video › Portable Speakers",
        ["water resistant", "long battery life", "stereo sound", "hands free"],
        [("color", COLORS)],
        (25, 150),
        ["Rugged", "Mini", "Outdoor"],
        _ELECTRONICS,
    ),
    _t(
        "gaming mouse",
        "electronics",
        "Computers & Accessories › Computer Accessories › Mice",
        ["plug and play", "ergonomic design", "rgb lighting", "programmable buttons", "high precision"],
        [("color", COLORS)],
        (15, 90),
        ["Wired", "Ultralight", "Pro"],
        _ELECTRONICS,
    ),
    _t(
        "hdmi cable",
        "electronics",
        "Accessories & Supplies › Audio & Video Accessories › HDMI Cables",
        ["high speed", "gold plated", "braided nylon", "ultra hd", "plug and play"],
        [("length", LENGTHS)],
        (6, 30),
        ["Premium", "Slim", "Flexible"],
        _ELECTRONICS,
    ),
    _t(
        "power bank",
        "electronics",
        "Cell Phones & Accessories › Chargers › Portable Power Banks",
        ["fast charging", "led display", "compact design", "high capacity", "wireless charging"],
        [("color", COLORS), ("size", ("5000mah", "13400mah", "26800mah"))],
        (18, 80),
        ["Slim", "Rugged", "Magnetic"],
        _ELECTRONICS,
    ),
)
