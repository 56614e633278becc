"""Issue 45's pre-registered rule, read from a probe grid's results.json: which settings
switch RSPO's mechanism on, and which of those costs the target least.

    python benchmarks/mechanism_rule.py [benchmarks/results/sparse_on_probe/results.json]

The rule (written into configs/experiments/sparse_on_probe.yaml before any probe ran), on
the mean over the seeds of each run's iterations (the mechanism table's `all` column):
rspo/groups_rescued >= 0.10, rspo/explorer_only_successes >= 1 an iteration, the
explorer's training success at least the target's, rspo/replayed > 0. Among the settings
that meet it, the chosen one has the smallest cost: |x - outcome| / outcome summed over
the target's policy/sampled_nll and policy/approx_kl. If none meets it, the closest passes
the most of the four tests (ties: the most groups rescued). Training rollouts only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RULE = {  # metric -> its test (the fourth test, explorer success >= target's, compares two metrics)
    "rspo/groups_rescued": lambda x: x >= 0.10,
    "rspo/explorer_only_successes": lambda x: x >= 1.0,
    "rspo/replayed": lambda x: x > 0.0,
}
COST = ("policy/sampled_nll", "policy/approx_kl")


def table(mechanism: list[dict]) -> list[dict]:
    """One row per reward mode (arm): the rule's metrics, whether it meets the rule, its cost."""
    means: dict[str, dict[str, tuple[float, int]]] = {}
    for m in mechanism:
        means.setdefault(m["mode"], {})[m["metric"]] = (m["all"]["mean"], m["seeds"])
    base = means["outcome"]
    rows = []
    for mode, m in means.items():
        if mode == "outcome":
            continue
        value = {k: m.get(k, (0.0, 0))[0] for k in [*RULE, "rollout/success_rate", "explorer/rollout/success_rate"]}
        passed = sum(test(value[k]) for k, test in RULE.items())
        passed += value["explorer/rollout/success_rate"] >= value["rollout/success_rate"]
        cost = sum(abs(m[k][0] - base[k][0]) / abs(base[k][0]) for k in COST)
        row = {"mode": mode, "seeds": m["rollout/success_rate"][1], **value, "passed": passed, "cost": cost}
        rows.append(row | {"meets": passed == len(RULE) + 1})
    return rows


def choose(rows: list[dict]) -> tuple[dict | None, dict]:
    """(the chosen row: the cheapest that meets the rule, or None; the closest row: the one
    passing the most of the four tests, ties broken by the most groups rescued)."""
    chosen = min((r for r in rows if r["meets"]), key=lambda r: r["cost"], default=None)
    return chosen, max(rows, key=lambda r: (r["passed"], r["rspo/groups_rescued"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path("benchmarks/results/sparse_on_probe/results.json")
    parser.add_argument("results", nargs="?", type=Path, default=default)
    rows = table(json.loads(parser.parse_args().results.read_text())["mechanism"])
    head = ["arm", "seeds", "groups rescued (>= 0.10)", "explorer-only successes (>= 1)",
            "explorer / target success", "replayed (> 0)", "tests passed (of 4)", "cost"]  # fmt: skip
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        cells = [r["mode"], r["seeds"], f"{r['rspo/groups_rescued']:.3f}", f"{r['rspo/explorer_only_successes']:.2f}",
                 f"{r['explorer/rollout/success_rate']:.3f} / {r['rollout/success_rate']:.3f}",
                 f"{r['rspo/replayed']:.2f}", r["passed"], f"{r['cost']:.2f}"]  # fmt: skip
        print("| " + " | ".join(map(str, cells)) + " |")
    chosen, closest = choose(rows)
    print(f"\nchosen: {chosen['mode']}" if chosen else f"\nno arm meets the rule; the closest: {closest['mode']}")


if __name__ == "__main__":
    main()
