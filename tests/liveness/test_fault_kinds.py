"""The injected fault kinds (``FaultKind``) do to the process what they say: die, stop, sleep, spin holding the GIL."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from lifecycle._liveness.monitor import process_state

_CHILD = """
import sys, threading, time
from lifecycle import FaultKind, Phase
from lifecycle._training.faults import fire
def beat():
    while True:
        sys.stdout.write("."); sys.stdout.flush()
        time.sleep(0.01)
threading.Thread(target=beat, daemon=True).start()
time.sleep(0.2)
sys.stdout.write("ready\\n"); sys.stdout.flush()
fire(FaultKind(sys.argv[1]), Phase.STEP, 0, 1)
"""


def _start(kind: str) -> subprocess.Popen[bytes]:
    child = subprocess.Popen([sys.executable, "-c", _CHILD, kind], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline().strip().endswith(b"ready")
    os.set_blocking(child.stdout.fileno(), False)
    return child


def _beats(child: subprocess.Popen[bytes], seconds: float) -> int:
    """How many beats the child's other thread wrote in the next ``seconds`` (after draining the earlier ones)."""
    assert child.stdout is not None
    _drain(child.stdout.fileno())
    time.sleep(seconds)
    return _drain(child.stdout.fileno())


def _drain(fd: int) -> int:
    """Read what is waiting on ``fd`` (non-blocking); how many bytes."""
    try:
        return len(os.read(fd, 1 << 20))
    except BlockingIOError:
        return 0


def _state_after(child: subprocess.Popen[bytes], seconds: float) -> str | None:
    time.sleep(seconds)
    return process_state(child.pid)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_crash_kills_the_process_with_sigkill() -> None:
    """crash: the process ends with SIGKILL (no exception, no exit code of its own)."""
    child = _start("crash")
    assert child.wait(timeout=20) == -9


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("kind", "state"),
    [
        pytest.param("stop", "T", marks=pytest.mark.slow),  # the fault cells cover stop and hang too
        pytest.param("hang", "S", marks=pytest.mark.slow),
        ("spin", "R"),
    ],
)
def test_silent_faults_leave_the_process_in_their_state(kind: str, state: str) -> None:
    """stop: stopped (T); hang: asleep (S); spin: running (R), its other thread silent (C code holds the GIL)."""
    child = _start(kind)
    try:
        assert _state_after(child, 1.0) == state
        assert child.poll() is None
        beats = _beats(child, 0.5) if kind != "stop" else 0
        if kind == "spin":  # C code holds the GIL: the other thread gets no turn
            assert beats <= 1, beats
        elif kind == "hang":  # asleep in Python: the other thread runs
            assert beats >= 10, beats
    finally:
        child.kill()
        child.wait(timeout=20)
