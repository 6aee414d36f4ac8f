"""What a rank and its monitor leave behind when they die, and how a lost monitor is noticed (torch-free)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lifecycle._liveness.page import process_state

_RANK = """
import os, sys, time
from lifecycle._liveness.rank import start_monitor
from lifecycle._liveness.settings import Settings
settings = Settings(rank=0, world_size=1, host="127.0.0.1", port=1, prefix="p", mode="report", interval_s=0.25,
                    floor_s=1.0, default_deadline_s=600.0, stacks=sys.argv[1], store_timeout_s=0.05)
monitor = start_monitor(settings)
marks = monitor.marks
print(monitor.process.pid, os.path.realpath(marks.path), flush=True)
time.sleep(60)
"""


def _wait_gone(pid: int, within_s: float) -> None:
    """Return once ``pid`` is gone (or a zombie); raise past ``within_s``."""
    deadline = time.monotonic() + within_s
    while process_state(pid) is not None:
        assert time.monotonic() < deadline, f"process {pid} still there"
        time.sleep(0.005)


def _mapped(pid: int) -> bool:
    """Whether process ``pid`` has a marks page mapped."""
    try:
        return "lifecycle-marks" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.timeout(120)
def test_twenty_sigkills_of_a_rank_with_its_monitor_leave_no_page(tmp_path: Path) -> None:
    """A rank and its monitor SIGKILLed together, once both mapped the page, 20 times: no page of theirs is left."""
    names: list[str] = []
    for _ in range(20):
        rank = subprocess.Popen(
            [sys.executable, "-c", _RANK, str(tmp_path / "stacks.txt")],
            stdout=subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:
            assert rank.stdout is not None
            pid, name = rank.stdout.readline().decode().split(" ", 1)
            names.append(name.strip())
            deadline = time.monotonic() + 10.0
            while not _mapped(int(pid)):  # the monitor has mapped the page: both sides hold it
                assert time.monotonic() < deadline, "the monitor never mapped its page"
                time.sleep(0.002)
            os.killpg(rank.pid, signal.SIGKILL)
            rank.wait(10)
            _wait_gone(int(pid), 10.0)
        finally:
            if rank.poll() is None:
                os.killpg(rank.pid, signal.SIGKILL)
                rank.wait()
    left = [name for name in names if os.path.exists(name)]
    assert not left, left
