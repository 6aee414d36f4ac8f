"""What a test left alive, named, and releasing it within a bound: the pytest plugin's leak guard.

A ``Snapshot`` records what exists in this process now: the declared resource kinds
that are alive (``live_resources``: a process group, the Megatron-core globals, a store
server lifecycle hosts) with their live objects, the handler of each watched signal (the
object itself, whoever installed it), and the threads. Two snapshots give the ``Leak``
list: what is alive in the second and was not in the first (or is another object of
that kind now: a second hosted store counts, compared by object). A leak is named with
what lifecycle knows of it: the session that created it and the ``file:line`` that
acquired it (the record of ``lifecycle._core.leftovers``), the session whose handler is
installed. Releasing a leaked handler puts back exactly the handler seen before.

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
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, field
from typing import Any

from lifecycle._core.leftovers import LEFTOVERS, Leftover
from lifecycle._core.resources import Resource, declared_resources
from lifecycle._core.shield import Shield
from lifecycle._core.signals import Handler, InstalledHandlers, Link, resolve

__all__ = [
    "KINDS",
    "SIGNAL_HANDLER",
    "THREAD",
    "Leak",
    "LifecycleLeakWarning",
    "Snapshot",
    "find_leaks",
    "release_leaks",
    "snapshot",
]


class LifecycleLeakWarning(Warning):
    """A test left a process group, a Megatron-core global, a hosted store, a signal handler or a thread alive.

    A direct subclass of ``Warning``, on purpose: Python and pytest show it by default,
    and ``-W ignore::UserWarning`` (common, to hide Megatron-core's import warnings) or
    ``-W ignore::pytest.PytestWarning`` leave it visible. Silence it by its own name:
    ``-W ignore::lifecycle.testing.LifecycleLeakWarning``, or ``--lifecycle-leaks=off``.
    """


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


def _objects(resource: Resource) -> tuple[object, ...]:
    """The live objects of ``resource`` by its ``identity``: the object, or each member of a set it returns.

    Empty where the kind declares no identity or it gives None (then only the probe tells).
    """
    if resource.identity is None:
        return ()
    found = resource.identity()
    if found is None:
        return ()
    if isinstance(found, Set):  # several at once (the stores this process hosts): each by object
        return tuple(found)
    return (found,)


def _lifecycle_handler(handler: object) -> bool:
    """True for a signal handler of lifecycle's that runs: an active ``Link``, or another callable of the package."""
    if isinstance(handler, Link):
        return handler.active
    return callable(handler) and str(getattr(handler, "__module__", "") or "").startswith("lifecycle.")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What exists in this process at one moment: live resource kinds, signal handlers, threads.

    ``resources``: kind → tokens (weak references, else ids) of its live objects (empty
    where the kind declares no identity). ``handlers``: signal number → the handler
    installed for it, the object itself (lifecycle's or not; None: installed from C).
    ``threads``: the ``threading`` idents alive.
    """

    resources: dict[Resource, tuple[Any, ...]] = field(default_factory=dict)
    handlers: dict[int, Handler] = field(default_factory=dict)
    threads: frozenset[int] = frozenset()

    def __or__(self, other: Snapshot) -> Snapshot:
        """Both snapshots' contents (``other``'s handler wins where both name a signal): a baseline that allows both."""
        resources = dict(self.resources)
        for resource, tokens in other.resources.items():
            resources[resource] = resources.get(resource, ()) + tokens
        return Snapshot(resources, {**self.handlers, **other.handlers}, self.threads | other.threads)

    def added_since(self, before: Snapshot) -> Snapshot:
        """What this snapshot has that ``before`` had not: new objects per kind, changed handlers, new threads."""
        resources: dict[Resource, tuple[Any, ...]] = {}
        for resource, tokens in self.resources.items():
            if resource not in before.resources:
                resources[resource] = tokens
                continue
            new = tuple(t for t in tokens if not any(_same_token(t, old) for old in before.resources[resource]))
            if new:
                resources[resource] = new
        handlers = {s: h for s, h in self.handlers.items() if s not in before.handlers or before.handlers[s] is not h}
        return Snapshot(resources, handlers, self.threads - before.threads)


def _same_token(one: Any, other: Any) -> bool:
    if isinstance(one, weakref.ref) and isinstance(other, weakref.ref):
        found = one()
        return found is not None and found is other()
    return bool(one == other)


def snapshot() -> Snapshot:
    """Record what is alive now (cheap: a few attribute reads per kind, one ``getsignal`` per signal)."""
    resources: dict[Resource, tuple[Any, ...]] = {}
    for resource in declared_resources():
        if resource.probe is None or not resource.probe():
            continue
        resources[resource] = tuple(_token(obj) for obj in _objects(resource))
    handlers: dict[int, Handler] = {}
    for signum in WATCHED_SIGNALS:
        try:
            handlers[signum] = signal.getsignal(signum)
        except (ValueError, OSError):
            continue
    return Snapshot(resources, handlers, frozenset(t.ident for t in threading.enumerate() if t.ident))


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
    """The session whose handler this is: a shield's owner, or the closure of ``install_signal_handlers``."""
    installed = getattr(_target_of(handler), "__self__", None)
    if isinstance(installed, Shield):
        return installed.owner
    if isinstance(installed, InstalledHandlers):
        handler = installed.handler
    for cell in getattr(handler, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if type(value).__name__ == "Session" and type(value).__module__.partition(".")[0] == "lifecycle":
            session: object = value
            return session
    return None


def _target_of(handler: object) -> object:
    """What a lifecycle handler runs: a link's target (a shield's or ``InstalledHandlers``' method), else itself."""
    return handler.target if isinstance(handler, Link) else handler


def _handler_leak(signum: int, handler: object) -> Leak:
    name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else str(signum)
    session = _session_of_handler(handler)
    installed = getattr(_target_of(handler), "__self__", None)
    shield = isinstance(installed, Shield)
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
        function = installed.handler if isinstance(installed, InstalledHandlers) else handler
        what = f"{name} handler {getattr(function, '__qualname__', function)!s} still installed"
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
            new = [obj for obj in _objects(resource) if not any(_same(token, obj) for token in old)]
            if not old or not new:  # not told apart by object (no identity), or the same objects
                continue
            what = "still alive" if len(new) == 1 else f"{len(new)} still alive"
            if len(new) < len(_objects(resource)):
                what += " (besides those alive before the test)"
        else:
            what = "still alive"
        leaks.append(Leak(resource.value, what, _made_by(left.get(resource))))
    for signum, handler in now.handlers.items():
        was = before.handlers.get(signum)
        if handler is was:
            continue
        running = resolve(handler)  # a handler that only passes signals on is not the one that runs
        if running is not resolve(was) and _lifecycle_handler(running):
            leaks.append(_handler_leak(signum, running))
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

    Signal handlers go back to exactly the handler ``before`` saw, lifecycle's or not
    (main thread, at once; one installed from C cannot be put back from Python: the
    default instead). Resources a
    session created are released with that session's failure steps (the callables it
    bound when it acquired them, as a later session would reclaim them); then whatever
    is still alive (a test's own group, a half-made Megatron state) is force-released
    without any collective (``release_everything``'s way, importing only modules already
    loaded). That runs in a daemon thread: a gloo group with pending work may block its
    abort for the group timeout; past ``bound_s`` it is left running and False returned.
    """
    for leak in leaks:
        if leak.kind == SIGNAL_HANDLER and leak.signum is not None:
            if leak.signum not in before.handlers:
                continue
            previous = before.handlers[leak.signum]
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
        taken = LEFTOVERS.take(resource, live_too=True)  # the test leaked the session with it
        if taken is None:
            continue
        for kind in resource.failure:
            _quietly(taken.releases[kind])
        taken.done()  # released, or left to the force-release below: no longer a leftover either way
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
