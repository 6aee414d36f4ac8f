"""Ownership: who releases each resource, written down when it is acquired.

A ``Ledger`` is an immutable value. Recording an acquisition or a release
returns a new ledger; an entry, once written, is never rewritten, and a
resource is released at most once.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lifecycle._core.errors import LifecycleError
from lifecycle._core.resources import Resource
from lifecycle._core.states import Owner

__all__ = ["Ledger", "LedgerEntry", "Owner", "Resource", "caller_site"]

_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """The fact that ``resource`` (``name`` tells named resources apart) was acquired, and who owns it.

    ``site`` is where it was acquired: ``file:line`` of the first caller outside this
    package (see ``caller_site``), for error messages and leak reports; it takes no
    part in comparisons.
    """

    resource: Resource
    owner: Owner
    name: str = ""
    site: str = field(default="", compare=False)

    @property
    def key(self) -> tuple[Resource, str]:
        """The identity of the resource in a ledger."""
        return (self.resource, self.name)

    def __str__(self) -> str:
        label = f"{self.resource.value}:{self.name}" if self.name else self.resource.value
        return f"{label} (owner: {self.owner.value})"

    def described(self) -> str:
        """``str(self)`` followed by where it was acquired, when that is known."""
        return f"{self} acquired at {self.site}" if self.site else str(self)


@dataclass(frozen=True, slots=True)
class Ledger:
    """Acquisitions in the order they happened, and which of them were released."""

    entries: tuple[LedgerEntry, ...] = ()
    released: frozenset[tuple[Resource, str]] = field(default_factory=frozenset)
    failed: frozenset[tuple[Resource, str]] = field(default_factory=frozenset)
    """Keys whose release step raised at least once (still held unless a later one succeeded)."""

    def acquire(self, entry: LedgerEntry) -> Ledger:
        """Return a ledger with ``entry`` added; raise ``LifecycleError`` if its key was ever recorded."""
        if any(e.key == entry.key for e in self.entries):
            raise LifecycleError(f"{entry} is already recorded; an entry is never rewritten")
        return Ledger((*self.entries, entry), self.released, self.failed)

    def release(self, entry: LedgerEntry) -> Ledger:
        """Return a ledger with ``entry`` marked released; raise ``LifecycleError`` on a second release."""
        if entry not in self.entries:
            raise LifecycleError(f"{entry} was never acquired")
        if entry.key in self.released:
            raise LifecycleError(f"{entry} is already released")
        return Ledger(self.entries, self.released | {entry.key}, self.failed)

    def release_failed(self, entry: LedgerEntry) -> Ledger:
        """Return a ledger recording that a release step of ``entry`` raised; ``LifecycleError`` if never acquired."""
        if entry not in self.entries:
            raise LifecycleError(f"{entry} was never acquired")
        return Ledger(self.entries, self.released, self.failed | {entry.key})

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


def caller_site() -> str:
    """``file:line`` of the innermost frame outside the ``lifecycle`` package (its test suite counts as outside).

    Empty when every frame is inside the package.
    """
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_PACKAGE):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return ""
