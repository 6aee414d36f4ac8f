"""Running the suite's workers and commands: one launcher (``lifecycle.testing``), the paths it needs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from lifecycle.testing import RankResult, free_port, free_ports, launch_ranks, run_command

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
WORKERS = TESTS / "workers"
"""Every script a test runs as a rank lives here."""

__all__ = [
    "REPO",
    "TESTS",
    "WORKERS",
    "demo_command",
    "free_port",
    "free_ports",
    "run_bounded",
    "run_workers",
    "suite_env",
]


def suite_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables a child needs to import lifecycle from this checkout and ``support`` from tests/, quietly."""
    path = os.pathsep.join(filter(None, [str(REPO), str(TESTS), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, **(extra or {})}


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
