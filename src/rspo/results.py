"""An experiment's report (`rspo sweep ... --collect`): one JSON of every number, markdown
tables with 95% intervals, learning curves and RSPO's mechanism, from the finished runs.

The comparisons (`rspo.sweep` explains the grid): each arm (algo x reward mode) against the
outcome baseline of the same algorithm (a) at equal training iterations (the final eval),
(b) at equal environment steps (each run's last eval within `env_step_budget`), (c) by
gain (each run's after-RL minus before-RL success, task by task), each with a bootstrap
interval over seeds and tasks (`rspo.stats`), the gain also against zero, arm by arm (did
RL raise it at all); and (d) `same_start`: the arms of a seed that
share their warm start (equal weight hashes, or for runs recorded without one, equal
before-RL evals task by task), compared seed by seed, paired, so the start cancels.
The mechanism (`rspo.rewards.signal`, logged every iteration in each run's `trace`):
where the target's outcome signal came from, arm by arm.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from rspo.log import TRACE, write_json
from rspo.stats import bootstrap_diff, bootstrap_mean, fmt_interval

BASELINE = "outcome"
RUN_KEYS = ("name", "values", "env", "algo", "mode", "seed", "commit", "wall_s", "warm_start", "config", "env_steps",
            "before", "after", "difference", "curve", "before_tasks", "after_tasks", "trace", "final_at")  # fmt: skip
# (trace key, words) of the mechanism table and plot: the run's trace (`rspo.log.TRACE`)
MECHANISM = tuple(TRACE.items())


def _won(records: list[dict], split: str, key: str = "won") -> list[float]:
    return [float(r[key]) for r in sorted(records, key=lambda r: r["task_index"]) if r["split"] == split]


def _point_within(run: dict, budget: float) -> dict:
    """The run's last eval point whose env-step count is within `budget`."""
    points = [p for p in run["curve"] if p["env_steps"] <= budget]
    return points[-1] if points else run["curve"][0]


def _by_algo(all_runs: list[dict], env_step_budget: int | None):
    """(env, algo, its runs, its env-step budget, its eval splits, its reward modes, outcome first)."""
    for (env, algo), group in itertools.groupby(sorted(all_runs, key=lambda r: (r["env"], r["algo"])),
                                                key=lambda r: (r["env"], r["algo"])):  # fmt: skip
        group = list(group)
        budget = env_step_budget or min(r["env_steps"] for r in group)
        splits = list(dict.fromkeys(rec["split"] for rec in group[0]["after_tasks"]))
        modes = sorted(dict.fromkeys(r["mode"] for r in group), key=lambda m: m != BASELINE)
        yield env, algo, group, budget, splits, modes


def compare(all_runs: list[dict], env_step_budget: int | None = None) -> dict:
    """Per env, algo, split and arm: success (and score) mean ± std over seeds, and the
    difference from the same algo's outcome baseline with its interval, at equal
    iterations (final eval), at equal env steps (each run's last eval within
    `env_step_budget`, or by default within the smallest total of the algo's runs) and by gain."""
    table: dict = {}
    for env, algo, group, budget, splits, modes in _by_algo(all_runs, env_step_budget):
        for split, mode in itertools.product(splits, modes):
            arm = [r for r in group if r["mode"] == mode]
            base = [r for r in group if r["mode"] == BASELINE]
            row = {"seeds": [r["seed"] for r in arm], "env_step_budget": budget, "budget_fixed": bool(env_step_budget)}
            for basis, values in (  # a run's per-task values on `split`
                ("equal_iterations", lambda r, split, key: _won(r["after_tasks"], split, key)),
                ("equal_env_steps", lambda r, split, key, b=budget: _won(_point_within(r, b)["tasks"], split, key)),
                # after - before on each task: a run's gain over its own warm start's eval
                ("gain", lambda r, split, key: np.subtract(_won(r["after_tasks"], split, key),
                                                           _won(r["before_tasks"], split, key))),
            ):  # fmt: skip
                for metric, key in (("success", "won"), ("score", "score")):
                    x = np.array([values(r, split, key) for r in arm])
                    per_seed = x.mean(axis=1)
                    cell = {"mean": float(per_seed.mean()), "std": float(per_seed.std(ddof=1)) if len(arm) > 1 else 0.0}
                    if basis == "gain":  # did RL raise this arm at all: its gain against zero
                        _, cell["lo"], cell["hi"] = bootstrap_mean(x)
                    if base and mode != BASELINE:
                        b = np.array([values(r, split, key) for r in base])
                        cell["diff"], cell["diff_lo"], cell["diff_hi"] = bootstrap_diff(b, x)
                    row[f"{basis}/{metric}"] = cell
            before = np.array([_won(r["before_tasks"], split) for r in arm]).mean()
            row["before/success"] = float(before)
            row["env_steps"] = float(np.mean([r["env_steps"] for r in arm]))
            row["equal_env_steps/read_at_step"] = [_point_within(r, budget)["step"] for r in arm]
            types = sorted({rec["task_type"] for rec in arm[0]["after_tasks"] if rec["split"] == split})
            row["by_type"] = {t: float(np.mean([[rec["won"] for rec in r["after_tasks"]
                                                 if rec["split"] == split and rec["task_type"] == t] for r in arm]))
                              for t in types}  # fmt: skip
            table.setdefault(env, {}).setdefault(algo, {}).setdefault(split, {})[mode] = row
    return table


def shared_start(a: dict, b: dict) -> bool:
    """Whether two runs started from the same weights: equal warm-start hashes, or (a run
    recorded before hashes were) equal before-RL evals task by task."""
    if a.get("warm_start") and b.get("warm_start"):
        return a["warm_start"] == b["warm_start"]
    return a["before_tasks"] == b["before_tasks"]


def same_start(all_runs: list[dict], env_step_budget: int | None = None) -> list[dict]:
    """Arms of one algorithm that share a warm start, compared seed by seed.

    For each pair of reward modes (a, b): the seeds where they share one (`shared_start`),
    and b - a in success at equal iterations and at equal env steps, with a 95% interval
    from a bootstrap that resamples the seed pairs and the tasks of the per-task
    differences: the start's level cancels exactly, which the cross-seed tables can only
    approximate (by gain)."""
    rows = []
    for env, algo, group, budget, splits, modes in _by_algo(all_runs, env_step_budget):
        run = {(r["mode"], r["seed"]): r for r in group}
        for a, b in itertools.combinations(modes, 2):
            seeds = sorted(seed for mode, seed in run if mode == a and (b, seed) in run)
            pairs = [(run[a, s], run[b, s]) for s in seeds if shared_start(run[a, s], run[b, s])]
            if not pairs:
                continue
            row = {"env": env, "algo": algo, "a": a, "b": b, "seeds": [ra["seed"] for ra, _ in pairs]}
            bases = [("equal_iterations", lambda r: r["after_tasks"]),
                     ("equal_env_steps", lambda r, n=budget: _point_within(r, n)["tasks"])]  # fmt: skip
            temps = set.intersection(*(set(r.get("final_at", {})) for pair in pairs for r in pair))
            bases += [(f"final_at_T{t}", lambda r, t=t: r["final_at"][t]["tasks"]) for t in sorted(temps)]
            for basis, tasks in bases:
                for split in splits:
                    d = np.array([np.subtract(_won(tasks(rb), split), _won(tasks(ra), split)) for ra, rb in pairs])
                    diff, lo, hi = bootstrap_mean(d)
                    row[f"{basis}/{split}"] = {"diff": diff, "diff_lo": lo, "diff_hi": hi}
            rows.append(row)
    return rows


def mechanism(all_runs: list[dict]) -> list[dict]:
    """Per env, algo and arm, each mechanism metric (`MECHANISM`) at iteration 0, over the
    first and the last ten iterations, and over the whole run: mean over seeds with a 95%
    bootstrap interval over the seeds' own means. Runs without a `trace` are left out."""
    rows = []
    for env, algo, group, _, _, modes in _by_algo(all_runs, None):
        for mode in modes:
            arm = [r for r in group if r["mode"] == mode and r.get("trace")]
            for key, words in MECHANISM:
                series = [s for r in arm if (s := [p[key] for p in r["trace"] if key in p])]  # seeds that logged it
                if not series:
                    continue
                row = {"env": env, "algo": algo, "mode": mode, "metric": key, "words": words, "seeds": len(series)}
                for part, cut in (("first", slice(0, 1)), ("first10", slice(0, 10)), ("last10", slice(-10, None)),
                                  ("all", slice(None))):  # fmt: skip
                    per_seed = [np.mean(s[cut]) for s in series]  # every cut of a non-empty series is non-empty
                    mean, lo, hi = bootstrap_mean(np.array(per_seed)[:, None])
                    row[part] = {"mean": mean, "lo": lo, "hi": hi}
                rows.append(row)
    return rows


def _cell(c: dict) -> str:
    s = f"{c['mean']:.3f} ± {c['std']:.3f}"
    if "lo" in c:  # a gain: its own interval
        s = f"{fmt_interval(c['mean'], c['lo'], c['hi'], signed=True)} ± {c['std']:.3f}"
    if "diff" in c:
        s += f" ({_diff(c)})"
    return s


def _diff(c: dict) -> str:
    return fmt_interval(c["diff"], c["diff_lo"], c["diff_hi"], signed=True)


def _interval(c: dict | None, sci: bool) -> str:
    return fmt_interval(c["mean"], c["lo"], c["hi"], sci=sci) if c else "-"


def markdown(table: dict, all_runs: list[dict], shared: list[dict] = (), mech: list[dict] = ()) -> str:
    lines = [
        "Success rate after RL, mean ± std over seeds; in parentheses the difference from the same",
        "algorithm's `outcome` baseline with its 95% bootstrap interval (seeds and tasks resampled;",
        "the eval tasks are the same for every run, so tasks are paired).",
    ]
    for env, algos in table.items():
        scored = env == "webshop"
        splits = list(next(iter(algos.values())))
        for basis, title in (("equal_iterations", "success at equal training iterations (the final eval)"),
                             ("equal_env_steps", "success at equal environment steps"),
                             ("gain", "gain in success over each run's own start (after RL - before RL, "
                                      "task by task, with its 95% interval; warm starts rebuilt on another "
                                      "machine differ)")):  # fmt: skip
            lines += ["", f"### {env}: {title}", ""]
            lines.append("| algo | reward.mode | seeds | " + " | ".join(splits) + (" | score |" if scored else " |"))
            lines.append("|---" * (3 + len(splits) + scored) + "|")
            for algo, by_split in algos.items():
                for mode in by_split[splits[0]]:
                    row = by_split[splits[0]][mode]
                    cells = [_cell(by_split[s][mode][f"{basis}/success"]) for s in splits]
                    if scored:
                        cells.append(_cell(by_split[splits[0]][mode][f"{basis}/score"]))
                    lines.append(f"| {algo} | {mode} | {len(row['seeds'])} | " + " | ".join(cells) + " |")
            if basis == "equal_env_steps":
                lines.append("")
                for algo, by_split in algos.items():
                    arms = by_split[splits[0]]
                    first = next(iter(arms.values()))
                    how = "fixed by `env_step_budget`" if first["budget_fixed"] else "the smallest total of its runs"
                    read = "; ".join(f"{m} {', '.join(map(str, r['equal_env_steps/read_at_step']))}"
                                     for m, r in arms.items())  # fmt: skip
                    lines.append(f"{algo}: budget {int(first['env_step_budget']):,} env steps ({how}); "
                                 f"each seed's run read at iteration: {read}.  ")  # fmt: skip
        pairs = [p for p in shared if p["env"] == env]
        if pairs:
            lines += ["", f"### {env}: arms that share a warm start, seed by seed (b - a; the seeds where the "
                          "before-RL evals agree task by task; seed pairs and tasks resampled)", ""]  # fmt: skip
            bases = dict.fromkeys(k.split("/")[0] for p in pairs for k in p if "/" in k)  # final_at_T*: some pairs
            cols = [(basis, s) for basis in bases for s in splits]
            header = [f"{s}, {basis.replace('_', ' ')}" for basis, s in cols]
            lines.append("| algo | b - a | seeds | " + " | ".join(header) + " |")
            lines.append("|---" * (3 + len(cols)) + "|")
            for p in pairs:
                cells = [_diff(p[f"{b}/{s}"]) if f"{b}/{s}" in p else "" for b, s in cols]
                lines.append(f"| {p['algo']} | {p['b']} - {p['a']} | {', '.join(map(str, p['seeds']))} | "
                             + " | ".join(cells) + " |")  # fmt: skip
        lines += _mechanism_lines(env, [m for m in mech if m["env"] == env])
        lines += ["", f"### {env}: success by task type (after RL, mean over seeds)", ""]
        for split in splits:
            types = sorted({t for v in algos.values() for row in v[split].values() for t in row["by_type"]})
            lines += [f"{split}:", "", "| algo | reward.mode | before RL | " + " | ".join(types) + " |",
                      "|---" * (3 + len(types)) + "|"]  # fmt: skip
            for algo, by_split in algos.items():
                for mode, row in by_split[split].items():
                    cells = [f"{row['by_type'].get(t, float('nan')):.2f}" for t in types]
                    lines.append(f"| {algo} | {mode} | {row['before/success']:.3f} | " + " | ".join(cells) + " |")
            lines.append("")
    wall = sum(r["wall_s"] or 0 for r in all_runs)
    commits = sorted({r["commit"] for r in all_runs})
    lines += [f"{len(all_runs)} runs, {wall / 3600:.2f} h of wall time in all; commit(s): {', '.join(commits)}."]
    return "\n".join(lines) + "\n"


def _mechanism_lines(env: str, rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = ["", f"### {env}: where the outcome signal came from (training rollouts; mean over seeds, 95% "
                 "bootstrap over seeds)", "",
             "| algo | reward.mode | seeds | metric | iteration 0 | iterations 0-9 | last 10 | all |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for m in rows:
        parts = [m.get(part) for part in ("first", "first10", "last10", "all")]
        top = max((abs(c[k]) for c in parts if c for k in ("mean", "lo", "hi")), default=0.0)
        cells = [_interval(c, sci=0 < top < 0.01) for c in parts]  # a row too small for 3 decimals: 1e-04
        lines.append(f"| {m['algo']} | {m['mode']} | {m['seeds']} | {m['words']} | " + " | ".join(cells) + " |")
    return lines


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("sweep: matplotlib is not installed (pip install -e .[plots]); no plots written")
        return None
    return plt


def _band(x: np.ndarray) -> tuple[float, float, float]:
    """Mean and 95% bootstrap interval of an arm's (seeds, tasks) values: seeds and tasks resampled."""
    return bootstrap_mean(x, resamples=2000)


def plot_curves(table: dict, all_runs: list[dict], out_dir: Path, budgets: dict) -> list[Path]:
    """curves_<env>_<algo>.png: eval success vs training iteration and vs environment steps,
    one line per reward mode (mean over seeds, shaded: 95% bootstrap over seeds and tasks),
    one row per split, one y range for the whole experiment, the env-step budget drawn."""
    plt = _pyplot()
    if plt is None:
        return []
    curves = {}  # (env, algo, split, mode) -> (steps, env steps, mean, lo, hi)
    for env, algos in table.items():
        for algo, by_split in algos.items():
            for split, mode in itertools.product(by_split, next(iter(by_split.values()))):
                arm = [r for r in all_runs if (r["env"], r["algo"], r["mode"]) == (env, algo, mode)]
                n = min(len(r["curve"]) for r in arm)
                bands = np.array([_band([_won(r["curve"][i]["tasks"], split) for r in arm]) for i in range(n)])
                x = {k: np.mean([[p[k] for p in r["curve"][:n]] for r in arm], axis=0) for k in ("step", "env_steps")}
                curves[env, algo, split, mode] = (x["step"], x["env_steps"], *bands.T, len(arm))
    top = max(c[4].max() for c in curves.values()) if curves else 1.0
    paths = []
    for env, algos in table.items():
        for algo, by_split in algos.items():
            splits = list(by_split)
            fig, axes = plt.subplots(len(splits), 2, figsize=(11, 3.4 * len(splits)), squeeze=False, sharey=True)
            for i, split in enumerate(splits):
                for mode in by_split[split]:
                    steps, env_steps, mean, lo, hi, seeds = curves[env, algo, split, mode]
                    for ax, x in zip(axes[i], (steps, env_steps)):
                        (line,) = ax.plot(x, mean, marker="o", ms=3, label=f"{mode} ({seeds} seed{'s' * (seeds > 1)})")
                        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
                axes[i, 1].axvline(budgets[env, algo], color="grey", ls="--", lw=1)
                axes[i, 0].set_ylabel(f"success rate\n({split.replace('_', ' ')})")
                for ax in axes[i]:
                    ax.set_ylim(0, min(1.0, top * 1.1 + 0.02))
                    ax.grid(alpha=0.3)
            axes[-1, 0].set_xlabel("training iteration")
            axes[-1, 1].set_xlabel("environment steps (dashed: the equal-env-step budget)")
            handles, labels = axes[0, 0].get_legend_handles_labels()
            fig.suptitle(f"{env} / {algo}: held-out success (mean over seeds; shaded: 95% bootstrap interval)")
            fig.legend(
                handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=len(labels), frameon=False
            )
            fig.tight_layout(rect=(0, 0, 1, 0.91))
            paths.append(_save(fig, plt, out_dir / f"curves_{env}_{algo}.png"))
    return paths


def plot_mechanism(all_runs: list[dict], out_dir: Path, window: int = 5) -> list[Path]:
    """mechanism_<env>_<algo>.png: the `MECHANISM` metrics per training iteration, one line
    per reward mode (explorer dashed): each seed's running mean over `window` iterations,
    then the mean over seeds, shaded by a 95% bootstrap interval over seeds."""
    plt = _pyplot()
    if plt is None:
        return []
    keys = ["rollout/success_rate", "rollout/groups_without_signal", "rspo/groups_rescued"]
    panels = [(key, TRACE[key]) for key in [*keys, "rspo/explorer_only_successes"]]
    paths = []
    for env, algo, group, _, _, modes in _by_algo([r for r in all_runs if r.get("trace")], None):
        fig, axes = plt.subplots(2, 2, figsize=(11, 6.5), squeeze=False)
        for ax, (key, words) in zip(axes.flat, panels):
            for k, mode in enumerate(modes):
                keys = [key, "explorer/rollout/success_rate"] if key == "rollout/success_rate" else [key]
                for metric, style in zip(keys, ("-", "--")):
                    series = [_running([p.get(metric, np.nan) for p in r["trace"]], window)
                              for r in group if r["mode"] == mode]  # fmt: skip
                    n = min(len(s) for s in series)
                    y = np.array([s[:n] for s in series])
                    if np.isnan(y).all():
                        continue
                    bands = np.array([bootstrap_mean(col[~np.isnan(col)][:, None], resamples=2000)
                                      if (~np.isnan(col)).any() else (np.nan,) * 3 for col in y.T])  # fmt: skip
                    label = f"{mode}" + (" explorer" if style == "--" else "")
                    ax.plot(np.arange(n), bands[:, 0], ls=style, color=f"C{k}", label=label)
                    ax.fill_between(np.arange(n), bands[:, 1], bands[:, 2], color=f"C{k}", alpha=0.12, lw=0)
            ax.set_title(words, fontsize=10)
            ax.set_xlabel("training iteration")
            ax.grid(alpha=0.3)
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.suptitle(f"{env} / {algo}: where the outcome signal came from (running mean over {window} iterations; "
                     "shaded: 95% bootstrap over seeds)", fontsize=10)  # fmt: skip
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=len(labels), frameon=False)
        fig.tight_layout(rect=(0, 0, 1, 0.91))
        paths.append(_save(fig, plt, out_dir / f"mechanism_{env}_{algo}.png"))
    return paths


def _running(x: list[float], window: int) -> np.ndarray:
    """Trailing running mean over `window` values (fewer at the start), NaNs skipped."""
    x = np.asarray(x, dtype=float)
    out = np.full(len(x), np.nan)
    for i in range(len(x)):
        part = x[max(0, i - window + 1) : i + 1]
        if (~np.isnan(part)).any():
            out[i] = np.nanmean(part)
    return out


def _save(fig, plt, path: Path) -> Path:
    fig.savefig(path, dpi=110, metadata={"Software": None})  # no version string: regenerates byte for byte
    plt.close(fig)
    return path


def write_results(all_runs: list[dict], results_dir: str | Path, env_step_budget: int | None = None) -> dict:
    """Write results.json, results.md and the plots of `all_runs` (`rspo.sweep.load_runs`)
    under `results_dir`, and nothing else; return the table."""
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    table, shared, mech = (
        compare(all_runs, env_step_budget),
        same_start(all_runs, env_step_budget),
        mechanism(all_runs),
    )
    kept = [{k: r[k] for k in RUN_KEYS if r.get(k) is not None} for r in all_runs]
    write_json(out / "results.json", {"table": table, "same_start": shared, "mechanism": mech, "runs": kept})
    (out / "results.md").write_text(markdown(table, all_runs, shared, mech))
    budgets = {(env, algo): budget for env, algo, _, budget, _, _ in _by_algo(all_runs, env_step_budget)}
    plot_curves(table, all_runs, out, budgets)
    plot_mechanism(all_runs, out)
    return table
