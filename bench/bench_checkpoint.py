"""Checkpoint saves in the DCP format, against a plain copy, ``torch.save`` and ``dcp.save``.

World size 1, no process group, one process, one state of ``TENSORS`` float32 tensors of
``ELEMENTS`` elements each (64 MiB), written under one temporary folder on the disk
that holds the repository. Runs rotate through the sides, each taking every position in
turn, so that drift hits all alike; every side ends with its bytes durable (fsync).

Blocking time of an asynchronous save (what the training loop waits for):

(a) ``AsyncCheckpointer.save``: stage a CPU copy of every tensor, plan the DCP writes on
    the caller's thread, start the writer thread. (Its finalize runs untimed afterwards.)
(b) the floor: a plain copy of the state to CPU memory (``tensor.detach().clone()``).

Wall time of a synchronous save:

(c) ``AsyncCheckpointer.save`` + ``finalize``: stage, plan, write the data file with a
    ``FileSystemWriter`` (fsync), SHA-256 it, write the rank's record; at the commit,
    ``.metadata``, the manifest and ``latest`` (each write-tmp + fsync + rename) and the
    clean-up.
(d) ``torch.save`` of the same state to one file, then fsync of the file and its folder.
(e) ``torch.distributed.checkpoint.save(no_dist=True)``: DCP's own synchronous save.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import median, paired_ratio, table

TENSORS = 16
ELEMENTS = 1 << 20  # 4 MiB each
RUNS = 7
HERE = Path(__file__).resolve().parent


def _state() -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    return {"model": {f"layer{i}.weight": torch.randn(ELEMENTS) for i in range(TENSORS)}, "step": 1}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _async_blocking(root: Path, state: dict[str, Any], step: int) -> float:
    from lifecycle.checkpoint import AsyncCheckpointer

    writer = AsyncCheckpointer(root, keep_last=1)
    start = time.perf_counter()
    writer.save(step, state)
    elapsed = time.perf_counter() - start
    writer.finalize()
    return elapsed


def _plain_copy(state: dict[str, Any]) -> float:
    start = time.perf_counter()
    copy = {k: v.detach().clone() for k, v in state["model"].items()}
    elapsed = time.perf_counter() - start
    del copy
    return elapsed


def _sync_save(root: Path, state: dict[str, Any], step: int) -> float:
    from lifecycle.checkpoint import AsyncCheckpointer

    writer = AsyncCheckpointer(root, keep_last=1)
    start = time.perf_counter()
    writer.save(step, state)
    writer.finalize()
    return time.perf_counter() - start


def _torch_save(root: Path, state: dict[str, Any], step: int) -> float:
    import torch

    path = root / f"plain-{step}.pt"
    start = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(root)
    elapsed = time.perf_counter() - start
    path.unlink()
    return elapsed


def _dcp_save(root: Path, state: dict[str, Any], step: int) -> float:
    import torch.distributed.checkpoint as dcp

    folder = root / f"dcp-{step}"
    start = time.perf_counter()
    dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    _fsync_dir(folder)
    elapsed = time.perf_counter() - start
    shutil.rmtree(folder)
    return elapsed


def main() -> str:
    """Run the rotation; return the two tables."""
    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # dcp.save without a group warns that it assumes one process
    state = _state()
    root = Path(
        tempfile.mkdtemp(prefix="bench-ckpt-", dir=HERE.parent / "build" if (HERE.parent / "build").is_dir() else None)
    )
    times: dict[str, list[float]] = {k: [] for k in "abcde"}
    try:
        step = 0
        for run in range(RUNS):
            order = "abcde"[run % 5 :] + "abcde"[: run % 5]
            for side in order:
                step += 1
                if side == "a":
                    times["a"].append(_async_blocking(root / "async", state, step))
                elif side == "b":
                    times["b"].append(_plain_copy(state))
                elif side == "c":
                    times["c"].append(_sync_save(root / "sync", state, step))
                elif side == "d":
                    times["d"].append(_torch_save(root, state, step))
                else:
                    times["e"].append(_dcp_save(root, state, step))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ms = {k: [1000 * t for t in v] for k, v in times.items()}
    mib = TENSORS * ELEMENTS * 4 / (1 << 20)
    blocking = table(
        f"Blocking time of an asynchronous save ({mib:.0f} MiB in {TENSORS} tensors, world size 1, "
        f"median of {RUNS} rotating runs; ms)",
        ["(a) AsyncCheckpointer.save", "(b) plain copy to CPU memory", "(a)/(b)", "(a)/(b) back to back", "target"],
        [
            [
                f"{median(ms['a']):.1f}",
                f"{median(ms['b']):.1f}",
                f"{median(ms['a']) / median(ms['b']):.2f}",
                f"{paired_ratio(ms['a'], ms['b']):.2f}",
                "≤ 1.2",
            ]
        ],
    )
    synchronous = table(
        f"Synchronous save, made durable ({mib:.0f} MiB, world size 1, median of {RUNS} rotating runs; ms)",
        [
            "(c) save + finalize (DCP format)",
            "(d) torch.save + fsync",
            "(e) dcp.save (no_dist)",
            "(c)/(d)",
            "(c)/(d) back to back",
            "target (c)/(d)",
            "(c)/(e)",
        ],
        [
            [
                f"{median(ms['c']):.0f}",
                f"{median(ms['d']):.0f}",
                f"{median(ms['e']):.0f}",
                f"{median(ms['c']) / median(ms['d']):.2f}",
                f"{paired_ratio(ms['c'], ms['d']):.2f}",
                "≤ 1.2",
                f"{median(ms['c']) / median(ms['e']):.2f}",
            ]
        ],
    )
    return blocking + "\n" + synchronous + "\n" + SHOWS + "\n"


SHOWS = (
    "What this shows: the training loop waits for a save about as long as a plain copy of the state to CPU "
    "memory (the copy is the staging; planning the DCP writes on the caller's thread adds well under a "
    "millisecond). A synchronous save with its commit costs more than a bare `torch.save` + fsync of the same "
    "bytes, and more than `dcp.save`, whose write is the same as ours: on top come the SHA-256 of the data file "
    "that the commit and every resume verify (CPU-bound; hashing while writing instead of re-reading the file "
    "from the page cache saved nothing measurable), the staging copy, and the commit's small files (record, "
    "`.metadata`, manifest, `latest`: each written to a tmp file, fsynced and renamed). Where (c)/(d) is above "
    "its target, a cheaper checksum (CRC-32) or hashing in a second thread while the write proceeds are the "
    "levers left."
)


if __name__ == "__main__":
    print(main())
