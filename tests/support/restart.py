"""Helpers shared by test_restart.py and its worker: fast Wrapper settings, ports, observers."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psutil
import torch.distributed as dist

from lifecycle import State
from support.probes import alive

INTERVAL = timedelta(seconds=0.05)
FAST: dict[str, Any] = {
    "monitor_thread_interval": INTERVAL,
    "monitor_process_interval": INTERVAL,
    "heartbeat_interval": INTERVAL,
    "progress_watchdog_interval": INTERVAL,
    "last_call_wait": INTERVAL,
}
"""Wrapper settings for tests: 50 ms intervals keep a restart near a quarter of a second."""

GROUP_TIMEOUT_S = 10.0
"""Every test group's timeout; the Wrapper's timeouts are ordered after it."""

_SESSION_FILE = os.path.join("lifecycle", "_core", "session.py")
_RESTART_FILE = os.path.join("lifecycle", "restart", "__init__.py")


def free_ports(count: int = 2) -> int:
    """A port P below the ephemeral range such that P … P + count - 1 are all free now."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        try:
            for candidate in range(port, port + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no {count} consecutive free ports found")


def megatron_globals_left() -> list[str]:
    """The names of the Megatron-core globals that still exist (empty: none)."""
    return [name for name, up in alive().items() if up and name != "process_group"]


@dataclass(frozen=True)
class TeardownCall:
    """A call to a torch.distributed teardown function: which, in which iteration, from whose code."""

    name: str
    iteration: int
    via_session: bool
    via_restart: bool
    thread: str


class TeardownCalls:
    """Records every ``barrier`` / ``destroy_process_group`` / ``_abort_process_group`` made in torch.distributed.

    Each record says whether a ``lifecycle.Session`` (its teardown) or
    ``lifecycle.restart`` (the Wrapper's abort/finalize) is on the calling stack.
    ``iteration`` is whatever the test last set.
    """

    NAMES = ("barrier", "destroy_process_group")

    def __init__(self) -> None:
        self.calls: list[TeardownCall] = []
        self.iteration = -1
        self._saved: list[tuple[Any, str, Any]] = []

    def install(self) -> TeardownCalls:
        """Patch the functions; ``restore()`` puts them back."""
        targets = [(dist, name) for name in self.NAMES]
        targets += [(dist.distributed_c10d, name) for name in (*self.NAMES, "_abort_process_group")]
        for module, name in targets:
            original = getattr(module, name)
            self._saved.append((module, name, original))
            setattr(module, name, self._recording(name, original))
        return self

    def restore(self) -> None:
        """Put the original functions back."""
        while self._saved:
            module, name, original = self._saved.pop()
            setattr(module, name, original)

    def _recording(self, name: str, original: Any) -> Any:
        def record(*args: Any, **kwargs: Any) -> Any:
            files = [frame.filename for frame in traceback.extract_stack()]
            self.calls.append(
                TeardownCall(
                    name,
                    self.iteration,
                    any(f.endswith(_SESSION_FILE) for f in files),
                    any(f.endswith(_RESTART_FILE) for f in files),
                    threading.current_thread().name,
                )
            )
            return original(*args, **kwargs)

        return record

    def by_session(self, iteration: int) -> list[TeardownCall]:
        """The calls made from a session's code in ``iteration``."""
        return [c for c in self.calls if c.iteration == iteration and c.via_session]

    def by_wrapper(self, iteration: int) -> list[TeardownCall]:
        """The calls made from ``lifecycle.restart`` (the Wrapper's abort/finalize) in ``iteration``."""
        return [c for c in self.calls if c.iteration == iteration and c.via_restart and not c.via_session]


def reap(pids: list[int], grace_s: float = 10.0) -> list[int]:
    """Wait up to ``grace_s`` for ``pids`` to exit; kill the ones still running and return them."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    return [proc.pid for proc in alive]


def monitor_pid(call_wrapper: Any) -> int:
    """The pid of the Wrapper's monitor process for this call (a daemon, not our child)."""
    return int(call_wrapper.monitor_process.process_monitor_proc.pid)


FAULT_STATES = (State.UNINITIALIZED, State.DIST_READY, State.GLOBALS_READY, State.TRAINING, State.FINALIZING)
"""The live states a fault can be injected in."""
