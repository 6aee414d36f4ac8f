"""Reading damaged journals (issue 37, item 4): ``strict=False`` skips what holds no record and says so, typed.

``stream`` yields a file's records as it reads them, then one ``Skipped`` per problem of the file (per unknown kind);
``load``/``load_each`` gather them in ``Loaded.skipped``; the default (``strict=True``) still raises as before.
Torch-free. The show command's side is in tests/tools/test_show_damaged.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lifecycle.journal import Origin, Problem, RunStart, Skipped, TrainStep, load, load_each, read, stream

ORIGIN = Origin("r", 0, 0, "ordinary", 0)


def rows(steps: int = 3) -> list[str]:
    """A journal's lines: a start and ``steps`` steps."""
    records = [
        RunStart(origin=ORIGIN, world_size=1, pid=1, host="h", start=1.0),
        *(TrainStep(origin=ORIGIN, step=s, loss=1.0, start=1.0 + s, end=1.5 + s) for s in range(1, steps + 1)),
    ]
    return [json.dumps(r.to_json()) for r in records]


def write(path: Path, data: bytes) -> Path:
    """``data`` written to ``path``; ``path``."""
    path.write_bytes(data)
    return path


def test_stream_yields_the_records_then_one_typed_value_per_problem(tmp_path: Path) -> None:
    """Not-JSON lines, records of an unknown kind, a broken record and trailing NULs: the records in order, then a
    ``Skipped`` each (lines, count, kind or what is wrong), by first line; the NULs at the end."""
    lines = rows()
    unknown = json.dumps(json.loads(lines[1]) | {"kind": "foo"})
    broken = json.dumps({k: v for k, v in json.loads(lines[1]).items() if k != "step"})
    data = "\n".join([lines[0], "oops", "oops", unknown, lines[1], unknown, broken, lines[2], lines[3]]) + "\n"
    path = write(tmp_path / "rank0.jsonl", data.encode() + b"\0" * 10)
    items = list(stream(path, strict=False))
    assert [type(item) for item in items[:4]] == [RunStart, TrainStep, TrainStep, TrainStep]
    assert items[4:] == [
        Skipped(path, Problem.NOT_JSON, 2, 3, 2),
        Skipped(path, Problem.UNKNOWN_KIND, 4, 6, 2, "foo"),
        Skipped(path, Problem.BAD_RECORD, 7, 7, 1, "field 'step' is missing"),
        Skipped(path, Problem.NUL_BYTES, 10, 10, 10, at_end=True),
    ]


def test_nuls_over_the_last_record_are_a_torn_line_and_nuls_at_the_end(tmp_path: Path) -> None:
    """A crash that zeroed the end of the last record: the text before the NULs is the torn record (``TORN``, where it
    is), the NULs ``NUL_BYTES`` at the end."""
    lines = rows()
    path = write(tmp_path / "rank0.jsonl", ("\n".join(lines[:3]) + "\n" + lines[3][:25]).encode() + b"\0" * 50)
    items = list(stream(path, strict=False))
    assert len(items) == 5 and all(isinstance(r, RunStart | TrainStep) for r in items[:3])
    assert items[3:] == [Skipped(path, Problem.TORN, 4, 4, 1), Skipped(path, Problem.NUL_BYTES, 4, 4, 50, at_end=True)]


def test_a_file_with_no_record_nor_json_object_is_one_not_a_journal(tmp_path: Path) -> None:
    """A binary file is one ``NOT_A_JOURNAL`` (binary), a text file of no JSON one too (not binary); a file of NULs
    only is its NULs."""
    binary = write(tmp_path / "a.jsonl", bytes(range(256)) * 8)
    prose = write(tmp_path / "b.jsonl", b"hello\nworld\n")
    zeros = write(tmp_path / "c.jsonl", b"\0" * 64)
    assert list(stream(binary, strict=False)) == [Skipped(binary, Problem.NOT_A_JOURNAL, 0, 0, 9, binary=True)]
    assert list(stream(prose, strict=False)) == [Skipped(prose, Problem.NOT_A_JOURNAL, 0, 0, 2)]
    assert list(stream(zeros, strict=False)) == [Skipped(zeros, Problem.NUL_BYTES, 1, 1, 64, at_end=True)]


def test_load_gathers_what_it_skipped_and_strict_reading_still_raises(tmp_path: Path) -> None:
    """``load(strict=False)`` and ``load_each(strict=False)`` return the records and ``skipped``; ``load``, ``read`` and
    ``stream`` by default raise ``ValueError("path:line: ...")`` as before issue 37; torn lines are ``torn`` in both."""
    lines = rows()
    path = write(tmp_path / "rank0.jsonl", ("\n".join([lines[0], "oops", lines[1], lines[2][:20]])).encode())
    loaded = load([tmp_path], strict=False)
    assert len(loaded.records) == 2 and loaded.torn == (f"{path}:4",)
    assert loaded.skipped == (Skipped(path, Problem.NOT_JSON, 2, 2, 1),)
    assert [each.skipped for _, each in load_each([tmp_path], strict=False)] == [loaded.skipped]
    for reading in (lambda: load([path]), lambda: read([path]), lambda: list(stream(path))):
        with pytest.raises(ValueError, match=f"^{path}:2: not a journal record: not JSON"):
            reading()


def test_stream_holds_one_line_not_the_file(tmp_path: Path) -> None:
    """``stream`` yields a file's first record before it has read the file's end: a record at a time, not the whole
    file decoded at once (the old reader read and split the whole file first)."""
    lines = rows(2_000)
    path = write(tmp_path / "rank0.jsonl", ("\n".join(lines) + "\n").encode())
    records = stream(path)
    first = next(records)
    assert isinstance(first, RunStart)
    with open(path, "ab") as file:  # appended after the first record was yielded: a reader of lines still sees it
        file.write(b"not json\n")
    with pytest.raises(ValueError, match=f"^{path}:2002: "):
        list(records)
