"""What can a WebShop results page decide? Choice rules and how often their item can win, on TRAINING goals.

    .venv/bin/python benchmarks/webshop_ceiling.py --config configs/webshop_cpu.yaml
    .venv/bin/python benchmarks/webshop_ceiling.py --config configs/webshop_cpu.yaml env.webshop.page_size=10

No model: for `--goals` train goals of the generated shop (drawn with `--seed`), search the
goal's own words (as the expert does) and pick an item from the first results page by a
rule that reads only what a shopper sees. A pick "can win" when buying it with the goal's
options scores 1 (`best_score`, the expert's test). Rules, from least to most read:

  first listed            the top result
  best title and price    of the items priced under the goal's bound, the one whose title
                          names the most goal attributes (ties: the higher listed)
  ... and options         the same among those that also offer the goal's option values
                          (which only its item page shows)
  any listed can win      some item on the page can (the page's ceiling)

and the page-reading expert (`env.webshop.expert=reader`, the warm start's demonstrator when
set) played out: it opens items in the "best title and price" order and buys the first whose
page offers the goal's options, so it should win about "... and options", less what
`max_steps` cuts short.

"best title and price" is about the best a policy reading only the results page can do; the
gap from it to "any listed" is what reading item pages (features, options) is worth, and a
policy that does not compare titles sits near "first listed". No eval split is read.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import replace

from rspo.config import load_config
from rspo.envs.webshop import WebshopEnv, best_score, expert_query, offers, reading_order
from rspo.stats import wilson

RULES = ("first listed", "best title and price", "... and options", "any listed can win")
PLAYED = "the reader expert, played"  # env.webshop.expert=reader, a whole episode within max_steps


def picks(env: WebshopEnv) -> dict[str, bool]:
    """Each rule's verdict on the current results page: can its pick win?"""
    shop, goal, listed = env.shop, env.goal, env.session.listed()
    can = {i: best_score(shop.products[i], goal) == 1.0 for i in listed}
    order = reading_order(shop, goal, listed)  # under the price, the best-named titles first
    offering = [i for i in order if offers(shop.products[i], goal)]
    return {
        "first listed": bool(listed) and can[listed[0]],
        "best title and price": bool(order) and can[order[0]],
        "... and options": bool(offering) and can[offering[0]],
        "any listed can win": any(can.values()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/webshop_cpu.yaml")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    ap.add_argument("--goals", type=int, default=400, help="train goals drawn")
    ap.add_argument("--seed", type=int, default=777, help="seed of the goals drawn")
    args = ap.parse_args()
    cfg = load_config(args.config, args.overrides)
    env, reader = WebshopEnv(cfg.env.webshop), WebshopEnv(replace(cfg.env.webshop, expert="reader"))
    rng = random.Random(args.seed)
    wins = dict.fromkeys([*RULES, PLAYED], 0)
    for _ in range(args.goals):
        index = rng.randrange(env.num_tasks("train"))
        env.reset("train", index)
        env.step(f"search[{expert_query(env.goal)}]")
        for rule, won in picks(env).items():
            wins[rule] += won
        state = reader.reset("train", index)
        while not state.done:
            state = reader.step(reader.expert_action())
        wins[PLAYED] += state.won
    print(f"{args.goals} train goals, page 1 of the goal's own search ({cfg.env.webshop.page_size} a page):")
    for rule in [*RULES, PLAYED]:
        lo, hi = wilson(wins[rule], args.goals)
        print(f"  {rule:30s} {wins[rule] / args.goals:.3f} [{lo:.3f}, {hi:.3f}]")


if __name__ == "__main__":
    main()
