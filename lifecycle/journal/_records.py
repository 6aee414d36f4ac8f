"""The journal's record types (schema version 4): frozen dataclasses, one flat JSON object per line.

The schema, field by field, and what changed from versions 1, 2 and 3 are in
``docs/journal.md``. Every record's JSON object holds ``version``, ``kind``, the
fields of its ``Origin`` and its own fields; each field's type is compiled when this
module loads (``lifecycle.journal._schema``), so a field of a type JSON cannot hold
fails here, at import.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from lifecycle.journal._schema import Fields, brief, compile_fields, text_problem
from lifecycle.journal.evidence import Evidence, Kind

VERSION = 4
"""The schema version this module writes; ``parse`` also reads 3 and 2, and the reader version 1 files."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Who wrote a record, in which attempt.

    ``run_id``: the job's id, the same on every rank and across launcher restarts (see
    ``lifecycle.journal.run_id``). ``rank``: the writer's global rank. ``attempt``:
    the ``pretrain`` call's attempt number; ``restart_mode`` and ``iteration``: its
    session's (``iteration`` counts in-process restarts). ``restart_count``: how many
    times torchrun had restarted the writer's worker group when the writer started
    (``TORCHELASTIC_RESTART_COUNT``; 0 outside torchrun, and in version 2 records written
    before the field existed). A restarted worker is a new process whose ``attempt``
    starts at 0 again: ``(restart_count, attempt)`` orders the attempts of one run.
    """

    run_id: str
    rank: int
    attempt: int
    restart_mode: str
    iteration: int
    restart_count: int = 0


class _Record:
    """What every record kind shares: its ``kind``, its ``origin``, and its JSON object (``to_json``)."""

    __slots__ = ()
    kind: ClassVar[str]
    origin: Origin

    def to_json(self) -> dict[str, Any]:
        """The record as one flat JSON object: ``version``, ``kind``, the origin's fields, then its own."""
        return {
            "version": VERSION,
            "kind": self.kind,
            **_ORIGIN.dump(self.origin),
            **_COMPILED[type(self)].dump(self),  # type: ignore[index]
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStart(_Record):
    """A ``pretrain`` call started (``start``) in process ``pid`` on ``host``; a writer's first record in a file.

    ``liveness``: the liveness deadlines its config puts in force, in words
    (``LivenessConfig.in_force``); "" when liveness is off (or the writer is older).
    """

    kind: ClassVar[str] = "run"
    origin: Origin
    world_size: int
    pid: int
    host: str
    start: float
    liveness: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition(_Record):
    """The session moved ``source`` → ``dest`` by ``trigger``; its work (a teardown too) ran ``start``..``end``.

    ``detail``: what the session noted on the move (the error, on a move into
    ``failed``). On the move to ``dist_ready`` (``init_distributed``), ``agreed_attempt``
    is the attempt number the ranks agreed on through the rendezvous store and
    ``store_prefix`` the key prefix of the group created on it; None where not known
    (another move, a caller's own group, actions that do not say).
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
    """One teardown step ran ``start``..``end``: ``step`` (its kind) on resource ``resource`` named ``name``.

    ``step`` is a step kind (``abort_process_group``), ``resource`` a resource kind
    (``process_group``), ``name`` the resource's name where its kind has several
    (user resources; "" otherwise), ``owner`` who owned it. ``outcome`` is ``success``
    or ``failure`` (the plan it belongs to), ``reclaim`` for a release of what an
    earlier session left (``note`` says which and where it was acquired),
    ``abandoned`` for a step an escalated interrupt cut off (it did not run), or, for a
    release of the session's entry outside its plans (version 4, issue 45; ``note`` says
    it in words), who ran it: ``wrapper_abort`` (the restart wrapper's abort, on NVRx's
    monitor thread: on a peer of the failed rank, usually before its own failure),
    ``wrapper_finalize``, or ``late`` (a step left running past its deadline that returned).
    ``error`` is what the step raised, None if nothing.
    """

    kind: ClassVar[str] = "teardown"
    origin: Origin
    outcome: str
    step: str
    resource: str
    name: str = ""
    owner: str
    start: float
    end: float
    error: str | None = None
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Left(_Record):
    """A resource held at teardown that the session did not release: its kind, name and owner, why, and where from.

    ``resource`` is the resource kind, ``name`` its name where its kind has several
    ("" otherwise), ``owner`` who owns it, ``reason`` why it was left alone (a
    ``LeftReason`` value), ``site`` the ``file:line`` where it was acquired ("" if unknown).
    """

    kind: ClassVar[str] = "left"
    origin: Origin
    resource: str
    name: str = ""
    owner: str
    reason: str
    site: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class _StepLoss(_Record):
    """The fields a training step and an evaluation share: the step, the loss over all ranks, when it ran."""

    origin: Origin
    step: int
    loss: float
    start: float | None
    end: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainStep(_StepLoss):
    """Training step ``step`` ran ``start``..``end``; ``loss`` is averaged over all ranks (JSON kind ``step``)."""

    kind: ClassVar[str] = "step"


@dataclass(frozen=True, slots=True, kw_only=True)
class Eval(_StepLoss):
    """An evaluation after step ``step`` ran ``start``..``end``; ``loss`` is averaged over all ranks."""

    kind: ClassVar[str] = "eval"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnd(_Record):
    """The ``pretrain`` call ended (``end``) in ``state``: ``exit_reason`` on success, ``error`` on failure.

    ``final_step``: the last training step it ran; ``checkpoint_step``: the step of its
    last checkpoint, None if it saved none.
    """

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
    ``evidence`` (version 4): this failure's facts, typed (``lifecycle.journal.evidence``:
    its kind, rank, step, phase, who decided); ``first``: the first failure's facts as
    this rank learned them (the peer's notice or its monitor's verdict), when that was a
    peer's. None where unknown, and in records read from older versions.
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
    evidence: Evidence | None = None
    first: Evidence | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict(_Record):
    """A liveness monitor's verdict: rank ``culprit`` is ``verdict`` in ``phase`` at training step ``step``.

    Written by the monitor that judged (``lifecycle._liveness.monitor``) into its own
    rank's journal, at ``time`` (wall clock), also when the store is gone or the rank
    was killed: a rank's own monitor judges it (``culprit`` is the writer's rank:
    ``stopped``, ``spinning``, ``waiting``, ``died``), a neighbour's monitor a rank it
    stopped hearing from (``unresponsive``). ``note`` is the verdict's words (what every
    rank's exception carries when the notice could be read), ``seq`` the failure notice's
    sequence number (None: not published), ``stacks`` the file the culprit's Python
    stacks were dumped into ("" if none). Version 4: ``verdict`` is a ``Kind`` value
    (``hang``, which version 3 called ``waiting``); ``evidence`` the verdict's facts,
    typed (process state, seconds without progress, the deadline, who decided); ``killed``
    whether the monitor killed the culprit after it (its own rank, in ``kill`` mode).
    """

    kind: ClassVar[str] = "verdict"
    origin: Origin
    culprit: int
    verdict: str
    phase: str
    step: int | None
    note: str
    time: float
    seq: int | None = None
    stacks: str = ""
    evidence: Evidence | None = None
    killed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class MonitorLost(_Record):
    """This rank's liveness monitor (process ``pid``) exited while the rank trained, ``how`` (``killed by SIGKILL``).

    Written by the rank (``lifecycle._liveness.rank``) at ``time``, when it noticed, at
    ``phase``/``step``. ``action`` is what the rank did: ``restarted`` (a new monitor,
    ``new_pid``, runs), ``failed`` (the monitor was lost again, or could not be started:
    in ``kill`` mode the rank fails with ``MonitorLost``), ``without`` (so lost in
    ``report`` mode, or where no handler can fail the rank: it trains on unsupervised).
    ``note``: the words, as logged.
    """

    kind: ClassVar[str] = "monitor_lost"
    origin: Origin
    pid: int
    how: str
    action: str
    phase: str
    step: int | None
    note: str
    time: float
    new_pid: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FailedSave(_Record):
    """A checkpoint save of ``step`` that every rank dropped (``lifecycle.checkpoint.SaveFailed``), at ``time``.

    ``error``: the failure as every rank raised it (``SaveFailed``'s text: each failed
    rank with its file and OS error, or rank 0's commit error), the same on every rank.
    ``consecutive``: failed saves in a row, this one included. ``action``:
    ``continued`` (training went on) or ``failed`` (the attempt failed on it). Its failure is
    ``Kind.SAVE_FAILED`` (``failure_kind``: how every view words it).
    """

    kind: ClassVar[str] = "save_failed"
    failure_kind: ClassVar[Kind] = Kind.SAVE_FAILED
    origin: Origin
    step: int
    error: str
    consecutive: int
    action: str
    time: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSkipped(_Record):
    """Step ``step``'s update was applied on no rank: the loss was not finite on ``ranks`` rank(s).

    ``loss`` is this rank's own. ``consecutive``: skipped steps in a row, this one included. Written at ``time``.
    ``culprit``: the rank whose loss was not finite when it was one rank (None: several, or not recorded). Its
    failure is ``Kind.NONFINITE_LOSS`` (``failure_kind``: how every view words it).
    """

    kind: ClassVar[str] = "step_skipped"
    failure_kind: ClassVar[Kind] = Kind.NONFINITE_LOSS
    origin: Origin
    step: int
    loss: float
    ranks: int
    consecutive: int
    time: float
    culprit: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Resumed(_Record):
    """The ``pretrain`` call resumed training after step ``step`` from ``source``, at ``time`` (wall clock).

    ``source``: ``memory`` (the run's copy in node memory, ``lifecycle._training.memory``)
    or ``checkpoint`` (the committed checkpoint every rank agreed on). ``checkpoint_step``: the
    newest committed checkpoint rank 0 saw when the step was chosen (None: none). Version 4.
    """

    kind: ClassVar[str] = "resume"
    origin: Origin
    step: int
    source: str
    checkpoint_step: int | None
    time: float


@dataclass(frozen=True, slots=True, kw_only=True)
class JobDecision(_Record):
    """The job's decision after its failed attempt ``after_attempt`` (0-based, job-wide), made at ``time`` (wall clock).

    Written once per failed attempt, by the rank that recorded the decision (``decide_after``,
    ``lifecycle._training.retry``), into its own journal, with the origin of the attempt
    that failed. ``action``: ``restart`` or ``stop``; ``reason``: why (``may_recover``,
    ``not_restartable``, ``reproducible``, ``repeated_culprit``, ``budget``,
    ``no_progress``); ``words``: the reason in a sentence; ``details``: its facts (the
    culprit's ``host`` / ``rank``, counts and limits); ``exit_code``: what a worker exits
    with (93 for a stop, 1 for a restart). ``after_attempt`` counts the job's failed attempts
    (``Decision.attempt``; the origin's ``attempt`` is the ``pretrain`` call's). Version 4.
    """

    kind: ClassVar[str] = "decision"
    origin: Origin
    action: str
    reason: str
    after_attempt: int
    words: str
    details: dict[str, str | int | float | bool | None] = dataclasses.field(default_factory=dict)
    exit_code: int
    time: float

    def line(self) -> str:
        """``stop (reproducible): ...``: how ``show`` says it."""
        return f"{self.action} ({self.reason}): {self.words}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Suspicion(_Record):
    """A liveness monitor suspects rank ``culprit`` (``evidence``) at ``time``: journaled, not yet a verdict.

    A suspicion kills nothing and names no cause; it is withdrawn (``Withdrawal``) when
    progress resumes, or followed by a ``Verdict``. ``stacks``: the file its Python
    stacks were dumped into ("" if none). Version 4.
    """

    kind: ClassVar[str] = "suspicion"
    origin: Origin
    culprit: int
    evidence: Evidence
    time: float
    stacks: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Withdrawal(_Record):
    """A liveness monitor withdrew its suspicion of rank ``culprit`` at ``time``: it made progress again.

    ``step``, ``phase``: where it was seen moving again. Version 4.
    """

    kind: ClassVar[str] = "withdrawal"
    origin: Origin
    culprit: int
    time: float
    step: int | None = None
    phase: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupPosition:
    """Where a rank stood in one process group's collectives: its ``label`` (``data-parallel``, ``default``,
    ``group 3 (ranks 0, 1)``), the sequence numbers of the last collective it ``entered`` and of the last it saw
    finish (``left``: inside one while ``entered > left``), and that collective's ``op`` (docs/collectives.md)."""

    label: str
    entered: int
    left: int
    op: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Collectives(_Record):
    """Where this rank stood in each process group's collectives (``groups``) when it failed, at ``time``, at
    ``step``/``phase``: written by the rank on its failure edge (with liveness on). ``show`` lists them per attempt
    and group. Version 4."""

    kind: ClassVar[str] = "collectives"
    origin: Origin
    time: float
    groups: tuple[GroupPosition, ...]
    step: int | None = None
    phase: str = ""


Record: TypeAlias = (
    RunStart
    | Transition
    | TeardownStep
    | Left
    | TrainStep
    | Eval
    | RunEnd
    | Failure
    | Verdict
    | MonitorLost
    | FailedSave
    | StepSkipped
    | JobDecision
    | Resumed
    | Suspicion
    | Withdrawal
    | Collectives
)
"""Any journal record."""

_CLASSES = (RunStart, Transition, TeardownStep, Left, TrainStep, Eval, RunEnd, Failure, Verdict, MonitorLost)
_V4 = (Suspicion, Withdrawal, FailedSave, StepSkipped, JobDecision, Resumed, Collectives)
KINDS: dict[str, type[Record]] = {c.kind: c for c in (*_CLASSES, *_V4)}
"""Each record class by its JSON ``kind``."""

_ORIGIN = compile_fields(Origin)
_COMPILED: dict[type[Record], Fields] = {cls: compile_fields(cls, skip=frozenset({"origin"})) for cls in KINDS.values()}

_ORIGIN_SIZE = len(_ORIGIN.fields)


def _check_flat(compiled: Mapping[type[Record], Fields]) -> None:
    """``TypeError`` at import for a record field named as an ``Origin`` field: the JSON object is flat, so the
    record's value would overwrite the origin's (``attempt``)."""
    for cls, fields in compiled.items():
        clash = {f.name for f in fields.fields} & {f.name for f in _ORIGIN.fields}
        if clash:
            raise TypeError(f"{cls.__qualname__} has field(s) {sorted(clash)} named as Origin's: the JSON is flat")


_check_flat(_COMPILED)

Shared = dict[Any, Any]
"""What the records of one reading share, so that 300,000 records hold a few thousand objects for them: each
``Origin`` by the tuple of its values, and each value of a ``str`` field by itself (the same few words on every
line: ``failure``, ``abort_process_group``, ``session``)."""
_MOST_SHAPES = 1024


class _Kind:
    """How records of one kind are read: the checked way (``fields``) and, for the usual lines, a fast one.

    A line whose every field is present with a type its field takes as it is (``exact``)
    needs no conversion and no check beyond that: ``shapes`` is every such tuple of
    value types (origin fields first), ``get`` takes the values out of the JSON object in
    one call, and the record is made from them by setting its slots (no field of a record
    has a ``__post_init__`` to run). Kinds with a field of no ``exact`` type (a list, a
    nested record) or too many shapes are always read the checked way.
    """

    __slots__ = ("cls", "fields", "get", "setters", "shapes", "texts")

    def __init__(self, cls: type[Record], fields: Fields) -> None:
        """Compile the fast way of ``cls`` (compiled ``fields``), where it has one."""
        self.cls = cls
        self.fields = fields
        every = (*_ORIGIN.fields, *fields.fields)
        shapes: set[tuple[type, ...]] = {()}
        for field in every:
            shapes = {(*shape, kind) for shape in shapes for kind in field.type.exact}
            if len(shapes) > _MOST_SHAPES:
                shapes = set()
        self.shapes = frozenset(shapes)
        self.get = operator.itemgetter(*(f.name for f in every))
        slots = ["origin", *(f.name for f in fields.fields)]
        self.setters = tuple(getattr(cls, name).__set__ for name in slots)
        self.texts = tuple(i for i, f in enumerate(fields.fields) if f.type.exact == {str})

    def fast(self, data: Mapping[str, Any], shared: Shared | None) -> Record | None:
        """The record in ``data`` if it has the usual shape (see the class), else None (read it the checked way)."""
        try:
            values = self.get(data)
        except KeyError:
            return None
        if tuple(map(type, values)) not in self.shapes:
            return None
        key = values[:_ORIGIN_SIZE]
        origin = None if shared is None else shared.get(key)
        if origin is None:
            origin = Origin(*key)
            if shared is not None:
                shared[key] = origin
        own = values[_ORIGIN_SIZE:]
        if shared is not None and self.texts:  # a word seen before: its first string
            own = list(own)
            for i in self.texts:
                text = own[i]
                own[i] = shared.setdefault(text, text)
        record: Record = object.__new__(self.cls)
        setters = self.setters
        setters[0](record, origin)
        for setter, value in zip(setters[1:], own, strict=True):
            setter(record, value)
        return record


_BY_KIND: dict[str, _Kind] = {kind: _Kind(cls, _COMPILED[cls]) for kind, cls in KINDS.items()}


def usual(data: Any, shared: Shared) -> Record | None:
    """The record in ``data`` if it is the usual line: a version 4 JSON object of a known kind whose every field
    has a type it takes as it is (see ``_Kind``); else None, to be read the checked way (``build``)."""
    if type(data) is not dict:
        return None
    version, kind = data.get("version"), data.get("kind")
    if type(version) is not int or version != VERSION or type(kind) is not str:
        return None
    known = _BY_KIND.get(kind)
    return known.fast(data, shared) if known is not None and known.shapes else None


def build(data: Mapping[str, Any], shared: Shared | None = None) -> Record:
    """The version 4 record in the JSON object ``data`` (its ``version`` already checked; its text too).

    ``shared``: the ``Origin`` objects built so far, by value; a record of an origin
    seen before shares its object (a journal's records share a handful of shared).
    ``ValueError`` ``field 'x' ...`` on an unknown ``kind`` or a bad field.
    """
    kind = data.get("kind")
    known = _BY_KIND.get(kind) if type(kind) is str else None
    if known is None:
        if "kind" not in data:
            raise ValueError("field 'kind' is missing")
        raise ValueError(f"field 'kind' is {brief(kind)}: unknown record kind (known: {', '.join(KINDS)})")
    record = known.fast(data, shared) if known.shapes else None
    if record is None:
        origin = Origin(**_ORIGIN.values(data))
        if shared is not None:
            origin = shared.setdefault(tuple(dataclasses.astuple(origin)), origin)
        record = known.cls(origin=origin, **known.fields.values(data))
    return record


def check_text(data: Mapping[str, Any]) -> None:
    """``ValueError`` ``field 'x' is not valid text: ...`` if a field of ``data`` holds a lone surrogate."""
    for key, value in data.items():
        problem = text_problem(value)
        if problem is not None:
            where, _, why = problem.partition(": ")
            raise ValueError(f"field {key + where!r} is not valid text: {why}")


def unknown_version(data: Mapping[str, Any]) -> ValueError:
    """The error for a record of a version this module does not read."""
    version = brief(data.get("version"))
    return ValueError(f"field 'version' is {version}: journal version {version} is not supported (known: 1, 2, 3, 4)")
