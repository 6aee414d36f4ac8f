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

MARKS_FORMAT = "<QQqqq40s"
"""count (odd while being written), done flag, attempt, step (-1: none), steps (the training loop's steps marked in
this attempt), phase (UTF-8, NUL-padded)."""
MARKS_SIZE = struct.calcsize(MARKS_FORMAT)
NO_STEP = -1
VERDICT_AT = 128
"""Where the page holds the first verdict the monitor saw (u32 length, then its JSON), for the rank to read."""
VERDICT_BYTES = 2048
POSITIONS_AT = 2304
"""Where the page holds the rank's collective positions: ``SLOTS`` slots of ``SLOT_FORMAT``, one per process group."""
SLOT_FORMAT = "<QQQQQ24s24s"
"""version (odd while being written), entered, left, fingerprint, op code | flags << 8 | site << 16, group key, group
label.

*entered*: the group's own sequence number of the last collective this rank issued on it
(``ProcessGroup._get_sequence_number_for_group``); *left*: that of the last one it saw
finish (its ``wait`` returned); inside a collective while ``entered > left``. The
fingerprint is ``numel << 8 | dtype code`` of the collective's tensor (0: none).
"""
SLOT_SIZE = struct.calcsize(SLOT_FORMAT)
SLOTS = 16
BLIND = 1
"""Flag: the group's counter ran ahead of what the wrappers saw (a caller bypassed them): its positions cannot tell."""
SITES_AT = POSITIONS_AT + SLOTS * SLOT_SIZE
"""Where the page holds the call sites of the rank's collectives: ``SITES`` entries of ``SITE_BYTES`` (u16 length,
then ``path:line in function``), each written once, its length last; a slot's code names one by number (0: none)."""
SITES = 64
SITE_BYTES = 128
PAGE_SIZE = SITES_AT + SITES * SITE_BYTES
OPS = (
    "",
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "_all_gather_base",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "broadcast",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "gather",
    "scatter",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "all_gather_single",
    "reduce_scatter_single",
)
"""The collectives whose positions are kept, by code (their index); the names are ``torch.distributed``'s."""
DTYPES = ("", "float32", "float64", "float16", "bfloat16", "int64", "int32", "int8")
"""The dtypes a fingerprint names, by code (their index; 0xFF: another); the names are ``torch``'s."""


def tensor_words(fingerprint: int) -> str:
    """A fingerprint in words: ``"1000 float32 elements"`` ("no tensor" for 0)."""
    if not fingerprint:
        return "no tensor"
    code = fingerprint & 0xFF
    return f"{fingerprint >> 8} {DTYPES[code] if code < len(DTYPES) else 'other'} elements"


def write_verdict(page: mmap.mmap, verdict: bytes) -> None:
    """Put ``verdict`` (JSON) in the page: the text first, its length last. One over ``VERDICT_BYTES`` is made to fit
    as JSON still (its evidence's call sites left out, then its note shortened), never cut mid-text."""
    data = verdict if len(verdict) <= VERDICT_BYTES else _fitted(verdict)
    page[VERDICT_AT + 4 : VERDICT_AT + 4 + len(data)] = data
    struct.pack_into("<I", page, VERDICT_AT, len(data))


def _fitted(verdict: bytes) -> bytes:
    """``verdict`` within ``VERDICT_BYTES`` as JSON: without its evidence's ``sites``, then with a shorter note."""
    try:
        found = json.loads(verdict)
    except ValueError:
        return verdict[:VERDICT_BYTES]
    if not isinstance(found, dict):
        return verdict[:VERDICT_BYTES]
    if isinstance(found.get("evidence"), dict):
        found["evidence"].pop("sites", None)
    data = json.dumps(found).encode()
    note = str(found.get("note", ""))
    while len(data) > VERDICT_BYTES and note:
        note = note[: max(0, len(note) - (len(data) - VERDICT_BYTES) - 8)]
        found["note"] = note + "…"
        data = json.dumps(found).encode()
    return data[:VERDICT_BYTES]


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
    """Where a rank is: its ``count`` of marks, ``attempt``, ``step`` (None: none yet) and ``phase``; ``steps``: how
    many steps of the training loop it marked in this attempt (a monitor that first sees the loop many steps in still
    knows its warm-up is past)."""

    count: int
    attempt: int
    step: int | None
    phase: str
    done: bool = False
    steps: int = 0

    def where(self) -> str:
        """``"step 30, phase step"``, or ``"phase setup"`` without a step."""
        return f"phase {self.phase}" if self.step is None else f"step {self.step}, phase {self.phase}"


def read_marks(page: mmap.mmap) -> Position:
    """The position in ``page``, read consistently (retried while the writer is mid-write)."""
    while True:
        first = struct.unpack_from("<Q", page, 0)[0]
        if first % 2 == 0:
            count, done, attempt, step, steps, phase = struct.unpack_from(MARKS_FORMAT, page, 0)
            if struct.unpack_from("<Q", page, 0)[0] == first:
                name = phase.rstrip(b"\0").decode("utf-8", "replace")
                return Position(count // 2, attempt, None if step == NO_STEP else step, name, bool(done), steps)
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


@dataclass(frozen=True, slots=True)
class Collective:
    """Where a rank stands in one process group: ``key`` (the group's name), ``label`` (in words), ``entered``,
    ``left`` (sequence numbers), the last collective's ``op`` and ``fingerprint``, and whether it is ``blind``."""

    key: str
    label: str
    entered: int
    left: int
    op: str
    fingerprint: int
    blind: bool
    site: str = ""
    """Where the last collective was called (``path:line in function``), "" if not known."""

    @property
    def inside(self) -> bool:
        """Whether the rank is inside a collective of this group (entered one it has not seen finish)."""
        return self.entered > self.left


def group_words(label: str) -> str:
    """A group's label in words: ``the data-parallel group``; a label that names its group (``group 3 (ranks 0,
    1)``) as it is."""
    return label if label.startswith("group ") else f"the {label} group"


def position_fields(position: Collective) -> list[object]:
    """``position`` as a beat carries it (``summary.Seen`` without its ``since``)."""
    return [
        position.key,
        position.label,
        position.entered,
        position.left,
        position.op,
        position.fingerprint,
        position.blind,
    ]


def read_site(page: mmap.mmap, number: int) -> str:
    """Call site ``number`` of the page (1 to ``SITES``), "" for 0 or one not written yet."""
    if not 0 < number <= SITES:
        return ""
    at = SITES_AT + (number - 1) * SITE_BYTES
    (size,) = struct.unpack_from("<H", page, at)
    return bytes(page[at + 2 : at + 2 + min(size, SITE_BYTES - 2)]).decode("utf-8", "replace")


def read_collectives(page: mmap.mmap) -> list[Collective]:
    """The collective positions in ``page``, one per group registered in it (each slot read consistently)."""
    found = []
    for slot in range(SLOTS):
        at = POSITIONS_AT + slot * SLOT_SIZE
        while True:
            first = struct.unpack_from("<Q", page, at)[0]
            if first % 2 == 0:
                _, entered, left, fingerprint, code, key, label = struct.unpack_from(SLOT_FORMAT, page, at)
                if struct.unpack_from("<Q", page, at)[0] == first:
                    break
            time.sleep(0)
        if not key.rstrip(b"\0"):
            break  # slots are taken in order: the first empty one ends them
        op = OPS[code & 0xFF] if code & 0xFF < len(OPS) else "?"
        found.append(
            Collective(
                key.rstrip(b"\0").decode("utf-8", "replace"),
                label.rstrip(b"\0").decode("utf-8", "replace"),
                entered,
                left,
                op,
                fingerprint,
                bool((code >> 8) & BLIND),
                read_site(page, code >> 16),
            )
        )
    return found
