"""One rank of ``test_abort_racing_finalize_never_commits_a_manifest_missing_a_shard``.

Usage: ``ckpt_race_worker.py DIRECTORY ITERATIONS SEED`` on 2 ranks (``RANK`` etc. set by
``lifecycle.testing.launch_ranks``). Each iteration both ranks save step 1 into their own
folder and finalize it; on rank 0 a thread calls ``abort()`` after a seeded random delay,
as NVRx's monitor thread does while the main thread finalizes. Rank 0 then checks the
folder: a manifest must list one shard per rank, and ``latest`` may only name a complete
step. Prints one JSON line: the outcome counts and every bad folder.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lifecycle.checkpoint import AsyncCheckpointer, CheckpointError
from lifecycle.checkpoint.layout import read_manifest
from lifecycle.checkpoint.writer import ROW, VERDICT

RANK = int(os.environ["RANK"])
_calls: dict[str, Any] = {"all_gather": 0, "broadcast": 0, "rows": []}
_real_all_gather, _real_broadcast = dist.all_gather, dist.broadcast


def _counting_all_gather(out: list[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
    _calls["all_gather"] += 1
    _calls["rows"] = out
    return _real_all_gather(out, *args, **kwargs)


def _counting_broadcast(*args: Any, **kwargs: Any) -> Any:
    _calls["broadcast"] += 1
    return _real_broadcast(*args, **kwargs)


def _match_the_peer(gathered: int, broadcast: int) -> None:
    """Rank 0: join the collectives rank 1's finalize waits in that this rank's finalize skipped.

    Needed only on a broken writer (a finalize that went single-process, or skipped the
    broadcast), so that the test reports the bad folder instead of hanging.
    """
    if _calls["all_gather"] == gathered:  # none: rank 1 then reads "rank 0 wrote nothing"
        _real_all_gather([torch.zeros(ROW, dtype=torch.int64) for _ in range(2)], torch.zeros(ROW, dtype=torch.int64))
    elif _calls["broadcast"] == broadcast and all(int(row[0]) for row in _calls["rows"]):
        _real_broadcast(torch.zeros(VERDICT, dtype=torch.int64), group_src=0)  # "not committed"


def _inspect(folder: Path) -> str | None:
    """What is wrong with a folder after the race, or None."""
    manifest_path = folder / "step_0000000001" / "manifest.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if len(manifest["shards"]) != manifest["world_size"] or manifest["world_size"] != 2:
            return f"{manifest_path}: world size {manifest['world_size']} with {len(manifest['shards'])} shards"
    if (folder / "latest").exists():
        try:
            read_manifest(folder / "step_0000000001", 1)
        except CheckpointError as exc:
            return f"latest names an incomplete step: {exc}"
    return None


def main(directory: str, iterations: str, seed: str) -> None:
    """Race abort() (a thread on rank 0) against finalize() ITERATIONS times."""
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=20))
    torch.distributed.all_gather = _counting_all_gather  # type: ignore[assignment]
    torch.distributed.broadcast = _counting_broadcast  # type: ignore[assignment]
    rng = random.Random(int(seed))
    outcomes = {"none": 0, "failed": 0, "committed": 0}
    bad = []
    for i in range(int(iterations)):
        folder = Path(directory) / f"it{i:04d}"
        writer = AsyncCheckpointer(folder)
        writer.save(1, {"w": torch.full((64,), float(RANK))})
        racer = None
        if RANK == 0:
            delay = rng.uniform(0.0, 0.008)
            racer = threading.Thread(target=lambda: (time.sleep(delay), writer.abort()))  # noqa: B023
            racer.start()
            time.sleep(rng.uniform(0.0, 0.003))  # so that abort also lands before finalize, sometimes
        gathered, broadcast = _calls["all_gather"], _calls["broadcast"]
        try:
            outcome = "none" if writer.finalize() is None else "committed"
        except CheckpointError:
            outcome = "failed"
        if RANK == 0:
            _match_the_peer(gathered, broadcast)
        if racer is not None:
            racer.join(timeout=10)
        outcomes[outcome] += 1
        dist.barrier()
        if RANK == 0:
            problem = _inspect(folder)
            if problem is not None:
                bad.append(problem)
    print(json.dumps({"outcomes": outcomes, "bad": bad}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
