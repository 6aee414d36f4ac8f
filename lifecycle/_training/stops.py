"""What a SIGTERM means to one ``pretrain`` call: a requested exit, or the launcher stopping the job after a failure.

torchrun's agent stops every local worker (SIGTERM) as soon as one of them has died,
and the launcher that forwards a user's stop (a scheduler's preemption, Ctrl-C) sends
the same signal. The rank tells them apart by evidence that a peer failed, read where
reading costs nothing and cannot hang, in this order:

1. this rank is already failing (its failure edge is being taken: a lost connection, a
   peer's notice): a SIGTERM now is the launcher's, whatever else is known;
2. the liveness verdict this rank's monitor copied into its page (memory, no call);
3. a failure notice in the rendezvous store (notice 1, from a peer or a peer's monitor,
   which publishes a dead rank's verdict within milliseconds of its death): one read,
   on one of lifecycle's workers, bounded by ``STORE_READ_S``;
4. at the failure that follows a SIGTERM none of those explained: the error itself, a
   connection to a peer lost (gloo's ``Connection reset by peer`` / ``closed by peer``).

With evidence, a SIGTERM in user code raises ``StoppedByLauncher`` at once (the failure
edge, no final save); one during the failure is recorded (``stopped``). Without, it is
a pending exit request: the loop stops after the step all ranks agree on and saves,
unless a failure with evidence comes first.
"""

from __future__ import annotations

import json
import signal
from types import FrameType

import torch.distributed as dist
from torch.distributed import PrefixStore, Store  # type: ignore[attr-defined]  # re-exported at runtime

from lifecycle._core.events import FailureEvent, SessionEvent
from lifecycle._core.session import Session
from lifecycle._core.signals import Handler, Link
from lifecycle._core.states import State
from lifecycle._core.worker import POOL as WORKERS
from lifecycle._liveness.rank import RankMonitor
from lifecycle._training.exits import StoppedByLauncher
from lifecycle.journal.evidence import VERDICT_PREFIX, Kind, consequence, error_kind, kind_of

STORE_READ_S = 0.2
"""The longest a SIGTERM waits for the store to say whether a peer failed (a live store answers in well under 1 ms)."""

_TRAINING_STATES = (State.DIST_READY, State.GLOBALS_READY, State.TRAINING)
"""Where a SIGTERM with evidence raises: user code runs, no teardown."""


class LauncherStops:
    """One ``pretrain`` call's view of SIGTERM (see the module docstring); ``on_signal`` is the session's handler."""

    def __init__(self, session: Session, rank: int) -> None:
        """Watch ``session`` (its failure announcement); ``rank`` is updated once the group exists."""
        self.session, self.rank = session, rank
        self.monitor: RankMonitor | None = None
        self.signalled: str | None = None
        """A SIGTERM with no evidence yet: a pending exit request."""
        self.stopped: str | None = None
        """The signal's name once it is known to be the launcher's stop, not a request."""
        self.failing = False
        self._announced: FailureEvent | None = None
        self._guard: Link | None = None
        self._why: str | None = None
        session.add_observer(self._observe)

    def _observe(self, event: SessionEvent) -> None:
        if isinstance(event, FailureEvent):
            self._announced = event

    # -- the signal -----------------------------------------------------------------

    def on_signal(self, signum: int) -> None:
        """A SIGTERM reached the session's handler: record it, or raise ``StoppedByLauncher`` on evidence."""
        name = signal.Signals(signum).name
        if self.failing:
            self.stopped = self.stopped or name
            return
        if self.session.state not in _TRAINING_STATES:  # finalizing: the commit's collective will tell
            self.signalled = self.signalled or name
            return
        why = self.peer_failure(None)
        if why is None:
            self.signalled = self.signalled or name
            return
        self.stopped, self._why = name, why
        raise StoppedByLauncher(name, why)

    def failed(self, error: BaseException) -> None:
        """The call is failing with ``error`` (before the session's failure edge): classify a SIGTERM seen before.

        From here until ``close``, a SIGTERM is recorded as the launcher's stop (a handler
        above the session's, on the main thread). A SIGTERM seen before the failure is
        the launcher's if a peer's failure explains it; otherwise it was a requested exit
        (the session notes ``requested_exit``, as before).
        """
        self.failing = True
        self._guard_signals()
        if isinstance(error, StoppedByLauncher) or self.signalled is None or self.stopped is not None:
            return
        why = self.peer_failure(error)
        if why is None:
            self.session.request_exit(self.signalled)
        else:
            self.stopped, self._why = self.signalled, why

    def requested(self) -> str | None:
        """The exit request this rank holds (the session's, or a SIGTERM without evidence), for the loop's flags."""
        return self.session.exit_requested or self.signalled

    def close(self, error: BaseException | None) -> None:
        """Once the session is final: mark ``error`` if the launcher stopped this rank; remove the guard handler."""
        if self._guard is not None:
            self._guard.uninstall()
            self._guard = None
        if error is None or self.stopped is None or isinstance(error, StoppedByLauncher):
            return
        why = self.reason()
        error.stopped_by_launcher = f"{self.stopped} after {why}"  # type: ignore[attr-defined]
        error.add_note(
            f"lifecycle: stopped by the launcher ({self.stopped}) after {why}: not a requested exit; "
            "a restart resumes from the last committed checkpoint"
        )

    def reason(self) -> str:
        """Which failure the launcher's stop followed, in words ("rank 1 died at step 20, phase step (...)")."""
        if self._why is not None:
            return self._why
        announced = self._announced
        if announced is not None and announced.announcement.first_rank not in (None, self.rank):
            return announced.announcement.note.removeprefix("lifecycle: ")
        return self._page() or "this rank's own failure (another rank's process ended first)"

    # -- evidence -------------------------------------------------------------------

    def peer_failure(self, error: BaseException | None) -> str | None:
        """A peer's failure this rank knows of, in words; None if none (see the module docstring for the order)."""
        found = self._page() or self._notice()
        if found is None and error is not None and kind_of(error) is Kind.CONNECTION_LOST:
            found = "a peer's process left (this rank's collective lost its connection)"
        return found

    def _page(self) -> str | None:
        verdict = self.monitor.marks.verdict() if self.monitor is not None else None
        if verdict is None or not isinstance(verdict.get("rank"), int) or verdict["rank"] == self.rank:
            return None
        return str(verdict.get("note") or f"rank {verdict['rank']} failed")

    def _notice(self) -> str | None:
        prefix = getattr(self.session.actions, "store_prefix", None)
        if not isinstance(prefix, str) or not dist.is_initialized():
            return None
        try:
            store = _raw_store()
        except Exception:  # noqa: BLE001 - no store to ask: no evidence
            return None
        if store is None:
            return None
        keys, rank = PrefixStore(prefix, store), self.rank
        finished, found = WORKERS.run_within(lambda: _first_notice(keys, rank), STORE_READ_S)
        return found if finished else None

    def _guard_signals(self) -> None:
        if self._guard is not None:
            return
        guard = Link(signal.SIGTERM, self._while_failing)
        try:
            guard.install()
        except (ValueError, OSError):  # off the main thread: the session's own handling stands
            return
        self._guard = guard

    def _while_failing(self, signum: int, frame: FrameType | None, previous: Handler) -> None:
        self.stopped = self.stopped or signal.Signals(signum).name


def _raw_store() -> Store | None:
    """The store under the default group's prefixes (torchrun's agent's, or the one lifecycle started)."""
    store: object = dist.distributed_c10d._get_default_store()
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    return store if isinstance(store, Store) else None


def _first_notice(store: Store, rank: int) -> str | None:
    """Notice 1 of the attempt, in words, if a peer's; None otherwise (or if it cannot be read). Never raises."""
    try:
        if not store.check(["failures/1"]):
            return None
        notice = json.loads(bytes(store.get("failures/1")).decode())
        first, error, kind = int(notice["rank"]), str(notice["error"]), str(notice.get("kind", ""))
    except Exception:  # noqa: BLE001 - an unreadable notice is no evidence
        return None
    if first == rank:
        return None
    if error.startswith(VERDICT_PREFIX):
        return error.removeprefix(VERDICT_PREFIX)
    if consequence(error, kind):  # never the cause: say what it was, and that the cause is not named
        said = Kind.named(kind) if kind and kind != Kind.RAISED.value else error_kind(error)
        return f"rank {first} {said.words if said else 'failed'} (a consequence; the cause is not named): {error}"
    return f"rank {first} failed: {error}"
