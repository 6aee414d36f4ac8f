"""Test doubles: recording, fault-injecting stand-ins for the real resource actions.

``RecordingActions`` implements ``DistributedActions`` without torch: each call is
appended to ``calls`` (shared with a ``RecordingCheckpoints``), and a call named in
``fail_on`` raises the given exception instead (after nothing was acquired). It
announces failures too (``AnnouncesFailures``), recorded apart, in ``announced``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lifecycle._core.ownership import Owner, Resource
from lifecycle._core.seams import Announcement

_INIT = {
    "init_store": Resource.RENDEZVOUS_STORE,
    "init_process_group": Resource.PROCESS_GROUP,
    "init_model_parallel": Resource.MODEL_PARALLEL,
    "init_microbatch_calculator": Resource.MICROBATCH_CALCULATOR,
    "init_rerun_state_machine": Resource.RERUN_STATE_MACHINE,
}

NOT_PUBLISHED = Announcement(None, "a RecordingActions double publishes nothing")
"""What ``RecordingActions.announce_failure`` returns unless told otherwise."""

COLLECTIVES = frozenset({"barrier", "destroy_process_group", "finalize_checkpoints"})
"""Recorded calls that involve every rank."""


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
    """A ``DistributedActions`` double that records every call and injects faults.

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

    def announce_failure(self, error: BaseException, *, phase: str, step: int | None, time: float) -> Announcement:
        """Record the failure in ``announced``; return ``announcement`` (or raise the injected fault)."""
        self.announced.append((error, phase, step))
        injected = self.fail_on.get("announce_failure")
        if injected is not None:
            raise injected
        return self.announcement

    def _acquire(self, name: str) -> Owner:
        self._record(name)
        return Owner.CALLER if _INIT[name] in self.caller_owns else Owner.SESSION

    def init_store(self) -> Owner:
        """Record; report the store opened or the caller's."""
        return self._acquire("init_store")

    def init_process_group(self) -> Owner:
        """Record; report the group created or found."""
        return self._acquire("init_process_group")

    def init_model_parallel(self) -> Owner:
        """Record; report model-parallel state created or found."""
        return self._acquire("init_model_parallel")

    def init_microbatch_calculator(self) -> Owner:
        """Record; report the calculator created or found."""
        return self._acquire("init_microbatch_calculator")

    def init_rerun_state_machine(self) -> Owner:
        """Record; report the rerun state machine created or found."""
        return self._acquire("init_rerun_state_machine")

    def destroy_rerun_state_machine(self) -> None:
        """Record the release."""
        self._record("destroy_rerun_state_machine")

    def destroy_microbatch_calculator(self) -> None:
        """Record the release."""
        self._record("destroy_microbatch_calculator")

    def destroy_model_parallel(self) -> None:
        """Record the release."""
        self._record("destroy_model_parallel")

    def barrier(self) -> None:
        """Record the barrier."""
        self._record("barrier")

    def destroy_process_group(self) -> None:
        """Record the release."""
        self._record("destroy_process_group")

    def abort_process_group(self) -> None:
        """Record the release."""
        self._record("abort_process_group")

    def close_store(self) -> None:
        """Record the release."""
        self._record("close_store")


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
