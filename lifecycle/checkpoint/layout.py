"""The on-disk layout of a checkpoint directory, and the file operations every part shares.

Layout under ``directory`` (format 2, written since issue 28; docs/checkpoint-format.md)::

    .lifecycle-owner                               JSON: the run id of the job that owns the folder
    step_0000000002/__0_<token>_0.distcp           DCP data: rank 0's tensors of one save attempt
    step_0000000002/__0_<token>.json               rank 0's record: non-tensor state, where each tensor lies
    step_0000000002/.metadata                      DCP's global metadata: written by rank 0 at the commit
    step_0000000002/manifest.json                  commit record: written last, only by finalize()
    latest                                         JSON marker naming the committed step

A step folder is committed when its manifest is valid and every file it lists (each
writing rank's record and data files, and ``.metadata``) is present with its recorded
size; anything else is a partial checkpoint and is never returned. Temporary files are
hidden (``.<name>.<hex>.tmp``) and never read. Format 1 (one ``torch.save`` file per
writing rank, ``rank00000-<token>.pt``) is still read.

Without a ``ShardLayout`` every rank writes its own shard and the manifest lists them
by rank (``shards[i]["rank"] == i``); such a checkpoint loads on the same world size
only. With one, the manifest also records the layout (``{"tensor", "pipeline", "data"}``
sizes) and lists one shard per model-parallel slice (``shards[i]["shard"] == i``, with
the global rank that wrote it): only the first data-parallel replica of each slice
writes, since the others hold the same state. It loads on any data-parallel size with
the same tensor and pipeline sizes: every replica reads its slice's shard.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lifecycle.checkpoint.errors import CheckpointError, CheckpointUnreadable, os_error_text, storage_error

MARKER = "latest"
MANIFEST = "manifest.json"
OWNER = ".lifecycle-owner"
FORMAT = 2
"""The format finalize() writes; ``FORMATS`` are those read."""
FORMATS = (1, 2)
STEP_RE = re.compile(r"step_(\d+)")
SHARD_RE = re.compile(r"rank\d{5}-[0-9a-f]{16}\.pt")
"""Format 1: one torch.save file per writing rank and save attempt."""
DATA_RE = re.compile(r"__\d+_[0-9a-f]{16}_\d+\.distcp")
"""Format 2: a rank's DCP data file of one save attempt."""
RECORD_RE = re.compile(r"__\d+_[0-9a-f]{16}\.json")
"""Format 2: a rank's record of one save attempt."""
DCP_METADATA = ".metadata"
"""Format 2: DCP's global metadata (a pickle that DCP's reader loads; lifecycle's loader never reads it)."""
TMP_RE = re.compile(r"\..+\.tmp")


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """Where one rank's state sits among the others': model-parallel sizes and this rank's coordinates.

    ``tensor`` × ``pipeline`` model-parallel slices, each held by ``data`` replicas
    (data-parallel, and context-parallel, ranks: their state is the same).
    ``tensor_rank``, ``pipeline_rank`` and ``data_rank`` place this rank. The slice's
    index is ``shard``; only replica 0 ``writes`` it. ``ValueError`` for a size below 1
    or a coordinate outside its size.
    """

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    tensor_rank: int = 0
    pipeline_rank: int = 0
    data_rank: int = 0

    def __post_init__(self) -> None:
        """Reject sizes below 1 and coordinates outside them."""
        for size, rank in (("tensor", "tensor_rank"), ("pipeline", "pipeline_rank"), ("data", "data_rank")):
            n, r = getattr(self, size), getattr(self, rank)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"ShardLayout.{size} must be an int >= 1, got {n!r}")
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < n:
                raise ValueError(f"ShardLayout.{rank} must be an int in 0..{n - 1}, got {r!r}")

    @property
    def shards(self) -> int:
        """How many distinct shards a checkpoint of this layout holds: tensor × pipeline."""
        return self.tensor * self.pipeline

    @property
    def shard(self) -> int:
        """This rank's shard: ``pipeline_rank * tensor + tensor_rank``."""
        return self.pipeline_rank * self.tensor + self.tensor_rank

    @property
    def replica(self) -> str:
        """The replica set of this rank's shard, when its state is replicated (``"2x1:1"``: tensor x pipeline
        sizes, then the shard): the ranks with the same one hold the same model state; "" without data
        parallelism. Only where the optimizer is not sharded across them either does a copy stand in for another."""
        return f"{self.tensor}x{self.pipeline}:{self.shard}" if self.data > 1 else ""

    @property
    def writes(self) -> bool:
        """True on the rank that writes its slice's shard: data-parallel replica 0."""
        return self.data_rank == 0

    def sizes(self) -> dict[str, int]:
        """The sizes as the manifest records them: ``{"tensor": T, "pipeline": P, "data": D}``."""
        return {"tensor": self.tensor, "pipeline": self.pipeline, "data": self.data}


def describe_layout(sizes: dict[str, Any] | None, world_size: int | None = None) -> str:
    """A layout's sizes as the errors name them: ``"TP2 PP1 DP2"``; one shard per rank when ``sizes`` is None."""
    if sizes is None:
        return f"one shard per rank (world size {world_size})" if world_size is not None else "one shard per rank"
    return f"TP{sizes['tensor']} PP{sizes['pipeline']} DP{sizes['data']}"


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


def write_new(path: Path, data: bytes) -> None:
    """Create ``path`` (a name no one reads before a commit lists it) holding ``data``, fsynced; no rename.

    For a file whose name is new and which is checked by size and checksum before
    anything trusts it: a torn write is caught there, so the tmp file and rename of
    ``write_atomic`` buy nothing, and the fsync of the folder that the commit's manifest
    write does makes the name durable. On failure the file is removed; raises
    ``CheckpointError`` naming the path and the OS error.
    """
    try:
        with open(path, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        with contextlib.suppress(OSError):  # the error below says what went wrong
            path.unlink(missing_ok=True)
        raise storage_error("write", path, exc) from exc


def sha256(path: Path) -> bytes:
    """The SHA-256 digest of the file at ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.digest()


CHUNK = 1 << 20
"""Bytes read at a time to checksum a file: small enough to stay in the CPU's cache."""


def crc32(path: Path) -> int:
    """The CRC-32 (``zlib.crc32``) of the file at ``path``."""
    crc = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
    return crc


def checksum_matches(path: Path, entry: dict[str, Any]) -> bool:
    """True when the file at ``path`` has the whole-file checksum its listing ``entry`` records.

    Records, ``.metadata`` and format-1 shards record ``"sha256"``; a data file records
    ``"crc32"`` (8 hex digits) only when torch's zip CRCs were off as it was written, and
    ``"sha256"`` in records of format 1 (else its zip members' CRC-32 are checked:
    ``dcp_format``). ``CheckpointError`` for an entry with neither; ``OSError`` if the
    file cannot be read.
    """
    if "crc32" in entry:
        return f"{crc32(path):08x}" == str(entry["crc32"])
    if "sha256" in entry:
        return sha256(path).hex() == str(entry["sha256"])
    raise CheckpointError(f"the listing of {path} records no checksum")


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

    Complete: a manifest of a known format and this step listing ranks 0..world_size-1 (with
    a layout: shards 0..tensor*pipeline-1), each file it lists (``listed_files``)
    present with its recorded size (checksums are checked by the loader). A manifest or shard that is absent, or a
    manifest that is invalid, raises ``CheckpointError``: the step is partial. An I/O
    error reading either (ESTALE, EIO, ...) raises ``CheckpointUnreadable`` (a
    ``CheckpointError``): the step may be complete, and clean-up must keep it.
    """
    path = folder / MANIFEST
    try:
        raw = path.read_bytes()
        manifest = json.loads(raw)
        shards = manifest["shards"]
        if manifest["format"] not in FORMATS or manifest["step"] != step:
            raise ValueError("format or step does not match")
        sizes = manifest.get("layout")
        if sizes is not None:
            count = int(sizes["tensor"]) * int(sizes["pipeline"])
            if [s["shard"] for s in shards] != list(range(count)):
                raise ValueError("shards do not list shards 0..tensor*pipeline-1")
        elif [s["rank"] for s in shards] != list(range(manifest["world_size"])):
            raise ValueError("shards do not list ranks 0..world_size-1")
        for s in listed_files(manifest):
            name = s["file"]
            if not isinstance(name, str) or Path(name).name != name:
                raise ValueError(f"invalid file name {name!r}")  # never read outside the folder
            shard = folder / name
            try:
                size = shard.stat().st_size
            except (FileNotFoundError, NotADirectoryError):
                size = None
            if size != s["bytes"]:
                raise CheckpointError(f"shard {shard} is missing or has the wrong size")
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise CheckpointError(f"no valid manifest at {path}: it does not exist") from exc
    except OSError as exc:
        raise CheckpointUnreadable(f"cannot read {path} or its shards: {os_error_text(exc)}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"no valid manifest at {path}: {exc}") from exc
    return dict(manifest), raw


def listed_files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Every file a manifest lists, as ``{"file", "bytes", ...}`` entries.

    Format 1: each shard. Format 2: each shard's record and data files, and ``.metadata``.
    """
    files: list[dict[str, Any]] = []
    for shard in manifest["shards"]:
        files.append(shard)
        files.extend(shard["data"] if manifest["format"] >= 2 else [])
    if manifest["format"] >= 2:
        files.append(manifest["metadata"])
    return files
