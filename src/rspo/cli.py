"""`rspo` command line: train, eval, sft, config, sweep, alfworld-gen.

Config errors exit with code 2 and one line naming the key; other failures print one
line (`RSPO_DEBUG=1` or `--debug` shows the traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from rspo.config import AlfworldConfig, Config, ConfigError, dump, load_config
from rspo.envs.alfworld_gen import MAX_RECEPTACLES, SPLIT_DIRS, TASK_TYPES, check_task_types, generate, split_sizes
from rspo.multinode import checked_everywhere


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file (defaults apply to every key it leaves out)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. algo.name=gigpo")


def _cmd_config(cfg: Config, args: argparse.Namespace) -> None:
    print(dump(cfg), end="")


def _cmd_train(cfg: Config, args: argparse.Namespace) -> None:
    from rspo.train import train

    train(cfg)


def _cmd_eval(cfg: Config, args: argparse.Namespace) -> None:
    from rspo.eval import evaluate_command

    evaluate_command(cfg, checkpoint=args.checkpoint, overrides=args.overrides)


def _cmd_sft(cfg: Config, args: argparse.Namespace) -> None:
    from rspo.sft import sft_command

    sft_command(cfg)


COMMANDS: dict[str, tuple[str, Callable[[Config, argparse.Namespace], None]]] = {
    "train": ("train a policy with RL (warm-starts first when sft.episodes > 0)", _cmd_train),
    "eval": ("evaluate a checkpoint on the held-out splits", _cmd_eval),
    "sft": ("supervised warm start on expert demonstrations", _cmd_sft),
    "config": ("print the resolved config", _cmd_config),
}


def quiet_libraries() -> None:
    """Keep the console to rspo's own bars and lines (HF's load/save bars and advice off)."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)


def alfworld_gen(argv: list[str]) -> int:
    """`rspo alfworld-gen --out DIR [--split S] [--num N] [--seed S] [--task-types a,b]`."""
    defaults = AlfworldConfig()
    sizes = split_sizes(defaults)
    parser = argparse.ArgumentParser(
        prog="rspo alfworld-gen",
        description="Generate ALFWorld games (official layout; point env.alfworld.data_dir or ALFWORLD_DATA at --out).",
    )
    parser.add_argument("--out", required=True, type=Path, help="root directory (json_2.1.1/ is created inside)")
    parser.add_argument("--split", choices=list(SPLIT_DIRS), help="one split (default: all three)")
    sizes_text = ", ".join(f"{k}={v}" for k, v in sizes.items())
    parser.add_argument("--num", type=int, help=f"games per split (default: {sizes_text})")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--task-types", default=",".join(TASK_TYPES), help="comma-separated (default: all six)")
    parser.add_argument("--max-receptacles", type=int, default=MAX_RECEPTACLES, help="room size (fewer: easier)")
    args = parser.parse_args(argv)
    task_types = [t for t in args.task_types.split(",") if t]
    try:
        check_task_types(task_types)
    except ValueError as e:
        parser.error(str(e))
    if args.num is not None and args.num < 0:
        parser.error(f"--num must be >= 0, got {args.num}")
    for split in [args.split] if args.split else list(SPLIT_DIRS):
        try:
            num = sizes[split] if args.num is None else args.num
            paths = generate(args.out, split, num, args.seed, task_types, args.max_receptacles)
        except FileExistsError as e:
            parser.error(str(e))
        print(f"{split}: {len(paths)} games in {args.out / 'json_2.1.1' / SPLIT_DIRS[split]}")
    return 0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["alfworld-gen"]:  # its own flags; not driven by the config
        return alfworld_gen(argv[1:])
    parser = argparse.ArgumentParser(prog="rspo", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        _config_args(p)
        if name == "eval":
            p.add_argument("--checkpoint", default="", help="checkpoint dir (default: latest in train.output_dir)")
    sub.add_parser("alfworld-gen", help="generate ALFWorld games (see `rspo alfworld-gen --help`)")
    sweep = sub.add_parser("sweep", help="run an experiment grid and collect its table, plots and JSON")
    sweep.add_argument("--config", required=True, help="experiment file (configs/experiments/*.yaml)")
    sweep.add_argument("--only", default="", help="run only these: comma-separated run names or parts of names")
    sweep.add_argument("--collect", action="store_true", help="only rebuild the results from finished runs")
    sweep.add_argument("--parallel", type=int, help="runs at a time (overrides the experiment file's `parallel`)")
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("RSPO_DEBUG") == "1"
    quiet_libraries()
    try:
        if args.command == "eval" and args.checkpoint and args.config:
            raise ConfigError("--config: `rspo eval --checkpoint` reads the checkpoint's own config.yaml; "
                              "change its keys with key=value overrides")  # fmt: skip
        own = args.command == "sweep" or (args.command == "eval" and args.checkpoint)  # loaded by the command
        # launched on several machines: a config error on one (a path only the others have) stops all
        cfg = None if own else checked_everywhere(lambda: load_config(args.config, args.overrides))
    except ConfigError as e:
        print(f"rspo: config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    code = 0
    try:
        if args.command == "sweep":
            from rspo.sweep import sweep_command

            sweep_command(args.config, args.only, args.collect, args.parallel)
        else:
            COMMANDS[args.command][1](cfg, args)
    except KeyboardInterrupt:
        print("rspo: interrupted", file=sys.stderr)
        code = 130
    except ConfigError as e:
        print(f"rspo: config error: {e}", file=sys.stderr)
        code = 2
    except (OSError, ValueError, RuntimeError) as e:
        if debug:
            raise
        print(f"rspo: error: {type(e).__name__}: {e}\n(set RSPO_DEBUG=1 for the traceback)", file=sys.stderr)
        code = 1
    end_process(code)
    if code:
        raise SystemExit(code)


def end_process(code: int = 0) -> None:
    """In a process of a multi-process launch, exit now with `code`, skipping the process
    group's teardown; elsewhere return.

    Why: gloo's process group joins its worker threads when it is destroyed, and a worker
    may still hold the last collective's tensors, whose release needs the GIL. Destroyed
    from Python (`destroy_process_group`, then the last DDP wrapper freed), the joining
    thread holds the GIL: a deadlock (3 of 12 two-process launches of tests/ddp_check.py
    hung there, the worker in ~AsyncAllgatherWork waiting for the GIL). Left to interpreter
    exit, the release comes after Python is gone: SIGABRT, "terminate called without an
    active exception" (pytorch/pytorch#190489). A run's last collective is the barrier
    after its checkpoint, and its files are closed by then, so skipping the teardown loses
    nothing."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
