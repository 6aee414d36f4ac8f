"""What the tests observe: live resources (``lifecycle.testing``'s probes) and calls into torch and megatron-core."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch.distributed as dist
from megatron.core import num_microbatches_calculator, parallel_state, rerun_state_machine

from lifecycle import Session
from lifecycle.testing import TORCH_COLLECTIVES, alive, megatron_globals, release_everything, sockets, threads

__all__ = [
    "GROUP_ENDS",
    "MEGATRON_RELEASES",
    "NOTHING_ALIVE",
    "TORCH_COLLECTIVES",
    "TORCH_RELEASES",
    "Call",
    "TorchCalls",
    "alive",
    "by_session",
    "by_wrapper",
    "megatron_globals",
    "megatron_left",
    "monitor_pid",
    "reap",
    "record_run",
    "release_everything",
    "sockets",
    "threads",
]

NOTHING_ALIVE = dict.fromkeys(
    ("process_group", "model_parallel", "microbatch_calculator", "rerun_state_machine"), False
)
"""What ``alive()`` reports after a clean teardown."""

TORCH_RELEASES = ("destroy_process_group", "_abort_process_group")
"""torch.distributed's functions that release a process group."""

MEGATRON_RELEASES = (
    "destroy_model_parallel",
    "destroy_global_memory_buffer",
    "destroy_num_microbatches_calculator",
    "destroy_rerun_state_machine",
)
"""megatron-core's functions that release its globals."""

_PACKAGE = Path(__file__).resolve().parents[2] / "lifecycle"
_MODULES = (dist, dist.distributed_c10d, parallel_state, num_microbatches_calculator, rerun_state_machine)


def megatron_left() -> list[str]:
    """The megatron-core resources still alive (empty: none)."""
    return [name for name, up in alive().items() if up and name != "process_group"]


@dataclass(frozen=True)
class Call:
    """One recorded call: the function, the thread, the test's tag then, and the lifecycle modules on the stack."""

    name: str
    thread: str
    tag: Any
    via: frozenset[str]

    def via_module(self, module: str) -> bool:
        """True if ``module`` (dotted, e.g. ``lifecycle.restart``) was on the calling stack."""
        return module in self.via


class TorchCalls:
    """Records every call of the named torch.distributed / megatron-core functions; the calls still run.

    Each function is wrapped wherever the module defines it (``torch.distributed``, its
    ``distributed_c10d``, megatron-core's ``parallel_state``,
    ``num_microbatches_calculator``, ``rerun_state_machine``), in every thread. Calls
    are recorded while ``on``; each carries ``tag`` (whatever the test last set, e.g.
    an iteration) and which lifecycle modules were on the stack. Use as a context
    manager, or ``install()`` / ``restore()``.
    """

    def __init__(self, names: Iterable[str]) -> None:
        """Record ``names`` once installed."""
        self.names = tuple(names)
        self.calls: list[Call] = []
        self.on = True
        self.tag: Any = None
        self._saved: list[tuple[Any, str, Any]] = []

    def install(self) -> TorchCalls:
        """Wrap the functions; ``restore()`` puts the originals back."""
        for module in _MODULES:
            for name in self.names:
                original = getattr(module, name, None)
                if callable(original):
                    self._saved.append((module, name, original))
                    setattr(module, name, self._recording(name, original))
        return self

    def restore(self) -> None:
        """Put the original functions back."""
        while self._saved:
            module, name, original = self._saved.pop()
            setattr(module, name, original)

    def __enter__(self) -> TorchCalls:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def _recording(self, name: str, original: Any) -> Any:
        def record(*args: Any, **kwargs: Any) -> Any:
            if self.on:
                self.calls.append(Call(name, threading.current_thread().name, self.tag, _lifecycle_on_stack()))
            return original(*args, **kwargs)

        return record

    def named(self, *names: str) -> list[str]:
        """The names of the recorded calls, in order, limited to ``names`` if given."""
        return [c.name for c in self.calls if not names or c.name in names]


def _lifecycle_on_stack() -> frozenset[str]:
    """The lifecycle modules with a frame on the calling stack."""
    modules = set()
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        module = _module_of(frame.f_code.co_filename)
        if module:
            modules.add(module)
        frame = frame.f_back
    return frozenset(modules)


@functools.cache
def _module_of(filename: str) -> str:
    """The dotted lifecycle module a source file is, or "" if it is not one."""
    path = Path(filename)
    if not path.is_relative_to(_PACKAGE):
        return ""
    parts = path.relative_to(_PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def reap(pids: list[int], grace_s: float = 10.0) -> list[int]:
    """Wait up to ``grace_s`` for ``pids`` to exit; kill the ones still running and return them."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, running = psutil.wait_procs(procs, timeout=grace_s)
    for proc in running:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    return [proc.pid for proc in running]


def monitor_pid(call_wrapper: Any) -> int:
    """The pid of the Wrapper's monitor process for this call (a daemon, not our child)."""
    return int(call_wrapper.monitor_process.process_monitor_proc.pid)


GROUP_ENDS = ("barrier", "destroy_process_group", "_abort_process_group")
"""The torch.distributed calls that end a process group (the barrier before a destroy included)."""

SESSION_MODULES = (Session.__init__.__module__, "lifecycle._core.teardown")  # the class reads as ``lifecycle``
"""Where ``Session``'s teardown runs (a step with a deadline runs on a worker of its own, reached from the teardown
runner alone), and the release callables it bound, which the Wrapper's steps run too."""

ATTEMPT_MODULE = "lifecycle._core.wrapped"
"""Where the Wrapper's abort and finalize run their steps (``Attempt.release``), reached from ``lifecycle.restart``."""


def by_session(calls: TorchCalls, tag: Any) -> list[Call]:
    """The calls a session's own teardown made while ``calls.tag`` was ``tag``."""
    return [
        c
        for c in calls.calls
        if c.tag == tag and any(map(c.via_module, SESSION_MODULES)) and not c.via_module(ATTEMPT_MODULE)
    ]


def by_wrapper(calls: TorchCalls, tag: Any) -> list[Call]:
    """The calls the Wrapper's abort/finalize made (through the attempt's steps) while tagged ``tag``."""
    return [c for c in calls.calls if c.tag == tag and c.via_module(ATTEMPT_MODULE)]


def record_run(scenario: Callable[[dict[str, Any]], None], path: Path) -> int:
    """A worker rank's ending: run ``scenario(record)``, then write ``record`` as JSON to ``path``; returns 0.

    What the scenario raised goes in ``crash`` (with ``traceback``); then whether a group is
    still initialized, what ``alive()`` sees and what ``release_everything()`` had to release.
    """
    record: dict[str, Any] = {}
    try:
        scenario(record)
    except BaseException as exc:  # noqa: BLE001 - recorded: what the rank saw is the result
        record["crash"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()
    record["dist_initialized"] = dist.is_initialized()
    record["alive"] = alive()
    record["left"] = release_everything()
    path.write_text(json.dumps(record))
    return 0
