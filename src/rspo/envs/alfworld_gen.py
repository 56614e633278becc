"""Generate ALFWorld games from what the `alfworld` package ships (no download needed).

The official ALFWorld games (`json_2.1.1/...`) come from a GitHub release that offline
machines cannot reach. The `alfworld` package does ship the logic: the PDDL domain and
text grammar, AI2-THOR floorplans (which receptacles each of 120 rooms has, and where),
ALFRED's object/receptacle compatibility tables (`constants.py`) and goal templates
(`goal_library.py`). This module turns them into playable `game.tw-pddl` files:

  room      a floorplan's receptacles (ALFRED ids, so `AlfredDemangler` renders
            `cabinet 1`, `sinkbasin 1`), at most `max_receptacles` of them (default
            MAX_RECEPTACLES; fewer make an easier room to search), each at its own
            location (receptacles that share a pose in the floorplan are merged);
  objects   the task's target object (1-3 instances; 2-3 for `pick_two_obj_and_place`)
            and a few distractors, drawn from the floorplan's object classes and placed
            only in receptacles ALFRED allows (`VAL_RECEPTACLE_OBJECTS`), never in a
            receptacle of the goal's type;
  goal      the goal library's PDDL and one of its two sentence templates.

Splits: `train` and `eval_in_distribution` use ALFRED's training floorplans (different
random streams, so new placements); `eval_out_of_distribution` uses its held-out
floorplans. Game `i` of a split depends only on (seed, split, i, task types), and task
types cycle with `i`, so every split is balanced over types.

Departures from the official games, all for speed or simplicity: no receptacle starts
open; no object starts hot/cool/clean (ALFRED marks objects found in the fridge cool);
lamps are desk lamps on a table-like receptacle (floor lamps stand on the floor, which the
text engine cannot toggle); no walkthrough is stored (`policy_commands` plans at run
time); rooms are subsets of the floorplan. Games are solvable by construction and
`solvable: true` is written without running the planner (tests and
`benchmarks/bench_alfworld.py --check` verify the expert wins them all).

Files are written in the official layout, so the stock loader
(`alfworld.agents.environment.AlfredTWEnv`) reads them with `ALFWORLD_DATA=<root>`:
    <root>/json_2.1.1/<train|valid_seen|valid_unseen>/<task>-<Obj>-None-<Recep>-<scene>/trial_<seed>_<i>/
        traj_data.json   task_type, pddl_params, scene, the sentence as a turk annotation
        game.tw-pddl     pddl_domain, grammar (sentence filled in), pddl_problem, solvable
"""

from __future__ import annotations

import importlib.util
import json
import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

from rspo.config import ALFWORLD_MAX_RECEPTACLES, ALFWORLD_TASK_TYPES

TASK_TYPES = ALFWORLD_TASK_TYPES
# rspo split name -> directory name in the official layout
SPLIT_DIRS = {"train": "train", "eval_in_distribution": "valid_seen", "eval_out_of_distribution": "valid_unseen"}

VERSION = 1  # bump whenever generated games change: caches are keyed by it
MAX_RECEPTACLES = ALFWORLD_MAX_RECEPTACLES  # room size: keeps the planner and the engine's admissible commands fast
MAX_DISTRACTORS = 5  # non-target objects (at least 2)
TOOLS = {  # the receptacle a state-change task needs, which is also never its target
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}
ACTION_CLASS = {  # the VAL_ACTION_OBJECTS entry the target object must belong to
    "pick_clean_then_place_in_recep": "Cleanable",
    "pick_heat_then_place_in_recep": "Heatable",
    "pick_cool_then_place_in_recep": "Coolable",
}
LAMP = "DeskLamp"
LAMP_RECEPTACLES = {"Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable"}
# Type names the domain's actions mention as constants: every problem must declare them.
DOMAIN_OTYPES = ["KnifeType", "ButterKnifeType"]
DOMAIN_RTYPES = ["SinkBasinType", "MicrowaveType", "FridgeType"]


# ---------------------------------------------------------------------------------------
# What the package ships
# ---------------------------------------------------------------------------------------


@cache
def _package_dir() -> Path:
    """The installed `alfworld` package, found without importing it.

    `import alfworld` sets `$ALFWORLD_DATA` and creates `~/.cache/alfworld` as a side
    effect; generation needs only plain files and two dependency-free modules.
    """
    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("ALFWorld games need the `alfworld` package: pip install alfworld==0.4.2")
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def _module(relpath: str) -> ModuleType:
    """Load one of alfworld's standalone modules (constants, goal library) from its file."""
    spec = importlib.util.spec_from_file_location(relpath.replace("/", "_"), _package_dir() / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def constants() -> ModuleType:
    return _module("gen/constants.py")


def goal_library() -> dict:
    return _module("gen/goal_library.py").gdict


@cache
def domain_text() -> str:
    return (_package_dir() / "data" / "alfred.pddl").read_text()


@cache
def grammar_text() -> str:
    return (_package_dir() / "data" / "alfred.twl2").read_text()


@dataclass(frozen=True)
class Floorplan:
    scene: int
    kind: str  # Kitchen | LivingRoom | Bedroom | Bathroom
    receptacles: tuple[tuple[str, str, tuple[int, int, int, int]], ...]  # (ALFRED id, class, grid pose)
    object_classes: frozenset[str]  # classes present in the room


def _receptacle_class(alfred_id: str) -> str:
    """`Sink|..|SinkBasin` -> SinkBasin; `Cabinet|..` -> Cabinet."""
    parts = alfred_id.split("|")
    return parts[-1] if len(parts) == 5 else parts[0]


@cache
def floorplan(scene: int) -> Floorplan:
    """Read one floorplan; receptacles sharing a pose keep only the first (sorted) id."""
    layouts = _package_dir() / "gen" / "layouts"
    points = json.loads((layouts / f"FloorPlan{scene}-openable.json").read_text())
    classes = frozenset(json.loads((layouts / f"FloorPlan{scene}-objects.json").read_text()))
    valid = constants().VAL_RECEPTACLE_OBJECTS
    seen, receptacles = set(), []
    for rid in sorted(points):
        x, z, rotation, horizon = points[rid]
        pose = (round(x / 0.25), round(z / 0.25), int(rotation) // 90, int(horizon))  # ALFRED's grid units
        if pose in seen or _receptacle_class(rid) not in valid:
            continue
        seen.add(pose)
        receptacles.append((rid, _receptacle_class(rid), pose))
    kind = next(k for k, scenes in constants().SCENE_TYPE.items() if scene in scenes)
    return Floorplan(scene, kind, tuple(receptacles), classes)


@cache
def pickupable_classes() -> frozenset[str]:
    """Object classes ALFRED can place somewhere (sliced variants excluded)."""
    c = constants()
    placeable = set().union(*c.VAL_RECEPTACLE_OBJECTS.values())
    return frozenset(o for o in placeable if o in c.OBJECTS and "Sliced" not in o)


def split_scenes(split: str) -> list[int]:
    """Seen floorplans for train / in-distribution eval, held-out ones for out-of-distribution."""
    check_split(split)
    c = constants()
    return list(c.TEST_SCENE_NUMBERS if split == "eval_out_of_distribution" else c.TRAIN_SCENE_NUMBERS)


def check_split(split: str) -> None:
    if split not in SPLIT_DIRS:
        raise ValueError(f"unknown ALFWorld split {split!r} (valid: {', '.join(SPLIT_DIRS)})")


def split_sizes(cfg) -> dict[str, int]:
    """Generated games per split, from an `AlfworldConfig`."""
    return {
        "train": cfg.num_train,
        "eval_in_distribution": cfg.num_eval_in_distribution,
        "eval_out_of_distribution": cfg.num_eval_out_of_distribution,
    }


def check_task_types(task_types: list[str]) -> None:
    bad = [t for t in task_types if t not in TASK_TYPES]
    if bad or not task_types:
        raise ValueError(f"unknown ALFWorld task type(s) {bad or task_types!r} (valid: {', '.join(TASK_TYPES)})")


# ---------------------------------------------------------------------------------------
# One game
# ---------------------------------------------------------------------------------------


@dataclass
class Task:
    task_type: str
    scene: int
    obj: str  # target object class, e.g. Apple
    recep: str  # target receptacle class ("" for look_at_obj_in_light)
    toggle: str  # lamp class ("" unless look_at_obj_in_light)
    sentence: str  # "put a hot apple in diningtable"


def pddl_name(alfred_id: str) -> str:
    """ALFRED's PDDL encoding of an id: `Apple|-01.66|...` -> `Apple_bar__minus_01_dot_66_...`."""
    for char, code in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        alfred_id = alfred_id.replace(char, code)
    return alfred_id


def _choose_targets(task_type: str, plan: Floorplan, rng: random.Random) -> tuple[str, str, str] | None:
    """(object class, receptacle class, toggle class) valid in this room, or None."""
    c = constants()
    room_receps = {cls for _, cls, _ in plan.receptacles}
    objects = sorted(plan.object_classes & pickupable_classes())
    if task_type in ACTION_CLASS:
        if TOOLS[task_type] not in room_receps:
            return None
        objects = [o for o in objects if o in c.VAL_ACTION_OBJECTS[ACTION_CLASS[task_type]]]
    rng.shuffle(objects)
    for obj in objects:
        homes = {r for r in room_receps if obj in c.VAL_RECEPTACLE_OBJECTS[r]}
        if task_type == "look_at_obj_in_light":
            if LAMP in plan.object_classes and homes and room_receps & LAMP_RECEPTACLES:
                return obj, "", LAMP
            continue
        goals = sorted(homes - {TOOLS.get(task_type, "")})
        rng.shuffle(goals)
        for recep in goals:
            if homes - {recep}:  # somewhere else to start from
                return obj, recep, ""
    return None


def _pick_receptacles(plan: Floorplan, task: Task, rng: random.Random, most: int) -> list[tuple[str, str, tuple]]:
    """The room's receptacles: the ones the task needs, then random others up to `most` in all."""
    valid = constants().VAL_RECEPTACLE_OBJECTS
    pool = list(plan.receptacles)
    rng.shuffle(pool)
    needs = [
        lambda r: r[1] == task.recep,  # a goal receptacle
        lambda r: r[1] == TOOLS.get(task.task_type),  # the sink / microwave / fridge
        lambda r: bool(task.toggle) and r[1] in LAMP_RECEPTACLES,  # where the lamp stands
        lambda r: r[1] != task.recep and task.obj in valid[r[1]],  # where the target starts
    ]
    chosen = []
    for need in needs:
        if not any(need(r) for r in chosen):
            chosen += [r for r in pool if need(r) and r not in chosen][:1]
    chosen += [r for r in pool if r not in chosen][: max(most - len(chosen), 0)]
    return sorted(chosen)


def _place_objects(receps: list, task: Task, plan: Floorplan, rng: random.Random) -> list[tuple[str, str]]:
    """(object class, receptacle id) for the targets and a few distractors."""
    valid = constants().VAL_RECEPTACLE_OBJECTS
    two = task.task_type == "pick_two_obj_and_place"
    placed = []
    starts = [rid for rid, cls, _ in receps if cls != task.recep and task.obj in valid[cls]]
    for _ in range(rng.randint(2, 3) if two else rng.randint(1, 3)):
        placed.append((task.obj, rng.choice(starts)))
    others = sorted(plan.object_classes & pickupable_classes() - {task.obj})
    rng.shuffle(others)
    for obj in others[: rng.randint(2, MAX_DISTRACTORS)]:
        homes = [rid for rid, cls, _ in receps if obj in valid[cls]]
        if homes:
            placed.append((obj, rng.choice(homes)))
    if task.toggle:
        placed.append((task.toggle, rng.choice([rid for rid, cls, _ in receps if cls in LAMP_RECEPTACLES])))
    return placed


def _object_ids(placed: list[tuple[str, str]], rng: random.Random) -> list[str]:
    """ALFRED-style object ids `Class|+x.xx|+y.yy|+z.zz` near their receptacle, unique."""
    ids: list[str] = []
    for cls, rid in placed:
        x, y, z = (float(v) for v in rid.split("|")[1:4])
        while True:
            coords = (x + rng.uniform(-0.3, 0.3), y + rng.uniform(0.0, 0.3), z + rng.uniform(-0.3, 0.3))
            oid = cls + "".join(f"|{v:+06.2f}" for v in coords)
            if oid not in ids:
                break
        ids.append(oid)
    return ids


def _loc(pose: tuple[int, int, int, int]) -> str:
    return pddl_name("loc|" + "|".join(str(v) for v in pose))


def _start_pose(taken: set[tuple[int, int, int, int]], rng: random.Random) -> tuple[int, int, int, int]:
    """Where the agent starts: a pose no receptacle has ("You are in the middle of a room")."""
    while True:
        pose = (rng.randint(-12, 12), rng.randint(-12, 12), rng.randint(0, 3), 30)
        if pose not in taken:
            return pose


def _problem(name: str, task: Task, receps: list, placed: list[tuple[str, str]], rng: random.Random) -> str:
    """The PDDL problem text: objects, receptacles, locations, the initial facts and the goal."""
    c = constants()
    oids = _object_ids(placed, rng)
    rtypes = sorted({cls for _, cls, _ in receps} | {t[:-4] for t in DOMAIN_RTYPES})
    otypes = sorted({cls for cls, _ in placed} | {t[:-4] for t in DOMAIN_OTYPES} | {task.obj})
    poses = {rid: pose for rid, _, pose in receps}
    start = _start_pose(set(poses.values()), rng)
    decl = ["agent1 - agent"] + [f"{t}Type - otype" for t in otypes] + [f"{t}Type - rtype" for t in rtypes]
    decl += [f"{pddl_name(o)} - object" for o in oids] + [f"{pddl_name(r)} - receptacle" for r, _, _ in receps]
    decl += [f"{_loc(p)} - location" for p in sorted(set(poses.values()) | {start})]
    init = [f"(atLocation agent1 {_loc(start)})"]
    for rid, cls, pose in receps:
        r = pddl_name(rid)
        init += [f"(receptacleType {r} {cls}Type)", f"(receptacleAtLocation {r} {_loc(pose)})"]
        init += [f"(openable {r})"] if cls in c.OPENABLE_CLASS_SET else []
    for oid, (cls, rid) in zip(oids, placed):
        o = pddl_name(oid)
        init += [f"(objectType {o} {cls}Type)", f"(inReceptacle {o} {pddl_name(rid)})"]
        init += [f"(objectAtLocation {o} {_loc(poses[rid])})"]
        init += [f"(toggleable {o})"] if cls == LAMP else [f"(pickupable {o})"]
        init += [
            f"({p} {o})"
            for p, k in (("heatable", "Heatable"), ("coolable", "Coolable"), ("cleanable", "Cleanable"))
            if cls in c.VAL_ACTION_OBJECTS[k]
        ]
        init += [f"(isReceptacleObject {o})"] if cls in c.MOVABLE_RECEPTACLES_SET else []
    room_rtypes = sorted({cls for _, cls, _ in receps})
    room_otypes = sorted({cls for cls, _ in placed})
    init += [
        f"(canContain {r}Type {o}Type)" for r in room_rtypes for o in room_otypes if o in c.VAL_RECEPTACLE_OBJECTS[r]
    ]
    goal = goal_library()[task.task_type]["pddl"].format(obj=task.obj, recep=task.recep, toggle=task.toggle, mrecep="")
    return "\n".join(
        [f"(define (problem {name})", "(:domain alfred)", "(:objects"]
        + [f"        {d}" for d in decl]
        + [")", "(:init"]
        + [f"        {f}" for f in init]
        + [")", goal.replace("#", "-").strip()]
    )


def make_game(
    seed: int, split: str, index: int, task_types: list[str], max_receptacles: int = MAX_RECEPTACLES
) -> tuple[Task, dict, dict]:
    """Game `index` of `split`: (task, traj_data, game.tw-pddl contents). Deterministic.

    The rooms always hold the receptacles the task needs (1-4), even under a smaller
    `max_receptacles`."""
    check_split(split)
    check_task_types(task_types)
    rng = random.Random(f"rspo-alfworld/{seed}/{split}/{index}")  # str seeds hash stably (sha512)
    task_type = task_types[index % len(task_types)]
    valid_kinds = constants().GOALS_VALID[task_type]
    scenes = [s for s in split_scenes(split) if floorplan(s).kind in valid_kinds]
    for _ in range(1000):  # a few rooms lack what a task needs (a lamp, a fitting object): draw again
        plan = floorplan(rng.choice(scenes))
        targets = _choose_targets(task_type, plan, rng)
        if targets is not None:
            break
    else:
        raise RuntimeError(f"no floorplan of {split} fits {task_type}")
    obj, recep, toggle = targets
    template = rng.choice(goal_library()[task_type]["templates"])
    sentence = template.format(obj=obj.lower(), recep=recep.lower(), toggle=toggle.lower())
    task = Task(task_type, plan.scene, obj, recep, toggle, sentence)
    receps = _pick_receptacles(plan, task, rng, max_receptacles)
    placed = _place_objects(receps, task, plan, rng)
    problem = _problem(f"plan_rspo_{SPLIT_DIRS[split]}_{seed}_{index}", task, receps, placed, rng)
    params = {
        "object_target": obj,
        "parent_target": recep,
        "toggle_target": toggle,
        "mrecep_target": "",
        "object_sliced": False,
    }
    traj = {
        "task_type": task_type,
        "pddl_params": params,
        "scene": {"floor_plan": f"FloorPlan{plan.scene}", "scene_num": plan.scene},
        "turk_annotations": {"anns": [{"task_desc": sentence}]},
        "rspo": {"generator": "rspo.envs.alfworld_gen", "seed": seed, "split": split, "index": index},
    }
    game = {
        "pddl_domain": domain_text(),
        "grammar": grammar_text().replace("UNKNOWN GOAL", sentence),
        "pddl_problem": problem,
        "solvable": True,
        "walkthrough": None,
    }
    return task, traj, game


def trial_dir(root: Path, split: str, task: Task, seed: int, index: int) -> Path:
    """`<root>/json_2.1.1/<split dir>/<task>-<Obj>-None-<Recep>-<scene>/trial_<seed>_<index>`."""
    folder = f"{task.task_type}-{task.obj}-None-{task.recep or task.toggle}-{task.scene}"
    return root / "json_2.1.1" / SPLIT_DIRS[split] / folder / f"trial_s{seed}_{index:06d}"


def generate(
    root: Path, split: str, num: int, seed: int, task_types: list[str], max_receptacles: int = MAX_RECEPTACLES
) -> list[Path]:
    """Write games 0..num-1 of `split` under `root` (official layout); return their sorted game paths."""
    split_dir = Path(root) / "json_2.1.1" / SPLIT_DIRS[split]
    if split_dir.is_dir() and any(split_dir.iterdir()):  # old games would silently mix with the new
        raise FileExistsError(f"{split_dir} already holds games; remove it or choose another directory")
    paths = []
    for index in range(num):
        task, traj, game = make_game(seed, split, index, task_types, max_receptacles)
        folder = trial_dir(Path(root), split, task, seed, index)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "traj_data.json").write_text(json.dumps(traj, indent=1))
        (folder / "game.tw-pddl").write_text(json.dumps(game))
        paths.append(folder / "game.tw-pddl")
    return sorted(paths)
