"""Holdings: what one session holds, the only object that changes its ledger.

Acquisition is atomic with respect to asynchronous exceptions (a Ctrl-C, NVRx's
``RankShouldRestart`` raised into the main thread): before a kind's ``acquire`` runs,
a *pending* acquisition is recorded in one assignment, with what the kind's probe saw;
once ``acquire`` returned, the entry is confirmed in one assignment. Whatever bytecode an
exception lands on, the resource is either not created, or recorded (confirmed), or
pending, and ``settle_pending`` (run first by every teardown) tells from the probe whether
it was created: then it is recorded as the session's, else the pending record is dropped.
A kind without a probe that was pending is recorded as the session's: its release must
tolerate a resource that was never made.

Releases keep per-entry claims: the restart wrapper's abort releases from its monitor
thread while the main thread may be tearing down, and a resource is released once. Every
release that runs here is recorded with who ran it and when (``Released``), in the same
locked assignment as the ledger's change, and handed to ``on_release``: so a release is
never silent, whichever thread runs it (the session's plans, the wrapper's abort or
finalize, a step left running that returns late).

Every ``Holdings`` is known to the process (``REGISTRY``): what a *final* or
garbage-collected session still holds of a kind it created is a leftover, which the next
session reclaims (``lifecycle._core.leftovers``); what a *live* session holds is never
reclaimed by another session, which finds it as the caller's.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from lifecycle._core.executor import Released, Releaser, StepRecord
from lifecycle._core.ownership import Ledger, LedgerEntry
from lifecycle._core.plans import Outcome, Step
from lifecycle._core.resources import Releases, Resource, StepKind
from lifecycle._core.states import Owner, State

Key = tuple[Resource, str]


class _Stateful(Protocol):
    @property
    def state(self) -> State: ...


def token_of(resource: Resource) -> weakref.ref[Any] | None:
    """A weak reference to the live object of ``resource`` (its ``identity``), or None."""
    if resource.identity is None:
        return None
    current = resource.identity()
    if current is None:
        return None
    try:
        return weakref.ref(current)
    except TypeError:  # not weakly referenceable: never hold it strongly (a gloo group would stay open)
        return None


@dataclass(frozen=True, slots=True)
class Pending:
    """An acquisition under way: what it would record, and what the kind's probe saw before it started."""

    entry: LedgerEntry
    releases: Releases
    alive_before: bool | None
    token_before: weakref.ref[Any] | None

    def created(self) -> bool:
        """True if the resource exists now and was made since the acquisition started (no probe: assume so)."""
        resource = self.entry.resource
        if resource.probe is None:
            return True
        if not resource.probe():
            return False
        if not self.alive_before:
            return True
        if resource.identity is None:
            return False  # alive before and now, and nothing tells them apart: the one found
        now = resource.identity()
        return now is not None and (self.token_before is None or self.token_before() is not now)


class Holdings:
    """The ledger of one session, with the release callables of each entry and their claims.

    ``label()`` names the session for people; ``session_id`` identifies it; ``session``
    is held weakly: once it is collected, or its state is final, what this still holds of
    a kind acquired through a handler is a leftover.
    """

    def __init__(self, session: _Stateful, session_id: int, label: Callable[[], str]) -> None:
        """Nothing held; registered with the process (``REGISTRY``) at once."""
        self.ledger = Ledger()
        self.session_id = session_id
        self.label = label
        self._session = weakref.ref(session)
        self._releases: dict[Key, Releases] = {}
        self._tokens: dict[Key, weakref.ref[Any] | None] = {}
        self._pending: Pending | None = None
        self._claimed: set[Key] = set()
        self._claim_kind: dict[Key, StepKind] = {}  # the step kind whose release holds a claim
        self._alongside: dict[Key, set[StepKind]] = {}  # aborts running beside a claim (see ``run``)
        self._stuck: set[Key] = set()  # claims whose release was left running past its deadline
        self._reclaimed: set[Key] = set()
        self._released: list[Released] = []  # every release run here, in the order they ended
        self.on_release: Callable[[Released], object] | None = None
        """Called with each ``Released`` right after it is recorded, on the thread that ran it (outside the lock)."""
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)  # notified when a claimed release ends
        REGISTRY.add(self)

    # -- reading ------------------------------------------------------------------------

    @property
    def abandoned(self) -> bool:
        """True once its session is final or was collected: what it still holds is nobody's to release but a reclaim."""
        session = self._session()
        return session is None or session.state.is_final

    def releases(self, key: Key) -> Releases:
        """The release callables bound to the entry ``key`` when it was acquired."""
        return self._releases[key]

    def released(self) -> tuple[Released, ...]:
        """Every release run through ``run`` so far (raised or not): who ran it and when, in the order they ended."""
        with self._lock:
            return tuple(self._released)

    def token(self, key: Key) -> weakref.ref[Any] | None:
        """A weak reference to the object ``key`` was acquired as (None where its kind has no identity)."""
        return self._tokens.get(key)

    # -- acquiring ----------------------------------------------------------------------

    def acquire(self, entry: LedgerEntry, releases: Releases, acquire: Callable[[], Owner]) -> LedgerEntry:
        """Run ``acquire`` with a pending record of ``entry`` first; confirm it with the owner it returns.

        ``entry.owner`` is ignored: the owner is what ``acquire`` returns. If ``acquire``
        raises, the pending record is settled (see ``settle_pending``) and the error
        propagates. Returns the confirmed entry.
        """
        resource = entry.resource
        alive = None if resource.probe is None else bool(resource.probe())
        self._pending = Pending(entry, releases, alive, token_of(resource) if alive else None)
        try:
            owner = acquire()
        except BaseException:
            self.settle_pending()
            raise
        return self.record(LedgerEntry(resource, owner, entry.name, entry.site), releases)

    def record(self, entry: LedgerEntry, releases: Releases) -> LedgerEntry:
        """Confirm an acquisition (or record one made outside ``acquire``): bind its releases, write the entry.

        ``LifecycleError`` if its key was ever recorded. The ledger is written in one
        assignment, the pending record dropped after it (a landing in between leaves both,
        and ``settle_pending`` then sees the entry and drops the pending one).
        """
        key = entry.key
        self._releases[key] = releases
        self._tokens[key] = token_of(entry.resource) if entry.owner is not Owner.CALLER else None
        with self._lock:
            self.ledger = self.ledger.acquire(entry)
        pending = self._pending
        if pending is not None and pending.entry.key == key:
            self._pending = None
        return entry

    def settle_pending(self, owner: Callable[[Resource], Owner] = lambda resource: Owner.SESSION) -> None:
        """Resolve an acquisition an exception cut short: recorded as ``owner(kind)`` if created, else dropped."""
        pending = self._pending
        if pending is None:
            return
        key = pending.entry.key
        if self.ledger.entry(*key) is None and pending.created():
            entry = pending.entry
            self.record(LedgerEntry(entry.resource, owner(entry.resource), entry.name, entry.site), pending.releases)
        self._pending = None

    # -- releasing ----------------------------------------------------------------------

    def run(
        self,
        step: Step,
        call: Callable[[Callable[[], object]], object] = lambda release: release(),
        *,
        by: Releaser = Releaser.FAILURE,
    ) -> bool:
        """Run ``step``'s release (through ``call``) for ``by``; False if another thread claimed its entry first.

        A releasing step that ran (returned or raised) is recorded as ``Released`` (see
        ``released``) under the lock that changes the ledger, with ``by`` as its runner
        (``LATE`` instead if it was left running past its deadline meanwhile: ``stuck``),
        its wall-clock start and duration, and its error; then ``on_release`` gets it.

        A releasing step claims its entry first and, once it returned, marks it released
        in the ledger; one that raised gives the claim back and marks the entry failed
        (a later plan may retry it, per its kind). Every ``BaseException`` propagates.
        A step of a kind that ``unblocks`` (an abort) runs even while another step of the
        entry holds the claim if that one was left running past its deadline (``stuck``: a
        graceful destroy that hangs): it is what unblocks it; the claim stays with its
        holder until that returns. Otherwise a claimed entry is not run twice at once (a
        restart wrapper's abort waits for its next pass while the session's release runs).
        """
        release = self._releases[step.entry.key][step.kind]
        entry = step.entry
        if entry not in self.ledger.entries:  # the wrapper's plan names it with another owner
            entry = self.ledger.entry(*entry.key) or entry
        if not step.kind.releases:
            try:
                call(release)
            except BaseException:
                with self._lock:
                    self.ledger = self.ledger.release_failed(entry)
                raise
            return True
        key = step.entry.key
        with self._lock:
            if key in self.ledger.released:
                return False
            busy: set[StepKind | None] = set(self._alongside.get(key, ()))
            if key in self._claimed:
                busy.add(self._claim_kind.get(key))  # None: claimed for a reclaim
            alongside = bool(busy)
            if alongside and (not step.kind.unblocks or key not in self._stuck or step.kind in busy):
                return False
            if alongside:
                self._alongside.setdefault(key, set()).add(step.kind)
            else:
                self._claimed.add(key)
                self._claim_kind[key] = step.kind
        start, started = time.time(), time.monotonic()
        try:
            call(release)
        except BaseException as exc:
            with self._lock:
                done = self._log(step, by, start, started, exc, alongside)
                self._unclaim_run(key, step.kind, alongside)
                if key not in self.ledger.released:
                    self.ledger = self.ledger.release_failed(entry)
                self._settled.notify_all()
            self._tell(done)
            raise
        with self._lock:
            done = self._log(step, by, start, started, None, alongside)
            if key not in self.ledger.released:
                self.ledger = self.ledger.release(entry)
            self._unclaim_run(key, step.kind, alongside)
            self._settled.notify_all()
        self._tell(done)
        return True

    def _log(
        self, step: Step, by: Releaser, start: float, started: float, error: BaseException | None, alongside: bool
    ) -> Released:
        """Record that ``step`` ran for ``by`` (``LATE`` if its claim was left stuck meanwhile); lock held."""
        if by.own_plan and not alongside and step.entry.key in self._stuck:
            by = Releaser.LATE
        outcome = Outcome.SUCCESS if by is Releaser.SUCCESS else Outcome.FAILURE
        as_held = Step(step.kind, self.ledger.entry(*step.entry.key) or step.entry)  # its owner as recorded
        done = Released(by, StepRecord(as_held, start, time.monotonic() - started, error, outcome))
        self._released.append(done)
        return done

    def _tell(self, done: Released) -> None:
        """Hand ``done`` to ``on_release``, if set (it must not raise ``Exception``; see ``Session``)."""
        listener = self.on_release
        if listener is not None:
            listener(done)

    def _unclaim_run(self, key: Key, kind: StepKind, alongside: bool) -> None:
        """A run of ``kind`` on ``key`` ended: drop its claim, or its mark as running alongside one (lock held)."""
        if alongside:
            self._alongside.get(key, set()).discard(kind)
        else:
            self._claimed.discard(key)
            self._claim_kind.pop(key, None)
            self._stuck.discard(key)

    def stuck(self, key: Key) -> None:
        """The release holding ``key``'s claim was left running (past its deadline): an abort may now run beside it."""
        with self._lock:
            if key in self._claimed:
                self._stuck.add(key)

    def running(self) -> tuple[LedgerEntry, ...]:
        """Entries a release is running on now (claimed): a worker may still be inside it, released since or not.

        A release left running past its deadline whose entry an abort released meanwhile
        still counts: when it returns it may still touch what the kind's globals hold.
        """
        with self._lock:
            return tuple(e for e in self.ledger.entries if e.key in self._claimed and e.key not in self._reclaimed)

    def wait_settled(self, key: Key, timeout_s: float) -> bool:
        """Wait until no release of ``key`` runs (at most ``timeout_s``); True if none does."""
        deadline = time.monotonic() + timeout_s
        with self._settled:
            while key in self._claimed and key not in self._reclaimed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._settled.wait(min(left, 0.05))
            return True

    def reclaimed(self, entry: LedgerEntry) -> None:
        """Another session released ``entry`` (or found it gone): no longer a leftover; the ledger stays as left."""
        with self._lock:
            self._reclaimed.add(entry.key)

    def left(self) -> tuple[LedgerEntry, ...]:
        """What this holds of the kinds acquired through a handler, its own, not reclaimed since; acquisition order.

        Those are what a final or collected session leaves (``lifecycle._core.leftovers``):
        a caller's entry or a registered user resource is nobody's to reclaim.
        """
        return tuple(
            entry
            for entry in self.ledger.held()
            if entry.key not in self._reclaimed
            and entry.owner is not Owner.CALLER
            and (entry.resource.acquired_by is not None or entry.resource.handler is not None)
        )

    def claim(self, key: Key) -> bool:
        """Take ``key`` for a reclaim by another session; False if it is claimed already."""
        with self._lock:
            if key in self._claimed or key in self.ledger.released or key in self._reclaimed:
                return False
            self._claimed.add(key)
            return True

    def unclaim(self, key: Key) -> None:
        """Give back a claim taken with ``claim`` (the reclaim failed: it stays a leftover)."""
        with self._lock:
            self._claimed.discard(key)


class Registry:
    """Every ``Holdings`` of this process that may still hold something. Thread-safe."""

    def __init__(self) -> None:
        """Nothing registered."""
        self._all: dict[int, Holdings] = {}
        self._lock = threading.Lock()

    def add(self, holdings: Holdings) -> None:
        """Register ``holdings`` (kept strongly: what it holds outlives its session)."""
        with self._lock:
            self._all[id(holdings)] = holdings

    def holdings(self) -> tuple[Holdings, ...]:
        """Every registered holdings that still holds something, oldest first (the rest are dropped)."""
        with self._lock:
            for key, holdings in list(self._all.items()):
                if holdings.abandoned and not holdings.left() and holdings._pending is None:
                    del self._all[key]
            return tuple(self._all.values())


REGISTRY = Registry()
"""This process's holdings."""
