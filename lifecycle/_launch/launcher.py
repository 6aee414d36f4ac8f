"""Starting processes that must not outlive whoever started them: one launcher for the demo and ``lifecycle.testing``.

What a launcher needs, in one place: the torchrun command and the environment for
torchrun and its ranks (``torchrun_command``, ``child_env``); death signals, so that a
child dies with its parent (``set_parent_death_signal`` in the child,
``die_with`` as a ``preexec_fn``); and the way to find and kill what a launch started.
A launch marks its processes with an environment variable (``NAME=<value>``) that every
descendant inherits, even one that starts a session of its own (torchrun's ranks,
NVRx's monitor process): ``marked`` finds them (Linux ``/proc``; nothing elsewhere),
``kill_marked`` kills them and waits until they are gone, and ``kill_group`` kills a
child's whole process group. A launcher that is a subreaper (``become_subreaper``)
inherits what its children leave behind, ranks that exited under a stopped or killed
torchrun included, and collects them (``reap_orphans``). No torch import here.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from lifecycle._core.bounds import SHUTDOWN_VARIABLE, Bounds
from lifecycle._core.processes import is_running, process_environments

__all__ = [
    "become_subreaper",
    "child_env",
    "die_with",
    "kill_group",
    "kill_marked",
    "marked",
    "process_state",
    "reap_orphans",
    "set_parent_death_signal",
    "torchrun_command",
    "wait_gone",
]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.05


def torchrun_command(
    nproc: int,
    master_addr: str,
    master_port: int,
    script: list[str],
    *,
    rendezvous_timeout_s: float | None = None,
    max_restarts: int = 0,
    rank_logs: Path | None = None,
) -> list[str]:
    """The command that runs ``script`` (``-m module args`` or ``path args``) on ``nproc`` local ranks with torchrun.

    Static rendezvous at ``master_addr:master_port``. When a rank fails torchrun stops
    the other ranks; it starts them all again at most ``max_restarts`` times (0: the
    failure ends the job). ``rendezvous_timeout_s``:
    torchrun gives up the rendezvous after that long (rounded up to whole seconds;
    None: torchrun's default, 15 minutes). ``rank_logs``: torchrun redirects each
    rank's stdout and stderr into files under that folder
    (``<job>/attempt_<n>/<rank>/stdout.log``), not to its own terminal.
    """
    timeout = [] if rendezvous_timeout_s is None else [f"--rdzv-conf=timeout={max(1, math.ceil(rendezvous_timeout_s))}"]
    logs = [] if rank_logs is None else [f"--log-dir={rank_logs}", "--redirects=3"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        f"--master-addr={master_addr}",
        f"--master-port={master_port}",
        f"--max-restarts={max_restarts}",
        *timeout,
        *logs,
        *script,
    ]


def child_env(master_addr: str, group_timeout_s: float | None = None) -> dict[str, str]:
    """This process's environment, plus quiet, loopback-friendly defaults for torchrun and its ranks.

    ``group_timeout_s`` (the ranks' ``DistributedConfig.timeout_s``): torchrun's grace
    between the SIGTERM it forwards and its SIGKILL becomes ``Bounds.stop_grace_s``
    (``SHUTDOWN_VARIABLE``), unless this environment sets it already (``Bounds.shutdown_timeout``
    warns when that is shorter). None: torchrun's own (30 s).
    """
    env = dict(os.environ)
    if group_timeout_s is not None:
        env[SHUTDOWN_VARIABLE] = Bounds(group_timeout_s).shutdown_timeout(env)
    # One thread a rank (torchrun would set it and warn); quiet c10d's C++ logging.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCH_CPP_LOG_LEVEL", "error")
    if master_addr == "127.0.0.1" and sys.platform == "linux":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's own sockets stay on loopback too
    env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")  # torch.cuda's pynvml notice, in every process
    return env


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux); None elsewhere or where it cannot be loaded."""
    if sys.platform != "linux":
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux); False where it cannot.

    If the parent is already gone (this process was re-parented to init), ``signum``
    is sent at once.
    """
    prctl = _prctl()
    if prctl is None:
        return False
    if prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        return False
    if os.getppid() == 1:
        os.kill(os.getpid(), signum)
    return True


def die_with(parent: int, signum: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` giving the child ``signum`` when ``parent`` (this process) dies; None off Linux.

    Safe only in a process that runs no other thread when it forks (a ``preexec_fn``'s rule).
    """
    prctl = _prctl()  # loaded before the fork: the child only calls it
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died between the fork and the prctl
            os.kill(os.getpid(), signum)

    return preexec


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``process``'s process group (a child started with ``start_new_session``) and reap ``process``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def marked(name: str, prefix: str = "") -> dict[int, str]:
    """pid → the rest of the value, for every running process whose environment holds ``name=<prefix>…``.

    Zombies and other users' processes are not seen; nothing is found off Linux.
    """
    start = f"{name}={prefix}".encode()
    found: dict[int, str] = {}
    for pid, environment in process_environments():
        rest = next((item[len(start) :].decode() for item in environment if item.startswith(start)), None)
        if rest is not None:
            found[pid] = rest
    return found


def wait_gone(pids: Iterable[int], within_s: float) -> None:
    """Wait (at most ``within_s``) until none of ``pids`` runs any more: gone or a zombie.

    Reads each process's state, not its environment: a process in the middle of exiting
    has already lost its environment (so it no longer looks marked) but still runs.
    """
    pids = set(pids)
    deadline = time.monotonic() + within_s
    while any(map(is_running, pids)) and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def kill_marked(name: str, prefix: str = "", within_s: float = 10.0) -> dict[int, str]:
    """SIGKILL every running process ``marked(name, prefix)`` finds, until none is left; return those it killed.

    Returns once they are gone, or after ``within_s`` (a SIGKILLed process is gone
    within milliseconds: the bound only keeps a process in uninterruptible sleep from
    holding the caller).
    """
    deadline = time.monotonic() + within_s
    killed: dict[int, str] = {}
    while (left := marked(name, prefix)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed.update(left)
        time.sleep(_POLL_S)
    wait_gone(killed, max(0.0, deadline - time.monotonic()))
    return killed


def become_subreaper() -> bool:
    """Make this process the one that inherits its orphaned descendants (Linux); False where it cannot.

    A rank whose torchrun agent is stopped exits as a zombie its parent never collects;
    once the agent is killed, the rank is re-parented here (not to init, which in a
    container may collect nothing), and ``reap_orphans`` collects it.
    """
    prctl = _prctl()
    if prctl is None:
        return False
    return bool(prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def reap_orphans(within_s: float = 0.0) -> list[int]:
    """Collect every child of this process that has exited (``waitpid(-1, WNOHANG)``); the pids collected.

    With ``within_s`` > 0, keeps collecting until this process has no child left or
    ``within_s`` has passed: a rank re-parented here while still in its exit path (its
    memory already released, so no longer found by its mark, but not yet a zombie) is
    collected once it is one, not left to an init that may never collect it.
    Call it only once the children this process waits for itself (``subprocess.Popen``)
    have been waited for: it collects any child, theirs included.
    """
    reaped: list[int] = []
    deadline = time.monotonic() + within_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid != 0:
            reaped.append(pid)
        elif time.monotonic() >= deadline:
            return reaped
        else:
            time.sleep(_POLL_S)


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``R``, ``S``, ``T`` stopped, ``Z`` zombie...); None if gone or unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :][:1].decode() or None
