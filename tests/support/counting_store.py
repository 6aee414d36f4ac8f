"""A real ``TCPStore`` client that counts the calls made on it, and W simulated ranks each holding one.

``CountingStore`` is a ``torch.distributed.Store`` (a ``PrefixStore`` built on it routes
through it too) that forwards every call to the wrapped client and counts it by name:
``ops`` is the number of store operations (requests to the server; ``set_timeout`` and
``timeout``, which stay on the client, are not counted). ``ranks(W)`` connects W clients
to one server, one after another (connecting them all at once stalls here: most connects
then wait 5 s or more), and ``run_ranks`` runs one function per rank, each on its own
thread, the way W ranks each hold their own client.

Each new ``TCPStore`` client looks up the name of its socket's address (``::ffff:127.0.0.1``),
which ``/etc/hosts`` does not list: on a machine whose DNS server is slow to say so, about
one connect in 25 waits out the resolver's 5 s timeout. Importing this module sets
``RES_OPTIONS`` (glibc's resolver reads it when a thread first resolves) to one try of 1 s.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from torch.distributed import Store, TCPStore  # type: ignore[attr-defined]  # re-exported at runtime

os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")


class CountingStore(Store):  # type: ignore[misc]  # torch's Store is untyped
    """Forwards every call to ``inner`` and counts it (``calls``: name → count; ``ops``: their sum)."""

    def __init__(self, inner: Store) -> None:
        super().__init__()
        self.inner = inner
        self.calls: Counter[str] = Counter()

    @property
    def ops(self) -> int:
        """How many requests this client sent to the server."""
        return sum(self.calls.values())

    def reset(self) -> None:
        """Start counting from zero."""
        self.calls.clear()

    def _count(self, name: str) -> None:
        self.calls[name] += 1

    def set(self, key: str, value: Any) -> None:
        self._count("set")
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        self._count("get")
        return bytes(self.inner.get(key))

    def add(self, key: str, amount: int) -> int:
        self._count("add")
        return int(self.inner.add(key, amount))

    def check(self, keys: list[str]) -> bool:
        self._count("check")
        return bool(self.inner.check(keys))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        self._count("compare_set")
        return bytes(self.inner.compare_set(key, expected, desired))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._count("wait")
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def append(self, key: str, value: Any) -> None:
        self._count("append")
        self.inner.append(key, value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self._count("multi_get")
        return [bytes(value) for value in self.inner.multi_get(keys)]

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self._count("multi_set")
        self.inner.multi_set(keys, values)

    def delete_key(self, key: str) -> bool:
        self._count("delete_key")
        return bool(self.inner.delete_key(key))

    def num_keys(self) -> int:
        self._count("num_keys")
        return int(self.inner.num_keys())

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)

    @property
    def timeout(self) -> timedelta:
        found: timedelta = self.inner.timeout
        return found


def server(timeout_s: float = 30.0) -> TCPStore:
    """A store server on loopback, on a free port."""
    return TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def ranks(host: TCPStore, world: int, timeout_s: float = 30.0) -> list[CountingStore]:
    """``world`` counting clients of ``host``, connected one after another."""
    return [
        CountingStore(
            TCPStore(
                "127.0.0.1", host.port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
            )
        )
        for _ in range(world)
    ]


def run_ranks(stores: Sequence[CountingStore], work: Callable[[int, CountingStore], Any], join_s: float) -> list[Any]:
    """Run ``work(rank, store)`` for every rank at once, one thread each; each rank's result or exception.

    Counts start from zero. A thread still running after ``join_s`` leaves ``TimeoutError`` as its result.
    """
    for store in stores:
        store.reset()
    results: list[Any] = [TimeoutError("still running")] * len(stores)

    def one(rank: int) -> None:
        try:
            results[rank] = work(rank, stores[rank])
        except Exception as exc:  # noqa: BLE001 - returned to the test
            results[rank] = exc

    threads = [threading.Thread(target=one, args=(rank,), daemon=True) for rank in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(join_s)
    return results
