"""One tensor's ``torch.save`` zip checked and rebuilt in one pass, or "not the plain case".

A DCP data file holds each tensor as its own ``torch.save`` zip. Checking one with
``zipfile`` and loading it with ``torch.load(weights_only=True)`` costs about 0.2 ms of
Python per tensor: the demo's 121 tensors took longer to read than the rest of a
retry's set-up. ``read_plain`` does both jobs at once on the zip torch writes: members
stored (not compressed), one storage, sizes under 4 GiB, little-endian, a pickle that
rebuilds one tensor. It reads the central directory with ``struct``, checks every
member's CRC-32 with ``zlib`` (the storage's too), and unpickles ``data.pkl`` with the C
unpickler restricted to what such a pickle names: torch's tensor rebuild (replaced by
ours, which checks its arguments), an empty ``OrderedDict`` of hooks and the storage
types. No other global is found; nothing else can be called.

It never rejects: anything else (damage, another zip layout, a tensor with a gradient
flag or hooks, a newer torch's pickle) returns None, and the caller takes the careful
path (``zipfile``'s member checks and ``torch.load``), which says what is wrong.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
import zlib
from collections import OrderedDict
from typing import Any

import numpy
import torch

__all__ = ["read_plain"]

_END = struct.Struct("<IHHHHIIH")  # end of central directory: signature ... comment length
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # a central directory entry, before its name
_LOCAL = struct.Struct("<IHHHHHIIIHH")  # a local file header, before its name
_SATURATED = 0xFFFFFFFF  # a size or offset kept in a zip64 field: not the plain case
_STORED = 0
_ENCRYPTED = 0x1

_STORAGE_TYPES = {
    f"{name}Storage": dtype
    for name, dtype in {
        "Double": torch.float64,
        "Float": torch.float32,
        "Half": torch.float16,
        "BFloat16": torch.bfloat16,
        "Long": torch.int64,
        "Int": torch.int32,
        "Short": torch.int16,
        "Char": torch.int8,
        "Byte": torch.uint8,
        "Bool": torch.bool,
    }.items()
}
"""The storage types a plain tensor's pickle names, and their dtypes (others take the careful path)."""


class _NotPlain(Exception):
    """The zip or its pickle is not the plain case ``read_plain`` reads."""


def _members(data: memoryview) -> dict[str, memoryview]:
    """Every member of the zip ``data``, by name, its bytes checked against the CRC-32 its directory records."""
    if len(data) < _END.size:
        raise _NotPlain
    signature, disk, _, _, count, size, offset, comment = _END.unpack_from(data, len(data) - _END.size)
    if signature != 0x06054B50 or disk or comment or _SATURATED in (size, offset):
        raise _NotPlain
    members: dict[str, memoryview] = {}
    at = offset
    for _ in range(count):
        (signature, _, _, flags, method, _, _, crc, packed, length, name_len, extra_len, note_len, *_, local) = (
            _CENTRAL.unpack_from(data, at)
        )
        if signature != 0x02014B50 or method != _STORED or flags & _ENCRYPTED or packed != length:
            raise _NotPlain
        if _SATURATED in (length, local):
            raise _NotPlain
        name = bytes(data[at + _CENTRAL.size : at + _CENTRAL.size + name_len])
        at += _CENTRAL.size + name_len + extra_len + note_len
        header = _LOCAL.unpack_from(data, local)
        start = local + _LOCAL.size + header[9]
        if header[0] != 0x04034B50 or bytes(data[local + _LOCAL.size : start]) != name:
            raise _NotPlain
        start += header[10]
        body = data[start : start + length]
        if len(body) != length or zlib.crc32(body) != crc:
            raise _NotPlain
        if name.decode() in members:
            raise _NotPlain
        members[name.decode()] = body  # utf-8: torch names its members in ASCII
    if at != offset + size:
        raise _NotPlain
    return members


class _Unpickler(pickle.Unpickler):
    """The C unpickler, finding only what a plain tensor's pickle names and taking its storage from ``members``."""

    def __init__(self, pickled: memoryview, members: dict[str, memoryview], prefix: str) -> None:
        super().__init__(io.BytesIO(pickled))
        self.members, self.prefix = members, prefix
        self.storages: list[str] = []

    def find_class(self, module: str, name: str) -> Any:
        """Our rebuild for torch's, ``OrderedDict``, a storage type's dtype; ``_NotPlain`` for any other global."""
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch" and name in _STORAGE_TYPES:
            return _STORAGE_TYPES[name]
        raise _NotPlain

    def persistent_load(self, pid: Any) -> Any:
        """The one storage the pickle names, as (dtype, a copy of its member's bytes); ``_NotPlain`` otherwise."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _NotPlain
        _, dtype, key, _location, numel = pid
        body = self.members.get(f"{self.prefix}data/{key}") if isinstance(key, str) else None
        if not isinstance(dtype, torch.dtype) or body is None or not isinstance(numel, int):
            raise _NotPlain
        if len(body) != numel * dtype.itemsize or self.storages:
            raise _NotPlain
        self.storages.append(key)
        owned = torch.empty(len(body), dtype=torch.uint8)  # torch's own memory, aligned, not the zip's buffer
        owned.numpy()[:] = numpy.frombuffer(body, dtype=numpy.uint8)
        return dtype, owned.untyped_storage()


def _rebuild(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, hooks: Any, *rest: Any) -> Any:
    """The tensor a plain pickle describes: no gradient flag, no hooks, no metadata (else not plain)."""
    if rest or requires_grad is not False or not isinstance(hooks, OrderedDict) or hooks:
        raise _NotPlain
    if not (isinstance(storage, tuple) and isinstance(offset, int) and isinstance(size, tuple)):
        raise _NotPlain
    if not isinstance(stride, tuple) or not all(isinstance(n, int) for n in size + stride):
        raise _NotPlain
    dtype, untyped = storage
    return torch.empty(0, dtype=dtype).set_(untyped, offset, size, stride)  # set_ refuses a geometry out of bounds


def read_plain(data: bytes | bytearray | memoryview) -> torch.Tensor | None:
    """The tensor ``data`` (one ``torch.save`` zip) holds, every member checked, or None if it is not the plain case.

    A tensor returned owns its storage (a copy of the zip's bytes in memory torch
    allocated, not a view of ``data``), and its every byte was covered by a CRC-32 check:
    its storage's or its pickle's. None for anything else, damaged bytes included: the
    caller then checks and loads ``data`` the careful way. Never raises for any ``data``.
    """
    try:
        members = _members(memoryview(data).cast("B"))
        pickles = [name for name in members if name.rsplit("/", 1)[-1] == "data.pkl"]
        if len(pickles) != 1:
            raise _NotPlain
        prefix = pickles[0][: -len("data.pkl")]
        storages = [name for name in members if name.startswith(f"{prefix}data/")]
        order = bytes(members.get(f"{prefix}byteorder", b""))
        if len(storages) != 1 or order != b"little" or sys.byteorder != "little":
            raise _NotPlain
        unpickler = _Unpickler(members[pickles[0]], members, prefix)
        tensor = unpickler.load()
        if not isinstance(tensor, torch.Tensor) or len(unpickler.storages) != 1:
            raise _NotPlain
        return tensor
    except Exception:  # noqa: BLE001 - _NotPlain, and whatever damaged bytes make struct, pickle or set_ raise
        return None
