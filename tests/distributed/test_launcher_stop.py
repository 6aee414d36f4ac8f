"""A SIGTERM from torchrun's agent after a peer died is the launcher's stop, not a requested exit (issue 26).

Two ranks under one torchrun agent with no restarts (``tests/workers/launcher_stop_worker.py``): rank 1 SIGKILLs
itself at the end of step 5 while rank 0 sleeps in a callback, outside any collective; the agent SIGTERMs rank 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.launch import WORKERS, free_port, suite_env

from lifecycle import ExitCode
from lifecycle.journal import RunEnd, TeardownStep, TrainStep, Transition, read
from lifecycle.testing import run_command

DEATH_STEP = 5


def _torchrun(port: int, out: Path) -> list[str]:
    """torchrun on 2 local ranks, static rendezvous at 127.0.0.1:``port``, no restarts."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        str(WORKERS / "launcher_stop_worker.py"),
        str(out),
    ]


@pytest.mark.timeout(180)
def test_the_survivor_is_stopped_by_the_launcher_after_the_peer_died(tmp_path: Path) -> None:
    """The survivor takes the failure edge at once on the agent's SIGTERM, its journal naming the dead peer.

    No collective after the death (no step after 5, no finalize, no barrier), the failure plan, ``end`` record
    ``exit_reason`` ``stopped_by_launcher``, and exit code ``RESTART``. On the old code the SIGTERM became a
    requested exit: the rank slept on, its next collective failed, and the failure carried ``requested_exit``.
    """
    done = run_command(_torchrun(free_port(), tmp_path), timeout_s=150, env=suite_env(), cwd=tmp_path)
    assert done.returncode != 0 and not done.timed_out and not done.left_behind, str(done)
    outcome = json.loads((tmp_path / "rank0.json").read_text())
    assert outcome["type"] == "StoppedByLauncher", outcome
    assert outcome["text"].startswith("stopped by the launcher (SIGTERM) after rank 1 died at step 5"), outcome
    assert outcome["exit_code"] == ExitCode.RESTART
    assert not (tmp_path / "rank1.json").exists()  # SIGKILLed: it wrote nothing

    records = [r for r in read([tmp_path / "journal"]) if r.origin.rank == 0]
    assert max(r.step for r in records if isinstance(r, TrainStep)) == DEATH_STEP
    moves = [(r.source, r.dest) for r in records if isinstance(r, Transition)]
    assert moves[-1] == ("training", "failed"), moves
    steps = [r.step for r in records if isinstance(r, TeardownStep)]
    assert "abort_process_group" in steps and "barrier" not in steps and "finalize_checkpoints" not in steps, steps
    (end,) = [r for r in records if isinstance(r, RunEnd)]
    assert (end.state, end.exit_reason, end.final_step) == ("failed", "stopped_by_launcher", DEATH_STEP)
    assert end.error is not None and "after rank 1 died" in end.error
