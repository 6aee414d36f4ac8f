"""The on-disk layout of a checkpoint directory, and the file operations every part shares.

Layout under ``directory``::

    .lifecycle-owner                       JSON: the run id of the job that owns the folder
    step_0000000002/rank00000-<token>.pt   one shard per rank and save attempt
    step_0000000002/manifest.json          commit record: written only by finalize()
    latest                                 JSON marker naming the committed step

A step folder without a valid manifest is a partial checkpoint and is never returned.
Temporary files are hidden (``.<name>.<hex>.tmp``) and never read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

from lifecycle.checkpoint.errors import CheckpointError, storage_error

MARKER = "latest"
MANIFEST = "manifest.json"
OWNER = ".lifecycle-owner"
FORMAT = 1
STEP_RE = re.compile(r"step_(\d+)")
SHARD_RE = re.compile(r"rank\d{5}-[0-9a-f]{16}\.pt")
TMP_RE = re.compile(r"\..+\.tmp")


def step_dir(directory: Path, step: int) -> Path:
    """The folder of ``step`` under ``directory``."""
    return directory / f"step_{step:010d}"


def shard_name(rank: int, token: int) -> str:
    """The file name of ``rank``'s shard for one save attempt (``token``).

    Unique per attempt, so a late write from an abandoned save can never overwrite a
    shard that a newer writer committed for the same step.
    """
    return f"rank{rank:05d}-{token:016x}.pt"


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in ``path`` durable; without it a crash can forget it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` by write-tmp + fsync + rename; on failure no tmp file is left.

    Raises ``CheckpointError`` naming the path and the OS error.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise storage_error("write", path, exc) from exc


def sha256(path: Path) -> bytes:
    """The SHA-256 digest of the file at ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


def probe_directory(directory: Path, rank: int) -> None:
    """Create ``directory`` if needed, then write, fsync and remove a probe file in it.

    Raises ``CheckpointError`` naming the path and the OS error when the folder cannot
    hold checkpoints (not a directory, not writable, a read-only or full file system),
    so a run finds out at setup, before training.
    """
    try:
        if not directory.is_dir():  # mkdir of an existing folder may fail EACCES before EEXIST
            directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error("create the checkpoint directory", directory, exc) from exc
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} is not a directory")
    probe = directory / f".probe-rank{rank:05d}-{secrets.token_hex(4)}.tmp"
    try:
        with open(probe, "wb") as f:
            f.write(b"lifecycle checkpoint probe\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise storage_error("write to the checkpoint directory: probe file", probe, exc) from exc
    finally:
        with contextlib.suppress(OSError):  # a failed write already says why
            probe.unlink(missing_ok=True)


def step_folders(directory: Path) -> list[int]:
    """Steps that have a folder under ``directory``, newest first."""
    found = (STEP_RE.fullmatch(p.name) for p in directory.iterdir() if p.is_dir())
    return sorted((int(m.group(1)) for m in found if m), reverse=True)


def read_manifest(folder: Path, step: int) -> tuple[dict[str, Any], bytes]:
    """Return the folder's manifest and its bytes if the checkpoint is complete; else raise CheckpointError.

    Complete: a manifest of this format and step listing ranks 0..world_size-1, each
    shard present with its recorded size (checksums are checked by the loader).
    """
    path = folder / MANIFEST
    try:
        raw = path.read_bytes()
        manifest = json.loads(raw)
        shards = manifest["shards"]
        if manifest["format"] != FORMAT or manifest["step"] != step:
            raise ValueError("format or step does not match")
        if [s["rank"] for s in shards] != list(range(manifest["world_size"])):
            raise ValueError("shards do not list ranks 0..world_size-1")
        for s in shards:
            name = s["file"]
            if not isinstance(name, str) or Path(name).name != name:
                raise ValueError(f"invalid file name {name!r}")  # never read outside the folder
            shard = folder / name
            if not shard.is_file() or shard.stat().st_size != s["bytes"]:
                raise CheckpointError(f"shard {shard} is missing or has the wrong size")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"no valid manifest at {path}: {exc}") from exc
    return dict(manifest), raw
