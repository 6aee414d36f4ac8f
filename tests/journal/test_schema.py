"""The journal's schema, version 3: field types of any JSON type, no prose in data fields, v1 and v2 still read.

Torch-free. The records as a session's run writes them are pinned in ``tests/core/test_journal.py``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.internals import synthetic
from support.journals import v1_failed_call

from lifecycle.journal import (
    KINDS,
    VERSION,
    Collectives,
    FailedSave,
    Failure,
    GroupPosition,
    JobDecision,
    Left,
    MonitorLost,
    Origin,
    Record,
    Resumed,
    RunEnd,
    RunStart,
    StepSkipped,
    Suspicion,
    TeardownStep,
    TrainStep,
    Transition,
    Verdict,
    Withdrawal,
    parse,
    read,
)
from lifecycle.journal._records import _check_flat, build, usual
from lifecycle.journal._schema import compile_fields
from lifecycle.journal.evidence import Evidence, Kind

ORIGIN = Origin(run_id="r", rank=0, attempt=0, restart_mode="ordinary", iteration=0)
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@dataclass(frozen=True, slots=True)
class _Point:
    """A nested record: a JSON object inside a field."""

    x: int
    label: str = ""


@dataclass(frozen=True, slots=True)
class _EveryType:
    """A record with a field of every JSON type the schema supports."""

    flag: bool
    count: int
    ratio: float
    text: str
    nothing: None
    maybe: int | None
    items: list[int]
    names: tuple[str, ...]
    table: dict[str, float]
    point: _Point
    points: list[_Point]
    either: float | str = 0.0


EVERY = _EveryType(
    flag=True,
    count=3,
    ratio=0.5,
    text="é",
    nothing=None,
    maybe=None,
    items=[1, 2],
    names=("a", "b"),
    table={"a": 1.5},
    point=_Point(1, "p"),
    points=[_Point(2), _Point(3, "q")],
    either="s",
)


def test_a_record_field_of_any_json_type_round_trips_through_json() -> None:
    """bool, int, float, str, None, unions, lists, tuples, dicts, nested records: dumped, decoded, read back equal."""
    fields = compile_fields(_EveryType)
    text = json.dumps(fields.dump(EVERY))
    assert _EveryType(**fields.values(json.loads(text))) == EVERY
    assert json.loads(text)["point"] == {"x": 1, "label": "p"}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("flag", 1, "field 'flag' must be bool, got 1"),
        ("count", True, "field 'count' must be int, got True"),
        ("count", 1.0, "field 'count' must be int, got 1.0"),
        ("ratio", "1", "field 'ratio' must be float, got '1'"),
        ("maybe", "x", "field 'maybe' must be int | None, got 'x'"),
        ("items", [1, "2"], r"field 'items\[1\]' must be int, got '2'"),
        ("items", 5, r"field 'items' must be a JSON array \(list\[int\]\), got 5"),
        ("table", {"a": "b"}, "field 'table.a' must be float, got 'b'"),
        ("point", {"label": "no x"}, "field 'point.x' is missing"),
        ("points", [{"x": 1}, {"x": "2"}], r"field 'points\[1\].x' must be int, got '2'"),
    ],
)
def test_a_field_of_the_wrong_json_type_is_named_with_its_path(field: str, value: Any, message: str) -> None:
    """A value of another type, at any depth, raises ValueError naming the field's path, its type and the value."""
    fields = compile_fields(_EveryType)
    data = fields.dump(EVERY) | {field: value}
    with pytest.raises(ValueError, match=message):
        fields.values(data)


def test_an_integer_reads_as_a_float_where_a_float_is_declared() -> None:
    """JSON does not tell 1 from 1.0: a float field takes an integer, as a float."""
    fields = compile_fields(_EveryType)
    values = fields.values(fields.dump(EVERY) | {"ratio": 2})
    assert values["ratio"] == 2.0 and type(values["ratio"]) is float


@pytest.mark.parametrize("annotation", ["set[int]", "bytes", "Any", "list", "dict[int, str]", "tuple[int, str]"])
def test_a_field_of_a_type_json_cannot_hold_fails_when_compiled(annotation: str) -> None:
    """A field typed set, bytes, Any, a bare list, dict with non-str keys or a fixed tuple: TypeError naming it."""
    namespace: dict[str, Any] = {}
    source = (
        "from dataclasses import dataclass\nfrom typing import Any\n"
        f"@dataclass(frozen=True)\nclass Bad:\n    ok: int\n    wrong: {annotation}\n"
    )
    exec(compile(source, "<record>", "exec", dont_inherit=True), namespace)  # this file's __future__ import left out
    with pytest.raises(TypeError, match=r"Bad\.wrong has type .*, which is no JSON type"):
        compile_fields(namespace["Bad"])


def test_a_record_module_with_a_field_json_cannot_hold_fails_at_import(tmp_path: Path) -> None:
    """The record types are compiled when ``lifecycle.journal`` loads: a bad field type stops the import, by name."""
    records = Path(__file__).resolve().parents[2] / "lifecycle" / "journal" / "_records.py"
    text = records.read_text(encoding="utf-8")
    anchor = '    kind: ClassVar[str] = "left"\n    origin: Origin\n'
    assert anchor in text
    package = tmp_path / "lifecycle" / "journal"
    package.mkdir(parents=True)
    for source in records.parent.glob("*.py"):
        (package / source.name).write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    (package / "_records.py").write_text(text.replace(anchor, anchor + "    tags: set[str]\n"), encoding="utf-8")
    (tmp_path / "lifecycle" / "__init__.py").write_text("", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", "import lifecycle.journal"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "TypeError: Left.tags has type set[str], which is no JSON type" in done.stderr


def test_every_record_kind_is_compiled_and_its_fields_have_json_types() -> None:
    """Each record kind's fields compile (the import did it); the kinds are the documented ones."""
    assert set(KINDS) == {
        "run",
        "transition",
        "teardown",
        "left",
        "step",
        "eval",
        "end",
        "failure",
        "verdict",
        "monitor_lost",
        "suspicion",
        "withdrawal",
        "save_failed",
        "step_skipped",
        "decision",
        "resume",
        "collectives",
    }
    for cls in KINDS.values():
        names = [f.name for f in compile_fields(cls, skip=frozenset({"origin"})).fields]
        assert names == [f.name for f in dataclasses.fields(cls) if f.name != "origin"]


def test_version_3_keeps_a_resources_kind_name_and_owner_apart() -> None:
    """A left resource and a teardown step carry kind, name and owner in fields of their own: no prose to parse."""
    left = Left(origin=ORIGIN, resource="user", name="cache", owner="caller", reason="owned by the caller")
    step = TeardownStep(
        origin=ORIGIN, outcome="failure", step="release_user_resource", resource="user", name="cache", owner="caller",
        start=1.0, end=2.0,
    )  # fmt: skip
    assert left.to_json()["version"] == VERSION == 4
    assert {k: left.to_json()[k] for k in ("resource", "name", "owner")} == {
        "resource": "user", "name": "cache", "owner": "caller"
    }  # fmt: skip
    assert {k: step.to_json()[k] for k in ("step", "resource", "name")} == {
        "step": "release_user_resource", "resource": "user", "name": "cache"
    }  # fmt: skip
    assert parse(left.to_json()) == left and parse(step.to_json()) == step


def test_a_version_2_journal_reads_as_version_3_records() -> None:
    """The v2 fixture (prose in ``step`` and ``resource``) reads with kind, name and owner apart."""
    records = read([FIXTURES / "v2" / "rank0.jsonl"])
    steps = [(r.step, r.resource, r.name, r.owner) for r in records if isinstance(r, TeardownStep)]
    assert steps == [
        ("abort_process_group", "process_group", "", "session"),
        ("release_user_resource", "user", "cache", "caller"),
    ]
    lefts = [(r.resource, r.name, r.owner, r.reason) for r in records if isinstance(r, Left)]
    assert lefts == [
        ("model_parallel", "", "restart_wrapper", "deferred to the restart wrapper"),
        ("user", "kv:store", "caller", "owned by the caller"),
    ]
    assert [r.step for r in records if isinstance(r, TrainStep)] == [1, 2]
    assert {r.origin for r in records} == {Origin("job-2", 0, 1, "ordinary", 0, restart_count=1)}


def test_a_version_1_journal_fixture_reads_as_version_3_records() -> None:
    """The v1 fixture (the v1 writer's lines, checked in) reads: the teardown step and left resource kept apart."""
    path = FIXTURES / "v1" / "rank0.jsonl"
    assert [json.loads(line) for line in path.read_text().splitlines()] == v1_failed_call()
    records = read([path])
    assert [r.kind for r in records] == ["run", "transition", "teardown", "left", "transition", "step", "step", "eval",
                                         "end"]  # fmt: skip
    teardown, left = records[2], records[3]
    assert isinstance(teardown, TeardownStep) and (teardown.step, teardown.name) == ("abort_process_group", "")
    assert isinstance(left, Left) and (left.resource, left.name, left.owner) == ("x", "", "caller")


def test_the_fast_reading_of_a_usual_line_gives_what_the_checked_reading_gives() -> None:
    """Every kind's usual line (exact field types) is read fast, equal to the checked read; anything else is not."""
    synthetic_run = synthetic.failing_run("r", 3, 1)[1] + synthetic.rank_call(ORIGIN, 1, 5.0, steps=1)
    left = Left(origin=ORIGIN, resource="user", name="cache", owner="caller", reason="owned by the caller")
    verdict = Verdict(
        origin=ORIGIN, culprit=1, verdict="stopped", phase="step", step=3, note="rank 1 is stopped", time=5.0, seq=1
    )
    lost = MonitorLost(
        origin=ORIGIN, pid=7, how="was killed by SIGKILL", action="restarted", phase="step", step=3, note="…",
        time=5.0, new_pid=8,
    )  # fmt: skip
    failed_save = FailedSave(
        origin=ORIGIN, step=4, error="rank 1 could not write: [Errno 28 ENOSPC]", consecutive=1,
        action="continued", time=5.0,
    )  # fmt: skip
    skipped = StepSkipped(origin=ORIGIN, step=5, loss=float("inf"), ranks=1, consecutive=1, time=6.0)
    decided = JobDecision(
        origin=ORIGIN, action="restart", reason="may_recover", after_attempt=0, words="…", exit_code=1, time=7.0
    )
    suspicion = Suspicion(origin=ORIGIN, culprit=1, evidence=Evidence("hang", 1, 3, "batch", "S", 4.0, 2.0), time=4.0)
    withdrawal = Withdrawal(origin=ORIGIN, culprit=1, time=4.5, step=4, phase="batch")
    resumed = Resumed(origin=ORIGIN, step=4, source="memory", checkpoint_step=None, time=4.2)
    stood = Collectives(
        origin=ORIGIN, time=4.3, groups=(GroupPosition(label="default", entered=3, left=2, op="barrier"),)
    )
    records = [
        *synthetic_run, left, verdict, lost, suspicion, withdrawal, failed_save, skipped, decided, resumed, stood
    ]  # fmt: skip
    assert {r.kind for r in records} == set(KINDS) - {"eval"}
    shared: dict[object, object] = {}
    fast = []
    for record in records:
        data = record.to_json()
        fast.append(usual(data, shared))
        if isinstance(record, Suspicion | JobDecision | Collectives):  # nested fields: read the checked way
            assert fast.pop() is None and build(data) == record
            continue
        assert fast[-1] == build(data) == record and type(fast[-1]) is type(record)
    assert len({id(r.origin) for r in fast if r is not None}) == 2  # one Origin object per origin
    owners = [r.owner for r in fast if isinstance(r, TeardownStep)]
    assert len(owners) > 1 and len({id(owner) for owner in owners}) == 1  # one string per word
    data = TrainStep(origin=ORIGIN, step=1, loss=1.0, start=1.0, end=2.0).to_json()
    for unusual in (data | {"start": 1}, data | {"rank": True}, data | {"step": 1.0}, data | {"version": 2}):
        assert usual(unusual, {}) is None  # read the checked way: converted (1 -> 1.0) or refused
    assert build(data | {"start": 1}) == parse(data | {"start": 1.0})
    with pytest.raises(ValueError, match="field 'rank' must be int, got True"):
        build(data | {"rank": True})


def v4_records() -> list[Record]:
    """One rank's version 4 journal, every record kind version 4 added or typed: the run's liveness deadlines, the
    failure with its evidence and the first failure's, a suspicion, its withdrawal, a release by the restart
    wrapper's abort, a verdict with its evidence that killed the rank, a failed save, a skipped step (its culprit),
    a resume from the copy in node memory, the job's decision after the attempt; the v4 fixture holds these lines
    (an issue that adds a record kind or field adds it here and rewrites the fixture)."""
    o = Origin("job-4", 1, 0, "ordinary", 0)
    hang = Evidence("hang", 1, 41, "batch", "S", 4.1, 2.0, "monitor")
    return [
        RunStart(origin=o, world_size=2, pid=11, host="h", start=20.0, liveness="kill: every 1 s"),
        Transition(origin=o, source="globals_ready", dest="training", trigger="start_training", start=20.3, end=20.4),
        Resumed(origin=o, step=39, source="memory", checkpoint_step=30, time=20.35),
        TrainStep(origin=o, step=40, loss=2.5, start=20.4, end=20.5),
        FailedSave(
            origin=o, step=40, error="rank 1: [Errno 28 ENOSPC]", consecutive=1, action="continued", time=20.6,
        ),
        StepSkipped(origin=o, step=41, loss=2.5, ranks=1, consecutive=1, time=20.7, culprit=0),
        Suspicion(origin=o, culprit=1, evidence=Evidence("hang", 1, 12, "batch", "S", 1.2, 2.0, "monitor"), time=21.0),
        Withdrawal(origin=o, culprit=1, time=21.5, step=13, phase="batch"),
        MonitorLost(
            origin=o, pid=12, how="was killed by SIGKILL", action="restarted", phase="step", step=14, note="…",
            time=22.0, new_pid=13,
        ),
        TeardownStep(
            origin=o, outcome="wrapper_abort", step="abort_process_group", resource="process_group",
            owner="restart_wrapper", start=25.2, end=25.3,
            note="released by the restart wrapper's abort (NVRx's monitor thread)",
        ),
        Failure(
            origin=o, phase="step", step=41, error="StoppedByLauncher: SIGTERM after rank 0 died", time=25.5, seq=2,
            first_rank=0, note="lifecycle: rank 0 failed first (step 41, phase step; it died): LivenessVerdict: ...",
            evidence=Evidence("stopped_by_launcher", 1, 41, "step"), first=Evidence("died", 0, 41, "step", "", 3.0),
        ),
        Verdict(
            origin=o, culprit=1, verdict="hang", phase="batch", step=41, note="rank 1 hung at step 41, phase batch",
            time=25.0, seq=1, stacks="/tmp/j/rank1.stacks.txt", evidence=hang, killed=True,
        ),
        RunEnd(
            origin=o, state="failed", exit_reason="stopped_by_launcher", final_step=40, checkpoint_step=None,
            error="StoppedByLauncher: SIGTERM after rank 0 died", end=26.0,
        ),
        JobDecision(
            origin=o, action="stop", reason="repeated_culprit", after_attempt=2,
            words="host h caused the last 3 failed attempts: exclude it and resubmit",
            details={"host": "h", "rank": 1, "window_s": 1800.0, "known": True, "none": None}, exit_code=93, time=26.5,
        ),
    ]  # fmt: skip


def test_the_version_4_fixture_is_what_the_writer_writes_and_reads_back_typed() -> None:
    """The v4 fixture (checked in) holds exactly the lines ``v4_records`` writes today, and reads back as them: the
    evidence fields typed, suspicion and withdrawal their own kinds. A schema change that forgets the fixture fails."""
    path = FIXTURES / "v4" / "rank1.jsonl"
    expected = v4_records()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [r.to_json() for r in expected]
    records = read([path])
    assert records == expected
    verdict = next(r for r in records if isinstance(r, Verdict))
    assert verdict.evidence is not None and verdict.evidence.what is Kind.HANG and verdict.killed
    assert [r.kind for r in records if isinstance(r, Suspicion | Withdrawal)] == ["suspicion", "withdrawal"]


def test_a_version_3_journal_reads_as_version_4_records_without_evidence() -> None:
    """The v3 fixture (checked in): its ``waiting`` verdict reads as ``hang`` (one name per concept), with no typed
    evidence, not killed by the field (v3 had none); every other record as it was written."""
    records = read([FIXTURES / "v3" / "rank1.jsonl"])
    assert [r.kind for r in records] == ["run", "transition", "transition", "transition", "step", "verdict"]
    verdict = records[-1]
    assert isinstance(verdict, Verdict) and verdict.verdict == "hang" and verdict.evidence is None
    assert not verdict.killed and verdict.stacks == "/tmp/j/rank1.stacks.txt"
    assert {r.origin for r in records} == {Origin("job-3", 1, 0, "ordinary", 0)}


def test_a_record_field_named_as_an_origin_field_is_refused_at_import() -> None:
    """A record's JSON object is flat: a field ``attempt`` would overwrite the origin's, so it is a ``TypeError``."""

    @dataclass(frozen=True, slots=True, kw_only=True)
    class _Shadow:
        origin: Origin
        attempt: int

    with pytest.raises(TypeError, match=r"_Shadow has field\(s\) \['attempt'\] named as Origin's"):
        _check_flat({_Shadow: compile_fields(_Shadow, skip=frozenset({"origin"}))})  # type: ignore[dict-item]
