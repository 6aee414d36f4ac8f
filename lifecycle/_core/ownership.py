"""Ownership: who releases each resource, written down when it is acquired.

A ``Ledger`` is an immutable value. Recording an acquisition or a release
returns a new ledger; an entry, once written, is never rewritten, and a
resource is released at most once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from lifecycle._core.errors import LifecycleError


class Owner(StrEnum):
    """Who releases a resource."""

    SESSION = "session"
    CALLER = "caller"
    RESTART_WRAPPER = "restart_wrapper"


class Resource(StrEnum):
    """A kind of resource a session can hold."""

    PROCESS_GROUP = "process_group"
    MODEL_PARALLEL = "model_parallel"
    MICROBATCH_CALCULATOR = "microbatch_calculator"
    RERUN_STATE_MACHINE = "rerun_state_machine"
    ASYNC_CHECKPOINT = "async_checkpoint"
    SIGNAL_HANDLERS = "signal_handlers"
    USER = "user"


GLOBALS: frozenset[Resource] = frozenset(
    {Resource.MODEL_PARALLEL, Resource.MICROBATCH_CALCULATOR, Resource.RERUN_STATE_MACHINE}
)
"""The Megatron-core globals."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """The fact that ``resource`` (``name`` tells user resources apart) was acquired, and who owns it."""

    resource: Resource
    owner: Owner
    name: str = ""

    @property
    def key(self) -> tuple[Resource, str]:
        """The identity of the resource in a ledger."""
        return (self.resource, self.name)

    def __str__(self) -> str:
        label = f"{self.resource.value}:{self.name}" if self.name else self.resource.value
        return f"{label} (owner: {self.owner.value})"


@dataclass(frozen=True, slots=True)
class Ledger:
    """Acquisitions in the order they happened, and which of them were released."""

    entries: tuple[LedgerEntry, ...] = ()
    released: frozenset[tuple[Resource, str]] = field(default_factory=frozenset)

    def acquire(self, entry: LedgerEntry) -> Ledger:
        """Return a ledger with ``entry`` added; raise ``LifecycleError`` if its key was ever recorded."""
        if any(e.key == entry.key for e in self.entries):
            raise LifecycleError(f"{entry} is already recorded; an entry is never rewritten")
        return Ledger((*self.entries, entry), self.released)

    def release(self, entry: LedgerEntry) -> Ledger:
        """Return a ledger with ``entry`` marked released; raise ``LifecycleError`` on a second release."""
        if entry not in self.entries:
            raise LifecycleError(f"{entry} was never acquired")
        if entry.key in self.released:
            raise LifecycleError(f"{entry} is already released")
        return Ledger(self.entries, self.released | {entry.key})

    def held(self) -> tuple[LedgerEntry, ...]:
        """Entries acquired and not released, in acquisition order."""
        return tuple(e for e in self.entries if e.key not in self.released)

    def owner(self, resource: Resource, name: str = "") -> Owner | None:
        """The owner recorded for ``resource`` (and ``name``), or None if it was never acquired."""
        entry = self.entry(resource, name)
        return None if entry is None else entry.owner

    def entry(self, resource: Resource, name: str = "") -> LedgerEntry | None:
        """The entry recorded for ``resource`` (and ``name``), or None."""
        for entry in self.entries:
            if entry.key == (resource, name):
                return entry
        return None
