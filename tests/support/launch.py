"""Running the suite's workers and commands: one launcher (``lifecycle.testing``), the paths it needs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from lifecycle.testing import RankResult, free_port, free_ports, launch_ranks, run_command
from support.internals import process_environments

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
WORKERS = TESTS / "workers"
"""Every script a test runs as a rank lives here."""

__all__ = [
    "REPO",
    "TESTS",
    "WORKERS",
    "RunningDemo",
    "demo_command",
    "free_port",
    "free_ports",
    "marked_processes",
    "run_bounded",
    "run_demo",
    "run_workers",
    "started_demo",
    "suite_env",
]


def suite_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables a child needs to import lifecycle from this checkout and ``support`` from tests/, quietly."""
    path = os.pathsep.join(filter(None, [str(REPO), str(TESTS), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, **(extra or {})}


def steps_for(full: int, sampled: int) -> int:
    """How many steps a long healthy run takes: ``sampled`` when ``make test-slow`` samples (``LIFECYCLE_SLOW_SAMPLE``
    is set, to keep it in its budget), else ``full`` (``make test-slow-all``, a plain pytest run)."""
    return sampled if os.environ.get("LIFECYCLE_SLOW_SAMPLE") else full


def run_workers(
    worker: str,
    *args: str,
    world_size: int = 2,
    timeout_s: float,
    torchrun: bool = False,
    master_port: int | None = None,
    env: Mapping[str, str] | None = None,
    grace_s: float = 10.0,
) -> list[RankResult]:
    """Run ``tests/workers/<worker>.py ARGS`` as ``world_size`` ranks (or under torchrun); see ``launch_ranks``."""
    script = [str(WORKERS / f"{worker}.py"), *args]
    return launch_ranks(
        script,
        world_size,
        timeout_s=timeout_s,
        env=suite_env({"PYTHONWARNINGS": "ignore", **(env or {})}),
        torchrun=torchrun,
        master_port=master_port,
        grace_s=grace_s,
    )


def worker_reports(worker: str, *args: str, timeout_s: float) -> list[dict[str, Any]]:
    """Run ``worker`` on 2 ranks (``run_workers``); each must succeed; return each rank's last JSON line, parsed."""
    reports = []
    for result in run_workers(worker, *args, timeout_s=timeout_s):
        assert result.ok, str(result)
        reports.append(json.loads([line for line in result.output.splitlines() if line.startswith("{")][-1]))
    return reports


def run_bounded(command: list[str], timeout: float, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``command`` bounded in time; on timeout everything it started is killed and the test fails loudly.

    Output (stdout and stderr together) is captured. No process outlives this call.
    """
    done = run_command(command, timeout_s=timeout, env=suite_env(), cwd=cwd)
    if done.timed_out:
        raise AssertionError(f"{command} ran past {timeout} s; output:\n{done.output}")
    return subprocess.CompletedProcess(command, done.returncode, done.output, "")


def demo_command(*args: str) -> list[str]:
    """The demo command line: ``python -m lifecycle demo ARGS``."""
    return [sys.executable, "-m", "lifecycle", "demo", *args]


DEMO_MARK = "LIFECYCLE_DEMO_TEST"
"""The environment variable that marks every process a demo started by ``started_demo`` runs (inherited)."""


def marked_processes(name: str, value: str) -> list[int]:
    """The running processes (zombies excluded) whose environment holds ``name=value``; none off Linux."""
    mark = f"{name}={value}".encode()
    return [pid for pid, environment in process_environments() if mark in environment]


def run_demo(*args: str, timeout: float, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the demo to its end (``run_bounded``), and fail if it left any process running after it exited."""
    done = run_command(demo_command(*args), timeout_s=timeout, env=suite_env(), cwd=cwd, grace_s=1.0)
    if done.timed_out:
        raise AssertionError(f"the demo ran past {timeout} s; output:\n{done.output}")
    if done.left_behind:
        raise AssertionError(f"the demo left processes {done.left_behind} running; output:\n{done.output}")
    return subprocess.CompletedProcess(demo_command(*args), done.returncode, done.output, "")


class RunningDemo:
    """A demo running in its own session, its output (stdout and stderr) collected line by line as it comes."""

    def __init__(self, process: subprocess.Popen[str], mark: str) -> None:
        """Collect ``process``'s output in a thread; ``mark`` is the value of ``DEMO_MARK`` its processes carry."""
        self.process, self.mark = process, mark
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        """Everything printed so far."""
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> None:
        """Return once ``text`` was printed; ``AssertionError`` if not within ``timeout`` seconds or the demo ended."""
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if time.monotonic() > deadline or (self.process.poll() is not None and not self._reader.is_alive()):
                raise AssertionError(f"{text!r} not printed within {timeout} s; output:\n{self.output[-4000:]}")
            time.sleep(0.05)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the demo's launcher alone."""
        self.process.send_signal(signum)

    def finish(self, timeout: float) -> subprocess.CompletedProcess[str]:
        """Wait for the launcher to exit (``AssertionError`` after ``timeout`` s) and return how it ended."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the demo ran past {timeout} s; output:\n{self.output[-4000:]}") from None
        self._reader.join(10)
        return subprocess.CompletedProcess(self.process.args, self.process.returncode, self.output, "")

    def left_running(self, within: float = 0.0) -> list[int]:
        """The demo's processes still running after up to ``within`` seconds of waiting for them to go."""
        deadline = time.monotonic() + within
        while (left := marked_processes(DEMO_MARK, self.mark)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left


@contextlib.contextmanager
def started_demo(*args: str, cwd: Path, wrapper: Sequence[str] = ()) -> Iterator[RunningDemo]:
    """Start ``[WRAPPER...] python -m lifecycle demo ARGS`` in its own session; on leaving, SIGKILL what still runs.

    ``wrapper``: a command the demo runs under (``timeout 300``); the session's process
    group is then the wrapper's, and ``RunningDemo.process`` is the wrapper.
    """
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "PET_"))}
    process = subprocess.Popen(
        [*wrapper, *demo_command(*args)],
        env={**env, **suite_env(), DEMO_MARK: mark},
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        yield RunningDemo(process, mark)
    finally:
        if process.poll() is None:
            process.kill()
        for pid in marked_processes(DEMO_MARK, mark):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        process.wait()
