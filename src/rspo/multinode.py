"""Files across machines: what a multi-node run (`accelerate launch --num_machines N`)
needs of its disks. Nothing: no disk has to be shared between machines.

A run's files are of three kinds (README, "Multi-node"):

- **Caches** (`$RSPO_CACHE`: the tiny model, generated ALFWorld games and WebShop shops):
  every machine builds its own, from the config alone, the same bytes on every machine
  (seeded; `tests/test_policy.py`, `tests/test_alfworld.py` and `tests/test_webshop_levels.py`
  build them twice and compare). Cheap and deterministic, so nothing is sent.
- **Files every rank reads that one process writes**: the SFT warm start
  (`<train.output_dir>/sft`) and the checkpoint a run resumes from. The global main
  process writes them on its disk; `share_dir` then sends them over the process group to
  every machine whose copy differs. The warm start is not trained again on each machine:
  training is not bitwise reproducible across hardware or thread counts (the order of
  float reductions), and DDP's initial broadcast would not cover what it does not wrap
  (the KL reference, the tokenizer).
- **Outputs** (logs, TensorBoard, checkpoints, `eval_summary.json`): the global main
  process writes them, on its own disk.

Which machines lack the files is decided from a listing (names, sizes, modification
times): on a shared disk every machine sees the main's own files and nothing is sent; a
machine that received them earlier (their times are set to the main's) or that holds a
copy made with `rsync -a` keeps its copy.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # torch and accelerate are imported where used: `rspo config` loads neither
    from accelerate import Accelerator

T = TypeVar("T")
CHUNK = 1 << 26  # bytes a broadcast: 64 MiB


def launched() -> bool:
    """Whether this process is one of several started by `accelerate launch` (torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def checked_everywhere(check: Callable[[], T]) -> T:
    """`check()`'s result on this process. Under a multi-process launch, when the check
    failed on any process (a path one machine lacks, a run directory that holds a run on
    one disk only), every process raises the first failure: each machine stops with the
    same line, none waits for the others at the rendezvous."""
    result, error = None, None
    try:
        result = check()
    except (OSError, ValueError) as e:
        error = e
    if launched():
        from accelerate import PartialState
        from accelerate.utils import gather_object, parse_flag_from_env

        # joins the process group, as `Accelerator()` would (which then reuses it); `cpu` as it
        # reads it, else on CPU each process would take itself for the only one
        rank = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU")).process_index
        errors = [(i, e) for i, e in enumerate(gather_object([error])) if e is not None]
        if errors and errors[0][0] != rank:  # another process's: say whose
            i, error = errors[0]
            error.args = (f"{error} [on process {i}]",)
    if error is not None:
        raise error
    return result


def listing(path: Path) -> list[tuple[str, int, int]]:
    """(relative name, size, mtime in ns) of every file under `path`, sorted; [] if none."""
    if not path.is_dir():
        return []
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return [(str(f.relative_to(path)), (s := f.stat()).st_size, s.st_mtime_ns) for f in files]


def main_decides(acc: Accelerator, decide: Callable[[], T]) -> T:
    """`decide()` run on the global main process only; its result (or its error, raised
    again on every rank with the same one line, so no rank waits for a failed one) on all."""
    from accelerate.utils import broadcast_object_list

    answer: list = [None]
    if acc.is_main_process:
        try:
            answer = [(decide(), None)]
        except (OSError, ValueError) as e:
            answer = [(None, e)]
    if acc.use_distributed:
        broadcast_object_list(answer)
    result, error = answer[0]
    if error is not None:
        raise error
    return result


def share_dir(acc: Accelerator, path: Path) -> None:
    """Make `path` hold the global main process's files on every machine (a collective:
    every rank calls it). Each machine's local main process lists its copy; the main sends
    every file to those whose listing differs from its own, which write them whole beside
    `path` and rename them into place."""
    from accelerate.utils import gather_object

    from rspo.checkpoint import replace_dir

    if not acc.use_distributed:
        return
    rows = gather_object([listing(path) if acc.is_local_main_process else None])  # one per process
    files = rows[0]  # the global main's
    if not files:
        raise FileNotFoundError(f"{path}: not on the main process")
    need = [rank for rank, mine in enumerate(rows) if mine is not None and mine != files]
    if not need:
        return
    size = sum(f[1] for f in files)
    receive = acc.process_index in need
    if acc.is_main_process or receive:
        print(f"{path}: {size / 2**20:.1f} MiB sent by the main process to process(es) {need} (machines without it)")
    tmp = path.with_name(f".tmp-{path.name}-{acc.process_index}")
    shutil.rmtree(tmp, ignore_errors=True)
    for name, nbytes, mtime in files:
        _send_file(acc, path / name, tmp / name if receive else None, nbytes)
        if receive:
            os.utime(tmp / name, ns=(mtime, mtime))  # the main's times: a later run finds this copy the same
    if receive:
        replace_dir(tmp, path)
    acc.wait_for_everyone()  # every copy in place before any rank reads one


def _send_file(acc: Accelerator, source: Path, target: Path | None, nbytes: int) -> None:
    """Broadcast one file's bytes from the main process in chunks; `target`: where this
    rank writes them (None: it only takes part in the broadcast)."""
    import torch
    import torch.distributed as dist

    with contextlib.ExitStack() as files:
        src = files.enter_context(open(source, "rb")) if acc.is_main_process else None
        if target is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            dst = files.enter_context(open(target, "wb"))
        for start in range(0, nbytes, CHUNK):
            buf = torch.empty(min(CHUNK, nbytes - start), dtype=torch.uint8, device=acc.device)
            if src is not None:
                buf.copy_(torch.frombuffer(bytearray(src.read(len(buf))), dtype=torch.uint8))
            dist.broadcast(buf, src=0)
            if target is not None:
                dst.write(buf.cpu().numpy().tobytes())
