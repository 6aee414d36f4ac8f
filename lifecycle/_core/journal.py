"""Run journals: one file per rank, one JSON record per line, each appended and flushed as it happens.

The records (schema version 2, and how version 1 files are read) are in
``lifecycle._core.records``, re-exported here. ``JournalWriter`` appends to a rank's
file; ``read`` / ``load`` return typed records. A process killed mid-write leaves a
torn last line: the next writer starts on a fresh line, and the reader skips the torn
line and reports it instead of rejecting the file.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from lifecycle._core.records import (
    KINDS,
    V1_RUN_ID,
    VERSION,
    Eval,
    Left,
    Origin,
    Record,
    RunEnd,
    RunStart,
    Step,
    TeardownStep,
    Transition,
    from_v1,
    parse,
)

__all__ = [
    "KINDS",
    "V1_RUN_ID",
    "VERSION",
    "Eval",
    "JournalWriter",
    "Left",
    "Loaded",
    "Origin",
    "Record",
    "RunEnd",
    "RunStart",
    "Step",
    "TeardownStep",
    "Transition",
    "journal_path",
    "load",
    "read",
    "restart_count",
    "run_id",
]

_LOCAL_RUN_ID = f"local-{uuid.uuid4().hex[:12]}"


def run_id(env: Mapping[str, str] | None = None) -> str:
    """The run id journals are labelled with: the same on every rank of a job, and across its restarts.

    ``LIFECYCLE_RUN_ID`` if set (the demo sets one per run); else torchrun's
    ``TORCHELASTIC_RUN_ID`` (its ``--rdzv-id``) unless unset or ``"none"``; else, under
    torchrun without an id, ``torchrun-<MASTER_ADDR>:<MASTER_PORT>``: the agent's store
    address, the same on every rank and node of the job and across its restarts (two
    jobs that reuse an address are told apart by their start times). Outside torchrun,
    an id made once per process (``local-…``): set ``LIFECYCLE_RUN_ID`` to share one.
    """
    env = os.environ if env is None else env
    given = env.get("LIFECYCLE_RUN_ID")
    if given:
        return given
    elastic = env.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none":
        return elastic
    if elastic and env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return f"torchrun-{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return _LOCAL_RUN_ID


def restart_count(env: Mapping[str, str] | None = None) -> int:
    """How many times torchrun has restarted this worker group: ``TORCHELASTIC_RESTART_COUNT``, 0 if unset or bad.

    Each restart starts new worker processes; journals record the count in their
    ``Origin`` so a run's restarts read as its successive attempts.
    """
    env = os.environ if env is None else env
    raw = env.get("TORCHELASTIC_RESTART_COUNT", "").strip()
    return int(raw) if raw.isdigit() else 0


def journal_path(directory: str | os.PathLike[str], rank: int) -> Path:
    """The journal file of ``rank`` in ``directory``."""
    return Path(directory) / f"rank{rank}.jsonl"


class JournalWriter:
    """Appends records to one journal file, one JSON line each, flushed to the OS as each is written.

    Opening writes ``first`` (the writer's ``RunStart``); if the file's last line is
    torn (its last byte is not a newline, e.g. its writer was killed mid-write) a newline
    goes first, so the new records start on a fresh line. Folders are created as needed.
    Write errors (``OSError``) propagate; use as a context manager or call ``close``.
    """

    def __init__(self, path: str | os.PathLike[str], first: RunStart) -> None:
        """Open ``path`` for appending and write ``first``."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115 - kept open across records; closed by close()
        try:
            if self._file.tell() > 0:
                with open(self.path, "rb") as existing:
                    existing.seek(-1, os.SEEK_END)
                    if existing.read(1) != b"\n":
                        self._file.write(b"\n")
            self.write(first)
        except BaseException:
            self._file.close()
            raise

    def write(self, record: Record) -> None:
        """Append ``record`` as one line and flush it; ``ValueError`` once closed."""
        self._file.write((json.dumps(record.to_json()) + "\n").encode("utf-8"))
        self._file.flush()

    def close(self) -> None:
        """Close the file (again: no effect)."""
        self._file.close()

    def __enter__(self) -> JournalWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class Loaded:
    """What ``load`` read: the records in file order, and ``"path:line"`` of each torn line it skipped."""

    records: tuple[Record, ...]
    torn: tuple[str, ...]


def _decode(line: bytes, v1_run: dict[str, Any] | None) -> list[Record]:
    """The records of one journal line (a v1 line may stand for several); ``ValueError`` if it holds none."""
    try:
        data = json.loads(line.decode("utf-8"))
    except ValueError as exc:
        raise ValueError(f"not a JSON record: {exc}") from None
    if isinstance(data, dict) and "version" not in data:
        return from_v1(data, v1_run)
    return [parse(data)]


def _load_file(path: Path, records: list[Record], torn: list[str]) -> None:
    lines = path.read_bytes().split(b"\n")  # the last item is b"" unless the last line is torn
    v1_run: dict[str, Any] | None = None
    bad: tuple[int, ValueError] | None = None  # an unreadable line; torn if the next writer's RunStart follows
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            decoded = _decode(line, v1_run)
        except ValueError as exc:
            if bad is not None:
                break
            bad = (number, exc)
            continue
        if bad is not None:
            if not isinstance(decoded[0], RunStart) or decoded[0].origin.run_id == V1_RUN_ID:
                break
            torn.append(f"{path}:{bad[0]}")
            bad = None
        if decoded[0].origin.run_id == V1_RUN_ID and isinstance(decoded[0], RunStart):
            v1_run = json.loads(line)
        records += decoded
    if bad is not None:
        if bad[0] == len(lines):  # the last line, with no newline after it
            torn.append(f"{path}:{bad[0]}")
        else:
            raise ValueError(f"{path}:{bad[0]}: {bad[1]}")


def load(paths: Iterable[str | os.PathLike[str]]) -> Loaded:
    """Every record of the journals at ``paths`` (a folder stands for its ``*.jsonl`` files), v1 files included.

    A line that holds no record is skipped and listed in ``torn`` when it is torn: the
    file's last line with no newline after it, or a line right before a writer's
    ``RunStart`` (a later writer started on a fresh line after it). Any other such line
    raises ``ValueError`` naming its file and line.
    """
    records: list[Record] = []
    torn: list[str] = []
    for given in paths:
        given = Path(given)
        for path in sorted(given.glob("*.jsonl")) if given.is_dir() else [given]:
            _load_file(path, records, torn)
    return Loaded(tuple(records), tuple(torn))


def read(paths: Iterable[str | os.PathLike[str]]) -> list[Record]:
    """``load(paths).records`` as a list: the torn lines skipped silently."""
    return list(load(paths).records)
