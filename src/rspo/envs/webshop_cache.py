"""A WebShop level's shop (catalog and search index), generated once into the rspo cache.

As ALFWorld's generated games are: `$RSPO_CACHE/webshop/v<VERSION>-<Level.name()>/`
(default `~/.cache/rspo/webshop/...`) holds `catalog.json` (the products) and the BM25
index with its vocabulary, written under a lock to a temporary directory and renamed
into place, so concurrent env workers generate a level once and never read half of one.
A level's name holds every setting the catalog depends on; `VERSION` changes whenever
the generator's output does, so an old cache is never read for a new catalog.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rspo.config import WebshopConfig, cache_dir
from rspo.envs.webshop_catalog import Level, Product, SearchIndex, generate_catalog

VERSION = 1  # 1: descriptions stripped, difficulty levels


@dataclass(frozen=True)
class Shop:
    """The catalog and its search index; shared by every env of the same level."""

    products: list[Product]
    index: SearchIndex
    by_asin: dict[str, int]  # lower-case ASIN -> product index


def level_of(cfg: WebshopConfig) -> Level:
    """The catalog settings of an env config (`env.webshop.*`)."""
    return Level(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(Level)})  # same names


def level_dir(level: Level) -> Path:
    return cache_dir() / "webshop" / f"v{VERSION}-{level.name()}"


def _product(d: dict) -> Product:
    """A product read back from catalog.json (JSON lists back to tuples)."""
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return Product(**{**d, "options": {name: tuple(vs) for name, vs in d["options"].items()}})


def _write(level: Level, root: Path) -> None:
    """Generate `level` into `root` (which must not exist yet)."""
    products = generate_catalog(**dataclasses.asdict(level))
    tmp = root.parent / f".tmp-{root.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    SearchIndex(products).save(str(tmp / "index"))
    (tmp / "catalog.json").write_text(json.dumps([dataclasses.asdict(p) for p in products]))
    tmp.rename(root)


@functools.lru_cache(maxsize=4)
def load_level(level: Level) -> Shop:
    """The shop of `level`: read from the cache, generated into it first if absent. Once per process."""
    root = level_dir(level)
    if not (root / "catalog.json").exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        with open(root.parent / f".lock-{root.name}", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # other workers wait here, then find it written
            if not root.exists():
                _write(level, root)
    try:
        products = [_product(d) for d in json.loads((root / "catalog.json").read_text())]
        index = SearchIndex.load(str(root / "index"), len(products))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"corrupt WebShop cache {root}: {e}; delete the directory to regenerate it") from None
    return Shop(products, index, {p.asin.lower(): p.index for p in products})


def load_shop(num_products: int, seed: int, **level: float) -> Shop:
    """The shop of (num_products, seed) at the level given by `Level`'s other fields (default: the original's)."""
    return load_level(Level(num_products, seed, **level))
