"""A Ctrl-C while the demo starts up is a stop asked for, said so, with no torchrun traceback (issue 27, item 4).

Before issue 27 a Ctrl-C while the ranks imported or waited to connect ended with
"FAILED ... no rank wrote a journal: torchrun ended before any rank started (... the
rendezvous was ...)", exit 1, under torchrun's traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

STARTED = "demo: torchrun's own output goes to"
"""The launcher's line right after it started torchrun."""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ctrl_c_during_start_up_stops_as_asked(tmp_path: Path) -> None:
    """SIGINT right after torchrun started (the ranks still importing): the last line says "stopped on SIGINT during
    start-up, as asked", the exit code is 75 (STOPPED, lifecycle.ExitCode), and no traceback reaches the terminal;
    torchrun's output is in torchrun.log."""
    command = [sys.executable, "-m", "lifecycle", "demo", "--steps", "50", "--journal-dir", str(tmp_path)]
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "error"}
    demo = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert demo.stdout is not None
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = demo.stdout.readline()
        lines.append(line)
        if line.startswith(STARTED) or not line:
            break
    assert lines[-1].startswith(STARTED), lines
    demo.send_signal(signal.SIGINT)
    out, err = demo.communicate(timeout=150)
    terminal = "".join(lines) + out + err
    assert demo.returncode == 75, terminal
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("demo: stopped on SIGINT during start-up, as asked"), terminal
    assert "Traceback" not in terminal and "FAILED" not in terminal, terminal
    assert (tmp_path / "torchrun.log").is_file()
