"""How a session acquires: through each kind's handler, refusals first, leftovers reclaimed, every record atomic.

``Session``'s triggers and its ``acquire``, ``register`` and ``track_checkpoints`` go
through one ``Acquirer``: it finds a kind's handler (its own declaration's, else the one
the session's actions give), checks the release callables before anything exists, runs
every refusal (``Handler.check``) before anything is acquired, reclaims what earlier
sessions left of the kind (``lifecycle._core.leftovers``), and records each acquisition
through the session's holdings (``lifecycle._core.holdings``: atomic with respect to
asynchronous exceptions).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import FrameType

from lifecycle._core.errors import AlreadyHeld, LifecycleError
from lifecycle._core.executor import StepRecord
from lifecycle._core.holdings import Holdings
from lifecycle._core.leftovers import reclaim
from lifecycle._core.ownership import LedgerEntry
from lifecycle._core.plans import RestartMode, recorded_owner
from lifecycle._core.resources import Handler, Releases, Resource, StepKind, declared_resources
from lifecycle._core.seams import DistributedActions
from lifecycle._core.signals import InstalledHandlers
from lifecycle._core.states import Owner, Trigger

logger = logging.getLogger("lifecycle.session")

LATE_RELEASE_WAIT_S = 5.0
"""How long acquiring a kind waits for a release of it an abandoned teardown left running (then: refused)."""


class Acquirer:
    """Acquires and records resources for one session (see the module docstring)."""

    def __init__(
        self,
        holdings: Holdings,
        actions: DistributedActions,
        restart_mode: Callable[[], RestartMode],
        label: Callable[[], str],
        on_reclaimed: Callable[[StepRecord, str], None],
    ) -> None:
        """Acquire into ``holdings`` through ``actions``' handlers.

        ``restart_mode`` and ``label`` read the session's, now; ``on_reclaimed(record,
        left_by)`` is called for each step run on what an earlier session left.
        """
        self._holdings = holdings
        self._actions = actions
        self._restart_mode = restart_mode
        self._label = label
        self._on_reclaimed = on_reclaimed

    def declared(self, trigger: Trigger, site: str) -> None:
        """Acquire every kind declared ``acquired_by`` ``trigger``, in declaration order; refusals before any.

        If one acquisition raises, those before it stay recorded (the failure edge releases them).
        """
        kinds = [resource for resource in declared_resources() if resource.acquired_by is trigger]
        handlers = [(resource, self._handler(resource)) for resource in kinds]
        releases = [checked(resource, handler.releases) for resource, handler in handlers]  # before anything exists
        for _, handler in handlers:  # every refusal before anything is acquired
            if handler.check is not None:
                handler.check()
        # What earlier sessions left of these kinds goes first, all of it, in release
        # order (a group before its store): an init must not see a leftover of a kind
        # acquired before it as the caller's (the store's init takes a live group for one).
        for resource in reversed(kinds):
            self.reclaim_left(resource)
        for (resource, handler), bound in zip(handlers, releases, strict=True):
            self._acquire_one(resource, handler, bound, "", site)

    def own_handler(self, resource: Resource, name: str, site: str) -> None:
        """Acquire one instance of ``resource``, a kind with a handler of its own and no ``acquired_by``.

        ``LifecycleError`` for any other kind; ``AlreadyHeld`` if the session holds it.
        """
        if resource.acquired_by is not None or resource.handler is None:
            raise LifecycleError(
                f"{resource.value}: Session.acquire takes a kind with a handler of its own and no acquired_by "
                "(a trigger acquires the others)"
            )
        self.refuse_held(resource, name)
        handler = resource.handler(self._actions)
        releases = checked(resource, handler.releases)
        if handler.check is not None:
            handler.check()
        self.reclaim_left(resource)
        self._acquire_one(resource, handler, releases, name, site)

    def record(self, resource: Resource, owner: Owner, releases: Releases, name: str, site: str) -> None:
        """Record an acquisition the caller made (``register`` and the like) and bind its releases."""
        self._holdings.record(LedgerEntry(resource, owner, name, site), checked(resource, releases))

    def signal_handlers(
        self, signums: tuple[int, ...], handler: Callable[[int, FrameType | None], None], site: str
    ) -> None:
        """Install ``handler`` for each of ``signums``, recorded atomically; restored by the teardown plans.

        The entry is recorded (pending) before any handler is installed; at teardown a
        signal's previous handler is put back only if ``handler`` is still the one installed.
        """
        handlers = InstalledHandlers((), handler)

        def install() -> Owner:
            handlers.install(signums)
            return Owner.SESSION

        releases = checked(Resource.SIGNAL_HANDLERS, {StepKind.RESTORE_SIGNAL_HANDLERS: handlers.restore})
        self._holdings.acquire(LedgerEntry(Resource.SIGNAL_HANDLERS, Owner.SESSION, "", site), releases, install)

    def refuse_held(self, resource: Resource, name: str = "") -> None:
        """``AlreadyHeld`` if the session holds ``resource`` (of ``name``) already."""
        entry = self._holdings.ledger.entry(resource, name)
        if entry is not None:
            label = f"{resource.value}:{name}" if name else resource.value
            raise AlreadyHeld(label, f"this session already holds it ({entry.described()})")

    def reclaim_left(self, resource: Resource) -> None:
        """Release what a final or collected session left of ``resource`` (``lifecycle._core.leftovers.reclaim``)."""
        reclaimed = reclaim(resource, self._restart_mode(), self._on_reclaimed, LATE_RELEASE_WAIT_S)
        if reclaimed is not None:
            logger.warning(
                "%s: released %s, left live by %s", self._label(), reclaimed.entry.described(), reclaimed.session
            )

    def _handler(self, resource: Resource) -> Handler:
        """``resource``'s handler: its own declaration's, else the one the session's actions give for it."""
        if resource.handler is not None:
            return resource.handler(self._actions)
        return self._actions.handler(resource)

    def _acquire_one(self, resource: Resource, handler: Handler, releases: Releases, name: str, site: str) -> None:
        """Acquire one instance through ``handler``, atomically recorded (see ``lifecycle._core.holdings``)."""
        assert handler.acquire is not None
        acquire = handler.acquire
        restart_mode = self._restart_mode

        def owned() -> Owner:
            return recorded_owner(resource, acquire(), restart_mode())

        self._holdings.acquire(LedgerEntry(resource, Owner.SESSION, name, site), releases, owned)


def checked(resource: Resource, releases: Releases) -> Releases:
    """``releases`` as a dict, or ``LifecycleError`` if it lacks a callable for one of ``resource``'s steps."""
    missing = [kind.value for kind in resource.steps if kind not in releases]
    if missing:
        raise LifecycleError(f"{resource.value}: no release callable for step(s) {', '.join(missing)}")
    return dict(releases)
