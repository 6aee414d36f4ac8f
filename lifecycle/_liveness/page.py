"""What a monitor reads of its rank: the marks page (its position, the first verdict seen) and ``/proc``.

Standard library only: imported by ``lifecycle._liveness.rank`` (the writer) and by the
monitor, which runs as a script and imports it from its own folder (see ``monitor``).
"""

from __future__ import annotations

import json
import mmap
import struct
import time
from dataclasses import dataclass

MARKS_FORMAT = "<QQqq48s"
"""count (odd while being written), done flag, attempt, step (-1: none), phase (UTF-8, NUL-padded)."""
MARKS_SIZE = struct.calcsize(MARKS_FORMAT)
NO_STEP = -1
VERDICT_AT = 128
"""Where the page holds the first verdict the monitor saw (u32 length, then its JSON), for the rank to read."""
VERDICT_BYTES = 2048
PAGE_SIZE = VERDICT_AT + 4 + VERDICT_BYTES


def write_verdict(page: mmap.mmap, verdict: bytes) -> None:
    """Put ``verdict`` (JSON, cut to ``VERDICT_BYTES``) in the page: the text first, its length last."""
    data = verdict[:VERDICT_BYTES]
    page[VERDICT_AT + 4 : VERDICT_AT + 4 + len(data)] = data
    struct.pack_into("<I", page, VERDICT_AT, len(data))


def read_verdict(page: mmap.mmap) -> dict[str, object] | None:
    """The verdict in the page, or None if there is none (or it is unreadable)."""
    (size,) = struct.unpack_from("<I", page, VERDICT_AT)
    if not 0 < size <= VERDICT_BYTES:
        return None
    try:
        found = json.loads(bytes(page[VERDICT_AT + 4 : VERDICT_AT + 4 + size]))
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


@dataclass(frozen=True, slots=True)
class Position:
    """Where a rank is: its ``count`` of marks, ``attempt``, ``step`` (None: none yet) and ``phase``."""

    count: int
    attempt: int
    step: int | None
    phase: str
    done: bool = False

    def where(self) -> str:
        """``"step 30, phase step"``, or ``"phase setup"`` without a step."""
        return f"phase {self.phase}" if self.step is None else f"step {self.step}, phase {self.phase}"


def read_marks(page: mmap.mmap) -> Position:
    """The position in ``page``, read consistently (retried while the writer is mid-write)."""
    while True:
        first = struct.unpack_from("<Q", page, 0)[0]
        if first % 2 == 0:
            count, done, attempt, step, phase = struct.unpack_from(MARKS_FORMAT, page, 0)
            if struct.unpack_from("<Q", page, 0)[0] == first:
                name = phase.rstrip(b"\0").decode("utf-8", "replace")
                return Position(count // 2, attempt, None if step == NO_STEP else step, name, bool(done))
        time.sleep(0)


def process_state(pid: int) -> str | None:
    """The state letter of ``pid``'s main thread in ``/proc/<pid>/stat`` (``R``, ``S``, ``T``…), None if gone.

    A zombie (``Z``, dead and not yet reaped) counts as gone.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    state = text.rsplit(b")", 1)[1].split()[0].decode()
    return None if state in ("Z", "X") else state
