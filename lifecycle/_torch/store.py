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

from torch.distributed import DistNetworkError, DistStoreError, Store, TCPStore  # type: ignore[attr-defined]  # re-exported at runtime

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


def job_store(env: Mapping[str, str] | None = None, timeout_s: float = 5.0) -> TCPStore | None:
    """A client of torchrun's agent store, where the job's decisions live (``lifecycle._training.retry``).

    The agent hosts it (``TORCHELASTIC_USE_AGENT_STORE``, at ``MASTER_ADDR:MASTER_PORT``)
    for the whole job: it outlives worker restarts, and every node's workers reach it.
    None outside torchrun's agent store, or when it cannot be reached within ``timeout_s``.
    """
    env = os.environ if env is None else env
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return None
    try:
        return TCPStore(
            env["MASTER_ADDR"],
            int(env["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
    except (KeyError, ValueError, RuntimeError):  # DistNetworkError and DistStoreError are RuntimeErrors
        return None


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

    Each rank proposes ``proposal`` (default: ``local_proposal()``), raised to the
    generation's floor (above any attempt already agreed on this store in this
    ``generation``); the attempt is the highest proposal, decided once all
    ``world_size`` ranks have joined the agreement at one time (a rank never leaves a
    decided one); this process's later proposals are above the result.

    Bounded store work per rank, whatever the world size, and no polling: a rank reads
    the floor, counts itself in (a rank proposing above the floor first writes its
    proposal) and waits on one key the last rank to arrive sets (3 requests; the
    deciding rank 4 or 5). A rank that times out writes its proposal and counts itself
    out (2 more); the last to give up reads every proposal once and lists them all in
    its ``AttemptDisagreement`` (each rank of the world: its proposal, or None); the
    others' errors say so. ``where`` names the store in the error. The store's own
    error propagates if it goes away meanwhile (its host failed): a peer is never
    carried over into the host's next attempt behind its caller's back.
    """
    agreement = _Agreement(store, f"lifecycle/g{generation}", rank, world_size)
    del store  # held by ``agreement`` only, which drops it if this raises
    try:
        return agreement.run(local_proposal() if proposal is None else proposal, timeout_s, where)
    finally:
        # The frames of a failure's traceback must not keep a hosted server listening.
        agreement.store = None


_UNSET = "\x00"
"""``compare_set``'s expected value for a read: no key holds it, so the call only returns what is there."""
_AHEAD = 1 << 32
"""What a rank proposing above the floor adds to the count besides 1: the decider reads proposals only then."""
_DECIDING_S = 5.0
"""How long a rank that timed out as the last rank arrived waits for the decision it was part of."""


class _Agreement:
    """One rank's side of ``agree_attempt``; it alone holds the store, so dropping it here drops it everywhere.

    Keys, under ``lifecycle/g<generation>``: ``floor``, the lowest attempt not yet
    agreed; per round (the floor it started from) ``round/<f>/count`` (ranks present,
    plus ``_AHEAD`` per rank above the floor), ``round/<f>/ahead`` (``rank:proposal;``
    of those), ``round/<f>/decided`` (the attempt, set once) and ``round/<f>/left``
    (``rank:proposal;`` of the ranks that gave up).
    """

    def __init__(self, store: Store, ns: str, rank: int, world_size: int) -> None:
        self.store: Store | None = store
        self.ns = ns
        self.rank = rank
        self.world_size = world_size

    def _store(self) -> Store:
        assert self.store is not None
        return self.store

    def read(self, key: str) -> str | None:
        """The value of ``key`` in the namespace, or None if it is not set: one request, never waits."""
        value = bytes(self._store().compare_set(f"{self.ns}/{key}", _UNSET, _UNSET)).decode()
        return None if value == _UNSET else value

    def wait_for(self, key: str, until: float) -> str | None:
        """The value of ``key`` once it is set (one request), or None if it is not by ``until`` (monotonic)."""
        store = self._store()
        before = store.timeout  # type: ignore[attr-defined]  # torch's stub lacks it
        store.set_timeout(timedelta(seconds=max(until - time.monotonic(), 0.001)))
        try:
            return bytes(store.get(f"{self.ns}/{key}")).decode()
        except DistStoreError:  # the wait timed out (a server gone raises DistNetworkError)
            return None
        finally:
            store.set_timeout(before)

    def run(self, mine: int, timeout_s: float, where: str) -> int:
        """Join the round at the floor and wait for its decision; see ``agree_attempt``."""
        deadline = time.monotonic() + timeout_s
        floor = int(self.read("floor") or 0)
        mine = max(mine, floor)
        weight = 1 + (_AHEAD if mine > floor else 0)
        round_ = f"round/{floor}"
        if mine > floor:
            self._store().append(f"{self.ns}/{round_}/ahead", f"{self.rank}:{mine};")  # type: ignore[attr-defined]
        count = int(self._store().add(f"{self.ns}/{round_}/count", weight))
        if count % _AHEAD == self.world_size:
            decided = self.decide(round_, floor, count // _AHEAD > 0)
        else:
            # An overfull count (a process that died in this round and was replaced) waits as well.
            found = self.wait_for(f"{round_}/decided", deadline)
            if found is None:
                found = self.leave(round_, mine, weight, timeout_s, where)
            decided = int(found)
        _note_attempt(decided)
        return decided

    def decide(self, round_: str, floor: int, ahead: bool) -> int:
        """As the last rank to arrive: the highest proposal; the floor moves above it before anyone learns it."""
        decided = floor
        if ahead:
            for _, value in _entries(self.read(f"{round_}/ahead")).items():
                decided = max(decided, value)
        self._store().set(f"{self.ns}/floor", str(decided + 1))
        self._store().set(f"{self.ns}/{round_}/decided", str(decided))
        return decided

    def leave(self, round_: str, mine: int, weight: int, timeout_s: float, where: str) -> str:
        """Timed out: leave the round (the last to leave gathers every proposal) and raise; or the decision.

        A rank that was counted when the round filled up takes the decision (it may be
        in use already), waiting up to ``_DECIDING_S`` for the last rank to set it.
        """
        self._store().append(f"{self.ns}/{round_}/left", f"{self.rank}:{mine};")  # type: ignore[attr-defined]
        count = int(self._store().add(f"{self.ns}/{round_}/count", -weight))
        present = (count + weight) % _AHEAD
        if present >= self.world_size:
            found = self.wait_for(f"{round_}/decided", time.monotonic() + _DECIDING_S)
            if found is not None:
                return found
        proposals: dict[int, int | None] = dict.fromkeys(range(self.world_size))
        elsewhere = ""
        if count % _AHEAD == 0:
            proposals.update(_entries(self.read(f"{round_}/left"), self.world_size))
        else:
            proposals = {self.rank: mine}
            elsewhere = f"the last rank to give up lists every rank's proposal ({self.ns}/{round_}/left in the store)"
        raise AttemptDisagreement(where, timeout_s, proposals, present, elsewhere=elsewhere)


def _entries(text: str | None, world_size: int | None = None) -> dict[int, int]:
    """``"rank:proposal;"`` entries as a map, the last entry of a rank winning (ranks outside the world dropped)."""
    found: dict[int, int] = {}
    for entry in (text or "").split(";"):
        rank, _, value = entry.partition(":")
        if rank.isdigit() and value.lstrip("-").isdigit() and (world_size is None or int(rank) < world_size):
            found[int(rank)] = int(value)
    return found
