"""Rendezvous stores: the one a session opens, and the attempt every rank agrees on through it.

A group re-created on a long-lived store must not read an earlier attempt's keys
(pytorch issue 55967), so every attempt has its own key prefix,
``lifecycle/g<generation>/attempt-<n>``. No rank picks ``n`` alone: a rank that failed
fast and retried while its peer was still busy would otherwise be attempts ahead of
it for good. ``agree_attempt`` settles it through the store: each rank proposes its
own count, all join the highest, and an attempt is used only once every rank has
joined it. The generation is torchrun's restart count, so workers that torchrun
restarts on its agent's store (which keeps the old workers' keys) never meet an old
attempt's keys either.

A store a session opens is its own: ``TorchActions`` drops it when the session
releases it, and a server it hosts stops listening once its last reference is gone
(torch 2.13's ``TCPStore`` has no ``close()``). Nothing here outlives the session.

So a host serves one session per server, on the same port each time. A peer that
closes (or fails) before its host has dropped the previous server would reach that
server again in its next session and lose it mid-rendezvous. Each server the host
opens therefore carries a token; a client that has already rendezvoused through the
server with that token (``rendezvoused_through``) waits for the host's next one
(``open_store``).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Mapping
from datetime import timedelta

from torch.distributed import DistNetworkError, Store, TCPStore  # type: ignore[attr-defined]  # re-exported at runtime

from lifecycle._core.errors import AttemptDisagreement
from lifecycle._torch.config import Rendezvous
from lifecycle.journal import restart_count

_lock = threading.Lock()

HOSTED: weakref.WeakSet[TCPStore] = weakref.WeakSet()
"""The store servers this process hosts for lifecycle, while anything holds them (the live probe reads it)."""
_next_proposal = 0  # this process's count of attempts: its proposal for the next one

_TOKEN_KEY = "lifecycle/server-token"
_tokens: weakref.WeakKeyDictionary[TCPStore, tuple[str, int, str]] = weakref.WeakKeyDictionary()
"""The server each client store opened here reached: (address, port, the token its host set)."""
_spent: dict[tuple[str, int], str] = {}
"""Per host address and port, the token of the last server this process rendezvoused through."""
_opened = 0  # servers hosted so far: part of each one's token

_POLL_FIRST_S = 0.002
_POLL_MAX_S = 0.1
_BIND_RETRY_S = 0.05


def generation(env: Mapping[str, str] | None = None) -> int:
    """torchrun's restart count of this worker group (``TORCHELASTIC_RESTART_COUNT``), 0 outside torchrun."""
    return restart_count(env)


def attempt_prefix(attempt: int, generation: int = 0) -> str:
    """The store prefix of ``attempt`` in ``generation``: ``lifecycle/g<generation>/attempt-<attempt>``."""
    return f"lifecycle/g{generation}/attempt-{attempt}"


def local_proposal() -> int:
    """This process's proposal for its next attempt: one more than the last it made or joined (0 at first)."""
    with _lock:
        return _next_proposal


def _note_attempt(attempt: int) -> None:
    """Remember that this process made (or joined) ``attempt``: its next proposal is above it."""
    global _next_proposal
    with _lock:
        _next_proposal = max(_next_proposal, attempt + 1)


def next_store_prefix() -> str:
    """Take this process's next attempt without agreement, and return its prefix (generation included).

    For a world of one, or a caller that agrees on attempts by other means; ranks that
    use it must make exactly the same attempts. ``TorchActions`` agrees through the
    store instead (``agree_attempt``).
    """
    global _next_proposal
    with _lock:
        attempt, _next_proposal = _next_proposal, _next_proposal + 1
    return attempt_prefix(attempt, generation())


def open_store(rendezvous: Rendezvous, timeout: timedelta) -> TCPStore:
    """Open the rendezvous store: rank 0 hosts the server, unless torchrun's agent serves it; the others connect.

    The server listens on every interface at ``master_port`` (``TCPStore`` binds to all
    of them; ``master_addr`` only tells clients where to connect). A client retries
    connecting until ``timeout``, then raises; so does the host binding the port while
    another process's server (the host of the previous attempt, if ranks moved) still
    holds it. A client that reaches a server it already rendezvoused through (its
    host has not dropped it yet: see the module's docstring) reconnects until the host
    serves a new one, and raises ``TimeoutError`` if none comes within ``timeout``. The
    caller owns what is returned: the server stops listening when the last reference
    to it goes.
    """
    global _opened
    hosts = rendezvous.rank == 0 and not rendezvous.use_agent_store
    deadline = time.monotonic() + timeout.total_seconds()
    where = (rendezvous.master_addr, rendezvous.master_port)
    while True:
        try:
            left = timedelta(seconds=max(deadline - time.monotonic(), 0.1))
            store = _connect(rendezvous, timeout if hosts else left, hosts, deadline)
            store.set_timeout(timeout)  # a client connected within what is left; its operations get the whole
            token = "" if hosts or rendezvous.use_agent_store else bytes(store.get(_TOKEN_KEY)).decode()
        except DistNetworkError:
            # A client reached a server its host dropped a moment later (the host is
            # switching from its previous session's server to the next one): try again.
            if hosts or time.monotonic() >= deadline:
                raise
            time.sleep(_BIND_RETRY_S)
            continue
        if hosts:
            with _lock:
                _opened += 1
                token = f"{os.getpid()}-{_opened}-{time.time_ns()}"
            store.set(_TOKEN_KEY, token)
            HOSTED.add(store)
            return store
        if rendezvous.use_agent_store:
            return store  # torchrun's agent serves every session on one server
        if _spent.get(where) != token:
            _tokens[store] = (*where, token)
            return store
        del store  # the host still serves the session this process left: wait for its next server
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"rank 0's store at {where[0]}:{where[1]} still serves the session this rank already "
                f"rendezvoused in, {timeout.total_seconds():g} s later: rank 0 has not started a new session"
            )
        time.sleep(_BIND_RETRY_S)


def _connect(rendezvous: Rendezvous, timeout: timedelta, hosts: bool, deadline: float) -> TCPStore:
    """Host or connect to the server of ``rendezvous``; a host retries a port in use until ``deadline``."""
    while True:
        try:
            store = TCPStore(
                rendezvous.master_addr,
                rendezvous.master_port,
                rendezvous.world_size,
                is_master=hosts,
                timeout=timeout,
                # The group's own rendezvous waits for every peer (bounded by the timeout).
                wait_for_workers=False,
                # Share a server this process already hosts on the port (e.g. torch's own env://
                # store) instead of failing to bind; the attempt prefixes keep the keys apart.
                multi_tenant=hosts and rendezvous.master_port != 0,
            )
            return store
        except DistNetworkError as exc:
            # The previous attempt's host (another process, when ranks moved) may still be
            # tearing its server down: the port frees within its teardown.
            if not (hosts and "EADDRINUSE" in str(exc)) or time.monotonic() >= deadline:
                raise
            time.sleep(_BIND_RETRY_S)


def rendezvoused_through(store: Store) -> None:
    """Record that this process rendezvoused through ``store``: ``open_store`` never returns its server again."""
    reached = _tokens.get(store) if isinstance(store, TCPStore) else None  # a client store open_store opened
    if reached is not None:
        _spent[reached[:2]] = reached[2]


def agree_attempt(
    store: Store,
    *,
    rank: int,
    world_size: int,
    proposal: int | None = None,
    generation: int = 0,
    timeout_s: float,
    where: str,
) -> int:
    """Agree with every rank on the attempt number to use next, through ``store``; return it.

    Each rank proposes ``proposal`` (default: ``local_proposal()``), raised to above any
    attempt already agreed on this store in this ``generation``; all ranks join the
    highest proposal, and the attempt is decided once all ``world_size`` ranks are
    joined to it at one time (a rank never leaves a decided attempt). A rank that is
    behind joins the one ahead; this process's later proposals are above the result.
    Costs a few store operations per rank, polled with backoff.

    Raises ``AttemptDisagreement`` naming each rank's proposal if the ranks do not meet
    within ``timeout_s`` (``where`` names the store), and the store's own error if it
    goes away meanwhile (its host failed): a peer is never carried over into the host's
    next attempt behind its caller's back.
    """
    agreement = _Agreement(store, f"lifecycle/g{generation}", rank, world_size)
    del store  # held by ``agreement`` only, which drops it if this raises
    try:
        return agreement.run(local_proposal() if proposal is None else proposal, timeout_s, where)
    finally:
        # The frames of a failure's traceback must not keep a hosted server listening.
        agreement.store = None


class _Agreement:
    """One rank's side of ``agree_attempt``; it alone holds the store, so dropping it here drops it everywhere."""

    def __init__(self, store: Store, ns: str, rank: int, world_size: int) -> None:
        self.store: Store | None = store
        self.ns = ns
        self.rank = rank
        self.world_size = world_size

    def _store(self) -> Store:
        assert self.store is not None
        return self.store

    def read(self, key: str) -> str | None:
        """The value of ``key`` in the namespace, or None if it is not set (never waits for it)."""
        key = f"{self.ns}/{key}"
        if not self._store().check([key]):
            return None
        return bytes(self._store().get(key)).decode()

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter ``key``; return its new value."""
        return int(self._store().add(f"{self.ns}/{key}", amount))

    def propose(self, value: int) -> None:
        """Record this rank's proposal (read only to name the ranks if they do not meet)."""
        self._store().set(f"{self.ns}/proposal/{self.rank}", str(value))

    def raise_to(self, key: str, value: int) -> int:
        """Atomically raise the integer under ``key`` to at least ``value``; return what it is then."""
        current = self.read(key) or ""
        while not current or int(current) < value:
            result = bytes(self._store().compare_set(f"{self.ns}/{key}", current, str(value))).decode()
            if result == str(value):
                return value
            current = result
        return int(current)

    def run(self, mine: int, timeout_s: float, where: str) -> int:
        """Propose ``mine`` and poll until the ranks meet; see ``agree_attempt``."""
        deadline = time.monotonic() + timeout_s
        pause = _POLL_FIRST_S
        mine = max(mine, int(self.read("floor") or 0))
        self.propose(mine)
        joined = self.raise_to("max", mine)
        count = self.add(f"joined/{joined}", 1)
        while True:
            if count < self.world_size and int(self.read("max") or 0) > joined:
                joined, count = self.move_up(joined)
            if count >= self.world_size:
                self.raise_to("floor", joined + 1)
                _note_attempt(joined)
                return joined
            if time.monotonic() >= deadline:
                raise self.disagreement(joined, timeout_s, where)
            time.sleep(pause)
            pause = min(pause * 1.5, _POLL_MAX_S)
            count = self.add(f"joined/{joined}", 0)

    def move_up(self, joined: int) -> tuple[int, int]:
        """Leave ``joined`` for the highest proposal, unless every rank was joined to it: then it stands.

        Returns the attempt joined now and its count of joined ranks.
        """
        if self.add(f"joined/{joined}", -1) + 1 >= self.world_size:
            # Every rank was joined here just now, so some rank may have decided on it already.
            return joined, self.add(f"joined/{joined}", 1)
        highest = int(self.read("max") or 0)
        self.propose(highest)
        return highest, self.add(f"joined/{highest}", 1)

    def disagreement(self, joined: int, timeout_s: float, where: str) -> AttemptDisagreement:
        """The error for ranks that did not meet; leaves the attempt this rank had joined (best effort)."""
        proposals: dict[int, int | None] = dict.fromkeys(range(self.world_size))
        count = 0
        try:
            count = self.add(f"joined/{joined}", -1) + 1
            for peer in range(self.world_size):
                value = self.read(f"proposal/{peer}")
                proposals[peer] = None if value is None else int(value)
        except Exception:  # noqa: BLE001 - the store may be gone; report what is known
            pass
        return AttemptDisagreement(where, timeout_s, proposals, count)
