"""One rank of the two-rank checkpoint tests in ``tests/checkpoint/test_writer.py``.

Usage: ``checkpoint_worker.py SCENARIO DIRECTORY [ARGS]`` with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` set (``lifecycle.testing.launch_ranks`` sets them).
Prints one JSON line: what this rank observed.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lifecycle.checkpoint import AsyncCheckpointer, CheckpointError, latest_checkpoint, load_checkpoint
from lifecycle.checkpoint.layout import ShardLayout

RANK = int(os.environ["RANK"])


def _init(timeout_s: float) -> None:
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=timeout_s))


def _report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _close() -> None:
    """Leave together: a rank destroying its group while its peer still tears down can abort in gloo."""
    dist.barrier()
    dist.destroy_process_group()


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


def _two_steps(directory: str) -> None:
    """Both ranks commit steps 2 and 4 into the shared ``directory``; rank r's tensor holds 10 * step + r."""
    writer = AsyncCheckpointer(directory)
    for step in (2, 4):
        writer.save(step, {"w": torch.full((3,), 10.0 * step + RANK)})
        writer.finalize()


def _flip_own_shard(folder: Path, step: int) -> None:
    """Flip a byte of this rank's tensor as its shard stores it (``_two_steps``'s value for ``step``)."""
    (shard,) = folder.glob(f"__{RANK}_*_0.distcp")
    data = bytearray(shard.read_bytes())
    at = data.find(torch.full((3,), 10.0 * step + RANK).numpy().tobytes())
    assert at >= 0, f"no tensor bytes in {shard}"
    data[at + 5] ^= 0xFF
    shard.write_bytes(bytes(data))  # same size: only the checksum can tell


def _load_reporting(directory: str) -> None:
    """Load into a fresh state dict (collectively, over the default group); report step, tensor, warnings."""
    target = {"w": torch.zeros(3)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            loaded, error = load_checkpoint(directory, target), None
        except CheckpointError as exc:
            loaded, error = None, f"{type(exc).__name__}: {exc}"
    _report(
        loaded=loaded,
        w=target["w"].tolist(),
        error=error,
        warnings=[str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
    )


def stale_view(directory: str, copy: str, stale_rank: str) -> None:
    """Steps 2 and 4 commit; rank ``stale_rank`` then resumes from a copy of the folder that lacks step 4."""
    _init(20)
    _two_steps(directory)
    if RANK == 0:
        shutil.copytree(directory, copy)
        shutil.rmtree(Path(copy) / "step_0000000004")
        (Path(copy) / "latest").write_text(json.dumps({"step": 2}))
    dist.barrier()
    _load_reporting(copy if int(stale_rank) == RANK else directory)
    _close()


def corrupt_shard(directory: str, steps: str) -> None:
    """Steps 2 and 4 commit; rank 1 flips a byte of its shard of each of ``steps``; both resume together."""
    _init(20)
    _two_steps(directory)
    if RANK == 1:
        for step in steps.split(","):
            _flip_own_shard(Path(directory) / f"step_{int(step):010d}", int(step))
    dist.barrier()
    _load_reporting(directory)
    _close()


def mismatch(directory: str) -> None:
    """Steps 2 and 4 commit; rank 1 resumes into a state dict of another shape: both ranks refuse."""
    _init(20)
    _two_steps(directory)
    target = {"w": torch.zeros(3 if RANK == 0 else 5)}
    try:
        load_checkpoint(directory, target)
        error = None
    except CheckpointError as exc:
        error = {"type": type(exc).__name__, "what": getattr(exc, "what", None), "text": str(exc)}
    _report(error=error, w=target["w"].tolist())
    _close()


def own_folders(directory: str, other: str, big_rank: str = "-1") -> None:
    """Rank 0 saves step 1 in ``directory``, rank 1 in ``other`` (the same folder, or one rank 0 cannot see).

    Rank ``big_rank`` saves 4 MiB (to overflow a small file system); the others 12 bytes.
    """
    _init(20)
    size = (1 << 20) if int(big_rank) == RANK else 3
    writer = AsyncCheckpointer(directory if RANK == 0 else other)
    writer.save(1, {"w": torch.ones(size)})
    try:
        committed, error = writer.finalize(), None
    except CheckpointError as exc:
        committed, error = None, str(exc)
    _report(committed=committed, error=error)
    _close()


def _committed_step_1(directory: str, timeout: str) -> AsyncCheckpointer:
    """Join the group (its timeout ``timeout`` s); return a writer that committed step 1 in ``directory``."""
    _init(float(timeout))
    writer = AsyncCheckpointer(directory)
    writer.save(1, {"w": torch.full((3,), 1.0)})
    writer.finalize()
    return writer


def _finalize_step_2(writer: AsyncCheckpointer) -> tuple[str | None, float]:
    """Save step 2 and finalize it: the CheckpointError's text (None: committed) and how long finalize() took."""
    writer.save(2, {"w": torch.full((3,), 2.0)})
    start = time.monotonic()
    try:
        writer.finalize()
        error = None
    except CheckpointError as exc:
        error = str(exc)
    return error, time.monotonic() - start


def peer_aborts(directory: str, timeout: str, peer_destroys: str) -> None:
    """Step 1 commits; then rank 1 aborts a hung save of step 2 while rank 0 finalizes it."""
    writer = _committed_step_1(directory, timeout)
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
    error, elapsed = _finalize_step_2(writer)
    (Path(directory) / "rank0-done").touch()
    _report(error=error, elapsed=elapsed, latest=latest_checkpoint(directory)[0])  # type: ignore[index]
    os._exit(0)  # the group may be broken; do not let teardown wait on it


def hung_write(directory: str, timeout: str) -> None:
    """Step 1 commits; rank 1's write of step 2 hangs; both ranks finalize step 2 (default write bound)."""
    writer = _committed_step_1(directory, timeout)
    if RANK == 1:
        hung = threading.Event()  # never set: this rank's write hangs forever (a hard-mounted NFS outage)
        writer._before_write = hung.wait  # the writer's test seam
    error, elapsed = _finalize_step_2(writer)
    latest = latest_checkpoint(directory)
    _report(error=error, elapsed=elapsed, bound=writer.write_timeout_s, latest=None if latest is None else latest[0])
    _close()


def tensor_parallel_save(directory: str) -> None:
    """Every rank saves step 4 at TP2 x DP(world/2): tensor-parallel rank r holds ``expected_state(r)``."""
    from dcp_reader import expected_state  # the same directory; imports no lifecycle

    _init(30)
    world = dist.get_world_size()
    layout = ShardLayout(tensor=2, data=world // 2, tensor_rank=RANK % 2, data_rank=RANK // 2)
    writer = AsyncCheckpointer(directory, layout=layout)
    writer.save(4, expected_state(RANK % 2))
    _report(committed=writer.finalize())
    _close()


if __name__ == "__main__":
    scenarios = {
        "tensor_parallel_save": tensor_parallel_save,
        "hung_write": hung_write,
        "both_finalize": both_finalize,
        "peer_aborts": peer_aborts,
        "stale_view": stale_view,
        "corrupt_shard": corrupt_shard,
        "mismatch": mismatch,
        "own_folders": own_folders,
    }
    scenarios[sys.argv[1]](*sys.argv[2:])
