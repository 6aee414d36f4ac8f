"""Writing into a real ``TCPStore`` so that a reader on another connection sees it (torch-free).

torch's ``TCPStore.set`` sends its request and returns without waiting for the server, so
a monitor's next read on its own connection can still find the value before. The server
answers one connection's requests in order: a ``get`` on the writer's connection returns
only once the ``set`` has been applied.
"""

from __future__ import annotations

from typing import Any

__all__ = ["settled_set"]


def settled_set(store: Any, key: str, value: str | bytes) -> None:
    """``store.set(key, value)``, returning once the server holds ``value`` (read back on the same connection)."""
    store.set(key, value)
    expected = value.encode() if isinstance(value, str) else value
    if store.get(key) != expected:
        raise AssertionError(f"{key} read back something else than was just set")
