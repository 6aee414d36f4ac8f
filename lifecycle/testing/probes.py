"""What is alive in this process, observed from the world, not from the library's ledger.

Each probe reads the source of truth directly: torch's registry of process groups,
the module globals of ``megatron.core`` (``parallel_state``,
``num_microbatches_calculator``, ``rerun_state_machine``), the operating system's
threads and sockets (through psutil). A probe holds no reference to what it sees
(a held gloo group would keep its connections open), and imports torch, megatron-core
and psutil only when called.
"""

from __future__ import annotations

import contextlib
import gc
import types
from dataclasses import dataclass
from typing import Any

TORCH_COLLECTIVES: tuple[str, ...] = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "irecv",
    "isend",
    "monitored_barrier",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
)
"""torch.distributed functions that talk to peers: none may run on a failure path."""

MEGATRON_MODULES: dict[str, str] = {
    "model_parallel": "megatron.core.parallel_state",
    "microbatch_calculator": "megatron.core.num_microbatches_calculator",
    "rerun_state_machine": "megatron.core.rerun_state_machine",
}
"""The megatron-core modules whose globals ``megatron_globals`` reads, by the resource they hold."""

_PLAIN = (type(None), bool, int, float, str)
_NOT_STATE = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)


def _psutil() -> Any:
    """psutil, imported on first use (a test dependency, not one of the library's)."""
    import psutil  # type: ignore[import-untyped]  # no stubs in the dev environment

    return psutil


def _modules() -> dict[str, types.ModuleType]:
    import importlib

    return {resource: importlib.import_module(name) for resource, name in MEGATRON_MODULES.items()}


def _is_set(value: object) -> bool:
    """True unless ``value`` is a global's resting value: None or an empty container."""
    if value is None:
        return False
    return not (isinstance(value, dict | list | tuple | set) and not value)


def _is_plain(value: object) -> bool:
    """True for plain data (numbers, strings, containers of them): a leftover value, not a live object."""
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, dict):
        return all(_is_plain(k) and _is_plain(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return all(_is_plain(item) for item in value)
    return False


def _globals(module: types.ModuleType) -> dict[str, Any]:
    """The module's private state globals (``_NAME``) that are set now."""
    return {
        name: value
        for name, value in vars(module).items()
        if name.startswith("_") and not name.startswith("__") and not isinstance(value, _NOT_STATE) and _is_set(value)
    }


def megatron_globals() -> dict[str, str]:
    """Snapshot the megatron-core module globals that are set now: ``"module._NAME"`` → the value's type name.

    Set means anything but None or an empty container (every one of them rests at that
    before initialization). Plain data that megatron leaves after its own destroy
    (lists of ranks) is included; ``alive`` tells it apart from live objects. Holds no
    reference to any value.
    """
    snapshot = {}
    for module in _modules().values():
        short = module.__name__.rpartition(".")[2]
        for name, value in _globals(module).items():
            snapshot[f"{short}.{name}"] = type(value).__name__
    return snapshot


def _live_megatron() -> dict[str, bool]:
    """Resource → whether any of its module's globals holds a live object (not plain data)."""
    return {
        resource: any(not _is_plain(value) for value in _globals(module).values())
        for resource, module in _modules().items()
    }


def alive() -> dict[str, bool]:
    """Report which process-wide resources exist now, whoever made them; all False after a clean teardown.

    Keys: ``process_group`` (torch's default group is initialized, or any group is
    still in torch's registry ``distributed_c10d._world.pg_map``); ``model_parallel``,
    ``microbatch_calculator``, ``rerun_state_machine`` (a global of
    ``parallel_state``, ``num_microbatches_calculator``, ``rerun_state_machine``
    holds a live object: a group, a calculator, a state machine, a buffer). Plain data
    megatron leaves behind (lists of ranks) does not count.
    """
    import torch.distributed as dist

    groups = dist.is_available() and (dist.is_initialized() or bool(dist.distributed_c10d._world.pg_map))
    return {"process_group": bool(groups), **_live_megatron()}


def threads() -> list[str]:
    """Name every thread of this process (the operating system's view), sorted.

    A Python thread is named by its ``threading`` name; a native one (gloo's, a C++
    library's) as ``native:<kernel name>``. Compare lists (or lengths) before and after.
    """
    import threading

    psutil = _psutil()

    python = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    names = []
    for thread in psutil.Process().threads():
        name = python.get(thread.id)
        if name is None:
            try:
                with open(f"/proc/self/task/{thread.id}/comm", encoding="utf-8") as comm:
                    name = "native:" + comm.read().strip()
            except OSError:
                name = f"native:{thread.id}"
        names.append(name)
    return sorted(names)


@dataclass(frozen=True, slots=True)
class Socket:
    """One TCP socket of this process: ``LISTEN`` (``remote`` None) or ``ESTABLISHED``."""

    status: str
    local: tuple[str, int]
    remote: tuple[str, int] | None


def sockets() -> list[Socket]:
    """List this process's listening and established TCP sockets (IPv4 and IPv6), sorted.

    Sockets in other states (``TIME_WAIT``, ``CLOSE_WAIT``, …) are being closed and are
    left out. ``{s.local[1] for s in sockets() if s.status == "LISTEN"}`` are the ports
    this process serves.
    """
    psutil = _psutil()

    found = set()
    for conn in psutil.Process().net_connections(kind="tcp"):
        if conn.status not in (psutil.CONN_LISTEN, psutil.CONN_ESTABLISHED):
            continue
        remote = (conn.raddr.ip, conn.raddr.port) if conn.raddr else None
        found.add(Socket(conn.status, (conn.laddr.ip, conn.laddr.port), remote))
    return sorted(found, key=lambda s: (s.status, s.local, s.remote or ("", 0)))


def release_everything() -> list[str]:
    """Release every distributed resource of this process, whoever made it; return what was found alive.

    The one force-release for tests: destroys the rerun state machine and the
    microbatch calculator, runs ``destroy_model_parallel`` and resets any
    ``parallel_state`` global still holding a live object, aborts every process group
    in torch's registry (no collective, no wait on a peer). The result lists the
    ``alive()`` keys that were True, plus ``"hosted_store"`` if a store server lifecycle
    opened is still held after that (by a leaked reference, which this cannot drop):
    empty if nothing was left.
    """
    import torch.distributed as dist
    from megatron.core import num_microbatches_calculator, parallel_state, rerun_state_machine

    from lifecycle._torch.store import HOSTED

    found = [name for name, up in alive().items() if up]
    rerun_state_machine.destroy_rerun_state_machine()
    num_microbatches_calculator.destroy_num_microbatches_calculator()
    parallel_state.destroy_model_parallel()
    for name, value in _globals(parallel_state).items():
        if not _is_plain(value):
            if isinstance(value, dict):
                value.clear()
            else:
                setattr(parallel_state, name, None)
    if dist.is_available():
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if dist.is_initialized():
            _abort_or_destroy(dist, abort, None)
        for group in list(dist.distributed_c10d._world.pg_map):
            _abort_or_destroy(dist, abort, group)
    if HOSTED:
        gc.collect()  # a cycle (a failure's traceback) may be all that holds it
        if HOSTED:
            found.append("hosted_store")
    return found


def _abort_or_destroy(dist: Any, abort: Any, group: Any) -> None:
    """Abort ``group`` (None: all); where that fails or torch has no abort, destroy it."""
    if abort is not None:
        try:
            abort(group)
            return
        except Exception:  # noqa: BLE001 - destroying it instead is the fallback
            pass
    with contextlib.suppress(Exception):
        dist.destroy_process_group(group)
