"""What lifecycle sessions created in this process and did not release: never adopted, always reclaimed.

A session records here each process-wide resource it creates (a kind with an ``init``
action: the default group, the Megatron-core globals) with the release callables it
bound, and forgets it when a release step of it succeeds. What is still recorded when
a later session is about to acquire the same kind was left by an earlier session (an
interrupt or a failed release cut its teardown short). The later session must not
adopt it as the caller's: it reclaims it first, with the release callables of the
session that created it (``Session`` does this; see ``Leftover``).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

from lifecycle._core.ownership import LedgerEntry
from lifecycle._core.resources import Releases, Resource


@dataclass(frozen=True, slots=True)
class Leftover:
    """A resource a session created: its ledger ``entry``, the ``releases`` it bound, the ``session`` that did.

    ``session`` names it for people; ``session_id`` identifies it. ``token``: a weak
    reference to the object itself (the kind's ``identity``), None where the kind
    declares none or the object cannot be referenced weakly.
    """

    entry: LedgerEntry
    releases: Releases
    session: str
    session_id: int
    token: weakref.ref[Any] | None = None

    def is_live(self) -> bool:
        """True if its object still exists and is the one alive now (by the probe alone where there is no identity)."""
        resource = self.entry.resource
        if resource.probe is not None and not resource.probe():
            return False
        if resource.identity is None:
            return True
        current = resource.identity()
        return self.token is not None and current is not None and self.token() is current


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


class Leftovers:
    """The process-wide record. Thread-safe: the restart wrapper releases from its monitor thread."""

    def __init__(self) -> None:
        """Nothing recorded."""
        self._created: dict[Resource, Leftover] = {}
        self._lock = threading.Lock()

    def created(self, leftover: Leftover) -> None:
        """Record that ``leftover.session`` created ``leftover.entry``'s resource (replacing an older record of it)."""
        with self._lock:
            self._created[leftover.entry.resource] = leftover

    def released(self, resource: Resource, session_id: int) -> None:
        """Forget ``resource`` if the session ``session_id`` is the one recorded as its creator."""
        with self._lock:
            found = self._created.get(resource)
            if found is not None and found.session_id == session_id:
                del self._created[resource]

    def take(self, resource: Resource) -> Leftover | None:
        """Forget and return the record of ``resource``, or None if no session left one."""
        with self._lock:
            return self._created.pop(resource, None)

    def peek(self) -> tuple[Leftover, ...]:
        """Every record, oldest first (for leak reports)."""
        with self._lock:
            return tuple(self._created.values())


LEFTOVERS = Leftovers()
"""This process's record."""
