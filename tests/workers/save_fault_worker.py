"""One rank of the seeded save-fault test (``tests/checkpoint/test_save_faults.py``).

Usage: ``save_fault_worker.py DIRECTORY SEED SAVES`` with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` set. Both ranks draw the same faults from ``SEED``
and save ``SAVES`` steps on one long-lived gloo group with ``write_timeout_s=1``; each
save may get one fault injected at a seam: a write failing with ENOSPC, EROFS or
EACCES on one rank (the writer's ``_before_write`` hook), a write hung past its bound
on one rank, or EIO at rank 0's commit (its manifest or its ``latest`` marker). Prints
one JSON line: each save's outcome as this rank saw it, what ``latest`` was after each,
and the step and values a resume loaded.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import lifecycle.checkpoint.writer as writer_module
from lifecycle.checkpoint import AsyncCheckpointer, SaveFailed, latest_checkpoint, load_checkpoint

RANK = int(os.environ["RANK"])
FAULTS = ("none", "none", "enospc", "erofs", "eacces", "hung", "eio_manifest", "eio_latest")


def _raising(code: int) -> Callable[[], None]:
    def fail() -> None:
        raise OSError(code, os.strerror(code))

    return fail


def _hung() -> None:
    time.sleep(1.6)  # past write_timeout_s (1 s)


def _failing_commit(which: int) -> Callable[[Path, bytes], None]:
    """``write_atomic`` whose ``which``-th call (1: the manifest, 2: ``latest``) fails with EIO."""
    real = writer_module.write_atomic
    calls = [0]

    def write(path: Path, data: bytes) -> None:
        calls[0] += 1
        if calls[0] == which:
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))
        real(path, data)

    return write


def main(directory: str, seed: str, saves: str) -> None:
    """Save ``saves`` steps with the drawn faults; report outcomes, ``latest`` after each, and the resume."""
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=20))
    draw = random.Random(int(seed))
    writer = AsyncCheckpointer(directory, write_timeout_s=1.0)
    real_write_atomic = writer_module.write_atomic
    outcomes: list[dict[str, Any]] = []
    for step in range(1, int(saves) + 1):
        fault, victim = draw.choice(FAULTS), draw.randrange(2)
        hook: Callable[[], None] | None = None
        if fault in ("enospc", "erofs", "eacces") and victim == RANK:
            hook = _raising({"enospc": errno.ENOSPC, "erofs": errno.EROFS, "eacces": errno.EACCES}[fault])
        elif fault == "hung" and victim == RANK:
            hook = _hung
        writer._before_write = hook
        writer.save(step, {"w": torch.full((3,), 10.0 * step + RANK)})
        writer._before_write = None
        if fault.startswith("eio") and RANK == 0:
            writer_module.write_atomic = _failing_commit(1 if fault == "eio_manifest" else 2)  # type: ignore[assignment]
        try:
            committed, error = writer.finalize(), None
        except SaveFailed as exc:
            committed, error = None, str(exc)
        finally:
            writer_module.write_atomic = real_write_atomic
        found = latest_checkpoint(directory)
        outcomes.append(
            {"step": step, "fault": fault, "committed": committed, "error": error, "latest": found and found[0]}
        )
    dist.barrier()
    target = {"w": torch.zeros(3)}
    loaded = load_checkpoint(directory, target)
    print(json.dumps({"outcomes": outcomes, "loaded": loaded, "w": target["w"].tolist()}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
