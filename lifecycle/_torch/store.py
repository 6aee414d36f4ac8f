"""Rendezvous stores: the per-attempt key prefix, and the servers this process hosts.

A group re-created on a long-lived store must not read an earlier attempt's keys
(pytorch issue 55967): every attempt gets its own prefix. A server rank 0 hosts on a
fixed port outlives the attempt that opened it, so that a peer retrying early finds it.
"""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta

from torch.distributed import Store, TCPStore  # type: ignore[attr-defined]  # re-exported at runtime

from lifecycle._torch.config import Rendezvous

_attempts = itertools.count()
_lock = threading.Lock()

# Stores this process hosts, by (address, port), kept across attempts. A retry must
# find rank 0's server where it was: a peer that fails fast may connect for its next
# attempt before rank 0 has torn the previous one down, and if rank 0 then closed that
# server and opened a new one, the peer's connection would die under it. Attempts keep
# their keys apart by prefix, so one long-lived server serves them all (as torchrun's
# agent store does).
_hosted: dict[tuple[str, int], TCPStore] = {}


def next_store_prefix() -> str:
    """Return the store prefix of this process's next rendezvous attempt: ``lifecycle/attempt-<n>``.

    Each call returns a new one (a process-wide counter), so a group re-created after a
    destroy never reads a previous attempt's keys from a long-lived store (pytorch issue
    55967). Every rank must make the same number of attempts for the prefixes to agree;
    otherwise pass ``store_prefix`` to ``TorchActions`` explicitly.
    """
    with _lock:
        return f"lifecycle/attempt-{next(_attempts)}"


def close_hosted_stores() -> int:
    """Drop the rendezvous stores this process hosts for later attempts; return how many.

    A store hosted on a fixed port is kept from one attempt to the next so that peers
    can reconnect to it (see ``TorchActions``); call this when no further session will
    run in this process and the port should be released. Groups still using a store
    keep it alive until they are destroyed.
    """
    with _lock:
        count = len(_hosted)
        _hosted.clear()
    return count


def open_store(rendezvous: Rendezvous, timeout: timedelta) -> tuple[Store, tuple[str, int] | None]:
    """Open (or reuse) the rendezvous store; also return its hosting key if this call started hosting it.

    Rank 0 hosts the server unless torchrun's agent serves it. A server hosted on a fixed
    port is kept for later attempts (see ``close_hosted_stores``); pass the key to
    ``drop_hosted`` if the attempt that opened it fails.
    """
    hosts = rendezvous.rank == 0 and not rendezvous.use_agent_store
    # Port 0 (a world of one) has no peer to reconnect: a fresh server each time.
    key = (rendezvous.master_addr, rendezvous.master_port) if hosts and rendezvous.master_port else None
    if key is not None:
        with _lock:
            cached = _hosted.get(key)
        if cached is not None:
            cached.set_timeout(timeout)
            return cached, None
    store = TCPStore(
        rendezvous.master_addr,
        rendezvous.master_port,
        rendezvous.world_size,
        is_master=hosts,
        timeout=timeout,
        # The group's own rendezvous waits for every peer (bounded by the timeout).
        wait_for_workers=False,
        # Share a server this process already hosts on the port (e.g. torch's own
        # env:// store) instead of failing to bind; prefixes keep the keys apart.
        multi_tenant=key is not None,
    )
    if key is not None:
        with _lock:
            _hosted[key] = store
    return store, key


def drop_hosted(key: tuple[str, int], store: Store) -> None:
    """Stop keeping ``store`` for later attempts if it is still the one hosted under ``key``."""
    with _lock:
        if _hosted.get(key) is store:
            del _hosted[key]
