"""Process groups: telling a live one from a destroyed one, and aborting without waiting."""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

_log = logging.getLogger("lifecycle._torch")

FREE_WAIT_S = 1.0
"""How long ``abort_group`` waits for the aborted groups to be freed before it returns anyway.

Freeing a gloo group normally takes a few ticks of gloo's socket loop (one per
connection, plus one; see docs/benchmarks.md, gloo-tick); a group with collectives
still pending on it is freed only once they end (at the group timeout at worst,
pytorch issue 130345), and this rank should not wait that long: it leaves, and the
group is freed in the background.
"""


def pg_map() -> dict[Any, Any]:
    """torch's registry of live process groups."""
    # Megatron reads the same private registry to tell a live group from a destroyed one.
    pg_map: dict[Any, Any] = dist.distributed_c10d._world.pg_map
    return pg_map


def is_registered(group: Any) -> bool:
    """True if ``group`` is a process group torch still has registered (not destroyed or aborted)."""
    return group is not None and group in pg_map()


def abort_group(group: Any, *, wait_s: float = FREE_WAIT_S) -> None:
    """Abort ``group`` (None: every group) without waiting on its outstanding collectives.

    Uses torch's ``_abort_process_group``: for nccl it aborts the communicators; for
    gloo it unregisters the groups, and their connections close when the last reference
    to them goes, which releases a peer blocked in a collective within milliseconds
    ("Connection closed by peer"). If it raises while the group is still registered, a
    gloo-only group is destroyed instead (gloo's destroy waits on no peer); any other
    backend is never destroyed gracefully here (nccl's destroy can wait on pending work
    without bound): the error propagates and the group stays registered.

    ``abort_group(None)`` in a world of more than one rank frees the gloo groups in
    parallel, each in a daemon thread, when those threads hold the last references to
    them (torch's and megatron-core's already dropped); it waits at most ``wait_s``
    seconds for them (``FREE_WAIT_S``) and returns, a group still being freed finishing
    in the background. Why: a gloo group's destructor waits for a tick of gloo's socket
    loop to close each connection (and one more to stop the loop), with the GIL
    released, so freeing megatron-core's groups one after the other costs a tick per
    group and peer, and in parallel only a few ticks in all (see docs/benchmarks.md,
    gloo-tick, gloo-free-serial and gloo-free-parallel).
    """
    if group is None:
        _holding_gloo_groups(lambda: _abort_or_destroy(None), wait_s)
    else:  # one group: its caller holds it anyway
        _abort_or_destroy(group)


def destroy_world(*, wait_s: float = FREE_WAIT_S) -> None:
    """Destroy every group gracefully (``dist.destroy_process_group()``); a healthy close, after a barrier.

    Same end as torch's call (``dist.is_initialized()`` False, every group unregistered,
    its errors propagated), but in a world of more than one rank the gloo groups are freed
    in parallel, as ``abort_group(None)`` frees them: a daemon thread each, waited for at
    most ``wait_s`` seconds, a group still being freed finishing in the background. torch
    frees them one after the other, a tick of gloo's socket loop per group and peer: a close
    with megatron-core's 18 groups took about 110 ms at 2 ranks, in parallel about 20 ms
    (bench/bench_close.py).
    """
    _holding_gloo_groups(dist.destroy_process_group, wait_s)


def _holding_gloo_groups(unregister: Callable[[], None], wait_s: float) -> None:
    """Run ``unregister`` (torch's abort or destroy of every group) while holding the gloo groups, then free them
    in parallel within ``wait_s`` (``_free_in_parallel``), also when it raises."""
    # References that make our threads the ones to free the gloo groups. A world of one:
    # no connection to close, and threads only added their start-up cost (see
    # docs/benchmarks.md, gloo-free-world-of-one). Otherwise every gloo group, those of one
    # rank too (freeing them one after the other costs as much: see docs/benchmarks.md,
    # gloo-free-rank-local). nccl does its work itself: its groups go as before.
    threaded = dist.is_initialized() and dist.get_world_size() > 1
    held = [g for g, entry in pg_map().items() if threaded and _gloo_only(entry[0])]
    try:
        unregister()
    finally:
        _free_in_parallel(held, wait_s)


def _gloo_only(backend: object) -> bool:
    """True for a backend string naming gloo alone: ``"gloo"``, ``"cpu:gloo"``."""
    return all(part.rpartition(":")[2] == "gloo" for part in str(backend).split(","))


def _abort_or_destroy(group: Any) -> None:
    try:
        dist.distributed_c10d._abort_process_group(group)
    except Exception:
        still_there = dist.is_initialized() if group is None else is_registered(group)
        if not still_there:
            raise  # it is gone, but the abort itself failed: report it
        if not _all_gloo(group):
            raise  # never a graceful destroy on a failure path: it may wait on pending work
        _log.warning("aborting process group %r failed; destroying it instead (gloo)", group, exc_info=True)
        dist.destroy_process_group(group)


def _all_gloo(group: Any) -> bool:
    """True if ``group`` (None: every group) is served by gloo alone."""
    entries = pg_map().values() if group is None else [pg_map()[group]]
    return all(_gloo_only(entry[0]) for entry in entries)


def abort_groups(groups: list[Any]) -> list[Exception]:
    """Abort each registered group of ``groups`` (newest last in the list: aborted first); the errors, in order.

    Rank-local and non-graceful (see ``abort_group``); the groups stay in ``groups``,
    for the caller to drop its other references first and then ``free_in_parallel``.
    """
    errors: list[Exception] = []
    for group in reversed(groups):
        if is_registered(group):
            try:
                _abort_or_destroy(group)
            except Exception as exc:  # noqa: BLE001 - abort the others, then report
                errors.append(exc)
    return errors


def free_in_parallel(groups: list[Any], wait_s: float = FREE_WAIT_S) -> None:
    """Drop the references in ``groups`` (emptied): aborted gloo groups are freed in parallel, within ``wait_s``.

    In a world of one there is no connection to close: they are dropped here.
    """
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        groups.clear()
        return
    _free_in_parallel(groups, wait_s)


EXIT_WAIT_S = 5.0
"""At interpreter exit, how long to wait for groups still being freed in the background.

A gloo group whose destructor is still waiting on pending work when the process exits
aborts the process ("terminate called without an active exception", SIGABRT): its work
ends once the peer's side closes, which a peer's own teardown does within milliseconds.
"""

_FREEING: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


@atexit.register
def _wait_for_frees() -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    for thread in list(_FREEING):
        thread.join(max(0.0, deadline - time.monotonic()))


def _free_in_parallel(groups: list[Any], wait_s: float) -> None:
    """Drop this module's references to ``groups`` in one daemon thread each; wait at most ``wait_s`` for them.

    A thread frees its group only if it holds the last reference (torch's registry no
    longer does once the group is aborted or destroyed); otherwise it only drops a reference.
    """
    # One box per group, emptied by its thread: no reference to a group stays on this
    # thread's stack (``groups`` is emptied too, for the caller's sake). In registration
    # order: the default group, the one peers most likely wait on, first.
    boxes = [[g] for g in groups]
    groups.clear()
    threads = []
    for box in boxes:
        thread = threading.Thread(target=box.clear, name="lifecycle-free-group", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # interpreter shutting down: no new threads, free it here
            box.clear()
        else:
            threads.append(thread)
            _FREEING.add(thread)
    deadline = time.monotonic() + wait_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    still = sum(thread.is_alive() for thread in threads)
    if still and wait_s > 0:
        _log.warning(
            "%d process group(s) not freed within %.1f s (collectives still pending on them?); "
            "they are freed in the background, and peers may wait on their connections until then",
            still,
            wait_s,
        )
