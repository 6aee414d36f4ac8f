"""Test doubles: recording, fault-injecting stand-ins for the real resource actions.

``RecordingActions`` implements ``DistributedActions`` for every declared kind without
torch: one generic ``Handler`` per kind, whose acquire appends ``acquire_name(kind)``
(``"init_process_group"`` for the built-in group, ``"init_<kind>"`` for a kind of your own)
and whose releases append their step kind's name (``"abort_process_group"``) to ``calls``
(shared with a ``RecordingCheckpoints``); a call named in ``fail_on`` raises the given
exception instead (after nothing was acquired). It announces failures too
(``AnnouncesFailures``), recorded apart, in ``announced``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from lifecycle._core.ownership import Owner, Resource
from lifecycle._core.resources import Handler
from lifecycle._core.seams import Announcement

__all__ = ["COLLECTIVES", "NOT_PUBLISHED", "RecordingActions", "RecordingCheckpoints", "acquire_name"]

NOT_PUBLISHED = Announcement(None, "a RecordingActions double publishes nothing")
"""What ``RecordingActions.announce_failure`` returns unless told otherwise."""

COLLECTIVES = frozenset({"barrier", "destroy_process_group", "finalize_checkpoints"})
"""Recorded calls that involve every rank."""

_ACQUIRE_NAMES = {Resource.RENDEZVOUS_STORE: "init_store"}
"""The one built-in kind whose acquire is not ``init_<kind>`` (the name ``TorchActions`` gives it)."""


def acquire_name(resource: Resource) -> str:
    """What ``RecordingActions`` records when it acquires ``resource``: ``init_<kind>`` (the store: ``init_store``)."""
    return _ACQUIRE_NAMES.get(resource, f"init_{resource.value}")


class _Recorder:
    def __init__(self, calls: list[str] | None, fail_on: Mapping[str, BaseException] | None) -> None:
        self.calls: list[str] = [] if calls is None else calls
        self.fail_on = dict(fail_on or {})

    def _record(self, name: str) -> None:
        self.calls.append(name)
        error = self.fail_on.get(name)
        if error is not None:
            raise error


class RecordingActions(_Recorder):
    """A ``DistributedActions`` double for every declared kind that records every call and injects faults.

    Resources named in ``caller_owns`` are reported as found (``Owner.CALLER``);
    the rest as created (``Owner.SESSION``). ``announce_failure`` appends
    ``(error, phase, step)`` to ``announced`` (not to ``calls``: it releases nothing)
    and returns ``announcement``, or raises ``fail_on["announce_failure"]``.
    """

    def __init__(
        self,
        *,
        caller_owns: Iterable[Resource] = (),
        fail_on: Mapping[str, BaseException] | None = None,
        calls: list[str] | None = None,
        announcement: Announcement = NOT_PUBLISHED,
    ) -> None:
        """Start with an empty call log (or append to ``calls``)."""
        super().__init__(calls, fail_on)
        self.caller_owns = frozenset(caller_owns)
        self.announcement = announcement
        self.announced: list[tuple[BaseException, str, int | None]] = []

    def handler(self, resource: Resource) -> Handler:
        """A recording ``Handler`` of ``resource``: any declared kind, built from its declaration alone."""

        def acquire() -> Owner:
            self._record(acquire_name(resource))
            return Owner.CALLER if resource in self.caller_owns else Owner.SESSION

        def release(name: str) -> Callable[[], None]:
            return lambda: self._record(name)

        return Handler(acquire, {kind: release(kind.value) for kind in resource.steps})

    def announce_failure(self, error: BaseException, *, phase: str, step: int | None, time: float) -> Announcement:
        """Record the failure in ``announced``; return ``announcement`` (or raise the injected fault)."""
        self.announced.append((error, phase, step))
        injected = self.fail_on.get("announce_failure")
        if injected is not None:
            raise injected
        return self.announcement


class RecordingCheckpoints(_Recorder):
    """A checkpoint-writer double: records ``finalize_checkpoints`` / ``abort_checkpoints``."""

    def __init__(self, *, fail_on: Mapping[str, BaseException] | None = None, calls: list[str] | None = None) -> None:
        """Start with an empty call log (or append to ``calls``, e.g. a ``RecordingActions``' log)."""
        super().__init__(calls, fail_on)

    def finalize(self) -> None:
        """Record a collective finalize."""
        self._record("finalize_checkpoints")

    def abort(self) -> None:
        """Record a rank-local abort."""
        self._record("abort_checkpoints")
