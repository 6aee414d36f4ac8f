"""The process probes the launchers use to know what still runs (Linux /proc)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from lifecycle._core.processes import is_running, process_environments

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")


def test_a_killed_process_counts_as_running_until_it_has_exited() -> None:
    """is_running: True while the process lives, False once it is a zombie or reaped (never by its environment)."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        env={**os.environ, "PROBE": "1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert is_running(child.pid)
        # Its environment is its own only once it has exec'd (before, /proc shows the parent's): wait for it to say so.
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        assert any(pid == child.pid and b"PROBE=1" in env for pid, env in process_environments())
        os.kill(child.pid, signal.SIGSTOP)
        assert is_running(child.pid)  # stopped is not exited
        os.kill(child.pid, signal.SIGKILL)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie now, not yet reaped
        assert not is_running(child.pid)
    finally:
        child.kill()
        child.communicate()
    assert not is_running(child.pid)
