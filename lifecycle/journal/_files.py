"""Journal files: one per rank, one JSON record per line, each appended and flushed as it happens.

``JournalWriter`` appends to a rank's file; ``load`` / ``read`` return typed records
(``lifecycle.journal._records``), version 1 and 2 files included. A process killed
mid-write leaves a torn line: the next writer (a torchrun restart, a retry) starts on a
fresh line after it, and the reader skips the torn line, wherever it is, and reports
it instead of rejecting the file. In a folder, only ``rank<R>.jsonl`` files are journals.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from lifecycle.journal._older import V1_RUN_ID, from_v1, from_v2, from_v3
from lifecycle.journal._records import VERSION, Record, RunStart, Shared, build, check_text, unknown_version, usual

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
    ``rank<R>.jsonl``).
    """

    records: tuple[Record, ...]
    torn: tuple[str, ...]
    ignored: tuple[str, ...] = ()


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


def _load_file(path: Path, records: list[Record], torn: list[str], shared: Shared) -> None:
    """Append the records of the journal at ``path``; note its torn lines; ``ValueError`` ``path:line: ...``.

    The usual line is read by ``_usual`` (a file that is all UTF-8 is decoded at once);
    any other by ``_decode``.
    """
    raw = path.read_bytes()
    try:
        lines: Sequence[str | bytes] = raw.decode("utf-8").split("\n")
    except UnicodeDecodeError:  # a torn last character, or no UTF-8: line by line, to say which
        lines = raw.split(b"\n")
    v1_run: dict[str, Any] | None = None
    append = records.append
    for number, text in enumerate(lines, start=1):
        if isinstance(text, str):
            record = _usual(text, shared)
            if record is not None:
                append(record)
                continue
        line = text.encode("utf-8") if isinstance(text, str) else text
        if not line.strip():
            continue
        try:
            decoded, data = _decode(line, v1_run, shared)
        except _Torn:
            torn.append(f"{path}:{number}")
            continue
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
        if decoded[0].origin.run_id == V1_RUN_ID and isinstance(decoded[0], RunStart):
            v1_run = data
        records += decoded


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


def load(paths: Iterable[str | os.PathLike[str]]) -> Loaded:
    """Every record of the journals at ``paths``, as version 3 records (version 1 and 2 files included).

    A file is read whatever its name; a folder stands for its ``rank<R>.jsonl`` files,
    in rank order (its other ``*.jsonl`` files are not read; ``ignored`` notes those
    whose first line is a journal record). A torn line, anywhere in a file, is skipped
    and listed in ``torn``: a record cut off by its writer's death (an unclosed JSON
    object, or a cut UTF-8 character at its end); a restarted writer appends after it
    on a fresh line. Any other line that holds no record raises ``ValueError``
    ``"path:line: ..."``: not UTF-8, not JSON, or a record that breaks the schema
    (``field 'x' ...``). ``OSError`` if a path cannot be read. Records of one origin
    share one ``Origin`` object, and the values of text fields one string each.
    """
    records: list[Record] = []
    torn: list[str] = []
    ignored: list[str] = []
    shared: Shared = {}
    for path in _files_of(paths, ignored):
        _load_file(path, records, torn, shared)
    return Loaded(tuple(records), tuple(torn), tuple(ignored))


def _files_of(paths: Iterable[str | os.PathLike[str]], ignored: list[str]) -> Iterator[Path]:
    """The journal files ``load`` reads for ``paths``, in its order (each folder listed when reached)."""
    for given in paths:
        given = Path(given)
        yield from _journals_in(given, ignored) if given.is_dir() else [given]


def load_each(paths: Iterable[str | os.PathLike[str]]) -> Iterator[tuple[Path, Loaded]]:
    """``load(paths)`` one journal file at a time: for each file, in ``load``'s order, its path and a ``Loaded`` of
    its records, its torn lines and the notes on the files of its folder that were not read (given with the first
    file read after a folder was listed; a folder that holds no journal comes as its own path with no records).

    At most one journal file is open at a time and nothing of a file is kept once the
    next is read, so a tool can read any number of ranks' journals in the memory of one
    (``show`` does). Errors as ``load``'s, raised when the file that has them is reached.
    """
    for given in paths:
        given = Path(given)
        ignored: list[str] = []
        files = _journals_in(given, ignored) if given.is_dir() else [given]
        if not files and ignored:  # a folder of no rank<R>.jsonl: its notes still said
            yield given, Loaded((), (), tuple(ignored))
        for path in files:
            records: list[Record] = []
            torn: list[str] = []
            _load_file(path, records, torn, {})
            yield path, Loaded(tuple(records), tuple(torn), tuple(ignored))
            ignored = []


def read(paths: Iterable[str | os.PathLike[str]]) -> list[Record]:
    """``load(paths).records`` as a list: the torn lines skipped silently."""
    return list(load(paths).records)
