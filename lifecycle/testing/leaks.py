"""What a test left alive, named, and releasing it within a bound: the pytest plugin's leak guard.

A ``Snapshot`` records what exists in this process now: the declared resource kinds
that are alive (``live_resources``: a process group, the Megatron-core globals, a store
server lifecycle hosts), the signal handlers lifecycle installed, and the threads. Two
snapshots give the ``Leak`` list: what is alive in the second and was not in the first
(or is another object of that kind now). A leak is named with what lifecycle knows of
it: the session that created it and the ``file:line`` that acquired it (the record of
``lifecycle._core.leftovers``), the session whose handler is installed.

Nothing here imports torch or megatron-core: the probes read only modules already in
``sys.modules`` (a resource of a module never imported cannot exist), and releasing
imports only what is loaded already.
"""

from __future__ import annotations

import contextlib
import fnmatch
import gc
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from lifecycle._core.leftovers import LEFTOVERS, Leftover
from lifecycle._core.resources import Resource, declared_resources

__all__ = ["KINDS", "SIGNAL_HANDLER", "THREAD", "Leak", "Snapshot", "find_leaks", "release_leaks", "snapshot"]

SIGNAL_HANDLER = "signal_handler"
THREAD = "thread"
KINDS: tuple[str, ...] = (*(r.value for r in declared_resources() if r.probe is not None), SIGNAL_HANDLER, THREAD)
"""Every kind of leak the guard names (the names ``lifecycle_allow_leak`` takes)."""

WATCHED_SIGNALS: tuple[int, ...] = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)
"""The signals whose handlers the guard watches: the shield's and those a training job is sent (one getsignal each)."""
_THREAD_GRACE_S = 0.5  # a thread still finishing at teardown gets this long (in all) before it counts


def _token(obj: object) -> Any:
    """Something that tells ``obj`` apart later without keeping it alive: a weak reference, else its id."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return id(obj)


def _same(token: Any, obj: object) -> bool:
    if isinstance(token, weakref.ref):
        return token() is obj
    return bool(token == id(obj))


def _lifecycle_handler(handler: object) -> bool:
    """True for a signal handler lifecycle installed (a function or bound method defined in the package)."""
    return callable(handler) and str(getattr(handler, "__module__", "") or "").startswith("lifecycle.")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What exists in this process at one moment: live resource kinds, lifecycle's signal handlers, threads.

    ``resources``: kind → a token of its live object (None where the kind declares no
    identity). ``handlers``: signal number → a token of the lifecycle handler installed
    for it. ``threads``: the ``threading`` idents alive.
    """

    resources: dict[Resource, Any] = field(default_factory=dict)
    handlers: dict[int, Any] = field(default_factory=dict)
    previous_handlers: dict[int, Any] = field(default_factory=dict)
    threads: frozenset[int] = frozenset()

    def __or__(self, other: Snapshot) -> Snapshot:
        """Both snapshots' contents (``other`` wins where both name a kind): a baseline that allows both."""
        return Snapshot(
            {**self.resources, **other.resources},
            {**self.handlers, **other.handlers},
            {**other.previous_handlers, **self.previous_handlers},
            self.threads | other.threads,
        )


def snapshot() -> Snapshot:
    """Record what is alive now (cheap: a few attribute reads per kind, one ``getsignal`` per signal)."""
    resources: dict[Resource, Any] = {}
    for resource in declared_resources():
        if resource.probe is None or not resource.probe():
            continue
        obj = resource.identity() if resource.identity is not None else None
        resources[resource] = None if obj is None else _token(obj)
    handlers: dict[int, Any] = {}
    previous: dict[int, Any] = {}
    for signum in WATCHED_SIGNALS:
        try:
            handler = signal.getsignal(signum)
        except (ValueError, OSError):
            continue
        if _lifecycle_handler(handler):
            handlers[signum] = _token(handler)
        else:
            previous[signum] = handler
    return Snapshot(resources, handlers, previous, frozenset(t.ident for t in threading.enumerate() if t.ident))


@dataclass(frozen=True, slots=True)
class Leak:
    """One thing a test left alive: its ``kind`` (one of ``KINDS``), what it is, and who made it.

    ``made_by``: the session that created it and where (``"session 3 at test_x.py:12"``),
    empty where lifecycle did not (a test's own ``init_process_group``, a thread).
    """

    kind: str
    what: str
    made_by: str = ""
    signum: int | None = None

    def __str__(self) -> str:
        if self.made_by:
            return f"{self.kind}: {self.what}, created by {self.made_by}"
        if self.kind == THREAD:
            return f"{self.kind}: {self.what}"
        return f"{self.kind}: {self.what}, not created by a lifecycle session"


def _made_by(left: Leftover | None) -> str:
    if left is None:
        return ""
    site = f" at {left.entry.site}" if left.entry.site else ""
    return f"{left.session}{site}"


def _session_of_handler(handler: object) -> object | None:
    """The session whose handler this is: the closure of ``install_signal_handlers``, or a shield's owner."""
    owner = getattr(getattr(handler, "__self__", None), "_owner", None)
    if callable(owner):
        found: object | None = owner()
        return found
    for cell in getattr(handler, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if type(value).__name__ == "Session" and type(value).__module__.startswith("lifecycle."):
            session: object = value
            return session
    return None


def _handler_leak(signum: int, handler: object) -> Leak:
    name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else str(signum)
    session = _session_of_handler(handler)
    shield = hasattr(getattr(handler, "__self__", None), "_owner")
    made_by = ""
    if session is not None:
        label = f"{getattr(session, 'label', 'session')} [session {getattr(session, 'id', '?')}]"
        ledger = getattr(session, "ledger", None)
        entries = () if ledger is None else ledger.entries
        # The shield goes in at the session's first trigger; its own handlers with install_signal_handlers.
        entry = next((e for e in entries if shield or e.resource is Resource.SIGNAL_HANDLERS), None)
        made_by = f"{label} at {entry.site}" if entry is not None and entry.site else label
    if shield and session is None:
        what = f"{name} handler of the interrupt shield of a session that never became final (it is gone)"
        made_by = "a lifecycle session"
    elif shield:
        what = f"{name} handler of the interrupt shield still installed (its session is not final)"
    else:
        what = f"{name} handler {getattr(handler, '__qualname__', handler)!s} still installed"
    return Leak(SIGNAL_HANDLER, what, made_by, signum)


def find_leaks(before: Snapshot, *, allowed_threads: Iterable[str] = (), wait_threads: bool = True) -> list[Leak]:
    """What is alive now that was not in ``before`` (or is another object of its kind), each named.

    Threads: a non-daemon thread started since ``before`` that is still alive once every
    such thread had ``_THREAD_GRACE_S`` in all to finish (``wait_threads``), unless its
    name matches one of the ``allowed_threads`` glob patterns.
    """
    now = snapshot()
    left = {item.entry.resource: item for item in LEFTOVERS.peek() if item.is_live()}
    leaks: list[Leak] = []
    for resource in now.resources:
        if resource in before.resources:
            old = before.resources[resource]
            current = resource.identity() if resource.identity is not None else None
            if old is None or current is None or _same(old, current):
                continue
        leaks.append(Leak(resource.value, "still alive", _made_by(left.get(resource))))
    for signum in now.handlers:
        handler = signal.getsignal(signum)
        old = before.handlers.get(signum)
        if old is None or not _same(old, handler):
            leaks.append(_handler_leak(signum, handler))
    patterns = tuple(allowed_threads)
    started = [
        t
        for t in threading.enumerate()
        if t.ident not in before.threads and not t.daemon and t is not threading.current_thread()
    ]
    started = [t for t in started if not any(fnmatch.fnmatchcase(t.name, p) for p in patterns)]
    if started and wait_threads:
        deadline = time.monotonic() + _THREAD_GRACE_S
        for thread in started:
            thread.join(max(deadline - time.monotonic(), 0.0))
        started = [t for t in started if t.is_alive()]
    leaks += [Leak(THREAD, f"non-daemon thread {t.name!r} started during the test, still running") for t in started]
    return leaks


def release_leaks(leaks: list[Leak], before: Snapshot, bound_s: float) -> bool:
    """Release what ``leaks`` name (threads cannot be: they are left); True if it finished within ``bound_s``.

    Signal handlers go back to what ``before`` had (main thread, at once). Resources a
    session created are released with that session's failure steps (the callables it
    bound when it acquired them, as a later session would reclaim them); then whatever
    is still alive (a test's own group, a half-made Megatron state) is force-released
    without any collective (``release_everything``'s way, importing only modules already
    loaded). That runs in a daemon thread: a gloo group with pending work may block its
    abort for the group timeout; past ``bound_s`` it is left running and False returned.
    """
    for leak in leaks:
        if leak.kind == SIGNAL_HANDLER and leak.signum is not None:
            previous = before.previous_handlers.get(leak.signum, signal.SIG_DFL)
            with contextlib.suppress(ValueError, OSError):
                signal.signal(leak.signum, signal.SIG_DFL if previous is None else previous)
    kinds = {leak.kind for leak in leaks}
    if not kinds - {SIGNAL_HANDLER, THREAD}:
        return True
    done = threading.Event()

    def release() -> None:
        try:
            _release_resources(kinds)
        finally:
            done.set()

    worker = threading.Thread(target=release, name="lifecycle-leak-release", daemon=True)
    worker.start()
    return done.wait(bound_s)


def _release_resources(kinds: set[str]) -> None:
    """Reclaim what sessions left of ``kinds`` with their own failure steps, then force-release the rest."""
    for left in sorted(LEFTOVERS.peek(), key=lambda item: item.entry.resource.order):
        resource = left.entry.resource
        if resource.value not in kinds or not left.is_live():
            continue
        if LEFTOVERS.take(resource) is None:
            continue
        for kind in resource.failure:
            _quietly(left.releases[kind])
    gc.collect()
    _force_release()
    gc.collect()


def _quietly(release: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):  # a failed step leaves it to the force-release below
        release()


def _force_release() -> None:
    """Release, without a collective, the distributed state of modules already loaded, whoever made it."""
    if "megatron.core.parallel_state" in sys.modules and "torch.distributed" in sys.modules:
        from lifecycle.testing.probes import release_everything

        release_everything()
        return
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available():
        return
    from lifecycle.testing.probes import _abort_or_destroy

    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if dist.is_initialized():
        _abort_or_destroy(dist, abort, None)
    for group in list(dist.distributed_c10d._world.pg_map):
        _abort_or_destroy(dist, abort, group)
