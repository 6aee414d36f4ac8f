"""Journal files: one per rank, one JSON record per line, each appended and flushed as it happens.

``JournalWriter`` appends to a rank's file; ``load`` / ``read`` return typed records
(``lifecycle.journal._records``), version 1 and 2 files included. A process killed
mid-write leaves a torn line: the next writer (a torchrun restart, a retry) starts on a
fresh line after it, and the reader skips the torn line, wherever it is, and reports
it instead of rejecting the file. Other damage (a record of an unknown kind, a line
that is not JSON, NULs a crash left, a binary file) is refused, or, read with
``strict=False``, skipped and reported as typed ``Skipped`` values (``stream``). Files are
read a line at a time. In a folder, only ``rank<R>.jsonl`` files are journals.
"""

from __future__ import annotations

import enum
import json
import os
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from lifecycle.journal._older import V1_RUN_ID, from_v1, from_v2, from_v3
from lifecycle.journal._records import (
    KINDS,
    VERSION,
    Record,
    RunStart,
    Shared,
    build,
    check_text,
    unknown_version,
    usual,
)

_LOCAL_RUN_ID = f"local-{uuid.uuid4().hex[:12]}"


def run_id(env: Mapping[str, str] | None = None) -> str:
    """The run id journals are labelled with: the same on every rank of a job, and across its restarts.

    ``LIFECYCLE_RUN_ID`` if set (the demo sets one per run); else torchrun's
    ``TORCHELASTIC_RUN_ID`` (its ``--rdzv-id``) unless unset or ``"none"``; else, under
    torchrun without an id, ``torchrun-<MASTER_ADDR>:<MASTER_PORT>``: the agent's store
    address, the same on every rank and node of the job and across its restarts (two
    jobs that reuse an address are told apart by their start times). Outside torchrun,
    an id made once per process (``local-…``): set ``LIFECYCLE_RUN_ID`` to share one.
    """
    env = os.environ if env is None else env
    given = env.get("LIFECYCLE_RUN_ID")
    if given:
        return given
    elastic = env.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none":
        return elastic
    if elastic and env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return f"torchrun-{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return _LOCAL_RUN_ID


def restart_count(env: Mapping[str, str] | None = None) -> int:
    """How many times torchrun has restarted this worker group: ``TORCHELASTIC_RESTART_COUNT``, 0 if unset or bad.

    Each restart starts new worker processes; journals record the count in their
    ``Origin`` so a run's restarts read as its successive attempts.
    """
    env = os.environ if env is None else env
    raw = env.get("TORCHELASTIC_RESTART_COUNT", "").strip()
    return int(raw) if raw.isdigit() else 0


def journal_path(directory: str | os.PathLike[str], rank: int) -> Path:
    """The journal file of ``rank`` in ``directory``."""
    return Path(directory) / f"rank{rank}.jsonl"


class JournalWriter:
    """Appends records to one journal file, one JSON line each, flushed to the OS as each is written.

    Opening writes ``first`` (the writer's ``RunStart``); if the file's last line is
    torn (its last byte is not a newline, e.g. its writer was killed mid-write) a newline
    goes first, so the new records start on a fresh line. Folders are created as needed.
    Write errors (``OSError``) propagate; use as a context manager or call ``close``.
    """

    def __init__(self, path: str | os.PathLike[str], first: RunStart) -> None:
        """Open ``path`` for appending and write ``first``."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115 - kept open across records; closed by close()
        try:
            if self._file.tell() > 0:
                with open(self.path, "rb") as existing:
                    existing.seek(-1, os.SEEK_END)
                    if existing.read(1) != b"\n":
                        self._file.write(b"\n")
            self.write(first)
        except BaseException:
            self._file.close()
            raise

    def write(self, record: Record) -> None:
        """Append ``record`` as one line and flush it; ``ValueError`` once closed."""
        self._file.write((json.dumps(record.to_json()) + "\n").encode("utf-8"))
        self._file.flush()

    def close(self) -> None:
        """Close the file (again: no effect)."""
        self._file.close()

    def __enter__(self) -> JournalWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class Loaded:
    """What ``load`` read.

    ``records``: the records in file order. ``torn``: ``"path:line"`` of each torn line
    it skipped. ``ignored``: a note (``"path: ..."``) on each ``*.jsonl`` file in a given
    folder that was not read although it looks like a journal (its name is not
    ``rank<R>.jsonl``). ``skipped``: what a lenient reading (``strict=False``) skipped
    besides torn lines, one ``Skipped`` per problem of a file (see ``stream``).
    """

    records: tuple[Record, ...]
    torn: tuple[str, ...]
    ignored: tuple[str, ...] = ()
    skipped: tuple[Skipped, ...] = ()


_JOURNAL_NAME = re.compile(r"rank(0|[1-9][0-9]*)\.jsonl")
"""The name of a journal file in a folder: ``rank<R>.jsonl`` (``journal_path``'s)."""


class _Torn(Exception):
    """A line that is the start of a record cut off by its writer's death: skipped, not an error."""


def _cut_off(text: str, error: json.JSONDecodeError) -> bool:
    """Whether ``text``, which ``error`` says is no JSON, is a JSON object cut off before it closed.

    The parser of a cut-off object runs out of input: it fails in an unterminated
    string, or within the last few characters (a cut literal such as ``-Infinit``).
    """
    body = text.strip()
    if not body.startswith("{") or error.msg == "Extra data":
        return False
    return error.msg.startswith("Unterminated string") or error.pos >= len(body) - 10


def parse(data: object) -> Record:
    """The record in the decoded JSON ``data``: a version 4, 3 or 2 record (see ``docs/journal.md``).

    ``ValueError`` saying what is wrong with it, ``field 'x' ...`` where a field is
    (missing, of the wrong type, text no output can write, an unknown ``kind`` or
    ``version``). Version 1 records (no ``version``) are read by ``load``, which knows
    the file they are in.
    """
    if not isinstance(data, dict):
        raise ValueError(f"not a journal record: a JSON {type(data).__name__}, not an object")
    return _parse(data, None, check=True)


def _parse(data: dict[str, Any], shared: Shared | None, *, check: bool) -> Record:
    """``parse``'s work on a JSON object; ``check``: look for unwritable text (``check_text``) first."""
    version = data.get("version")
    if type(version) is not int or version not in (2, 3, VERSION):
        raise unknown_version(data)
    if check:
        check_text(data)
    return build(data if version == VERSION else from_v3(from_v2(data) if version == 2 else data), shared)


_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
"""The C scanner ``json.loads`` ends in (set in ``JSONDecoder.__init__``; typeshed does not declare it)."""


def _json_object(text: str) -> Any:
    """``json.loads(text)``, the usual line (an object from its first character) by the decoder's scanner directly.

    The same decoding without ``json.loads``' wrappers, a measurable share of its cost
    on a journal line (see docs/benchmarks.md, journal-scan); any other text, or one
    the scanner refuses, goes to ``json.loads``, which raises its own error.
    """
    if text[:1] == "{":
        try:
            value, end = _SCAN(text, 0)
        except (StopIteration, ValueError):
            pass
        else:
            if end == len(text) or not text[end:].strip():
                return value
    return json.loads(text)


def _decode(line: bytes, v1_run: dict[str, Any] | None, shared: Shared | None) -> tuple[list[Record], dict[str, Any]]:
    """The records of one journal line (a v1 line may stand for several) and its JSON object.

    ``_Torn`` if the line is a record cut off mid-write (by its end: a cut UTF-8
    character or an unclosed JSON object); ``ValueError`` saying what is wrong otherwise.
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data" and exc.end == len(line) and line.lstrip().startswith(b"{"):
            raise _Torn from None  # the last character was cut: the record is cut too
        raise ValueError(f"not UTF-8 text: byte 0x{line[exc.start]:02x} at column {exc.start + 1}") from None
    try:
        data = _json_object(text)
    except json.JSONDecodeError as exc:
        if _cut_off(text, exc):
            raise _Torn from None
        raise ValueError(f"not a journal record: not JSON ({exc})") from None
    except RecursionError:
        raise ValueError("not a journal record: JSON nested too deeply") from None
    if type(data) is not dict:
        raise ValueError(f"not a journal record: a JSON {type(data).__name__}, not an object")
    # Valid UTF-8 holds no lone surrogate: only a \u escape can spell one, so only such lines are searched for it.
    escaped = "\\u" in text
    if "version" not in data:
        if escaped:
            check_text(data)
        return from_v1(data, v1_run), data
    return [_parse(data, shared, check=escaped)], data


def _usual(text: str, shared: Shared) -> Record | None:
    """The record on the usual line ``text`` (one version 3 object, every field of its exact type, no ``\\u``
    escape), else None: the line is then read the checked way (``_decode``), which also says what is wrong."""
    if text[:1] != "{" or "\\u" in text:
        return None
    try:
        value, end = _SCAN(text, 0)
    except (StopIteration, ValueError):
        return None
    if end != len(text) and text[end:].strip():
        return None
    return usual(value, shared)


class Problem(enum.Enum):
    """What was wrong with the lines a reading skipped (``Skipped.problem``)."""

    TORN = "torn"
    """A record cut off by its writer's death (``count`` 1): skipped by every reading, strict or not."""
    UNKNOWN_KIND = "unknown_kind"
    """Records of a ``kind`` this reader does not know (``detail``: the kind), as a newer writer may write."""
    NOT_JSON = "not_json"
    """Lines that are not JSON (or not UTF-8 text)."""
    BAD_RECORD = "bad_record"
    """JSON that is no record this reader reads: a field missing or of the wrong type, an unknown version, text
    no output can write, a JSON value that is not an object (``detail``: what is wrong with the first)."""
    NUL_BYTES = "nul_bytes"
    """NUL bytes that end lines (``count``: bytes): what a crash leaves on some file systems at a file's end."""
    NOT_A_JOURNAL = "not_a_journal"
    """The whole file (``first`` and ``last`` 0, ``count`` its lines): no line of it is a record nor a JSON object;
    ``binary``: it holds bytes no text holds (NULs, control characters, bytes that are not UTF-8)."""


@dataclass(frozen=True, slots=True)
class Skipped:
    """What a reading skipped in one journal file, and why: one value per problem of a file, not per line.

    ``path``: the file. ``problem``: what was wrong (``Problem``). Lines with the same
    problem (and, for ``UNKNOWN_KIND``, the same kind) make one value: ``first`` and
    ``last``, their first and last line numbers (1-based; ``count`` equals
    ``last - first + 1`` when they are one run of lines), ``count`` how many lines or
    records (``NUL_BYTES``: bytes). ``detail``: the unknown kind (``UNKNOWN_KIND``), what is
    wrong with the first record (``BAD_RECORD``, as a strict reading would say it), "" for
    the others. ``at_end``: ``NUL_BYTES`` whose last line is the last of the file that is
    not blank (nothing was written after them). ``binary``: see ``Problem.NOT_A_JOURNAL``.
    A value, not a sentence: tools say it their way.
    """

    path: Path
    problem: Problem
    first: int
    last: int
    count: int
    detail: str = ""
    at_end: bool = False
    binary: bool = False


_BINARY = re.compile(rb"[\x00-\x08\x0e-\x1f\x7f]")
"""A byte that no line of text holds (NUL, the control characters but tab, line and page breaks)."""


class _Problems:
    """The problems of one lenient reading of one file, gathered: one ``Skipped`` per problem (and kind)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.found: dict[tuple[Problem, str], list[Any]] = {}  # (problem, kind) -> [first, last, count, detail]
        self.binary = False
        self.objects = False  # a line held a JSON object: the file is no binary or foreign file, whatever it holds

    def add(self, problem: Problem, number: int, count: int = 1, detail: str = "", kind: str = "") -> None:
        """Note ``count`` lines (or bytes) with ``problem`` on line ``number``."""
        seen = self.found.get((problem, kind))
        if seen is None:
            self.found[(problem, kind)] = [number, number, count, detail]
        else:
            seen[1], seen[2] = number, seen[2] + count

    def skipped(self, records: int, lines: int, filled: int) -> list[Skipped]:
        """What was skipped, by first line; one ``NOT_A_JOURNAL`` instead where no line was a record nor an object
        and some line was not JSON (``records``: how many records were read; ``lines``: the file's lines;
        ``filled``: the last line that was not blank)."""
        if not records and not self.objects and (Problem.NOT_JSON, "") in self.found:
            return [Skipped(self.path, Problem.NOT_A_JOURNAL, 0, 0, lines, binary=self.binary)]
        skipped = [
            Skipped(
                self.path,
                problem,
                first,
                last,
                count,
                kind or detail,
                at_end=problem is Problem.NUL_BYTES and last == filled,
            )
            for (problem, kind), (first, last, count, detail) in self.found.items()
        ]
        return sorted(skipped, key=lambda s: s.first)

    def classify(self, line: bytes, number: int, error: ValueError) -> None:
        """Note why ``line`` (number ``number``), which ``_decode`` refused with ``error``, holds no record."""
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            self.binary = True
            self.add(Problem.NOT_JSON, number)
            return
        self.binary = self.binary or _BINARY.search(line) is not None
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            self.add(Problem.NOT_JSON, number)
            return
        if type(data) is not dict:
            self.add(Problem.BAD_RECORD, number, detail=str(error))
            return
        self.objects = True
        kind = data.get("kind")
        if type(kind) is str and kind not in KINDS:
            self.add(Problem.UNKNOWN_KIND, number, kind=kind)
        else:
            self.add(Problem.BAD_RECORD, number, detail=str(error))


def stream(path: str | os.PathLike[str], *, strict: bool = True) -> Iterator[Record | Skipped]:
    """The records of the journal file at ``path``, in file order, as they are read, and what was skipped.

    Reads one line at a time: memory holds one line and the records the caller keeps.
    A torn line (see ``load``) is skipped and yielded where it is, as a ``Skipped``
    (``Problem.TORN``). Any other line that holds no record: with ``strict``, ``ValueError``
    ``"path:line: ..."`` (not UTF-8, not JSON, a record that breaks the schema, ``field 'x' ...``);
    without, it is skipped, and once the file is read one ``Skipped`` per problem (per
    unknown kind) follows its records: records of an unknown kind, lines that are not JSON,
    records that break the schema, NUL bytes that end lines (the text before them is
    read as a line); a file of which no line is a record nor a JSON object (a binary
    file, say) is one ``Problem.NOT_A_JOURNAL`` instead. ``OSError`` if ``path`` cannot be read.
    """
    return _stream(Path(path), strict, {})


def _stream(path: Path, strict: bool, shared: Shared) -> Iterator[Record | Skipped]:
    """``stream``, the records sharing the origins and text values in ``shared`` (see ``load``)."""
    problems = None if strict else _Problems(path)
    v1_run: dict[str, Any] | None = None
    number = records = filled = 0
    with open(path, "rb") as file:
        for number, raw in enumerate(file, start=1):
            try:
                text: str | None = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if text is not None:
                record = _usual(text, shared)
                if record is not None:
                    records, filled = records + 1, number
                    yield record
                    continue
            line = raw[:-1] if raw.endswith(b"\n") else raw
            if not line.strip():
                continue
            filled = number
            for item in _read_line(path, line, number, v1_run, shared, problems):
                if isinstance(item, dict):
                    v1_run = item
                else:
                    records += not isinstance(item, Skipped)
                    yield item
    if problems is not None:
        yield from problems.skipped(records, number, filled)


def _read_line(
    path: Path, line: bytes, number: int, v1_run: dict[str, Any] | None, shared: Shared, problems: _Problems | None
) -> list[Record | Skipped | dict[str, Any]]:
    """The records of a line that is not the usual one (``_decode``), a ``Skipped`` if torn, and, after the records of
    a version 1 start, its JSON object (the next lines' ``v1_run``). A line with no record: with ``problems`` (a
    lenient reading) noted there (trailing NULs split off, the text before them read as a line); else ``ValueError``.
    """
    try:
        decoded, data = _decode(line, v1_run, shared)
    except _Torn:
        return [Skipped(path, Problem.TORN, number, number, 1)]
    except ValueError as exc:
        if problems is None:
            raise ValueError(f"{path}:{number}: {exc}") from None
        text = line.rstrip(b"\0")
        if len(text) == len(line):
            problems.classify(line, number, exc)
            return []
        problems.add(Problem.NUL_BYTES, number, len(line) - len(text))
        return _read_line(path, text, number, v1_run, shared, problems) if text.strip() else []
    if problems is not None:
        problems.objects = True
    read: list[Record | Skipped | dict[str, Any]] = list(decoded)
    if decoded[0].origin.run_id == V1_RUN_ID and isinstance(decoded[0], RunStart):
        read.append(data)
    return read


def _load_file(
    path: Path, records: list[Record], torn: list[str], skipped: list[Skipped], shared: Shared, *, strict: bool
) -> None:
    """Append the records of the journal at ``path`` (``_stream``); note its torn lines and what else it skipped."""
    append = records.append
    for item in _stream(path, strict, shared):
        if type(item) is Skipped:
            if item.problem is Problem.TORN:
                torn.append(f"{path}:{item.first}")
            else:
                skipped.append(item)
        else:
            append(item)  # type: ignore[arg-type]  # not a Skipped: a Record


def _looks_like_a_journal(path: Path) -> bool:
    """Whether the first line of ``path`` (at most 1 MiB of it) is a journal record, of any version."""
    try:
        with open(path, "rb") as file:
            first = file.readline(1 << 20)
        _decode(first, None, None)
    except (OSError, ValueError, _Torn):
        return False
    return True


def journal_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The journals in ``folder``: its ``rank<R>.jsonl`` files, in rank order. ``OSError`` if it cannot be listed."""
    journals: dict[int, Path] = {}
    for path in Path(folder).iterdir():
        named = _JOURNAL_NAME.fullmatch(path.name)
        if named and path.is_file():
            journals[int(named.group(1))] = path
    return [journals[rank] for rank in sorted(journals)]


def _journals_in(folder: Path, ignored: list[str]) -> list[Path]:
    """``journal_files(folder)``, with a note in ``ignored`` on each other journal-like ``*.jsonl`` file."""
    journals = journal_files(folder)
    read = set(journals)  # a set: a folder may hold 16,384 journals (a list made this check quadratic)
    for path in sorted(folder.iterdir()):
        if path.suffix == ".jsonl" and path not in read and path.is_file() and _looks_like_a_journal(path):
            ignored.append(
                f"{path}: ignored: it looks like a journal, but only rank<R>.jsonl files of a folder are read"
                " (name the file to read it)"
            )
    return journals


def load(paths: Iterable[str | os.PathLike[str]], *, strict: bool = True) -> Loaded:
    """Every record of the journals at ``paths``, as version 3 records (version 1 and 2 files included).

    A file is read whatever its name; a folder stands for its ``rank<R>.jsonl`` files,
    in rank order (its other ``*.jsonl`` files are not read; ``ignored`` notes those
    whose first line is a journal record). A torn line, anywhere in a file, is skipped
    and listed in ``torn``: a record cut off by its writer's death (an unclosed JSON
    object, or a cut UTF-8 character at its end); a restarted writer appends after it
    on a fresh line. Any other line that holds no record raises ``ValueError``
    ``"path:line: ..."``: not UTF-8, not JSON, or a record that breaks the schema
    (``field 'x' ...``); with ``strict=False`` it is skipped instead, and said in
    ``skipped`` (see ``stream``). ``OSError`` if a path cannot be read. Records of one origin
    share one ``Origin`` object, and the values of text fields one string each.
    """
    records: list[Record] = []
    torn: list[str] = []
    skipped: list[Skipped] = []
    ignored: list[str] = []
    shared: Shared = {}
    for path in _files_of(paths, ignored):
        _load_file(path, records, torn, skipped, shared, strict=strict)
    return Loaded(tuple(records), tuple(torn), tuple(ignored), tuple(skipped))


def _files_of(paths: Iterable[str | os.PathLike[str]], ignored: list[str]) -> Iterator[Path]:
    """The journal files ``load`` reads for ``paths``, in its order (each folder listed when reached)."""
    for given in paths:
        given = Path(given)
        yield from _journals_in(given, ignored) if given.is_dir() else [given]


def each_file(paths: Iterable[str | os.PathLike[str]]) -> Iterator[tuple[Path, tuple[str, ...]]]:
    """The journal files ``load(paths)`` reads, in its order, each with the notes on the files of its folder that
    are not read (``Loaded.ignored``'s; given with the first file after the folder was listed). A folder that holds no
    journal but such files comes as its own path, with its notes: a caller reads only the paths that are no folder.

    Each folder is listed when it is reached; nothing is read: ``stream`` reads a file.
    """
    for given in paths:
        given = Path(given)
        ignored: list[str] = []
        files = _journals_in(given, ignored) if given.is_dir() else [given]
        if not files and ignored:  # a folder of no rank<R>.jsonl: its notes still said
            yield given, tuple(ignored)
        for path in files:
            yield path, tuple(ignored)
            ignored = []


def load_each(paths: Iterable[str | os.PathLike[str]], *, strict: bool = True) -> Iterator[tuple[Path, Loaded]]:
    """``load(paths)`` one journal file at a time: for each file, in ``load``'s order, its path and a ``Loaded`` of
    its records, its torn lines, what else it skipped (with ``strict=False``) and the notes on the files of its folder
    that were not read (``each_file``'s; a folder that holds no journal comes as its own path with no records).

    At most one journal file is open at a time and nothing of a file is kept once the
    next is read, so a tool can read any number of ranks' journals in the memory of one;
    a file's records are all held at once (``stream`` holds none). Errors as ``load``'s,
    raised when the file that has them is reached.
    """
    for path, ignored in each_file(paths):
        records: list[Record] = []
        torn: list[str] = []
        skipped: list[Skipped] = []
        if not path.is_dir():
            _load_file(path, records, torn, skipped, {}, strict=strict)
        yield path, Loaded(tuple(records), tuple(torn), ignored, tuple(skipped))


def read(paths: Iterable[str | os.PathLike[str]]) -> list[Record]:
    """``load(paths).records`` as a list: the torn lines skipped silently."""
    return list(load(paths).records)
