"""One rank of the SIGKILL run of the checkpoint abort fuzz (``tests/checkpoint/test_abort_fuzz.py``).

Usage: ``ckpt_kill_worker.py DIRECTORY`` on 2 ranks (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` set). Resumes from DIRECTORY (collectively) and prints
``{"loaded": step}``; then saves and commits the next steps, one after the other, until
it is killed, printing ``{"committed": step}`` after each. After its first commit, rank
0 prints ``{"left": [...]}`` (before either rank saves again): what the commit's clean-up left that it should not have
(partial folders, ``.tmp`` files, files no manifest lists). Each rank's tensors hold
``10 * step + rank``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lifecycle.checkpoint import AsyncCheckpointer, load_checkpoint
from lifecycle.checkpoint.layout import listed_files, read_manifest, step_folders

RANK = int(os.environ["RANK"])
SHAPE = (32, 4096)


def _left(directory: Path, committed: int) -> list[str]:
    left = [str(p) for p in directory.rglob("*.tmp")]
    for step in step_folders(directory):
        folder = directory / f"step_{step:010d}"
        try:
            manifest, _ = read_manifest(folder, step)
        except Exception:  # noqa: BLE001 - not complete: a partial folder the clean-up should have removed
            left.append(f"partial {folder}")
            continue
        listed = {e["file"] for e in listed_files(manifest)} | {"manifest.json"}
        left += [str(p) for p in folder.iterdir() if p.name not in listed]
    return left


def main(directory: str) -> None:
    """Resume, then save and commit forever."""
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=10))
    root = Path(directory)
    target: dict[str, Any] = {"w": torch.zeros(SHAPE), "step": 0}
    loaded = load_checkpoint(root, target)
    right = loaded is None or torch.equal(target["w"], torch.full(SHAPE, 10.0 * loaded + RANK))
    print(json.dumps({"loaded": loaded, "values_match": right}), flush=True)
    writer = AsyncCheckpointer(root)
    step = (loaded or 0) + 1
    while True:
        writer.save(step, {"w": torch.full(SHAPE, 10.0 * step + RANK), "step": step})
        writer.finalize()
        print(json.dumps({"committed": step}), flush=True)
        if step == (loaded or 0) + 1:
            if RANK == 0:
                print(json.dumps({"left": _left(root, step)}), flush=True)
            dist.barrier()  # before rank 1 starts its next save
        step += 1


if __name__ == "__main__":
    main(*sys.argv[1:])
