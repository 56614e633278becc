"""The generated WebShop: env steps/s, search latency by catalog size, expert success rate.

    PYTHONPATH=src python benchmarks/bench_webshop.py [--quick]

1. Steps/s of `WebshopEnv.step` on the default 2,000-product shop, for two policies:
   the rule-based expert (its own thinking time excluded) and a uniformly random
   admissible action (searches use the goal's product type).
2. Catalog build, index build and BM25 search latency (median and p95 over goal
   instructions) at 1k / 10k / 100k products (--quick: 1k / 10k).
3. The expert's success rate (score == 1) and mean score on the test goals
   (500 by default; --quick: 100).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from rspo.config import WebshopConfig
from rspo.envs.webshop import WebshopEnv
from rspo.envs.webshop_catalog import SearchIndex, generate_catalog, goal_target, make_goal


def steps_per_second(env: WebshopEnv, policy: str, episodes: int) -> float:
    """Env steps per second (time inside `step` only) over `episodes` test tasks."""
    rng = random.Random(0)
    steps, busy = 0, 0.0
    for i in range(episodes):
        s = env.reset("test", i % env.num_tasks("test"))
        while not s.done:
            if policy == "expert":
                action = env.expert_action()
            else:
                action = rng.choice(s.admissible)
                action = f"search[{env.goal.query}]" if action.startswith("search") else action
            t0 = time.perf_counter()
            s = env.step(action)
            busy += time.perf_counter() - t0
            steps += 1
    return steps / busy


def search_latency(num_products: int, queries: int) -> dict[str, float]:
    """Build times (s) and per-query search latency (ms) for a shop of `num_products`."""
    t0 = time.perf_counter()
    products = generate_catalog(num_products, seed=0)
    t1 = time.perf_counter()
    index = SearchIndex(products)
    t2 = time.perf_counter()
    texts = [make_goal(products[goal_target(i, num_products, 0)], i, 0).instruction_text for i in range(queries)]
    times = []
    for text in texts:
        q0 = time.perf_counter()
        index.search(text)
        times.append((time.perf_counter() - q0) * 1e3)
    times.sort()
    return {
        "catalog_s": t1 - t0,
        "index_s": t2 - t1,
        "median_ms": statistics.median(times),
        "p95_ms": times[int(0.95 * (len(times) - 1))],
    }


def expert_success(env: WebshopEnv, num_goals: int) -> tuple[float, float, float]:
    """(success rate, mean score, mean steps) of the expert on the first `num_goals` test goals."""
    wins, scores, steps = 0, [], 0
    for i in range(num_goals):
        s = env.reset("test", i)
        while not s.done:
            s = env.step(env.expert_action())
            steps += 1
        wins += s.won
        scores.append(s.score)
    return wins / num_goals, statistics.mean(scores), steps / num_goals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1k/10k products only, 100 test goals")
    args = parser.parse_args()
    cfg = WebshopConfig()
    t0 = time.perf_counter()
    env = WebshopEnv(cfg)
    print(f"default shop: {cfg.num_products:,} products, built in {time.perf_counter() - t0:.2f} s")

    episodes = 50 if args.quick else 200
    for policy in ("expert", "random"):
        print(f"env steps/s ({policy} policy, {episodes} episodes): {steps_per_second(env, policy, episodes):,.0f}")

    sizes = (1_000, 10_000) if args.quick else (1_000, 10_000, 100_000)
    for n in sizes:
        r = search_latency(n, queries=100 if args.quick else 300)
        print(
            f"{n:>7,} products: catalog {r['catalog_s']:6.2f} s, index {r['index_s']:6.2f} s, "
            f"search median {r['median_ms']:6.2f} ms, p95 {r['p95_ms']:6.2f} ms"
        )

    num_goals = 100 if args.quick else cfg.num_test_goals
    rate, mean_score, mean_steps = expert_success(env, num_goals)
    print(f"expert on {num_goals} test goals: success {rate:.3f}, mean score {mean_score:.3f}, {mean_steps:.1f} steps")


if __name__ == "__main__":
    main()
