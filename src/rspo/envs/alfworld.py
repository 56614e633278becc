"""ALFWorld (text mode) on the real TextWorld engine, behind `TextEnv`.

The engine stack is ALFWorld's own: `textworld.envs.PddlEnv` wrapped in
`AlfredDemangler(shuffle=False)` (ids -> `apple 1`) and `AlfredInfos`, with the planner's
remaining plan (`policy_commands`, planned when asked) as the expert, and TextWorld's
parses memoized (`rspo.envs.textworld_cache`). Games come from the official tree when
`env.alfworld.data_dir` or `$ALFWORLD_DATA` points at one (`<root>/json_2.1.1/...`), else
from rspo's generator (`alfworld_gen`), written lazily on first use into
`env.alfworld.games_dir` or `$RSPO_CACHE/alfworld` (default `~/.cache/rspo/alfworld`),
one directory per (seed, split sizes, task types). Tasks of a split are its game files
in sorted path order.

Splits: `train` -> `train/`, `eval_in_distribution` -> `valid_seen/`,
`eval_out_of_distribution` -> `valid_unseen/` (the official directory names).

Rewards of a step (see `rspo.envs.base`):
  outcome  1.0 on the step that wins, else 0 (the trainer scales it);
  process  Phi(s_{t+1}) - Phi(s_t), the potential below.

Process potential Phi(s) in [0, 1], read from the engine's PDDL facts. It counts the task
type's goal conditions that hold (after ALFRED's goal-condition success), with O the target
object type, R the target receptacle type, and "placed" = inside a receptacle of type R:
  pick_and_place_simple          (2) holding an O; an O placed (= win)
  pick_clean_then_place_in_recep (3) per O: held or placed; clean; clean and placed (= win)
  pick_heat_then_place_in_recep  (3) same with hot (a max over the O instances)
  pick_cool_then_place_in_recep  (3) same with cool
  pick_two_obj_and_place         (4) 2 x (O's in the fullest R, at most 2) + 1 if holding another O
  look_at_obj_in_light           (3) holding an O; a lamp turned on (`isToggled`, which the
                                     engine never clears); both at the lamp (= win)
Phi = 1 exactly when the engine reports the win: conditions that are all met without the
win (possible in the official games) are capped at (n-1)/n. A departure from ALFRED: its
"in place" condition counts an object put down without the state change; here the chain
is per object, so Phi is non-decreasing along the expert's plans (tested).
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
from collections import defaultdict
from pathlib import Path

from rspo.config import AlfworldConfig, cache_dir
from rspo.envs import alfworld_gen as gen
from rspo.envs import textworld_cache
from rspo.envs.base import EnvState, TextEnv

NOTHING = "Nothing happens."  # the engine's answer to anything it cannot do
GAME_FILE, TRAJ_FILE = "game.tw-pddl", "traj_data.json"


def official_root(cfg: AlfworldConfig) -> Path | None:
    """The official data root from config or `$ALFWORLD_DATA`; None = use generated games.

    `import alfworld` itself sets `$ALFWORLD_DATA=~/.cache/alfworld` when it is unset, so
    that default path counts only if it holds data.
    """
    if cfg.data_dir:
        root, source = Path(cfg.data_dir).expanduser(), "env.alfworld.data_dir"
    elif os.environ.get("ALFWORLD_DATA"):
        root, source = Path(os.environ["ALFWORLD_DATA"]).expanduser(), "$ALFWORLD_DATA"
        if root == Path("~/.cache/alfworld").expanduser() and not (root / "json_2.1.1").is_dir():
            return None
    else:
        return None
    if not (root / "json_2.1.1").is_dir():
        raise FileNotFoundError(
            f"{source}={root}: no json_2.1.1/ directory there (get the official games with `alfworld-download`,"
            " or leave data_dir and ALFWORLD_DATA unset to use rspo's generated games)"
        )
    return root


def index_split(root: Path, split: str, task_types: list[str]) -> list[Path]:
    """Game files of a split, filtered as the stock `AlfredTWEnv` loader does, sorted.
    Read once per process (it opens two JSON files per game: 3,553 games in the official
    train split) and shared by every env of the process; a corrupt file is not cached."""
    return list(_index_split(Path(root), split, tuple(task_types)))


@functools.cache
def _index_split(root: Path, split: str, task_types: tuple[str, ...]) -> tuple[Path, ...]:
    split_dir = root / "json_2.1.1" / gen.SPLIT_DIRS[split]
    if not split_dir.is_dir():
        raise FileNotFoundError(f"ALFWorld split {split!r}: no directory {split_dir}")
    games = []
    for traj_path in split_dir.rglob(TRAJ_FILE):
        folder = str(traj_path.parent)
        game_path = traj_path.parent / GAME_FILE
        if "movable" in folder or "Sliced" in folder or not game_path.is_file():
            continue
        if _read_json(traj_path)["task_type"] in task_types and _read_json(game_path).get("solvable", False):
            games.append(game_path)
    return tuple(sorted(games))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"corrupt ALFWorld game file {path}: {e}") from None


def generated_root(cfg: AlfworldConfig) -> Path:
    """Where this config's generated games live (one directory per seed, sizes and types)."""
    types = "all" if sorted(cfg.task_types) == sorted(gen.TASK_TYPES) else "+".join(sorted(cfg.task_types))
    sizes = f"{cfg.num_train}-{cfg.num_eval_in_distribution}-{cfg.num_eval_out_of_distribution}"
    rooms = "" if cfg.max_receptacles == gen.MAX_RECEPTACLES else f"-r{cfg.max_receptacles}"
    name = f"v{gen.VERSION}-seed{cfg.seed}-n{sizes}-{types}{rooms}"
    return Path(cfg.games_dir).expanduser() / name if cfg.games_dir else cache_dir() / "alfworld" / name


def ensure_generated(cfg: AlfworldConfig, split: str) -> Path:
    """Generate `split` under `generated_root(cfg)` unless done; safe across processes."""
    root = generated_root(cfg)
    split_dir = root / "json_2.1.1" / gen.SPLIT_DIRS[split]
    done = split_dir / ".rspo-complete"
    if done.exists():
        return root
    num = gen.split_sizes(cfg)[split]
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # other workers wait here, then find it done
        if not done.exists():
            tmp = root / f".tmp-{split}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            gen.generate(tmp, split, num, cfg.seed, cfg.task_types, cfg.max_receptacles)
            shutil.rmtree(split_dir, ignore_errors=True)  # a partial copy from an interrupted run
            split_dir.parent.mkdir(parents=True, exist_ok=True)
            (tmp / "json_2.1.1" / gen.SPLIT_DIRS[split]).rename(split_dir)
            shutil.rmtree(tmp)
            done.write_text(f"{num}\n")
    return root


# ---------------------------------------------------------------------------------------
# Process potential
# ---------------------------------------------------------------------------------------


class Facts:
    """The engine's PDDL facts, indexed for the goal conditions (names are lowercase)."""

    def __init__(self, facts: list) -> None:
        self.by_name: dict[str, set[tuple[str, ...]]] = defaultdict(set)
        for fact in facts:
            self.by_name[fact.name].add(tuple(arg.name for arg in fact.arguments))
        self.object_type = dict(self.by_name["objecttype"])  # object -> its type, e.g. appletype
        self.receptacle_type = dict(self.by_name["receptacletype"])
        self.inside = dict(self.by_name["inreceptacle"])  # object -> receptacle
        self.held = {o for _, o in self.by_name["holds"]}

    def objects(self, otype: str) -> list[str]:
        return sorted(o for o, t in self.object_type.items() if t == otype)

    def has(self, predicate: str, obj: str) -> bool:
        return (obj,) in self.by_name[predicate]

    def placed(self, obj: str, rtype: str) -> bool:
        """`obj` is inside a receptacle of type `rtype`."""
        return self.receptacle_type.get(self.inside.get(obj, "")) == rtype


STATE_CHANGE = {
    "pick_clean_then_place_in_recep": "isclean",
    "pick_heat_then_place_in_recep": "ishot",
    "pick_cool_then_place_in_recep": "iscool",
}


def goal_progress(task_type: str, facts: Facts, obj: str, recep: str, toggle: str) -> tuple[int, int]:
    """(conditions met, conditions) for a task type; see the module docstring."""
    otype, rtype = f"{obj.lower()}type", f"{recep.lower()}type"
    targets = facts.objects(otype)
    held = any(o in facts.held for o in targets)
    if task_type == "pick_and_place_simple":
        return (2 if any(facts.placed(o, rtype) for o in targets) else int(held)), 2
    if task_type in STATE_CHANGE:
        done = STATE_CHANGE[task_type]

        def chain(o: str) -> int:
            placed, changed = facts.placed(o, rtype), facts.has(done, o)
            return int(o in facts.held or placed) + int(changed) + int(changed and placed)

        return max((chain(o) for o in targets), default=0), 3
    if task_type == "pick_two_obj_and_place":
        per_recep = defaultdict(int)
        for o in targets:
            if facts.placed(o, rtype):
                per_recep[facts.inside[o]] += 1
        placed = min(max(per_recep.values(), default=0), 2)
        return 2 * placed + int(held and placed < 2), 4
    if task_type == "look_at_obj_in_light":
        lamp_on = any(facts.has("istoggled", o) for o in facts.objects(f"{toggle.lower()}type"))
        return int(held) + int(lamp_on), 3
    raise ValueError(f"unknown ALFWorld task type {task_type!r} (valid: {', '.join(gen.TASK_TYPES)})")


def potential(task_type: str, facts: list, won: bool, params: dict) -> float:
    """Phi(s): fraction of goal conditions met, 1.0 exactly at the win."""
    if won:
        return 1.0
    met, total = goal_progress(
        task_type, Facts(facts), params["object_target"], params["parent_target"] or "", params["toggle_target"] or ""
    )
    return min(met, total - 1) / total


# ---------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------


class AlfworldEnv(TextEnv):
    """One ALFWorld game at a time on the TextWorld engine."""

    def __init__(self, cfg: AlfworldConfig) -> None:
        gen.check_task_types(cfg.task_types)
        if cfg.max_steps < 1:
            raise ValueError(f"env.alfworld.max_steps must be >= 1, got {cfg.max_steps}")
        self.cfg = cfg
        self.max_steps = cfg.max_steps
        self._official = official_root(cfg)
        self._games: dict[str, list[Path]] = {}
        self._engine = None  # built on first reset (imports TextWorld)
        self._loaded: Path | None = None
        self._game_state = None  # the engine's last GameState
        self._episode: dict | None = None  # task, task_type, params, steps, phi, done

    # -- tasks ---------------------------------------------------------------------------

    def games(self, split: str) -> list[Path]:
        """The split's game files in task order (generating them on first use)."""
        gen.check_split(split)
        if split not in self._games:
            root = self._official or ensure_generated(self.cfg, split)
            self._games[split] = index_split(root, split, self.cfg.task_types)
        return self._games[split]

    def num_tasks(self, split: str) -> int:
        return len(self.games(split))

    # -- episode -------------------------------------------------------------------------

    def reset(self, split: str, index: int) -> EnvState:
        games = self.games(split)
        if not 0 <= index < len(games):
            raise IndexError(f"ALFWorld {split} has {len(games)} tasks; index {index} is out of range")
        path = games[index]
        traj = _read_json(path.parent / TRAJ_FILE)
        if self._loaded != path:
            self._load(path)
        state = self._game_state = self._engine.reset()
        feedback = state.feedback
        task = feedback.rsplit("Your task is to: ", 1)[-1].strip().rstrip(".")
        params = traj["pddl_params"]
        phi = potential(traj["task_type"], state["_facts"], bool(state["won"]), params)
        self._episode = {"task": task, "task_type": traj["task_type"], "params": params, "steps": 0, "phi": phi}
        self._episode["done"] = False  # set by step: won or out of steps
        return self._state(feedback, won=False, process=0.0, valid=True, gamefile=str(path))

    def step(self, action: str) -> EnvState:
        ep = self._episode
        if ep is None or ep["done"]:
            raise RuntimeError("AlfworldEnv.step: no episode in progress; call reset(split, index) first")
        ep["steps"] += 1
        command = action.strip() if isinstance(action, str) else None
        if command is None or command not in self._game_state["admissible_commands"]:
            # Exactly what the engine answers to a command it cannot match; skipping the
            # engine keeps huge or odd inputs cheap and leaves the game state untouched.
            feedback, won, process = NOTHING, False, 0.0
        else:
            self._game_state, _, _ = self._engine.step(command)
            feedback, won = self._game_state.feedback, bool(self._game_state["won"])
            phi = potential(ep["task_type"], self._game_state["_facts"], won, ep["params"])
            process, ep["phi"] = phi - ep["phi"], phi
        ep["done"] = won or ep["steps"] >= self.max_steps
        return self._state(feedback, won=won, process=process, valid=command is not None and feedback != NOTHING)

    def expert_action(self) -> str:
        """The planner's next command; `look` when it has none (game over or unsolvable).

        Planned when asked, from the engine's current state, as TextWorld's `policy_commands`
        info would plan it after every step (`PddlEnv._gather_infos`): only the warm start's
        demonstrations ask, and planning at every RL step cost a tenth of the step.
        """
        if self._game_state is None:
            raise RuntimeError("AlfworldEnv.expert_action: call reset(split, index) first")
        pddl = self._engine.unwrapped  # TextWorld's PddlEnv (entity names demangled in place)
        plan = pddl._pddl_state.replan(pddl._entity_infos) or []
        return plan[0] if plan else "look"

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self._engine, self._loaded = None, None

    # -- helpers -------------------------------------------------------------------------

    def _load(self, path: Path) -> None:
        if self._engine is None:
            self._engine = make_engine()
        self._loaded = None
        try:
            self._engine.load(str(path))
        except Exception as e:  # the engine raises many types on a malformed game
            raise ValueError(f"corrupt ALFWorld game file {path}: {type(e).__name__}: {e}") from e
        self._loaded = path

    def _state(self, feedback: str, won: bool, process: float, valid: bool, gamefile: str = "") -> EnvState:
        ep = self._episode
        info = {"steps": ep["steps"], "phi": ep["phi"]}
        if gamefile:
            info["gamefile"] = gamefile
        return EnvState(
            observation=feedback,
            admissible=list(self._game_state["admissible_commands"]),
            task=ep["task"],
            task_type=ep["task_type"],
            done=ep["done"],
            outcome=1.0 if won else 0.0,
            process=process,
            won=won,
            score=float(won),
            valid=valid,
            info=info,
        )


def make_engine():
    """ALFWorld's text engine stack: PddlEnv + AlfredDemangler(shuffle=False) + AlfredInfos,
    with TextWorld's parses memoized in this process (`rspo.envs.textworld_cache`)."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs import PddlEnv

    textworld_cache.install()
    infos = textworld.EnvInfos(won=True, admissible_commands=True)  # the plan: `AlfworldEnv.expert_action`
    return AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
