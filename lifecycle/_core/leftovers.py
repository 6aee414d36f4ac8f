"""What lifecycle sessions created in this process and no longer look after: never adopted, always reclaimed.

Derived from the holdings of every session (``lifecycle._core.holdings.REGISTRY``): an
entry a session recorded as its own (or the wrapper's) for a kind a trigger acquires,
still held once that session is final or was garbage-collected, is a ``Leftover`` (an
interrupt or a failed release cut its teardown short). A later session must not adopt
it as the caller's: it reclaims it first, with the release callables of the session that
created it. What a *live* session holds is not a leftover: another session in the same
process finds it as the caller's.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lifecycle._core.errors import StaleResource, describe
from lifecycle._core.executor import StepRecord, execute
from lifecycle._core.holdings import REGISTRY, Holdings
from lifecycle._core.ownership import LedgerEntry
from lifecycle._core.plans import Outcome, Plan, RestartMode, Step, Teardown
from lifecycle._core.resources import Releases, Resource


@dataclass(frozen=True, slots=True)
class Leftover:
    """A resource a session created: its ledger ``entry``, the ``releases`` it bound, the ``session`` that did.

    ``session`` names it for people; ``session_id`` identifies it. ``token``: a weak
    reference to the object itself (the kind's ``identity``), None where the kind
    declares none or the object cannot be referenced weakly. ``abandoned``: its session
    is final or gone (a live session's entries are listed for leak reports, never reclaimed).
    """

    entry: LedgerEntry
    releases: Releases
    session: str
    session_id: int
    token: weakref.ref[Any] | None = None
    abandoned: bool = True
    holdings: Holdings | None = field(default=None, repr=False, compare=False)

    def is_live(self) -> bool:
        """True if its object still exists and is the one alive now (by the probe alone where there is no identity)."""
        resource = self.entry.resource
        if resource.probe is not None and not resource.probe():
            return False
        if resource.identity is None:
            return True
        current = resource.identity()
        return self.token is not None and current is not None and self.token() is current

    def done(self) -> None:
        """The reclaim released it, or found it gone: its session no longer holds it."""
        if self.holdings is not None:
            self.holdings.reclaimed(self.entry)

    def give_back(self) -> None:
        """The reclaim failed or was interrupted: it stays a leftover, for the next session to try again."""
        if self.holdings is not None:
            self.holdings.unclaim(self.entry.key)


class Leftovers:
    """The process-wide view of what sessions hold of the kinds triggers acquire."""

    def peek(self) -> tuple[Leftover, ...]:
        """Every entry sessions created and still hold, oldest session first; ``abandoned`` says whose are leftovers."""
        return tuple(left for holdings in REGISTRY.holdings() for left in _of(holdings))

    def wait_for_running(self, resource: Resource, timeout_s: float) -> None:
        """Wait for a release of ``resource`` that a final session's abandoned teardown left running.

        A session about to acquire ``resource`` calls this first, so that a late release never
        undoes what it acquires (a late ``destroy_model_parallel`` resetting its globals).
        ``StaleResource`` naming that session if the release still runs after ``timeout_s``.
        """
        for holdings in REGISTRY.holdings():
            if not holdings.abandoned:
                continue
            for entry in holdings.running():
                if entry.resource is resource and not holdings.wait_settled(entry.key, timeout_s):
                    raise StaleResource(
                        resource.value,
                        f"a release of it that {holdings.label()} left running ({entry.described()}) still runs "
                        f"after {timeout_s:g} s: not acquiring it over a release that may still undo it",
                    )

    def take(self, resource: Resource, *, live_too: bool = False) -> Leftover | None:
        """Claim the newest abandoned leftover of ``resource`` for a reclaim, or None if there is none.

        ``live_too``: a live session's too (the pytest plugin's leak guard, releasing what a
        test leaked together with its session; never a session's acquisition). The claimer
        calls ``done()`` once it released it (or found it gone), or ``give_back()`` if it
        could not: the record stays until then.
        """
        for left in reversed(self.peek()):
            mine = left.entry.resource is resource and (left.abandoned or live_too) and left.holdings is not None
            if mine and left.holdings is not None and left.holdings.claim(left.entry.key):
                return left
        return None


def _of(holdings: Holdings) -> list[Leftover]:
    abandoned = holdings.abandoned
    return [
        Leftover(
            entry,
            holdings.releases(entry.key),
            holdings.label(),
            holdings.session_id,
            holdings.token(entry.key),
            abandoned,
            holdings,
        )
        for entry in holdings.left()
    ]


LEFTOVERS = Leftovers()
"""This process's record."""


def reclaim(
    resource: Resource,
    mode: RestartMode,
    observed: Callable[[StepRecord, str], None],
    wait_s: float,
) -> Leftover | None:
    """Release what a final or collected session left of ``resource``; the leftover released, or None.

    First waits (at most ``wait_s``) for a release of it left running (``wait_for_running``).
    Runs the leftover's failure steps with the callables its session bound, calling
    ``observed(record, left_by)`` after each. ``StaleResource`` naming that session if a step
    raises (the record is kept: the next session tries again); an interruption (Ctrl-C) is
    re-raised as itself, the record kept too. What a live session holds is left alone.
    """
    LEFTOVERS.wait_for_running(resource, wait_s)
    left = LEFTOVERS.take(resource)
    if left is None:
        return None
    try:
        if not left.is_live():  # a probe may raise too: the claim is given back whatever is raised
            left.done()
            return None
        _release(left, mode, observed)
    except BaseException:
        left.give_back()
        raise
    left.done()
    return left


def _release(left: Leftover, mode: RestartMode, observed: Callable[[StepRecord, str], None]) -> None:
    entry = left.entry
    planned = Teardown(Plan(tuple(Step(kind, entry) for kind in entry.resource.failure)), (), Outcome.FAILURE, mode)
    report = execute(planned, lambda step: left.releases[step.kind](), on_step=lambda r: observed(r, left.session))
    interruption = next((f.error for f in report.failed if not isinstance(f.error, Exception)), None)
    if interruption is not None:
        raise interruption
    if report.failed:
        error = report.failed[0].error
        raise StaleResource(
            entry.resource.value,
            f"left live by {left.session} ({entry.described()}); releasing it failed: {describe(error)}",
        ) from error
