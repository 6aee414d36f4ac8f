"""Snapshots of megatron-core's module globals: prove a teardown leaves ``megatron.core`` as it found it.

``snapshot()`` records every module-level global of every ``megatron.core`` module
already imported (modules, routines, classes and dunders left out), keyed by
``(module, name)``: plain data (None, bool, int, float, str, and containers of only
those) by a copy of its value; a container holding anything else by its identity and
its items, recorded the same way; any other object by its identity (type and id). A
snapshot holds no strong reference to anything it records (a held gloo group would
keep its connections open).

``diff(before, after)`` names the globals of ``before`` that differ in ``after``;
``added(before, after)`` the globals ``after`` has that ``before`` lacked (modules
imported in between), unless they hold a resting value (None, False, empty).
"""

from __future__ import annotations

import inspect
import sys
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

__all__ = ["PACKAGE", "Container", "Identity", "Snapshot", "Value", "added", "diff", "snapshot"]

PACKAGE = "megatron.core"
"""The package whose modules are walked (the package itself and every submodule in ``sys.modules``)."""

_PLAIN = (type(None), bool, int, float, str)
_CONTAINERS = (dict, list, tuple, set, frozenset)
_MAX_DEPTH = 6
"""Nesting beyond this is recorded by identity (and never counts as plain data)."""


@dataclass(frozen=True, slots=True)
class Value:
    """Plain data, by value (an immutable copy: a list is kept as a tuple, tagged with its type)."""

    type_name: str
    value: Any

    def __str__(self) -> str:
        shown = {"list": list, "set": set, "frozenset": frozenset, "dict": dict}.get(self.type_name)
        return _short(repr(self.value if shown is None else shown(self.value)))


@dataclass(frozen=True, slots=True)
class Identity:
    """Any other object, by identity; ``alive`` (a weak reference, where the type takes one) is not compared."""

    type_name: str
    id: int
    alive: Callable[[], object] | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"<{self.type_name} at {self.id:#x}>"


@dataclass(frozen=True, slots=True)
class Container:
    """A container holding more than plain data: its identity and its items (a dict's keys and values alternate)."""

    identity: Identity
    items: tuple[Record, ...]

    def __str__(self) -> str:
        return f"{self.identity} holding {_short(', '.join(map(str, self.items)))}"


Record: TypeAlias = Value | Identity | Container
Snapshot: TypeAlias = dict[tuple[str, str], Record]


def snapshot(package: str = PACKAGE) -> Snapshot:
    """Record the module globals of every imported module of ``package`` (default ``megatron.core``)."""
    records: Snapshot = {}
    for module_name, module in sorted(list(sys.modules.items()), key=lambda item: item[0]):
        if module is None or not (module_name == package or module_name.startswith(package + ".")):
            continue
        for name, value in list(vars(module).items()):
            if name.startswith("__") or _is_code(value):
                continue
            records[module_name, name] = _record(value, 0)
    return records


def diff(before: Snapshot, after: Snapshot) -> list[str]:
    """Each global of ``before`` that ``after`` lacks or records differently: ``"module.name: before → after"``."""
    changes = []
    for (module, name), old in before.items():
        new = after.get((module, name))
        if new is None:
            changes.append(f"{module}.{name}: {old} → (gone)")
        elif not _same(old, new):
            changes.append(f"{module}.{name}: {old} → {new}")
    return changes


def added(before: Snapshot, after: Snapshot) -> list[str]:
    """Globals new in ``after``, unless at rest (None, False, empty): ``"module.name = value"``."""
    return [
        f"{module}.{name} = {new}"
        for (module, name), new in after.items()
        if (module, name) not in before and not _at_rest(new)
    ]


# -- internals ---------------------------------------------------------------------------


def _is_code(value: object) -> bool:
    """Modules, classes and routines (functions, builtins, cached functions): code, not state."""
    return isinstance(value, types.ModuleType | type) or inspect.isroutine(value)


def _is_plain(value: object, depth: int = 0) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if depth >= _MAX_DEPTH:
        return False
    if isinstance(value, dict):
        return all(_is_plain(k, depth + 1) and _is_plain(v, depth + 1) for k, v in value.items())
    if isinstance(value, _CONTAINERS):
        return all(_is_plain(item, depth + 1) for item in value)
    return False


def _frozen(value: Any) -> Any:
    """An immutable, comparable copy of plain data (dict items and set members in a stable order)."""
    if isinstance(value, dict):
        return tuple(sorted(((_frozen(k), _frozen(v)) for k, v in value.items()), key=repr))
    if isinstance(value, set | frozenset):
        return tuple(sorted((_frozen(item) for item in value), key=repr))
    if isinstance(value, list | tuple):
        return tuple(_frozen(item) for item in value)
    return value


def _identity(value: object) -> Identity:
    try:
        ref: Callable[[], object] | None = weakref.ref(value)
    except TypeError:
        ref = None
    return Identity(type(value).__qualname__, id(value), ref)


def _record(value: object, depth: int) -> Record:
    if _is_plain(value):
        return Value(type(value).__name__, _frozen(value))
    if depth < _MAX_DEPTH and isinstance(value, _CONTAINERS):
        if isinstance(value, dict):  # keys and values alternate, in insertion order
            members: list[Any] = [part for pair in value.items() for part in pair]
        elif isinstance(value, set | frozenset):
            members = sorted(value, key=id)
        else:
            members = list(value)
        return Container(_identity(value), tuple(_record(item, depth + 1) for item in members))
    return _identity(value)


def _same(old: Record, new: Record) -> bool:
    """Equal records; an object recorded before must also still be alive (else its id may have been reused)."""
    if isinstance(old, Identity) and isinstance(new, Identity):
        return old == new and (old.alive is None or old.alive() is not None)
    if isinstance(old, Container) and isinstance(new, Container):
        return (
            _same(old.identity, new.identity)
            and len(old.items) == len(new.items)
            and all(_same(a, b) for a, b in zip(old.items, new.items, strict=True))
        )
    return old == new


def _at_rest(record: Record) -> bool:
    return isinstance(record, Value) and (record.value is None or record.value is False or record.value == ())


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
