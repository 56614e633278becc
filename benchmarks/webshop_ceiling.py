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

"best title and price" is about the best a policy reading only the results page can do; the
gap from it to "any listed" is what reading item pages (features, options) is worth, and a
policy that does not compare titles sits near "first listed". No eval split is read.
"""

from __future__ import annotations

import argparse
import random

from rspo.config import load_config
from rspo.envs.webshop import WebshopEnv, best_score, expert_query
from rspo.stats import wilson

RULES = ("first listed", "best title and price", "... and options", "any listed can win")


def picks(env: WebshopEnv) -> dict[str, bool]:
    """Each rule's verdict on the current results page: can its pick win?"""
    goal = env.goal
    listed = [env.shop.products[i] for i in env.session.listed()]
    can = [best_score(p, goal) == 1.0 for p in listed]
    named = [sum(a in p.title.lower() for a in goal.attributes) for p in listed]  # goal attributes a title names
    cheap = [p.pricing[0] <= goal.price_upper for p in listed]
    offers = [all(v in p.options.get(k, ()) for k, v in goal.options.items()) for p in listed]

    def best(ok: list[bool]) -> bool:
        """Can the item naming the most goal attributes among those `ok` win (ties: the first)?"""
        ranked = sorted((i for i in range(len(listed)) if ok[i]), key=lambda i: -named[i])  # stable
        return bool(ranked) and can[ranked[0]]

    return {
        "first listed": bool(can) and can[0],
        "best title and price": best(cheap),
        "... and options": best([c and o for c, o in zip(cheap, offers)]),
        "any listed can win": any(can),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/webshop_cpu.yaml")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    ap.add_argument("--goals", type=int, default=400, help="train goals drawn")
    ap.add_argument("--seed", type=int, default=777, help="seed of the goals drawn")
    args = ap.parse_args()
    cfg = load_config(args.config, args.overrides)
    env = WebshopEnv(cfg.env.webshop)
    rng = random.Random(args.seed)
    wins = dict.fromkeys(RULES, 0)
    for _ in range(args.goals):
        env.reset("train", rng.randrange(env.num_tasks("train")))
        env.step(f"search[{expert_query(env.goal)}]")
        for rule, won in picks(env).items():
            wins[rule] += won
    print(f"{args.goals} train goals, page 1 of the goal's own search ({cfg.env.webshop.page_size} a page):")
    for rule in RULES:
        lo, hi = wilson(wins[rule], args.goals)
        print(f"  {rule:30s} {wins[rule] / args.goals:.3f} [{lo:.3f}, {hi:.3f}]")


if __name__ == "__main__":
    main()
