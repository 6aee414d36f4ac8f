"""How a rank parks its monitor between attempts (``RankMonitor.park``): the words on the monitor's stdin and stdout.

Standard library only, like the monitor that imports it (``python -S -E -s monitor.py``).
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal

PARK = b"park\n"
"""What a rank writes on its monitor's stdin when its attempt fails (``RankMonitor.park``): once the attempt's
watch ends, the monitor says ``ENDED`` on stdout and waits for the rank's next attempt instead of exiting."""
ENDED = b"ended\n"
PARKED_LOOK_S = 1.0
"""How often a parked monitor checks that its rank is still there (a forked child may hold its stdin open)."""


def read_line(fd: int, wait_s: float | None, pid: int) -> bytes:
    """One line read from ``fd`` (its newline kept); b"" at its end, after ``wait_s`` without a first byte (None:
    no limit), or once the process ``pid`` is no longer this one's parent (looked at every ``PARKED_LOOK_S``)."""
    line = b""
    while not line.endswith(b"\n"):
        look = PARKED_LOOK_S if wait_s is None or line else min(wait_s, PARKED_LOOK_S)
        try:
            ready = select.select([fd], [], [], look)[0]
        except InterruptedError:
            ready = []
        if not ready:
            if os.getppid() != pid or (wait_s is not None and not line):
                return b""
            continue
        chunk = os.read(fd, 1)
        if not chunk:
            return b""
        line += chunk
    return line


def next_attempt(pid: int) -> tuple[str, str] | None:
    """After an attempt's watch: if the rank ``pid`` parked this monitor (``PARK`` on stdin), say ``ENDED`` on stdout
    and wait for the next attempt's line on stdin, the JSON list ``[settings, page]`` (``page``:
    ``/proc/<rank>/fd/<n>``); None when not parked, or once stdin ends (the rank closed it, or exited) or the rank
    is gone."""
    if read_line(0, 0.0, pid) != PARK:
        return None
    os.write(1, ENDED)
    told = read_line(0, None, pid)
    if not told:
        return None
    settings, page = json.loads(told)
    return str(settings), str(page)


PR_SET_PDEATHSIG = 1


def start_watching() -> int:
    """Have this process signalled SIGUSR1 when its parent (the rank's thread that started it) ends
    (``PR_SET_PDEATHSIG``); the read end of a non-blocking pipe that every signal this process handles writes a byte
    into (made once: each attempt's watch loop waits on it)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0)
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write)
    return read
