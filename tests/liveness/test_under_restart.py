"""Under an in-process restart (NVRx's Wrapper) the liveness monitor names a culprit and never kills it.

The Wrapper's own timeouts end a hung rank and restart every rank in their processes; a
monitor that also killed would end a process the Wrapper is about to restart. ``pretrain``
is given the session the Wrapper's iteration would give it (``RestartMode.INPROCESS``),
on a real gloo group of one rank, and the real monitor process's settings are read from
its command line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.configs import config_of_one

from lifecycle import (
    Callback,
    CheckpointConfig,
    DistributedConfig,
    LivenessConfig,
    ParallelConfig,
    Session,
    SessionHandle,
    TorchActions,
    journal,
    pretrain,
)
from lifecycle.lowlevel import RestartMode
from lifecycle.testing import free_port, release_everything


@pytest.fixture
def rank_of_one(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """This process as rank 0 of 1 on a fresh port (as the Wrapper's environment gives it); released afterwards."""
    port = free_port()
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    try:
        yield port
    finally:
        release_everything()


class MonitorModes(Callback):
    """At each step end, the mode of every liveness monitor this process started (from its command line), and
    whether ``session``'s progress marks go somewhere (its ``progress_sink``)."""

    def __init__(self, session: Session) -> None:
        self.modes: list[str] = []
        self.plugged: list[bool] = []
        self.session = session

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        self.plugged.append(self.session.progress_sink is not None)
        for child in psutil.Process().children():
            try:
                command = child.cmdline()
            except psutil.Error:  # a child that exited (a zombie until reaped: the previous run's monitor)
                continue
            script = next((i for i, part in enumerate(command) if part.endswith("monitor.py")), None)
            if script is not None:  # monitor.py '<json settings>' <marks page>
                self.modes.append(json.loads(command[script + 1])["mode"])


def _run(tmp_path: Path, restart_mode: RestartMode) -> tuple[MonitorModes, Session]:
    """One ``pretrain`` with a ``kill`` monitor under ``restart_mode``: what its callback saw, and its session."""
    actions = TorchActions(DistributedConfig(timeout_s=20), ParallelConfig(), store_prefix="iteration0")
    session = Session(actions, restart_mode=restart_mode)
    config = config_of_one(
        tmp_path,
        distributed=DistributedConfig(timeout_s=20),
        liveness=LivenessConfig(mode="kill"),
        checkpoint=CheckpointConfig(),
    )
    peek = MonitorModes(session)
    pretrain(config, callbacks=[peek], session=session)
    return peek, session


@pytest.mark.timeout(120)
def test_under_an_in_process_restart_a_kill_monitor_only_reports(tmp_path: Path, rank_of_one: int) -> None:
    """``mode="kill"`` under ``RestartMode.INPROCESS``: the monitor runs in ``report`` mode; ordinary runs kill."""
    assert set(_run(tmp_path / "inprocess", RestartMode.INPROCESS)[0].modes) == {"report"}
    assert set(_run(tmp_path / "ordinary", RestartMode.ORDINARY)[0].modes) == {"kill"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("restart_mode", [RestartMode.INPROCESS, RestartMode.ORDINARY], ids=lambda m: m.value)
def test_pretrain_plugs_the_marks_into_its_session_while_the_monitor_runs(
    tmp_path: Path, rank_of_one: int, restart_mode: RestartMode
) -> None:
    """Every step marks through the session's ``progress_sink`` (the core's seam); unplugged once the monitor stops."""
    peek, session = _run(tmp_path, restart_mode)
    assert peek.plugged and all(peek.plugged)
    assert session.progress_sink is None
    # The journal's run record says the deadlines in force, in the monitor's real mode (show prints them).
    start = next(r for r in journal.read([tmp_path / "journal"]) if isinstance(r, journal.RunStart))
    mode = "report" if restart_mode is RestartMode.INPROCESS else "kill"
    assert start.liveness.startswith(f"{mode}: every 1 s; suspected past max(5 x the slowest step, 2 s)"), start
    assert "convicted past max(that, 6.67 s = patience 1 x the 20 s group timeout / 3)" in start.liveness, start
