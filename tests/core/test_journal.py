"""Journals as a session's run writes them: typed records round-trip, torn lines, v1 files, the run id, observers.

Torch-free. The schema itself (field types, versions 2 and 3) is pinned in ``tests/journal``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from support.internals import RunJournal
from support.journals import v1_failed_call

from lifecycle import Session, State
from lifecycle.journal import (
    V1_RUN_ID,
    VERSION,
    Eval,
    JournalWriter,
    Left,
    Origin,
    Record,
    RunEnd,
    RunStart,
    TeardownStep,
    TrainStep,
    Transition,
    load,
    parse,
    read,
    restart_count,
    run_id,
)
from lifecycle.lowlevel import FailureEvent, SessionEvent, TransitionEvent
from lifecycle.testing import RecordingActions

ORIGIN = Origin(run_id="job-7", rank=1, attempt=2, restart_mode="inprocess", iteration=3, restart_count=1)


def start(at: float = 100.0, origin: Origin = ORIGIN) -> RunStart:
    """A run start record."""
    return RunStart(origin=origin, world_size=2, pid=42, host="node", start=at)


def one_of_each() -> list[Record]:
    """One record of every kind, in the order a run writes them."""
    return [
        start(),
        Transition(origin=ORIGIN, source="uninitialized", dest="dist_ready", trigger="init_distributed",
                   start=100.1, end=100.2, detail="restart_mode=inprocess iteration=3", agreed_attempt=4,
                   store_prefix="lifecycle/g1/attempt-4"),
        TrainStep(origin=ORIGIN, step=1, loss=3.25, start=100.3, end=100.4),
        Eval(origin=ORIGIN, step=1, loss=3.5, start=100.4, end=100.5),
        TeardownStep(origin=ORIGIN, outcome="failure", step="abort_process_group", resource="process_group",
                     owner="session", start=100.6, end=100.7, error="RuntimeError('x')"),
        Left(origin=ORIGIN, resource="model_parallel", owner="restart_wrapper",
             reason="deferred to the restart wrapper"),
        TeardownStep(origin=ORIGIN, outcome="failure", step="release_user_resource", resource="user", name="cache",
                     owner="caller", start=100.7, end=100.75),
        Transition(origin=ORIGIN, source="training", dest="failed", trigger="fail", start=100.5, end=100.8),
        RunEnd(origin=ORIGIN, state="failed", exit_reason=None, final_step=1, checkpoint_step=None,
               error="InjectedFault: boom", end=100.9),
    ]  # fmt: skip


def test_every_record_kind_round_trips_through_the_writer_and_reader(tmp_path: Path) -> None:
    """Each record type is written as one versioned JSON line and read back equal, in order."""
    records = one_of_each()
    path = tmp_path / "rank1.jsonl"
    with JournalWriter(path, records[0]) as writer:
        for record in records[1:]:
            writer.write(record)
    lines = path.read_text().splitlines()
    assert len(lines) == len(records)
    assert all(json.loads(line)["version"] == VERSION for line in lines)
    assert json.loads(lines[2]) | {} == {
        "version": 4, "kind": "step", "run_id": "job-7", "rank": 1, "attempt": 2, "restart_mode": "inprocess",
        "iteration": 3, "restart_count": 1, "step": 1, "loss": 3.25, "start": 100.3, "end": 100.4,
    }  # fmt: skip
    moved = json.loads(lines[1])
    assert (moved["agreed_attempt"], moved["store_prefix"]) == (4, "lifecycle/g1/attempt-4")
    assert read([tmp_path]) == records
    assert {type(r) for r in records} == {RunStart, Transition, TrainStep, Eval, TeardownStep, Left, RunEnd}


def test_each_record_is_on_disk_as_soon_as_it_is_written(tmp_path: Path) -> None:
    """A record can be read from the file while its writer is still open (flushed, not buffered)."""
    path = tmp_path / "rank1.jsonl"
    writer = JournalWriter(path, start())
    writer.write(TrainStep(origin=ORIGIN, step=5, loss=1.0, start=1.0, end=2.0))
    assert [type(r) for r in read([path])] == [RunStart, TrainStep]
    writer.close()


def test_reopening_a_file_with_a_torn_last_line_starts_on_a_fresh_line(tmp_path: Path) -> None:
    """A writer opening a file whose last byte is not a newline writes one first; the torn line is reported."""
    path = tmp_path / "rank1.jsonl"
    with JournalWriter(path, start()) as writer:
        writer.write(TrainStep(origin=ORIGIN, step=1, loss=1.0, start=1.0, end=2.0))
    with open(path, "ab") as f:
        f.write(b'{"version": 3, "kind": "st')  # killed mid-write
    with JournalWriter(path, start(200.0)):
        pass
    lines = path.read_bytes().split(b"\n")
    assert lines[2] == b'{"version": 3, "kind": "st' and json.loads(lines[3])["start"] == 200.0
    loaded = load([path])
    assert [type(r) for r in loaded.records] == [RunStart, TrainStep, RunStart]
    assert loaded.torn == (f"{path}:3",)


def test_a_torn_last_line_is_read_up_to_the_last_whole_record(tmp_path: Path) -> None:
    """A file whose last line stops mid-record yields every whole record before it and names the torn line."""
    path = tmp_path / "rank1.jsonl"
    records = one_of_each()[:3]
    with JournalWriter(path, records[0]) as writer:
        for record in records[1:]:
            writer.write(record)
    whole = json.dumps(one_of_each()[3].to_json())
    with open(path, "a") as f:
        f.write(whole[: len(whole) // 2])
    loaded = load([tmp_path])
    assert list(loaded.records) == records
    assert loaded.torn == (f"{path}:4",)


def _journal_text(records: list[Record]) -> str:
    """``records`` as a journal's lines, each ending in a newline."""
    return "".join(json.dumps(record.to_json()) + "\n" for record in records)


def test_a_torn_line_anywhere_is_skipped_and_listed(tmp_path: Path) -> None:
    """A record cut off mid-write is skipped wherever it is: mid-file, before a record that is no writer's start,
    as the last line with a newline after it, cut inside a UTF-8 character. The old reader rejected each file whole."""
    records = one_of_each()
    whole = [json.dumps(r.to_json()) for r in records]
    arrow = json.dumps(records[1].to_json() | {"detail": "a → b"}, ensure_ascii=False).encode()
    lines = [
        whole[0].encode(),
        whole[1][:50].encode(),  # cut; the next line is a Step, no writer's RunStart
        whole[2].encode(),
        arrow[: arrow.index("→".encode()) + 1],  # cut inside the arrow's 3 bytes
        whole[3].encode(),
        whole[4][: len(whole[4]) // 2].encode(),  # the last line, cut, then a newline (an editor, a copy)
    ]
    path = tmp_path / "rank1.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    loaded = load([path])
    assert list(loaded.records) == [records[0], records[2], records[3]]
    assert loaded.torn == (f"{path}:2", f"{path}:4", f"{path}:6")


def test_a_whole_line_that_is_no_record_names_its_file_and_line(tmp_path: Path) -> None:
    """Text that is not JSON, not UTF-8, nested past the parser's depth or not an object raises ValueError naming
    file:line (the old reader let the nesting out as a RecursionError)."""
    path = tmp_path / "rank0.jsonl"
    good = json.dumps(start().to_json())
    for line, message in [
        (b"garbage", "not a journal record: not JSON"),
        (b'{"version": 2} trailing', "not a journal record: not JSON"),
        (b'{"version": 2, "host": "\xff"}', "not UTF-8 text: byte 0xff at column 25"),
        (b"[" * 100_000, "not a journal record: JSON nested too deeply"),
        (b"[1, 2]", "not a journal record: a JSON list, not an object"),
    ]:
        path.write_bytes(good.encode() + b"\n" + line + b"\n" + good.encode() + b"\n")
        with pytest.raises(ValueError, match=rf"^{path}:2: {message}"):
            read([path])


def test_a_folder_stands_for_its_rank_files_only(tmp_path: Path) -> None:
    """A folder's rank<R>.jsonl files are read in rank order; its other *.jsonl are not, a note naming those that
    look like journals; a file given by name is read whatever its name. The old reader read every *.jsonl."""
    for rank in (10, 2):
        (tmp_path / f"rank{rank}.jsonl").write_text(_journal_text([start(float(rank), replace(ORIGIN, rank=rank))]))
    copy = tmp_path / "rank2-old.jsonl"
    copy.write_text(_journal_text([start(1.0)]))
    (tmp_path / "metrics.jsonl").write_text('{"loss": 1.5}\n')
    (tmp_path / "rank3.jsonl.bak").write_text("anything\n")
    loaded = load([tmp_path])
    assert [r.origin.rank for r in loaded.records] == [2, 10]
    assert loaded.ignored == (
        f"{copy}: ignored: it looks like a journal, but only rank<R>.jsonl files of a folder are read"
        " (name the file to read it)",
    )
    assert read([copy]) == [start(1.0)]


def test_a_record_with_a_bad_field_or_version_is_rejected(tmp_path: Path) -> None:
    """A missing field, a wrong type, an unknown kind or version, unprintable text: ValueError "field 'x' ..."."""
    data = TrainStep(origin=ORIGIN, step=1, loss=1.0, start=1.0, end=2.0).to_json()
    assert parse(data) == TrainStep(origin=ORIGIN, step=1, loss=1.0, start=1.0, end=2.0)
    for bad, message in [
        ({k: v for k, v in data.items() if k != "loss"}, "field 'loss' is missing"),
        (data | {"step": "one"}, "field 'step' must be int, got 'one'"),
        ({k: v for k, v in data.items() if k != "kind"}, "field 'kind' is missing"),
        (data | {"kind": "nope"}, "field 'kind' is 'nope': unknown record kind"),
        (data | {"kind": ["step"]}, r"field 'kind' is \['step'\]: unknown record kind"),
        (data | {"version": 5}, "field 'version' is 5: journal version 5 is not supported"),
        (data | {"rank": None}, "field 'rank' must be int"),
        (data | {"run_id": "\udcff"}, "field 'run_id' is not valid text: surrogates not allowed"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse(bad)
    path = tmp_path / "rank0.jsonl"
    path.write_text(_journal_text([start()]) + json.dumps(data | {"step": 2.5}) + "\n")
    with pytest.raises(ValueError, match=rf"^{path}:2: field 'step' must be int, got 2.5$"):
        read([path])


def test_a_version_1_record_with_a_bad_field_names_it(tmp_path: Path) -> None:
    """A v1 record missing a field or with a field of the wrong type raises "file:line: field 'x' ..."."""
    run, transition, *_, end = v1_failed_call()
    path = tmp_path / "rank0.jsonl"
    for bad, message in [
        ({k: v for k, v in transition.items() if k != "at"}, "field 'at' is missing"),
        (transition | {"at": "noon"}, "field 'at' must be float, got 'noon'"),
        ({k: v for k, v in transition.items() if k != "rank"}, "field 'rank' is missing"),
        (end | {"losses": [[1]]}, r"field 'losses' must be a list of \[step, loss\] pairs"),
        (transition | {"kind": "nope"}, "field 'kind' is 'nope': unknown version 1 record kind"),
        ({"loss": 1.5}, "field 'kind' is missing"),
    ]:
        path.write_text(json.dumps(run) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=rf"^{path}:2: {message}"):
            read([path])


def test_a_version_1_file_is_still_read(tmp_path: Path) -> None:
    """v1 records become version 3 records: times start/end, losses as TrainStep/Eval records, the v1 run id."""
    path = tmp_path / "rank0.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in v1_failed_call()))
    records = read([path])
    kinds = [r.kind for r in records]
    assert kinds == ["run", "transition", "teardown", "left", "transition", "step", "step", "eval", "end"]
    assert {r.origin for r in records} == {Origin(V1_RUN_ID, 0, 0, "ordinary", 0)}
    first = records[1]
    assert isinstance(first, Transition) and (first.start, first.end) == (10.25, 10.5)
    teardown = records[2]
    assert isinstance(teardown, TeardownStep) and (teardown.start, teardown.end) == (11.0, 11.5)
    assert [(r.step, r.loss) for r in records if isinstance(r, TrainStep)] == [(1, 3.0), (2, 2.5)]
    end = records[-1]
    assert isinstance(end, RunEnd) and (end.state, end.final_step, end.end) == ("failed", 2, None)


def test_a_version_2_record_written_before_the_restart_fields_reads_them_as_their_defaults() -> None:
    """Records without restart_count / agreed_attempt / store_prefix read as 0 / None; unknown fields are ignored."""
    old = {"version": 2, "kind": "transition", "run_id": "r", "rank": 0, "attempt": 1, "restart_mode": "ordinary",
           "iteration": 0, "source": "uninitialized", "dest": "dist_ready", "trigger": "init_distributed",
           "start": 1.0, "end": 2.0, "detail": ""}  # fmt: skip
    record = parse(old)
    assert isinstance(record, Transition) and record.origin == Origin("r", 0, 1, "ordinary", 0, restart_count=0)
    assert (record.agreed_attempt, record.store_prefix) == (None, None)
    assert parse(old | {"field_of_a_later_writer": [1]}) == record
    with pytest.raises(ValueError, match="field 'restart_count' must be int"):
        parse(old | {"restart_count": "1"})


def test_the_restart_count_is_torchruns_and_zero_outside_it() -> None:
    """TORCHELASTIC_RESTART_COUNT is the restart count; absent or not a count, it is 0."""
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "2"}) == 2
    assert restart_count({}) == restart_count({"TORCHELASTIC_RESTART_COUNT": ""}) == 0
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "-1"}) == 0


class _AgreedActions(RecordingActions):
    """Recording actions that, like ``TorchActions``, say which attempt and store prefix their group used."""

    attempt = 3
    store_prefix = "lifecycle/g1/attempt-3"


@pytest.mark.parametrize(
    ("actions", "expected"), [(_AgreedActions(), (3, "lifecycle/g1/attempt-3")), (RecordingActions(), (None, None))]
)
def test_the_move_to_dist_ready_records_the_attempt_and_prefix_the_actions_agreed_on(
    tmp_path: Path, actions: RecordingActions, expected: tuple[int | None, str | None]
) -> None:
    """The dist_ready transition carries the actions' attempt and store prefix (None without them); no other does."""
    session = Session(actions)
    journal = RunJournal(str(tmp_path), ORIGIN, 2, session)
    session.add_observer(journal.observe)
    with session:
        session.init_distributed()
        session.init_globals()
        session.start_training()
    journal.close()
    moves = [(r.dest, r.agreed_attempt, r.store_prefix) for r in read([tmp_path]) if isinstance(r, Transition)]
    assert moves[0] == ("dist_ready", *expected)
    assert {(a, p) for _, a, p in moves[1:]} == {(None, None)} and moves[-1][0] == "closed"


def test_the_run_id_comes_from_the_launcher_else_torchrun_else_this_process() -> None:
    """LIFECYCLE_RUN_ID wins, then TORCHELASTIC_RUN_ID unless "none", then the torchrun store, else per process."""
    assert run_id({"LIFECYCLE_RUN_ID": "a", "TORCHELASTIC_RUN_ID": "b"}) == "a"
    assert run_id({"TORCHELASTIC_RUN_ID": "b"}) == "b"
    local = run_id({"TORCHELASTIC_RUN_ID": "none"})
    assert local.startswith("local-") and run_id({}) == local
    torchrun = {"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert run_id(torchrun) == "torchrun-10.0.0.1:29500"  # every rank and node of the job agrees


def test_a_session_observer_sees_each_transition_and_teardown_step_as_it_happens() -> None:
    """The observer is called after each transition and teardown step, in order, with wall-clock start <= end.

    On the failure edge the failure itself comes first, before any release.
    """
    actions = RecordingActions()
    seen: list[str] = []

    def observe(event: SessionEvent) -> None:
        if isinstance(event, FailureEvent):
            seen.append(f"failed: {event.error} ({len(actions.calls)} calls so far)")
            return
        assert event.start <= event.end
        if isinstance(event, TransitionEvent):
            seen.append(f"{event.entry.source.value}->{event.entry.dest.value}")
        else:
            seen.append(f"{event.outcome.value}:{event.record.step} ({len(actions.calls)} calls so far)")

    session = Session(actions)
    session.add_observer(observe)
    session.init_distributed()
    session.fail(RuntimeError("boom"))
    assert seen == [
        "uninitialized->dist_ready",
        "failed: RuntimeError: boom (2 calls so far)",
        "failure:abort_process_group (3 calls so far)",
        "failure:close_store (4 calls so far)",
        "dist_ready->failed",
    ]


def test_a_failing_observer_never_changes_the_outcome(caplog: pytest.LogCaptureFixture) -> None:
    """An observer that raises is logged and ignored: every step still runs and the session closes."""
    actions = RecordingActions()

    def broken(event: SessionEvent) -> None:
        raise OSError("disk full")

    with Session(actions) as session:
        session.add_observer(broken)
        session.init_distributed()
        session.init_globals()
        session.start_training()
    assert session.state is State.CLOSED and actions.calls[-3:] == ["barrier", "destroy_process_group", "close_store"]
    assert "disk full" in caplog.text
