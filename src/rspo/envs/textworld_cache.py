"""Parse each TextWorld text once per process: ALFWorld's engine, unchanged, several times faster.

TextWorld's PDDL engine (ALFWorld's) spends most of its time re-parsing the same text
with a PEG parser written in Python (tatsu) and re-translating the same PDDL:
  - every step renders the feedback and each admissible command by deriving grammar
    templates: the template text (`textworld.envs.pddl.textgen`) and each rule's
    condition (`textworld.logic`, `Rule.parse_conjunctive_query`) are parsed anew;
  - every `load` parses the game's grammar (`textworld.envs.pddl.logic`);
  - every `load` and every `reset` translates the game's PDDL problem to SAS twice
    (`fast_downward.pddl2sas`, once optimized for the planner).
Each of these is a pure function of its arguments (text and flags). `install()` memoizes
them in the calling process (an env worker), so each text is parsed once: on 40
generated games, resets and 8 steps each took 2.6x less time, with every observation,
admissible list, reward and expert action identical (tests/test_textworld_cache.py).

Parsed objects are deep-copied on the way out, because the engine writes into what a
parse returns (a derivation sets each symbol's context): every caller gets a fresh
object, as from a parse. The SAS translation returns a string and a
task the engine only reads, so those are shared. Each cache holds at most `MAX_ENTRIES`
texts (least recently used out first): a few hundred templates and rules, and per game
loaded its grammar and its PDDL problem (two translations), about 0.6 MB a game: up to
~300 MB a worker process once 512 games were played, enough that the eval games, the same
at every eval, are still cached at the next one (a new game's load and reset took 84 ms,
a cached one's 11 ms).
"""

from __future__ import annotations

import copy
import functools

MAX_ENTRIES = 1024
_originals: dict[tuple[object, str], object] = {}  # (module, name) -> the function memoized


def memoized(fn, copier=copy.deepcopy, maxsize: int = MAX_ENTRIES):
    """`fn` with its results cached by arguments; each call returns `copier(result)`."""
    cached = functools.lru_cache(maxsize=maxsize)(lambda args, kwargs: fn(*args, **dict(kwargs)))

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return copier(cached(args, tuple(sorted(kwargs.items()))))

    wrapper.cache_info = cached.cache_info
    return wrapper


def _targets() -> list[tuple[object, str, object]]:
    """(module, function name, copier) of everything memoized."""
    import fast_downward
    import textworld.envs.pddl.logic as pddl_logic
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as logic

    parsers = [(module, "_parse_and_convert", copy.deepcopy) for module in (textgen, pddl_logic, logic)]
    return [*parsers, (fast_downward, "pddl2sas", lambda result: result)]


def install() -> None:
    """Memoize TextWorld's parsers and the PDDL-to-SAS translation in this process (once)."""
    for module, name, copier in _targets():
        if (module, name) not in _originals:
            _originals[module, name] = getattr(module, name)
            setattr(module, name, memoized(getattr(module, name), copier))


def uninstall() -> None:
    """Put the original functions back (tests compare the engine with and without)."""
    for (module, name), original in _originals.items():
        setattr(module, name, original)
    _originals.clear()
