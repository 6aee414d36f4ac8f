"""A ``TCPStore`` client in the standard library alone, for the liveness monitor (which must not import torch).

Speaks torch's wire protocol (torch 2.x) over one socket, every call bounded by the
client's timeout: a store host that is frozen or gone costs the caller at most that.
Imported by ``lifecycle._liveness.monitor`` both as part of the package and, when the
monitor runs as a script (``python -S -E -s monitor.py``: no package on the path), as a
module of the script's own folder: it imports nothing but the standard library.
"""

from __future__ import annotations

import os
import socket
import struct

_VALIDATE, _SET, _COMPARE_SET, _ADD, _CHECK, _MULTI_GET, _PING = 0, 1, 2, 4, 5, 10, 13
_UNSET = b"\x00"
"""``compare_set``'s expected value for a read: no key holds it, so the server only returns what is there."""
_MAGIC = 0x3C85F7CE
_READY = 0


class StoreError(Exception):
    """A store call that failed or did not answer within the client's timeout (the connection is dropped)."""


class StoreClient:
    """A client of a ``TCPStore`` server, every call bounded by ``timeout_s`` (then ``StoreError``, reconnect next).

    Speaks torch's wire protocol (torch 2.x: validate, ping, set, add, check, compare_set, multi_get). One client per
    thread.
    """

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        """Remember the server; connect on first use."""
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._sock: socket.socket | None = None
        self._pending: socket.socket | None = None  # connected, validated and pinged; the ping's answer still due
        self._answer = b""  # the part of the ping's answer read so far
        self._nonce = os.getpid() & 0xFFFFFFFF
        self.calls = 0

    def connect(self) -> None:
        """Connect and validate now (``StoreError`` if that fails within the timeout)."""
        self._socket()

    def _socket(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        # A connection whose answer timed out is kept and read again, never replaced by a new one: a frozen server's
        # kernel still queues every new connection, which the server, resumed, must serve in turn before any other.
        sock, self._pending = self._pending, None
        sent = sock is not None
        try:
            if sock is None:
                self._answer = b""
                sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(struct.pack("<BI", _VALIDATE, _MAGIC))
                sock.sendall(struct.pack("<BI", _PING, self._nonce))
                sent = True
            while len(self._answer) < 4:
                chunk = sock.recv(4 - len(self._answer))
                if not chunk:
                    raise ConnectionResetError("the store closed the connection")
                self._answer += chunk
            if struct.unpack("<I", self._answer)[0] != self._nonce:
                raise StoreError("the store answered the ping with another nonce")
        except TimeoutError as exc:
            if sent and sock is not None:
                self._pending = sock  # its answer may come yet: read on the next call
            elif sock is not None:
                sock.close()
            raise StoreError(f"connecting to {self.host}:{self.port}: {exc}") from None
        except (OSError, struct.error, StoreError) as exc:
            if sock is not None:
                sock.close()
            raise StoreError(f"connecting to {self.host}:{self.port}: {exc}") from None
        self._sock = sock
        return sock

    @property
    def connected(self) -> bool:
        """Whether the client holds a connection (a failed call drops it)."""
        return self._sock is not None

    def close(self) -> None:
        """Drop the connection (the next call reconnects)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _call(self, request: bytes, answer: int | None) -> bytes:
        sock = self._socket()
        self.calls += 1
        try:
            sock.sendall(request)
            return b"" if answer is None else _exactly(sock, answer)
        except OSError as exc:
            self.close()
            raise StoreError(f"store call: {exc}") from None

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value``."""
        self._call(bytes([_SET]) + _key(key) + _string(value), None)

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the counter ``key``; its new value."""
        result: int = struct.unpack("<q", self._call(bytes([_ADD]) + _key(key) + struct.pack("<q", amount), 8))[0]
        return result

    def check(self, key: str) -> bool:
        """Whether ``key`` is set (never waits)."""
        reply = self._call(bytes([_CHECK]) + struct.pack("<Q", 1) + _key(key), 1)
        return reply[0] == _READY

    def get(self, key: str) -> bytes | None:
        """``key``'s value, or None if it is not set: one request (a compare_set that never matches), never waits."""
        sock = self._socket()
        self._call(bytes([_COMPARE_SET]) + _key(key) + _string(_UNSET) + _string(_UNSET), None)
        try:
            (size,) = struct.unpack("<Q", _exactly(sock, 8))
            found = _exactly(sock, size)
        except OSError as exc:
            self.close()
            raise StoreError(f"store get: {exc}") from None
        return None if found == _UNSET else found

    def create(self, key: str, value: bytes) -> bytes:
        """Set ``key`` to ``value`` unless it is set (atomically, on the server); the value it holds now."""
        sock = self._socket()
        self._call(bytes([_COMPARE_SET]) + _key(key) + _string(b"") + _string(value), None)
        try:
            (size,) = struct.unpack("<Q", _exactly(sock, 8))
            return _exactly(sock, size)
        except OSError as exc:
            self.close()
            raise StoreError(f"store create: {exc}") from None

    def multi_get(self, keys: list[str]) -> list[bytes | None]:
        """The values of ``keys`` in one request (None for a key not set); never waits.

        The server answers a key that is not set with an empty value (the libuv server,
        torch's default since 2.4); the older server drops the connection instead
        (``StoreError``), so a caller that may meet it reads only keys it knows are set.
        No value lifecycle stores is empty.
        """
        sock = self._socket()
        self._call(bytes([_MULTI_GET]) + struct.pack("<Q", len(keys)) + b"".join(_key(key) for key in keys), None)
        found: list[bytes | None] = []
        try:
            for _ in keys:
                (size,) = struct.unpack("<Q", _exactly(sock, 8))
                found.append(_exactly(sock, size) or None)
        except OSError as exc:
            self.close()
            raise StoreError(f"store multi_get: {exc}") from None
        return found


def _string(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def _key(key: str) -> bytes:
    """``key`` as the server stores it: torch's ``TCPStore`` client puts ``/`` before every key."""
    return _string(b"/" + key.encode())


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionResetError("the store closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
