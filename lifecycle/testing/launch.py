"""Running a multi-rank job from a test: every rank its own process, nothing left behind.

Each launch marks its processes with an environment variable (``LIFECYCLE_LAUNCH``)
that every descendant inherits, even one that starts its own session (NVRx's monitor
process does): that is how the launcher finds, and kills, whatever a rank left
running. Finding them reads ``/proc`` (Linux); elsewhere only the ranks' own process
groups are killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lifecycle._core.errors import check_number
from lifecycle._launch.launcher import child_env, kill_group, marked, torchrun_command, wait_gone
from lifecycle.testing.ports import free_port

LOOPBACK = "127.0.0.1"
MARK = "LIFECYCLE_LAUNCH"
"""The environment variable that marks a launch's processes: ``<launch id>:<rank>``."""

_TORCH_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_POLL_S = 0.05
_KILL_WAIT_S = 10.0  # a SIGKILLed process is gone within milliseconds; this only bounds the wait
_Command = tuple[int | None, list[str], dict[str, str]]  # (rank, argv, the rank's own variables)


@dataclass(frozen=True, slots=True)
class RankResult:
    """How one launched process ended.

    ``rank`` is the rank, or None for the torchrun agent (which ran every rank).
    ``returncode`` is the exit code (negative: killed by that signal). ``output`` is
    its stdout and stderr, interleaved. ``timed_out``: it was still running at the
    deadline and was killed. ``left_behind``: pids of processes it started that were
    still running ``grace_s`` after it exited, killed by the launcher.
    """

    rank: int | None
    returncode: int
    output: str
    timed_out: bool = False
    left_behind: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        """True if it exited 0 by itself and left nothing running."""
        return self.returncode == 0 and not self.timed_out and not self.left_behind

    def __str__(self) -> str:
        who = "torchrun" if self.rank is None else f"rank {self.rank}"
        how = "timed out" if self.timed_out else f"exit code {self.returncode}"
        left = f", left {len(self.left_behind)} process(es) running" if self.left_behind else ""
        return f"{who}: {how}{left}\n{self.output[-3000:]}"


def launch_ranks(
    script: Sequence[str],
    world_size: int,
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    torchrun: bool = False,
    master_port: int | None = None,
    cwd: str | os.PathLike[str] | None = None,
    grace_s: float = 10.0,
) -> list[RankResult]:
    """Run ``python SCRIPT`` as ranks ``0 … world_size - 1`` on loopback; return how each ended, by rank.

    ``script`` is what follows the interpreter: ``[path, *args]`` or ``["-m", module, *args]``.
    Each rank runs in its own process session with ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR=127.0.0.1`` and ``MASTER_PORT`` (``master_port``, or a
    free port) set, one OpenMP thread and gloo on the loopback interface; ``env`` is
    added on top. With ``torchrun``, one torchrun agent (static rendezvous, no
    restarts) runs the ranks instead, and the result is the agent's alone (``rank``
    None, exit code 0 only if every rank exited 0).

    Never leaves a process behind: at ``timeout_s`` every process still running is
    killed (``timed_out``); after a rank exits, what it started gets ``grace_s`` to exit
    by itself and is then killed (``left_behind``). Also on an exception or Ctrl-C.
    """
    check_number("world_size", world_size, at_least=1)
    port = free_port(LOOPBACK) if master_port is None else master_port
    base = _base_env(env)
    if torchrun:
        commands: list[_Command] = [(None, torchrun_command(world_size, LOOPBACK, port, list(script)), {})]
    else:
        commands = [
            (
                rank,
                [sys.executable, *script],
                {
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(world_size),
                    "LOCAL_WORLD_SIZE": str(world_size),
                    "MASTER_ADDR": LOOPBACK,
                    "MASTER_PORT": str(port),
                },
            )
            for rank in range(world_size)
        ]
    return _run(commands, timeout_s=timeout_s, base_env=base, cwd=cwd, grace_s=grace_s)


def run_command(
    command: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    grace_s: float = 10.0,
) -> RankResult:
    """Run one command (a launcher such as torchrun, or the demo) as ``launch_ranks`` runs a rank; rank None.

    Same environment (less the rank variables), same bounds: at ``timeout_s`` it and
    everything it started are killed (``timed_out``); what it started gets ``grace_s``
    after it exits, then is killed (``left_behind``).
    """
    return _run([(None, list(command), {})], timeout_s=timeout_s, base_env=_base_env(env), cwd=cwd, grace_s=grace_s)[0]


def _base_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """This process's environment with quiet loopback defaults, no launcher variables, then ``env``."""
    base = {k: v for k, v in child_env(LOOPBACK).items() if not k.startswith(("TORCHELASTIC_", "PET_"))}
    for name in _TORCH_LAUNCH_VARS:
        base.pop(name, None)
    base.update(env or {})
    return base


def _run(
    commands: list[_Command],
    *,
    timeout_s: float,
    base_env: dict[str, str],
    cwd: str | os.PathLike[str] | None,
    grace_s: float,
) -> list[RankResult]:
    """Start every command in its own session, marked; wait, kill and reap as ``launch_ranks`` documents."""
    launch = uuid.uuid4().hex
    ranks = [rank for rank, _, _ in commands]
    with contextlib.ExitStack() as files:
        outputs = [files.enter_context(tempfile.TemporaryFile()) for _ in commands]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for (rank, command, rank_env), out in zip(commands, outputs, strict=True):
                mark = f"{launch}:{'agent' if rank is None else rank}"
                procs.append(
                    subprocess.Popen(
                        command,
                        env={**base_env, **rank_env, MARK: mark},
                        cwd=cwd,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
            timed_out = _wait_all(procs, ranks, time.monotonic() + timeout_s, launch)
            left = _reap_descendants(launch, ranks, 0.0 if timed_out else grace_s)
        finally:
            doomed = set(_marked(launch))
            for proc in procs:
                kill_group(proc)
            _reap_descendants(launch, ranks, 0.0, doomed)
        results = []
        for rank, proc, out in zip(ranks, procs, outputs, strict=True):
            out.seek(0)
            text = out.read().decode(errors="replace")
            results.append(RankResult(rank, proc.returncode, text, rank in timed_out, left.get(rank, ())))
    return results


def _wait_all(
    procs: list[subprocess.Popen[bytes]], ranks: list[int | None], deadline: float, launch: str
) -> set[int | None]:
    """Wait for every process until ``deadline``; kill the ones still running then and return their ranks.

    Returns once what the killed process groups held is gone (bounded by ``_KILL_WAIT_S``).
    """
    while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    late = {rank for rank, proc in zip(ranks, procs, strict=True) if proc.poll() is None}
    if late:
        labels = {"agent" if rank is None else str(rank) for rank in late}
        doomed = {pid for pid, label in _marked(launch).items() if label in labels}
        for rank, proc in zip(ranks, procs, strict=True):
            if rank in late:
                kill_group(proc)
        wait_gone(doomed, _KILL_WAIT_S)
    return late


def _marked(launch: str) -> dict[int, str]:
    """pid → rank label of every running process that carries this launch's mark (none off Linux)."""
    return marked(MARK, f"{launch}:")


def _reap_descendants(
    launch: str, ranks: list[int | None], grace_s: float, doomed: set[int] | None = None
) -> dict[int | None, tuple[int, ...]]:
    """Give this launch's remaining processes ``grace_s`` to exit, then SIGKILL them; return them by rank.

    Returns once the killed ones and ``doomed`` (pids already sent SIGKILL) are gone
    (a zombie counts as gone), or after ``_KILL_WAIT_S``.
    """
    deadline = time.monotonic() + grace_s
    while _marked(launch) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    left: dict[int | None, list[int]] = {}
    for pid, label in _marked(launch).items():
        rank = None if label == "agent" else int(label)
        left.setdefault(rank if rank in ranks else None, []).append(pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    wait_gone({pid for pids in left.values() for pid in pids} | (doomed or set()), _KILL_WAIT_S)
    return {rank: tuple(sorted(pids)) for rank, pids in left.items()}
