"""How a record's fields are read from JSON: each field's type compiled into a check when the module loads.

A record (or a record nested in one) is a frozen dataclass whose every field has a
JSON type: ``bool``, ``int``, ``float`` (a JSON integer reads as a float), ``str``,
``None``, a union of them (``int | None``), ``list[T]`` or ``tuple[T, ...]`` (a JSON
array, read as a list or a tuple), ``dict[str, T]`` (a JSON object), or another such
dataclass (a JSON object), ``T`` any of these. ``compile_fields`` turns a class into its
``Fields``; any other type (``set``, ``bytes``, ``Any``, an unresolvable name) raises
``TypeError`` naming the class, the field and its type, so a record module with such a
field fails when it is imported, not when a journal is read.

Reading is the hot path of ``show`` (hundreds of thousands of records): a field whose
value already has an accepted type (``type(value) in exact``) is taken as it is; only
the others go through ``read``, which converts (an integer for a ``float``, a list for a
tuple, the fields of a nested record) or raises ``ValueError`` ``field 'x' ...``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lifecycle.journal.evidence import OMIT_EMPTY

Read = Callable[[Any, str], Any]
"""``read(value, path)``: ``value`` converted to the field's type, or ``ValueError`` naming ``path``."""


def brief(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (a hostile field may be long)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class JsonType:
    """One compiled field type: its ``name`` in messages, the value types taken as they are, and ``read``.

    ``nested``: a value may hold a nested record, which ``to_json`` turns into a dict
    before ``json.dumps`` writes it (other values it writes as they are).
    """

    name: str
    exact: frozenset[type]
    read: Read
    nested: bool = False


@dataclass(frozen=True, slots=True)
class Field:
    """One compiled field: its ``name``, its ``JsonType`` and its default (``dataclasses.MISSING``: required)."""

    name: str
    type: JsonType
    default: Any
    factory: Callable[[], Any] | None


class Fields:
    """A record class compiled: ``fields``, its fields in declaration order (``skip``-ped ones left out)."""

    __slots__ = ("_plan", "cls", "fields")

    def __init__(self, cls: type, fields: tuple[Field, ...]) -> None:
        """``cls`` with its compiled ``fields``."""
        self.cls = cls
        self.fields = fields
        self._plan = tuple((f.name, f.type.exact, f.type.read, f.default, f.factory) for f in fields)

    def values(self, data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
        """The fields' values in the JSON object ``data``: checked, converted, defaults filled in.

        ``ValueError`` ``field '<prefix><name>' is missing`` / ``... must be T, got V``.
        Fields ``data`` has and the class does not are ignored (a later writer's).
        """
        values: dict[str, Any] = {}
        for name, exact, read, default, factory in self._plan:
            if name in data:
                value = data[name]
                if type(value) not in exact:
                    value = read(value, prefix + name)
            elif factory is not None:
                value = factory()
            elif default is dataclasses.MISSING:
                raise ValueError(f"field {prefix + name!r} is missing")
            else:
                value = default
            values[name] = value
        return values

    def dump(self, record: object) -> dict[str, Any]:
        """The fields of ``record`` (an instance of ``cls``) as a JSON-ready dict, in declaration order."""
        out: dict[str, Any] = {}
        for field in self.fields:
            value = getattr(record, field.name)
            out[field.name] = to_json(value) if field.type.nested else value
        return out


def to_json(value: Any) -> Any:
    """``value`` with every dataclass in it turned into a dict of its fields (``json.dumps`` writes the rest); a
    field whose metadata sets ``OMIT_EMPTY`` is left out while empty."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_json(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if getattr(value, f.name) or not f.metadata.get(OMIT_EMPTY)
        }
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def _mismatch(name: str, value: object, path: str) -> ValueError:
    return ValueError(f"field {path!r} must be {name}, got {brief(value)}")


def _scalar(kind: type) -> JsonType:
    """``bool``, ``int``, ``str`` or ``None``: taken only as exactly that type (``True`` is no int)."""
    name = "None" if kind is types.NoneType else kind.__name__

    def read(value: Any, path: str) -> Any:
        raise _mismatch(name, value, path)

    return JsonType(name, frozenset({kind}), read)


def _float() -> JsonType:
    def read(value: Any, path: str) -> Any:
        if type(value) is int:  # a JSON integer in a float field; never a bool
            return float(value)
        raise _mismatch("float", value, path)

    return JsonType("float", frozenset({float}), read)


def _union(members: list[JsonType]) -> JsonType:
    name = " | ".join(m.name for m in members)
    exact = frozenset[type]().union(*(m.exact for m in members))

    def read(value: Any, path: str) -> Any:
        for member in members:
            try:
                return member.read(value, path)
            except ValueError:
                continue
        raise _mismatch(name, value, path)

    return JsonType(name, exact, read, any(m.nested for m in members))


def _array(item: JsonType, container: type) -> JsonType:
    name = f"{container.__name__}[{item.name}{', ...' if container is tuple else ''}]"

    def read(value: Any, path: str) -> Any:
        if type(value) is not list and type(value) is not tuple:
            raise _mismatch(f"a JSON array ({name})", value, path)
        exact, convert = item.exact, item.read
        return container(v if type(v) in exact else convert(v, f"{path}[{i}]") for i, v in enumerate(value))

    return JsonType(name, frozenset(), read, item.nested)


def _object(item: JsonType) -> JsonType:
    name = f"dict[str, {item.name}]"

    def read(value: Any, path: str) -> Any:
        if type(value) is not dict:
            raise _mismatch(f"a JSON object ({name})", value, path)
        exact, convert = item.exact, item.read
        out = {}
        for key, v in value.items():
            if type(key) is not str:
                raise ValueError(f"field {path!r} must be {name}: key {brief(key)} is no string")
            out[key] = v if type(v) in exact else convert(v, f"{path}.{key}")
        return out

    return JsonType(name, frozenset(), read, item.nested)


def _nested(cls: type) -> JsonType:
    fields = compile_fields(cls)
    name = f"a JSON object ({cls.__name__})"

    def read(value: Any, path: str) -> Any:
        if type(value) is not dict:
            raise _mismatch(name, value, path)
        return cls(**fields.values(value, f"{path}."))

    return JsonType(cls.__name__, frozenset(), read, nested=True)


def json_type(annotation: object, where: str) -> JsonType:
    """The compiled form of a field's resolved ``annotation``; ``TypeError`` naming ``where`` if it is no JSON type."""
    if annotation is None or annotation is types.NoneType:
        return _scalar(types.NoneType)
    if annotation in (bool, int, str):
        return _scalar(typing.cast(type, annotation))
    if annotation is float:
        return _float()
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (types.UnionType, typing.Union):
        return _union([json_type(arg, where) for arg in args])
    if origin is list and len(args) == 1:
        return _array(json_type(args[0], where), list)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _array(json_type(args[0], where), tuple)
    if origin is dict and len(args) == 2 and args[0] is str:
        return _object(json_type(args[1], where))
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _nested(annotation)
    raise TypeError(
        f"{where} has type {annotation!r}, which is no JSON type: use bool, int, float, str, None, a union of them,"
        " list[T], tuple[T, ...], dict[str, T] or a dataclass of such fields"
    )


def compile_fields(cls: type, skip: frozenset[str] = frozenset()) -> Fields:
    """``cls``'s fields (a dataclass; those named in ``skip`` left out) compiled: see the module docstring.

    ``TypeError`` naming the class and the field when a field's type is no JSON type or
    its annotation cannot be resolved.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__qualname__} is not a dataclass: a journal record is a frozen dataclass")
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError) as exc:
        raise TypeError(f"{cls.__qualname__}: a field's type cannot be resolved: {exc}") from None
    compiled = []
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        kind = json_type(hints[field.name], f"{cls.__qualname__}.{field.name}")
        factory = None if field.default_factory is dataclasses.MISSING else field.default_factory
        compiled.append(Field(field.name, kind, field.default, factory))
    return Fields(cls, tuple(compiled))


def text_problem(value: object) -> str | None:
    """Where ``value`` (decoded JSON) holds text no output can write (a lone surrogate), and why; None if nowhere.

    JSON can spell a lone surrogate (``\\udcff``); printing or writing it as UTF-8
    fails, so a reader refuses it up front. Returns ``"<where>: <reason> at character N"``
    with ``<where>`` empty for ``value`` itself, ``[i]`` or ``.key`` below it.
    """
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f": {exc.reason} at character {exc.start}"
        return None
    if isinstance(value, list):
        for i, item in enumerate(value):
            problem = text_problem(item)
            if problem is not None:
                return f"[{i}]{problem}"
    if isinstance(value, dict):
        for key, item in value.items():
            problem = text_problem(item) or text_problem(key)
            if problem is not None:
                return f".{key if isinstance(key, str) and key.isascii() else '?'}{problem}"
    return None
