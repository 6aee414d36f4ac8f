"""One rank of the two-rank checkpoint tests in ``tests/checkpoint/test_writer.py``.

Usage: ``checkpoint_worker.py SCENARIO DIRECTORY [ARGS]`` with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` set (``lifecycle.testing.launch_ranks`` sets them).
Prints one JSON line: what this rank observed.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lifecycle.checkpoint import AsyncCheckpointer, CheckpointError, latest_checkpoint, load_checkpoint

RANK = int(os.environ["RANK"])


def _init(timeout_s: float) -> None:
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=timeout_s))


def _report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def both_finalize(directory: str) -> None:
    """Both ranks save and finalize step 1, then each loads its own shard back."""
    _init(20)
    writer = AsyncCheckpointer(directory)
    writer.save(1, {"w": torch.full((3,), float(RANK))})
    committed = writer.finalize()
    dist.destroy_process_group()
    target = {"w": torch.zeros(3)}
    loaded = load_checkpoint(directory, target, rank=RANK)
    _report(committed=committed, loaded=loaded, w=target["w"].tolist())


def peer_aborts(directory: str, timeout: str, peer_destroys: str) -> None:
    """Step 1 commits; then rank 1 aborts a hung save of step 2 while rank 0 finalizes it."""
    _init(float(timeout))
    writer = AsyncCheckpointer(directory)
    writer.save(1, {"w": torch.full((3,), 1.0)})
    writer.finalize()
    if RANK == 1:
        hung = threading.Event()  # never set: this rank's write hangs forever
        writer._before_write = hung.wait  # the writer's test seam
        writer.save(2, {"w": torch.full((3,), 2.0)})
        writer.abort()
        _report(aborted=True)
        if peer_destroys == "destroy":
            dist.destroy_process_group()
        else:  # stay alive without taking part, until rank 0 is done
            flag = Path(directory) / "rank0-done"
            deadline = time.monotonic() + 30
            while not flag.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return  # exits with the hung daemon writer thread still blocked
    writer.save(2, {"w": torch.full((3,), 2.0)})
    start = time.monotonic()
    try:
        writer.finalize()
        error = None
    except CheckpointError as exc:
        error = str(exc)
    elapsed = time.monotonic() - start
    (Path(directory) / "rank0-done").touch()
    _report(error=error, elapsed=elapsed, latest=latest_checkpoint(directory)[0])  # type: ignore[index]
    os._exit(0)  # the group may be broken; do not let teardown wait on it


if __name__ == "__main__":
    scenarios = {"both_finalize": both_finalize, "peer_aborts": peer_aborts}
    scenarios[sys.argv[1]](*sys.argv[2:])
