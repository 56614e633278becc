r"""WebShop (text mode) over a generated catalog, behind the `TextEnv` interface.

Pages, text and actions follow the real WebShop's text mode (`web_agent_site`'s templates,
in the version whose text reads `Page 1 (Total results: N)` and `< Prev` on sub-pages):

    start    WebShop [SEP] Instruction: [SEP] <goal> [SEP] Search
    results  Instruction: [SEP] <goal> [SEP] Back to Search [SEP] Page 1 (Total results: N)
             [SEP] Next > [SEP] <ASIN> [SEP] <Title> [SEP] <price> ...
    item     Instruction: [SEP] <goal> [SEP] Back to Search [SEP] < Prev [SEP] <option name>
             [SEP] <value> ... [SEP] <Title> [SEP] Price: <price> [SEP] Rating: <r>
             [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now
    sub-page Instruction: [SEP] <goal> [SEP] Back to Search [SEP] < Prev [SEP] <text> ...
    done     Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] (Paste it in
             your MTurk interface.) [SEP] Your score (min 0.0, max 1.0) [SEP] <score>

As in those templates, `Next >` is on every results page (past the last one the listing
is empty), `< Prev` from page 2 on; an empty description, feature list or review list
shows nothing; the done page shows what a browser shows (the template's hidden blocks, the
purchased/target/goal fields and "Reward Details", which WebShop's text mode prints, are left
out: the page ends the episode, so no policy acts on it; the MTurk code is `None` in WebShop too).

Actions, as WebShop's text env reads them: `re.match(r"(.+)\[(.+)\]")` on the raw action
(a prefix match, greedy: `click[x] more` is `click[x]`, `search[a [b]]` is not a
search), the name exactly `search` or `click` (case and spaces count), the argument
lower-cased. `search[...]` works on every page, as in WebShop's `step` (the admissible
list offers it on the start page only, where the page has a search bar); `click[x]` when
x is a clickable of the current page; anything else is a no-op (valid=False, reward 0).
Only `buy now` ends an episode early; `max_steps` steps (valid or not) end it too. As in
WebShop the item page does not show which options are selected.

Rewards. outcome: on the purchase step, the score (`outcome=score`) or 1 when the score
is 1 (`outcome=success`). process: a potential difference Φ(s') − Φ(s), where
Φ(s) = the score the viewed item with the selected options would get if bought now, on
an item page or its Description/Features/Reviews sub-pages (the item stays in the
session there), and 0 on the start and results pages. The terminal state's Φ is the
episode's score (0 when the step cap ends it unbought), so the process rewards of an
episode always sum to its final score.

Known departures from the original (`benchmarks/webshop_agreement.py` measures the reward's):
- reward: see `webshop_reward` (title nouns by construction instead of spaCy; goal option
  values instead of WebShop's `(name, value)` pairs for dict goals; rapidfuzz's ratio for
  thefuzz 0.19's difflib one; no Latin-1 stripping);
- pages: one [SEP] per visible text element of the template (no empty segments for the
  whitespace between tags); the done page without its hidden blocks; later template
  versions (`Page 1 (1-10) of N total results`, `< Back to Item Page`, `No Description`)
  are not followed;
- the catalog, search engine (BM25 over `search_text`, not pyserini) and goals are rspo's
  own (`webshop_catalog`).

With `env.webshop.backend=real`, `rspo.envs.make_env` builds `webshop_real.RealWebshopEnv`
instead, which drives princeton-nlp's own `WebAgentTextEnv` (when installed) through the same
interface.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rspo.config import WebshopConfig
from rspo.envs.base import EnvState, TextEnv
from rspo.envs.webshop_cache import Shop, level_of, load_level
from rspo.envs.webshop_catalog import Goal, Product, goal_target, make_goal, product_reviews
from rspo.envs.webshop_reward import get_reward, option_matches

SEP = " [SEP] "
PAGE_SIZE = 10  # results per page (WebShop's; `env.webshop.page_size`)
SUB_PAGES = ("description", "features", "reviews")
SEARCH_PLACEHOLDER = "search[...]"
SPLITS = ("train", "test")
_ACTION = re.compile(r"(.+)\[(.+)\]")  # WebShop's engine.parse_action, used with re.match
VERBS = ("search", "click")
DONE_PAGE = ("Thank you for shopping with us!", "Your code:", "None", "(Paste it in your MTurk interface.)")


@dataclass
class Session:
    """Where the shopper is: the page, the last search's results and the viewed item."""

    page: str = "start"  # start | results | item | description | features | reviews | done
    results: list[int] = field(default_factory=list)  # product indices, best first
    page_no: int = 1
    item: int | None = None  # viewed product
    options: dict[str, str] = field(default_factory=dict)  # option name -> selected value
    page_size: int = PAGE_SIZE
    opened: list[int] = field(default_factory=list)  # items whose pages this episode opened, in order

    def listed(self) -> list[int]:
        return self.results[(self.page_no - 1) * self.page_size : self.page_no * self.page_size]


def parse_action(action: object) -> tuple[str, str] | None:
    """'click[Buy Now]' -> ('click', 'buy now'); None when it is not a search or a click."""
    m = _ACTION.match(action) if isinstance(action, str) else None
    return (m.group(1), m.group(2).lower()) if m and m.group(1) in VERBS else None


# ---- pages ------------------------------------------------------------------------------


def render(shop: Shop, s: Session, instruction: str, score: float = 0.0) -> str:
    """The text-mode observation of the session's page."""
    if s.page == "start":
        return SEP.join(["WebShop", "Instruction:", instruction, "Search"])
    if s.page == "done":
        return SEP.join([*DONE_PAGE, "Your score (min 0.0, max 1.0)", str(score)])
    head = ["Instruction:", instruction, "Back to Search"]
    if s.page == "results":
        head.append(f"Page {s.page_no} (Total results: {len(s.results)})")
        head += ["< Prev"] * (s.page_no > 1) + ["Next >"]
        for i in s.listed():
            p = shop.products[i]
            head += [p.asin, p.title, p.price_text]
        return SEP.join(head)
    p = shop.products[s.item]
    head.append("< Prev")
    if s.page == "item":
        for name, values in p.options.items():
            head += [name, *values]
        head += [p.title, f"Price: {p.price_text}", f"Rating: {p.rating}", "Description", "Features", "Reviews"]
        return SEP.join(head + ["Buy Now"])
    if s.page == "description":
        return SEP.join(head + [p.description] * bool(p.description))
    if s.page == "features":
        return SEP.join(head + list(p.bullets))
    reviews = [x for title, stars, body in product_reviews(p) for x in (f'"{title}"', str(stars), body)]
    return SEP.join(head + reviews)


def clickables(shop: Shop, s: Session) -> list[str]:
    """The page's clickable texts, lower-cased, in WebShop's order (its `get_available_actions`:
    the buttons in page order, then the product links, then the option values)."""
    if s.page in ("start", "done"):
        return []
    if s.page == "results":
        nav = ["< prev"] * (s.page_no > 1) + ["next >"]
        return ["back to search", *nav, *(shop.products[i].asin.lower() for i in s.listed())]
    if s.page == "item":
        values = [v for vs in shop.products[s.item].options.values() for v in vs]
        return ["back to search", "< prev", *SUB_PAGES, "buy now", *values]
    return ["back to search", "< prev"]


def click(shop: Shop, s: Session, target: str) -> None:
    """Apply a click on `target` (a clickable of the page) to the session."""
    if target == "back to search":
        s.page, s.results, s.item, s.options = "start", [], None, {}
    elif s.page == "results":
        if target in ("< prev", "next >"):
            s.page_no += 1 if target == "next >" else -1
        else:
            s.page, s.item, s.options = "item", shop.by_asin[target], {}
            s.opened.append(s.item)
    elif s.page == "item" and target == "< prev":
        s.page, s.item, s.options = "results", None, {}
    elif s.page == "item" and target in SUB_PAGES:
        s.page = target
    elif s.page == "item":  # an option value
        names = {v: name for name, vs in shop.products[s.item].options.items() for v in vs}
        s.options[names[target]] = target
    else:  # '< prev' on a sub-page
        s.page = "item"


# ---- the environment ---------------------------------------------------------------------


class WebshopEnv(TextEnv):
    """WebShop over a generated catalog; splits: test = goals 0..num_test_goals-1, train = the rest."""

    def __init__(self, cfg: WebshopConfig):
        if not 0 <= cfg.num_test_goals <= cfg.num_goals:
            raise ValueError(
                f"webshop: need 0 <= num_test_goals <= num_goals, got {cfg.num_test_goals}, {cfg.num_goals}"
            )
        self.cfg = cfg
        self.max_steps = cfg.max_steps
        self.shop = load_level(level_of(cfg))
        self.goal: Goal | None = None
        self.session = Session(page_size=cfg.page_size)
        self._state: EnvState | None = None
        self._steps = 0

    def num_tasks(self, split: str) -> int:
        if split not in SPLITS:
            raise ValueError(f"webshop: unknown split {split!r} (valid splits: {', '.join(SPLITS)})")
        return self.cfg.num_test_goals if split == "test" else self.cfg.num_goals - self.cfg.num_test_goals

    def make_goal(self, split: str, index: int) -> Goal:
        """Task `index` of `split` (test: goal index; train: num_test_goals + index)."""
        n = self.num_tasks(split)
        if not 0 <= index < n:
            raise IndexError(f"webshop: task {index} out of range for split {split!r} ({n} tasks)")
        goal_id = index if split == "test" else self.cfg.num_test_goals + index
        target = goal_target(goal_id, len(self.shop.products), self.cfg.seed)
        return make_goal(self.shop.products[target], goal_id, self.cfg.seed)

    def reset(self, split: str, index: int) -> EnvState:
        self.goal = self.make_goal(split, index)
        self.session = Session(page_size=self.cfg.page_size)
        self._steps = 0
        self._state = self._observe(valid=True, phi_before=0.0)
        return self._state

    def step(self, action: str) -> EnvState:
        if self._state is None:
            raise RuntimeError("webshop: call reset() before step()")
        if self._state.done:  # nothing happens after the end; the state is repeated
            return EnvState(**{**vars(self._state), "outcome": 0.0, "process": 0.0, "valid": False})
        phi_before = self._state.info["phi"]  # Φ of the current page, as observed
        self._steps += 1
        parsed = parse_action(action)
        valid = parsed is not None and self._apply(*parsed)
        self._state = self._observe(valid, phi_before)
        return self._state

    def _apply(self, verb: str, arg: str) -> bool:
        """Change the session for a well-formed action; False when it is a no-op."""
        s = self.session
        if verb == "search":  # from any page, as in WebShop's text env
            s.page, s.page_no, s.item, s.options = "results", 1, None, {}
            s.results = self.shop.index.search(arg)
            return True
        if arg not in clickables(self.shop, s):
            return False
        if arg == "buy now":
            s.page = "done"
        else:
            click(self.shop, s, arg)
        return True

    def potential(self) -> float:
        """Φ: the score of buying the viewed item with the selected options now (0 off item pages)."""
        s = self.session
        if s.item is None or s.page not in ("item", *SUB_PAGES):
            return 0.0
        return get_reward(self.shop.products[s.item], self.goal, s.options)[0]

    def _observe(self, valid: bool, phi_before: float) -> EnvState:
        s, goal = self.session, self.goal
        bought = s.page == "done"
        score, reward_info = get_reward(self.shop.products[s.item], goal, s.options) if bought else (0.0, {})
        done = bought or self._steps >= self.max_steps
        phi = score if done else self.potential()
        outcome = (score if self.cfg.outcome == "score" else float(score == 1.0)) if bought else 0.0
        text = render(self.shop, s, goal.instruction_text, score)
        admissible = [SEARCH_PLACEHOLDER] if s.page == "start" else [f"click[{c}]" for c in clickables(self.shop, s)]
        info = {"page": s.page, "goal_asin": goal.asin, "options": dict(s.options), "phi": phi, "steps": self._steps}
        if s.item is not None:
            info["asin"] = self.shop.products[s.item].asin
        if bought:
            info["reward_info"] = reward_info
        return EnvState(
            observation=text,
            admissible=admissible if not done else [],
            task=goal.instruction_text,
            task_type=goal.category,
            done=done,
            outcome=outcome,
            process=phi - phi_before,
            won=bought and score == 1.0,
            score=score,
            valid=valid,
            info=info,
        )

    def expert_action(self) -> str:
        """The expert's next action (`env.webshop.expert`); '' when no episode is running (never raises)."""
        if self._state is None or self._state.done:
            return ""
        return EXPERTS[self.cfg.expert](self.shop, self.goal, self.session)


# ---- the rule-based expert ------------------------------------------------------------


def expert_options(product: Product, goal: Goal) -> dict[str, str]:
    """The options the expert selects: per goal option, the goal's value if offered, else a matching one."""
    chosen = {}
    for name, values in product.options.items():
        want = goal.options.get(name)
        if want is None:
            continue
        match = want if want in values else next((v for v in values if option_matches([want], [v])), None)
        if match is not None:
            chosen[name] = match
    return chosen


def best_score(product: Product, goal: Goal) -> float:
    """The score the expert can reach with `product`."""
    return get_reward(product, goal, expert_options(product, goal))[0]


def expert_query(goal: Goal) -> str:
    """The goal's words, less the price clause."""
    return goal.instruction_text.split(", and price lower than")[0]


def expert_action(shop: Shop, goal: Goal, s: Session) -> str:
    """The oracle expert (`env.webshop.expert=oracle`, the default): search with the goal's
    words; open the first listed item that can score 1 (else page on, else the best listed),
    which it knows even when the page does not show it; select the goal's options; buy. A pure
    function of the state."""
    if s.page == "start":
        return f"search[{expert_query(goal)}]"
    if s.page in SUB_PAGES:
        return "click[< prev]"
    listed = s.listed()
    scores = [best_score(shop.products[i], goal) for i in listed]
    if s.page == "results":
        if not listed:
            return "click[back to search]"
        if 1.0 not in scores and s.page_no * s.page_size < len(s.results):
            return "click[next >]"
        best = listed[scores.index(1.0)] if 1.0 in scores else listed[scores.index(max(scores))]
        return f"click[{shop.products[best].asin.lower()}]"
    product = shop.products[s.item]
    if listed and best_score(product, goal) < max(scores):
        return "click[< prev]"
    for name, value in expert_options(product, goal).items():
        if s.options.get(name) != value:
            return f"click[{value}]"
    return "click[buy now]"


def reading_order(shop: Shop, goal: Goal, listed: list[int]) -> list[int]:
    """The listed items a shopper who reads only the page and the instruction would try, in
    order: those priced under the goal's bound, the titles naming the most of the goal's
    attributes first (ties: as listed)."""
    named = {i: sum(a in shop.products[i].title.lower() for a in goal.attributes) for i in listed}
    return sorted((i for i in listed if shop.products[i].pricing[0] <= goal.price_upper), key=lambda i: -named[i])


def offers(product: Product, goal: Goal) -> bool:
    """Does the item page offer every option value the instruction asks for?"""
    return all(v in product.options.get(k, ()) for k, v in goal.options.items())


def reader_action(shop: Shop, goal: Goal, s: Session) -> str:
    """The page-reading expert (`env.webshop.expert=reader`): it acts only on what the pages
    and the instruction show, so a policy can learn each choice from its observation. Search
    the goal's words; open the first listed item in `reading_order` not opened yet; if its
    page does not offer the goal's options and another candidate is left, go back and open
    that; else select the goal's options and buy (with no candidate at all: the first listed)."""
    if s.page == "start":
        return f"search[{expert_query(goal)}]"
    if s.page in SUB_PAGES:
        return "click[< prev]"
    listed = s.listed()
    order = reading_order(shop, goal, listed)
    left = [i for i in order if i not in s.opened]
    if s.page == "results":
        if not listed:
            return "click[back to search]"
        pick = left[0] if left else (order or listed)[0]
        return f"click[{shop.products[pick].asin.lower()}]"
    product = shop.products[s.item]
    if left and not offers(product, goal):
        return "click[< prev]"
    for name, value in expert_options(product, goal).items():
        if s.options.get(name) != value:
            return f"click[{value}]"
    return "click[buy now]"


EXPERTS = {"oracle": expert_action, "reader": reader_action}  # env.webshop.expert
