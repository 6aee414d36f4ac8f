"""The in-memory copy of a run's training state: three slots per rank in node memory, torch-free.

A run's copies live in ``<root>/<run>/`` (``copy_root()``: ``/dev/shm/lifecycle-copies``
unless ``LIFECYCLE_COPY_ROOT`` names another folder; ``<run>`` the run id with every
character but letters, digits, ``_`` and ``-`` made ``_``). Each rank has two slots for its
copies every few steps, ``rank<R>.slot0`` and ``rank<R>.slot1``: a new copy replaces the one
that does not hold the newer, so a writer killed mid-write leaves the previous copy whole.
A third, ``rank<R>.slot2``, holds the copy a rank takes when its call fails
(``FAILURE_SLOT``): it never evicts a copy a peer that died without one may share.
Ranks of one replica set (``CopyHeader.replica``: data-parallel replicas of a shard) may read
each other's copies (``stand_ins``); each then keeps its RNG state of its last two steps in
``rank<R>.rng`` (``keep_rng``), which a replica's copy lacks.

A slot file is ``MAGIC``, a 4-byte little-endian header length, the header (JSON: run id,
attempt, rank, world size, step, payload length, the payload's CRC-32), then the payload.
It is written with ``os.write`` to the rank's spare file and published by swapping it with
the slot (``renameat2``'s exchange; ``os.rename`` where there is none): the old copy's file
is the next spare, so its pages are written over, not allocated again. Never written
through a memory map (a full ``/dev/shm`` kills a process writing through a map with
SIGBUS; ``write`` gets ``ENOSPC``). Its size is checked against the free space and the cap
before a byte is written. A file whose header is not this run's, this rank's and this world
size's, or whose length or checksum does not match (a torn write), is never used.

Each process of the run holds a shared ``flock`` on ``<root>/<run>/.lock`` while it may use
the copies; the kernel drops it when the process dies, even by SIGKILL. ``sweep`` removes
the folders of other runs whose lock nobody holds: the files a whole job killed at once left.
A run whose id is the process's own (``remove_at_exit``) has its files removed when the process exits.
The root itself is removed with the last run's folder (an ``rmdir``, so only when empty).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import json
import os
import re
import shutil
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "FAILURE_SLOT",
    "MAGIC",
    "CopyHeader",
    "NoRoom",
    "RankCopies",
    "copy_root",
    "read_header",
    "remove_rank_copies",
    "sweep",
]

MAGIC = b"LCMCOPY1"
"""The first bytes of every slot file (format 1)."""
_LENGTH = struct.Struct("<I")
_LOCK = ".lock"
_SLOTS = 3
FAILURE_SLOT = 2
"""Slots 0 and 1 take turns with the copies every few steps; slot 2 holds the copy taken at a failure."""
RNG_MAGIC = b"LCMRNG01"
"""The first bytes of each record of a rank's RNG file (``RankCopies.keep_rng``)."""
RNG_RECORD = 16384
"""The bytes each of the two RNG records takes: room for torch's CPU generator state (5 KB) and more."""
_RNG = struct.Struct("<8sQII")
"""An RNG record's head: ``RNG_MAGIC``, step, length, CRC-32."""
_HELD: dict[Path, int] = {}
"""The lock this process holds on each run folder it opened: one per folder, whichever object opened it."""
_AT_EXIT: dict[tuple[Path, int], RankCopies] = {}
"""The ranks' copies ``remove_at_exit`` deletes when the interpreter exits, by folder and rank."""


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_RENAMEAT2: list[Any] = []


def _exchange(first: Path, second: Path) -> bool:
    """Swap the files at two paths in one step (Linux ``renameat2`` with ``RENAME_EXCHANGE``); False, nothing
    changed, where the C library, the kernel or the file system cannot."""
    if not _RENAMEAT2:
        try:
            function = ctypes.CDLL(None, use_errno=True).renameat2
            function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            function.restype = ctypes.c_int
        except (AttributeError, OSError):
            function = None
        _RENAMEAT2.append(function)
    if _RENAMEAT2[0] is None:
        return False
    return int(_RENAMEAT2[0](_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)) == 0


def copy_root() -> Path:
    """Where every run's copies on this node live: ``LIFECYCLE_COPY_ROOT``, else ``/dev/shm/lifecycle-copies``."""
    return Path(os.environ.get("LIFECYCLE_COPY_ROOT") or "/dev/shm/lifecycle-copies")


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text) or "_"


class NoRoom(OSError):
    """A copy does not fit: the file system's free space, or the cap, is smaller than it needs."""


@dataclass(frozen=True, slots=True)
class CopyHeader:
    """What a slot file says about its copy; ``checksum`` is the payload's CRC-32."""

    run_id: str
    attempt: str
    rank: int
    world_size: int
    step: int
    length: int
    checksum: int
    replica: str = ""
    """Which replica set the copy belongs to (``"1x1:0"``: tensor x pipeline sizes, then the shard): ranks whose
    copies name the same one hold the same model and optimizer state at a step, and may stand in for each other;
    "" for none (no data parallelism, or a sharded optimizer)."""

    def encode(self) -> bytes:
        """``MAGIC``, the header's length and the header: the bytes before the payload."""
        data = json.dumps(
            {
                "run_id": self.run_id,
                "attempt": self.attempt,
                "rank": self.rank,
                "world_size": self.world_size,
                "step": self.step,
                "length": self.length,
                "checksum": self.checksum,
                "replica": self.replica,
            }
        ).encode()
        return MAGIC + _LENGTH.pack(len(data)) + data

    @classmethod
    def decode(cls, raw: bytes) -> tuple[CopyHeader, int] | None:
        """The header at the start of ``raw`` and the payload's offset; None if ``raw`` does not start with one."""
        start = len(MAGIC) + _LENGTH.size
        if len(raw) < start or raw[: len(MAGIC)] != MAGIC:
            return None
        (size,) = _LENGTH.unpack_from(raw, len(MAGIC))
        try:
            data = json.loads(raw[start : start + size])
            header = cls(
                run_id=str(data["run_id"]),
                attempt=str(data["attempt"]),
                rank=int(data["rank"]),
                world_size=int(data["world_size"]),
                step=int(data["step"]),
                length=int(data["length"]),
                checksum=int(data["checksum"]),
                replica=str(data.get("replica", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None
        return header, start + size


def read_header(path: Path, whole: bool = False) -> CopyHeader | None:
    """The header of the slot file ``path`` (its first bytes only; the payload unchecked), None if it has none.

    ``whole``: None too unless the file is as long as its header says (not cut short); its checksum is not read."""
    try:
        with open(path, "rb") as file:
            raw = file.read(len(MAGIC) + _LENGTH.size)
            if len(raw) < len(MAGIC) + _LENGTH.size:
                return None
            raw += file.read(_LENGTH.unpack_from(raw, len(MAGIC))[0])
            size = os.fstat(file.fileno()).st_size
    except OSError:
        return None
    found = CopyHeader.decode(raw)
    if found is None or (whole and found[1] + found[0].length != size):
        return None
    return found[0]


def read_copy(path: Path, run_id: str, rank: int, world_size: int) -> tuple[CopyHeader, bytes] | None:
    """The header and payload of the slot file ``path`` if it is whole and this run's, rank's and world size's."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    found = CopyHeader.decode(raw)
    if found is None:
        return None
    header, offset = found
    payload = raw[offset:]
    if (header.run_id, header.rank, header.world_size) != (run_id, rank, world_size):
        return None
    if len(payload) != header.length or zlib.crc32(payload) != header.checksum:
        return None  # torn (a writer killed mid-write) or damaged
    return header, payload


class RankCopies:
    """One rank's three slots of run ``run_id`` under ``root`` (default ``copy_root()``).

    ``open`` takes the run's shared lock and removes this rank's temporary files (a torn
    write). ``write`` publishes a copy; ``newest`` lists the usable ones; ``remove`` deletes
    this rank's files (and the run's folder once no process holds its lock).
    """

    def __init__(self, run_id: str, rank: int, world_size: int, root: Path | None = None, replica: str = "") -> None:
        self.run_id, self.rank, self.world_size, self.replica = run_id, rank, world_size, replica
        self.folder = (root or copy_root()) / _safe(run_id)
        self._latest: Path | None = None  # the slot this object last published: no file is read to find it again
        self._rng: int | None = None  # the RNG record file, open (``keep_rng``)

    def slot(self, index: int) -> Path:
        """The path of slot ``index`` (0, 1 or ``FAILURE_SLOT``) of this rank."""
        return self.folder / f"rank{self.rank}.slot{index}"

    def open(self) -> None:
        """Create the run's folder, hold its shared lock (until ``remove`` or the process ends), drop torn writes."""
        if self.folder not in _HELD:
            for tries_left in reversed(range(3)):
                try:  # the root is removed once empty (``_remove_if_free``): between our mkdirs, another run's remover
                    self.folder.mkdir(parents=True, exist_ok=True)  # may take it; the next try makes it again
                    fd = os.open(self.folder / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
                    break
                except FileNotFoundError:
                    if not tries_left:
                        raise
            fcntl.flock(fd, fcntl.LOCK_SH)
            _HELD[self.folder] = fd
        for stale in self.folder.glob(f"rank{self.rank}.slot*-*"):  # spares, and an older version's <slot>.tmp-<pid>
            with contextlib.suppress(OSError):
                stale.unlink()

    def remove_at_exit(self) -> None:
        """Delete this rank's files (``remove``) when the interpreter exits normally: for a run no other process
        can resume, whose run id is this process's own. A process killed leaves them to the next run's ``sweep``."""
        _AT_EXIT.setdefault((self.folder, self.rank), self)

    def newest(self, slots: Sequence[int] = range(_SLOTS)) -> dict[int, Path]:
        """This rank's copies in ``slots`` (default all three) by step: each this run's, rank's and world size's,
        and as long as its header says. Headers only: the payload's checksum is verified by ``read``, which returns
        None for a damaged one (``resume`` then falls back on every rank). Other files are left alone."""
        found: dict[int, Path] = {}
        mine = (self.run_id, self.rank, self.world_size)
        for index in slots:
            header = read_header(self.slot(index), whole=True)
            if header is not None and (header.run_id, header.rank, header.world_size) == mine:
                found[header.step] = self.slot(index)
        return found

    def read(self, step: int) -> bytes | None:
        """The payload of this rank's usable copy of ``step``; None if there is none (any more).

        Only the slots whose header says ``step`` are read whole (and checked)."""
        for index in range(_SLOTS):
            header = read_header(self.slot(index))
            if header is None or header.step != step:
                continue
            copy = read_copy(self.slot(index), self.run_id, self.rank, self.world_size)
            if copy is not None and copy[0].step == step:
                return copy[1]
        return None

    def stand_ins(self) -> dict[int, Path]:
        """The copies of this run's other ranks on this node that may stand in for this rank's, by step (headers
        read, payloads not): same world size and the same non-empty ``replica`` (``CopyHeader``); none without one.
        """
        return {step: path for step, _, path in reversed(self._stand_ins())}  # the first path of each step

    def _stand_ins(self) -> list[tuple[int, int, Path]]:
        """Every copy that may stand in for this rank's (``stand_ins``): (step, rank, path), by path."""
        found: list[tuple[int, int, Path]] = []
        if not self.replica:
            return found
        for path in sorted(self.folder.glob("rank*.slot[0-9]")):
            header = read_header(path)
            if header is None or header.rank == self.rank or path.name != f"rank{header.rank}.{path.suffix[1:]}":
                continue
            if (header.run_id, header.world_size, header.replica) == (self.run_id, self.world_size, self.replica):
                found.append((header.step, header.rank, path))
        return found

    def read_stand_in(self, step: int) -> tuple[int, bytes] | None:
        """The rank and payload of a usable copy of ``step`` another rank of this replica set holds (``stand_ins``),
        its checksum verified (a torn one passed over for the next); None if there is none."""
        for found, rank, path in self._stand_ins():
            copy = read_copy(path, self.run_id, rank, self.world_size) if found == step else None
            if copy is not None and copy[0].step == step and copy[0].replica == self.replica:
                return rank, copy[1]
        return None

    def keep_rng(self, step: int, state: bytes) -> None:
        """Record this rank's RNG ``state`` at the end of ``step`` (a few KB; never raises): what a copy that
        another rank stands in with lacks (its RNG is that rank's). Two records in ``rank<R>.rng``, by the step's
        parity, each with its step and CRC-32, written in place with ``pwrite``: one torn by a kill leaves the
        other whole."""
        if len(state) + _RNG.size > RNG_RECORD:
            return
        try:
            if self._rng is None:
                self._rng = os.open(self.folder / f"rank{self.rank}.rng", os.O_RDWR | os.O_CREAT, 0o600)
            os.pwrite(self._rng, _RNG.pack(RNG_MAGIC, step, len(state), zlib.crc32(state)) + state,
                      (step % 2) * RNG_RECORD)  # fmt: skip
        except OSError:
            pass  # a full file system: a stand-in copy then keeps its own rank's RNG

    def rng(self, step: int) -> bytes | None:
        """This rank's RNG state recorded at the end of ``step`` (``keep_rng``), None if none is whole."""
        try:
            with open(self.folder / f"rank{self.rank}.rng", "rb") as file:
                file.seek((step % 2) * RNG_RECORD)
                raw = file.read(RNG_RECORD)
        except OSError:
            return None
        if len(raw) < _RNG.size:
            return None
        magic, found, length, checksum = _RNG.unpack_from(raw)
        state = raw[_RNG.size : _RNG.size + length]
        if magic != RNG_MAGIC or found != step or len(state) != length or zlib.crc32(state) != checksum:
            return None
        return state

    def write(
        self, step: int, attempt: str, payload: Sequence[bytes | memoryview], cap: int | None, *, failure: bool = False
    ) -> Path:
        """Publish ``payload`` (its parts, in order) as this rank's copy of ``step``; the slot it is in.

        Replaces whichever of slots 0 and 1 does not hold the newer usable copy, or with
        ``failure`` the failure slot (``FAILURE_SLOT``), which leaves both of them be.
        ``NoRoom`` (nothing written) when the file would not fit the file system's free
        space, or when the three slots and the spare of its size would exceed ``cap``
        bytes; another ``OSError`` (``ENOSPC`` included) after removing what it wrote.
        Written with ``os.write``, never through a memory map.
        """
        parts = [memoryview(part).cast("B") for part in payload]
        checksum = 0
        for part in parts:
            checksum = zlib.crc32(part, checksum)  # releases the GIL on large parts: the training thread runs on
        length = sum(len(part) for part in parts)
        header = CopyHeader(
            self.run_id, attempt, self.rank, self.world_size, step, length, checksum, self.replica
        ).encode()
        size = len(header) + length
        if cap is not None and (_SLOTS + 1) * size > cap:
            raise NoRoom(f"three copies of {size} bytes and the spare exceed the cap of {cap} bytes")
        stats = os.statvfs(self.folder)
        free = stats.f_bavail * stats.f_frsize
        if size > free:
            raise NoRoom(f"a copy of {size} bytes does not fit the {free} bytes free in {self.folder}")
        if self._latest is None:
            held = self.newest((0, 1))
            self._latest = held[max(held)] if held else self.slot(1)
        target = self.slot(FAILURE_SLOT) if failure else self.slot(1) if self._latest == self.slot(0) else self.slot(0)
        spare = self.spare()
        try:
            # Over the spare's old bytes, not a new file: tmpfs allocates and zeroes every page of a new file
            # (0.5 ms for 1.3 MB here, against 0.08 ms for the write itself).
            fd = os.open(spare, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                for part in (memoryview(header), *parts):
                    while part:
                        part = part[os.write(fd, part) :]
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
            if not (target.exists() and _exchange(spare, target)):
                os.rename(spare, target)
            if not failure:
                self._latest = target
        except OSError:
            with contextlib.suppress(OSError):
                spare.unlink()
            raise
        return target

    def spare(self) -> Path:
        """This process's spare file: a copy is written there, then swapped with its slot (the old copy's file is
        the next spare)."""
        return self.folder / f"rank{self.rank}.slot.spare-{os.getpid()}"

    def remove(self) -> None:
        """Delete this rank's slots and temporary files, release the lock; the folder too if no process holds it."""
        if self._rng is not None:
            with contextlib.suppress(OSError):
                os.close(self._rng)
            self._rng = None
        for path in [*self.folder.glob(f"rank{self.rank}.slot*"), self.folder / f"rank{self.rank}.rng"]:
            with contextlib.suppress(OSError):
                path.unlink()
        held = _HELD.pop(self.folder, None)
        if held is not None:
            os.close(held)
        _remove_if_free(self.folder)


def _remove_if_free(folder: Path) -> bool:
    """Remove ``folder`` if no process holds its lock (taken exclusively meanwhile), and the root above it once that
    holds no run's folder (``rmdir``: never a folder in use); whether ``folder`` is gone."""
    try:
        fd = os.open(folder / _LOCK, os.O_RDWR)
    except FileNotFoundError:
        fd = None
    except OSError:
        return False
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        shutil.rmtree(folder, ignore_errors=True)
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)
    if folder.exists():
        return False
    with contextlib.suppress(OSError):  # ENOTEMPTY while another run's folder is there: the root stays
        folder.parent.rmdir()
    return True


@atexit.register
def _remove_at_exit() -> None:
    for copies in _AT_EXIT.values():
        with contextlib.suppress(OSError):
            copies.remove()
    _AT_EXIT.clear()


def sweep(run_id: str, root: Path | None = None) -> list[Path]:
    """Remove the folders under ``root`` (default ``copy_root()``) of runs other than ``run_id`` that no live
    process holds (their processes ended, or were killed); the folders removed. Never raises ``OSError``."""
    removed = []
    try:
        folders = [p for p in (root or copy_root()).iterdir() if p.is_dir() and p.name != _safe(run_id)]
    except OSError:
        return []
    for folder in folders:
        if _remove_if_free(folder):
            removed.append(folder)
    return removed


def remove_rank_copies(run_id: str, rank: int, root: Path | None = None) -> None:
    """Delete rank ``rank``'s copies of run ``run_id`` (the job ended): its files, then the run's folder once no
    process holds its lock. What ``decide_after`` does after a stop; never raises ``OSError``."""
    with contextlib.suppress(OSError):
        RankCopies(run_id, rank, 0, root).remove()
