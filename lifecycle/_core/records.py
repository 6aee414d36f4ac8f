"""Journal records, schema version 2: typed, frozen, one JSON object per line. Writer and reader share them.

Every record's JSON object holds ``version`` (2), ``kind``, the fields of its
``Origin`` (``run_id``, ``rank``, ``attempt``, ``restart_mode``, ``iteration``,
``restart_count``) and its own fields:

- ``run`` (``RunStart``): ``world_size``, ``pid``, ``host``, ``start``.
- ``transition`` (``Transition``): ``source``, ``dest``, ``trigger``, ``start``, ``end``, ``detail``,
  ``agreed_attempt``, ``store_prefix``.
- ``teardown`` (``TeardownStep``): ``outcome``, ``step``, ``resource``, ``owner``, ``start``, ``end``, ``error``,
  ``note``.
- ``left`` (``Left``): ``resource``, ``owner``, ``reason``, ``site`` (held, and not released by this
  session; ``site`` is ``file:line`` where it was acquired, empty if unknown).
- ``step`` (``Step``): ``step``, ``loss``, ``start``, ``end``: one per training step.
- ``eval`` (``Eval``): ``step``, ``loss``, ``start``, ``end``.
- ``end`` (``RunEnd``): ``state``, ``exit_reason``, ``final_step``, ``checkpoint_step``, ``error``, ``end``.
- ``failure`` (``Failure``): ``phase``, ``step``, ``error``, ``time``, ``seq``, ``unpublished``, ``first_rank``,
  ``note``: this rank failed (written before its failure teardown); added after the others.

Times, one meaning each: wall-clock seconds since the epoch (``time.time()``), so the
journals of different ranks line up. ``start`` is when the event's work began, ``end``
when it finished; both are taken when the event happens (a transition's or teardown
step's ``start`` is its ``end`` less its duration on the monotonic clock). The only
``None`` times are those of records converted from version 1 journals, which kept none.
Version 1 records (no ``version`` field) are converted by ``from_v1``.

A field added to version 2 later has a default, which a record written before it
reads as (``restart_count`` 0; ``agreed_attempt`` and ``store_prefix`` None); a reader
ignores fields it does not know. Neither changes the version: only a change that an
older reader would misread (a field renamed, removed or given another meaning) makes
version 3. A record kind added later (``failure``) does not: an older reader refuses it
by name ("unknown record kind"), it cannot misread it.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self, TypeAlias, cast

VERSION = 2

V1_RUN_ID = "v1"
"""The ``run_id`` of records read from a version 1 journal, which had none."""

_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "str | None": (str, types.NoneType),
    "int | None": (int, types.NoneType),
    "float | None": (int, float, types.NoneType),
}


def _value(data: Mapping[str, Any], field: dataclasses.Field[Any]) -> Any:
    """``data[field.name]`` checked against the field's type (its default when absent).

    ``ValueError`` ``field 'x' ...`` if it is missing, of another type, or text that
    cannot be written as UTF-8.
    """
    if field.name not in data:
        if field.default is not dataclasses.MISSING:
            return field.default
        raise ValueError(f"field {field.name!r} is missing")
    value = data[field.name]
    allowed = _TYPES[str(field.type)]
    if not isinstance(value, allowed) or isinstance(value, bool):
        raise ValueError(f"field {field.name!r} must be {field.type}, got {_brief(value)}")
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: JSON can spell it (\udcff), no output can print it
            raise ValueError(f"field {field.name!r} is not valid text: {exc.reason} at character {exc.start}") from None
    return float(value) if float in allowed and isinstance(value, int) else value


def _brief(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (a hostile field may be long)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Origin:
    """Who wrote a record, in which attempt.

    ``run_id``: the job's id, the same on every rank and across launcher restarts (see
    ``lifecycle._core.journal.run_id``). ``rank``: the writer's global rank. ``attempt``:
    the ``pretrain`` call's attempt number; ``restart_mode`` and ``iteration``: its
    session's (``iteration`` counts in-process restarts). ``restart_count``: how many
    times torchrun had restarted the writer's worker group when the writer started
    (``TORCHELASTIC_RESTART_COUNT``; 0 outside torchrun, and in records written before
    the field existed). A restarted worker is a new process whose ``attempt`` starts at
    0 again: ``(restart_count, attempt)`` orders the attempts of one run.
    """

    run_id: str
    rank: int
    attempt: int
    restart_mode: str
    iteration: int
    restart_count: int = 0


class _Record:
    """What every record kind shares: its ``kind``, its ``origin``, and the JSON round trip."""

    __slots__ = ()
    kind: ClassVar[str]
    origin: Origin

    def to_json(self) -> dict[str, Any]:
        """The record as one flat JSON object: ``version``, ``kind``, the origin's fields, then its own."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(cast(Any, self)) if f.name != "origin"}
        return {"version": VERSION, "kind": self.kind, **dataclasses.asdict(self.origin), **own}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """The record in ``data`` (``version``, ``kind`` checked by the caller); ``ValueError`` on a bad field."""
        origin = Origin(**{f.name: _value(data, f) for f in dataclasses.fields(Origin)})
        own = {f.name: _value(data, f) for f in dataclasses.fields(cast(Any, cls)) if f.name != "origin"}
        record: Self = cast(Any, cls)(origin=origin, **own)
        return record


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStart(_Record):
    """A ``pretrain`` call started (``start``); a writer's first record in a file."""

    kind: ClassVar[str] = "run"
    origin: Origin
    world_size: int
    pid: int
    host: str
    start: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition(_Record):
    """The session moved ``source`` → ``dest`` by ``trigger``; its work (a teardown too) ran ``start``..``end``.

    On the move to ``dist_ready`` (``init_distributed``), ``agreed_attempt`` is the
    attempt number the ranks agreed on through the rendezvous store and ``store_prefix``
    the key prefix of the group created on it; None where not known (another move, a
    caller's own group, actions that do not say, a fixed prefix with no agreement).
    """

    kind: ClassVar[str] = "transition"
    origin: Origin
    source: str
    dest: str
    trigger: str
    start: float
    end: float
    detail: str = ""
    agreed_attempt: int | None = None
    store_prefix: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TeardownStep(_Record):
    """One step of a teardown plan of ``outcome`` ran ``start``..``end``; ``error`` is what it raised.

    ``outcome`` is ``success`` or ``failure``, or ``reclaim`` for a release of what an
    earlier session left (``note`` names it), or ``abandoned`` for a step an escalated
    interrupt cut off (it did not run).
    """

    kind: ClassVar[str] = "teardown"
    origin: Origin
    outcome: str
    step: str
    resource: str
    owner: str
    start: float
    end: float
    error: str | None = None
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Left(_Record):
    """A resource held at teardown that the session did not release, why, and where it was acquired (``site``)."""

    kind: ClassVar[str] = "left"
    origin: Origin
    resource: str
    owner: str
    reason: str
    site: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Step(_Record):
    """Training step ``step`` ran ``start``..``end``; ``loss`` is averaged over all ranks."""

    kind: ClassVar[str] = "step"
    origin: Origin
    step: int
    loss: float
    start: float | None
    end: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Eval(_Record):
    """An evaluation after step ``step`` ran ``start``..``end``; ``loss`` is averaged over all ranks."""

    kind: ClassVar[str] = "eval"
    origin: Origin
    step: int
    loss: float
    start: float | None
    end: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnd(_Record):
    """The ``pretrain`` call ended (``end``) in ``state``: ``exit_reason`` on success, ``error`` on failure."""

    kind: ClassVar[str] = "end"
    origin: Origin
    state: str
    exit_reason: str | None
    final_step: int
    checkpoint_step: int | None
    error: str | None
    end: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure(_Record):
    """This rank failed at ``time`` (wall clock), in ``phase`` at training step ``step``, with ``error``.

    Written when the session takes its failure edge, before anything is released.
    ``seq`` is the sequence number the rendezvous store's atomic counter gave this
    rank's failure notice (1 = the first rank of the attempt to publish one), or None
    when the notice could not be published (``unpublished`` says why, e.g. the store
    is unreachable). ``first_rank`` is the peer whose notice came first, when that was
    not this rank, and ``note`` the note added to this rank's exception ("" if none).
    """

    kind: ClassVar[str] = "failure"
    origin: Origin
    phase: str
    step: int | None
    error: str
    time: float
    seq: int | None = None
    unpublished: str = ""
    first_rank: int | None = None
    note: str = ""


Record: TypeAlias = RunStart | Transition | TeardownStep | Left | Step | Eval | RunEnd | Failure
"""Any journal record."""

KINDS: dict[str, type[Record]] = {
    c.kind: c for c in (RunStart, Transition, TeardownStep, Left, Step, Eval, RunEnd, Failure)
}


def parse(data: object) -> Record:
    """The version 2 record in the decoded JSON ``data``.

    ``ValueError`` saying what is wrong with it, ``field 'x' ...`` where a field is
    (missing, of the wrong type, an unknown ``kind`` or ``version``).
    """
    if not isinstance(data, dict):
        raise ValueError(f"not a journal record: a JSON {type(data).__name__}, not an object")
    version = data.get("version")
    if version != VERSION or isinstance(version, bool):
        raise ValueError(
            f"field 'version' is {_brief(version)}: journal version {_brief(version)} is not supported"
            f" (known: 1, {VERSION})"
        )
    if "kind" not in data:
        raise ValueError("field 'kind' is missing")
    kind = data["kind"]
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"field 'kind' is {_brief(kind)}: unknown record kind (known: {', '.join(KINDS)})")
    return cls.from_json(data)


def _number(data: Mapping[str, Any], key: str) -> float:
    """``data[key]``, a number (``KeyError`` if absent); ``ValueError`` ``field 'key' ...`` if of another type."""
    value = data[key]
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"field {key!r} must be float, got {_brief(value)}")
    return float(value)


def from_v1(data: object, run: Mapping[str, Any] | None) -> list[Record]:
    """The version 2 records for version 1 record ``data``; ``run`` is the file's last v1 ``run`` record before it.

    A v1 ``end`` record becomes its ``Step`` and ``Eval`` records (no times) and a
    ``RunEnd``. ``ValueError`` (``field 'x' ...`` where a field is to blame) if ``data``
    is not a v1 record.
    """
    if not isinstance(data, dict):
        raise ValueError(f"not a journal record: a JSON {type(data).__name__}, not an object")
    if "kind" not in data:
        raise ValueError("field 'kind' is missing: not a journal record (nor field 'version')")
    run = data if data["kind"] == "run" else (run or {})
    origin = {
        "run_id": V1_RUN_ID,
        **{key: data[key] for key in ("rank", "attempt") if key in data},
        "restart_mode": run.get("restart_mode", "ordinary"),
        "iteration": run.get("iteration", 0),
    }
    kind = data["kind"]
    both = {**data, **origin}
    try:
        if kind == "transition":  # v1: ``at`` when the state changed
            at, took = _number(data, "at"), _number(data, "duration_s")
            return [Transition.from_json({**both, "start": at - took, "end": at})]
        if kind == "teardown":  # v1: ``at`` when the step started
            at, took = _number(data, "at"), _number(data, "duration_s")
            return [TeardownStep.from_json({**both, "start": at, "end": at + took})]
        if kind == "end":
            out: list[Record] = []
            for cls, key in ((Step, "losses"), (Eval, "eval_losses")):
                pairs = data[key]
                if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                    raise ValueError(f"field {key!r} must be a list of [step, loss] pairs, got {_brief(pairs)}")
                out += [cls.from_json({**origin, "step": s, "loss": v, "start": None, "end": None}) for s, v in pairs]
            return [*out, RunEnd.from_json({**both, "end": None})]
        if kind in ("run", "left"):
            return [KINDS[kind].from_json(both)]
    except KeyError as exc:
        raise ValueError(f"field {exc.args[0]!r} is missing (a version 1 {kind!r} record)") from None
    except TypeError as exc:
        raise ValueError(f"bad version 1 {_brief(kind)} record: {exc}") from None
    raise ValueError(f"field 'kind' is {_brief(kind)}: unknown version 1 record kind")
