"""Who owns a checkpoint directory, and what rank 0 removes after a successful commit.

A directory is owned by the run whose id (``lifecycle.journal.run_id()``: the same
on every rank, across torchrun restarts and across retries in one process) is in its
``.lifecycle-owner`` file, written when the first save of a run finds none. Only under
that run, after a commit, rank 0 removes partial step folders (a manifest that is
absent or invalid, or lists a shard that is absent or of another size: a crash or an
aborted save; never one whose manifest could not be read for an I/O error, which is
kept with a warning), files no committed manifest references (a retry's stray
shards, hidden ``.tmp`` files) and, with ``keep_last``, the oldest complete steps. A
directory owned by another run is never cleaned, only warned about.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import warnings
from pathlib import Path
from typing import Any

from lifecycle.checkpoint.errors import CheckpointError, CheckpointUnreadable, os_error_text
from lifecycle.checkpoint.layout import (
    DATA_RE,
    DCP_METADATA,
    MANIFEST,
    MARKER,
    OWNER,
    RECORD_RE,
    SHARD_RE,
    TMP_RE,
    fsync_dir,
    listed_files,
    read_manifest,
    step_dir,
    step_folders,
)

__all__ = ["claim", "clean", "read_owner"]


def read_owner(directory: Path) -> str | None:
    """The run id in ``directory``'s owner file; None if there is none; ``"?"`` if it is unreadable."""
    try:
        owner = json.loads((directory / OWNER).read_bytes())["run_id"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return "?"
    return owner if isinstance(owner, str) else "?"


def claim(directory: Path, run_id: str) -> str:
    """Write ``directory``'s owner file for ``run_id`` unless one exists; return the owner's run id.

    Exclusive create: of two runs starting on one directory, exactly one owns it. An
    owner file that cannot be read names no run (``"?"``) and so never this one.
    """
    path = directory / OWNER
    record = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), "created": time.time()}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return read_owner(directory) or "?"
    except OSError:
        return "?"  # the save itself reports a storage fault; cleaning is only skipped
    try:
        os.write(fd, json.dumps(record).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(directory)
    return run_id


def _ours(path: Path) -> bool:
    name = path.name
    return bool(
        any(pattern.fullmatch(name) for pattern in (SHARD_RE, DATA_RE, RECORD_RE, TMP_RE))
        or name in (MANIFEST, DCP_METADATA)
    )


def _remove_folder(folder: Path, removed: list[Path]) -> None:
    """Remove a step folder that holds only our files; manifest first, so a crash leaves a partial step."""
    entries = list(folder.iterdir())
    foreign = [p.name for p in entries if not (p.is_file() and _ours(p))]
    if foreign:
        warnings.warn(
            f"checkpoint folder {folder} not removed: it holds files lifecycle did not write: {sorted(foreign)}",
            RuntimeWarning,
            stacklevel=4,
        )
        return
    (folder / MANIFEST).unlink(missing_ok=True)
    fsync_dir(folder)
    shutil.rmtree(folder)
    removed.append(folder)


def _unreferenced(folder: Path, manifest: dict[str, Any]) -> list[Path]:
    keep = {s["file"] for s in listed_files(manifest)}
    return [p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST and _ours(p) and p.name not in keep]


def clean(directory: Path, committed: int, run_id: str, keep_last: int | None) -> list[Path]:
    """After ``committed`` was committed: remove what this run left behind; return the paths removed.

    Only if ``directory`` is owned by ``run_id`` (else a RuntimeWarning names the owner
    and nothing is removed). Removes partial step folders, unreferenced shards and tmp
    files (the marker's, and the probe files of a constructor that was killed), and
    with ``keep_last`` the complete steps older than the ``keep_last`` newest at or
    below ``committed``; ``committed`` itself (the newest verified
    checkpoint) is never removed, nor are complete steps newer than it. A removal that
    fails is warned about, naming the path and the OS error; the commit stands.
    """
    owner = read_owner(directory)
    if owner != run_id:
        warnings.warn(
            f"checkpoint directory {directory} is owned by run {owner!r} ({directory / OWNER}), not this run "
            f"{run_id!r}: partial and old checkpoints are left in place (set LIFECYCLE_RUN_ID to the owner's "
            "id to continue that run, or use a directory of your own)",
            RuntimeWarning,
            stacklevel=3,
        )
        return []
    removed: list[Path] = []
    complete: list[int] = []
    for step in step_folders(directory):
        folder = step_dir(directory, step)
        try:
            try:
                manifest, _ = read_manifest(folder, step)
            except CheckpointUnreadable as exc:
                # An I/O error (a stale NFS handle, EIO) says nothing about completeness: keep it.
                warnings.warn(
                    f"checkpoint folder {folder} kept: {exc}; clean-up removes a folder only when its manifest is "
                    "absent or invalid",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            except CheckpointError:
                if step != committed:
                    _remove_folder(folder, removed)
                continue
            if step <= committed:
                complete.append(step)
            for stray in _unreferenced(folder, manifest):
                stray.unlink(missing_ok=True)
                removed.append(stray)
        except OSError as exc:
            warnings.warn(f"could not clean {folder}: {os_error_text(exc)}", RuntimeWarning, stacklevel=2)
    # The marker's tmp files, and the probe files of a constructor killed mid-probe: every rank
    # of this run built its writer before the commit, so none of its probes is still in use.
    for stray in [*directory.glob(f".{MARKER}.*.tmp"), *directory.glob(".probe-rank*.tmp")]:
        stray.unlink(missing_ok=True)
        removed.append(stray)
    if keep_last is not None:
        older = [s for s in complete if s != committed][max(keep_last - 1, 0) :]
        for step in older:
            try:
                _remove_folder(step_dir(directory, step), removed)
            except OSError as exc:
                warnings.warn(
                    f"could not remove old checkpoint {step_dir(directory, step)}: {os_error_text(exc)}",
                    RuntimeWarning,
                    stacklevel=2,
                )
    return removed
