"""Run journals: one JSON object per line, one file per rank, appended to by every attempt.

Record kinds, each with ``kind``, ``rank`` and ``attempt``:

- ``run``: ``world_size``, ``restart_mode``, ``iteration``, ``pid``, ``host``, ``start``.
- ``transition``: ``source``, ``dest``, ``trigger``, ``at``, ``duration_s``, ``detail``.
- ``teardown``: ``outcome``, ``step``, ``resource``, ``owner``, ``at``, ``duration_s``, ``error``.
- ``left``: ``resource``, ``owner``, ``reason`` (held, and not released by this session).
- ``end``: ``state``, ``exit_reason``, ``final_step``, ``error``, ``losses``, ``eval_losses``.

Times (``start``, ``at``) are wall-clock seconds since the epoch, so the journals of
different ranks line up on one timeline.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lifecycle._core.session import Session

Record = dict[str, Any]

FORMAT = 1


def journal_path(directory: str | os.PathLike[str], rank: int) -> Path:
    """The journal file of ``rank`` in ``directory``."""
    return Path(directory) / f"rank{rank}.jsonl"


def session_records(
    session: Session,
    *,
    rank: int,
    world_size: int,
    attempt: int,
    started: float,
    end: Record,
) -> list[Record]:
    """The records of one ``pretrain`` call: run header, transitions, teardown steps, then ``end``.

    ``started`` is the call's start (``time.monotonic()``); ``end`` holds the ``end``
    record's fields other than ``kind``, ``rank`` and ``attempt``.
    """
    # Session times are monotonic; one offset turns them into wall-clock times.
    offset = time.time() - time.monotonic()
    base = {"rank": rank, "attempt": attempt}
    records: list[Record] = [
        {
            "kind": "run",
            **base,
            "format": FORMAT,
            "world_size": world_size,
            "restart_mode": session.restart_mode.value,
            "iteration": session.iteration,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "start": started + offset,
        }
    ]
    teardown_end = None
    for entry in session.journal:
        records.append(
            {
                "kind": "transition",
                **base,
                "source": entry.source.value,
                "dest": entry.dest.value,
                "trigger": entry.trigger.value,
                "at": entry.at + offset,
                "duration_s": entry.duration_s,
                "detail": entry.detail,
            }
        )
        if entry.dest.is_final:
            teardown_end = entry.at
    report = session.report
    if report is not None:
        # The teardown ran inside the final transition; its steps ran back to back and
        # ended right before that transition was recorded.
        end_at = teardown_end if teardown_end is not None else time.monotonic()
        at = end_at - sum(r.duration_s for r in report.records)
        for record in report.records:
            records.append(
                {
                    "kind": "teardown",
                    **base,
                    "outcome": report.outcome.value,
                    "step": str(record.step),
                    "resource": record.step.entry.resource.value,
                    "owner": record.step.entry.owner.value,
                    "at": at + offset,
                    "duration_s": record.duration_s,
                    "error": None if record.error is None else repr(record.error),
                }
            )
            at += record.duration_s
        for held, reason in report.left:
            records.append({"kind": "left", **base, "resource": str(held), "owner": held.owner.value, "reason": reason})
    records.append({"kind": "end", **base, "state": session.state.value, **end})
    return records


def append(path: str | os.PathLike[str], records: Iterable[Record]) -> None:
    """Append ``records`` to the journal at ``path``, one JSON line each (creates folders as needed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(record, sort_keys=True) + "\n" for record in records)


def read(paths: Iterable[str | os.PathLike[str]]) -> list[Record]:
    """Every record of the journals at ``paths`` (a folder stands for its ``*.jsonl`` files).

    Raises ``ValueError`` naming the file and line of a record that is not a JSON object.
    """
    records: list[Record] = []
    for given in paths:
        given = Path(given)
        files = sorted(given.glob("*.jsonl")) if given.is_dir() else [given]
        for path in files:
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"{path}:{number}: not a JSON record: {exc}") from None
                if not isinstance(record, dict) or "kind" not in record:
                    raise ValueError(f"{path}:{number}: not a journal record")
                records.append(record)
    return records
