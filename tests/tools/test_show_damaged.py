"""``python -m lifecycle show`` on damaged journals (issue 37, item 4): it shows what it can and says what it skipped.

A record of an unknown kind, lines that are not JSON, a record that breaks the schema, NUL bytes a crash left, a
binary file beside an intact one: each is one warning (file, line or lines, count) and exit 0, the other records and
ranks shown as if the damage were not there; nothing readable anywhere is one line and exit 2; ``--strict`` keeps the
refusal (exit 2 at the first damaged line). Each case runs the real command in a subprocess (with a timeout); every
test here fails on the show before issue 37, which exited 2 with no report and had no ``--strict`` (checked by running
this file in a copy of that revision). Torch-free.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support.internals import synthetic

from lifecycle.journal import Origin

TIMEOUT_S = 60


def show(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python -m lifecycle show ARGS``, run to its end (bounded), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "lifecycle", "show", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def lines(rank: int, *, attempt: int = 0) -> list[str]:
    """Rank ``rank``'s journal lines of a closed call of 5 steps (no newlines)."""
    o = Origin("r", rank, attempt, "ordinary", 0)
    return [json.dumps(r.to_json()) for r in synthetic.rank_call(o, 2, 10.0 + rank + 100 * attempt, steps=5)]


def text(rows: list[str]) -> bytes:
    """``rows`` as a journal file's bytes."""
    return ("\n".join(rows) + "\n").encode()


def unknown_kind(rows: list[str]) -> bytes:
    """A record of a kind this reader does not know, as line 6."""
    return text([*rows[:5], json.dumps(json.loads(rows[5]) | {"kind": "foo"}), *rows[5:]])


def not_json(rows: list[str]) -> bytes:
    """13 lines of text that is not JSON, lines 6-18."""
    return text([*rows[:5], *(f"garbage {i}" for i in range(13)), *rows[5:]])


def nul_run(rows: list[str]) -> bytes:
    """4,096 NUL bytes after the last line: a crash on a file system that had grown the file but not written it."""
    return text(rows) + b"\0" * 4096


def schema_break(rows: list[str]) -> bytes:
    """A step record whose loss is missing, as line 6."""
    broken = {k: v for k, v in json.loads(rows[5]).items() if k != "loss"}
    return text([*rows[:5], json.dumps(broken), *rows[5:]])


DAMAGE: dict[str, tuple[Callable[[list[str]], bytes], str]] = {
    "unknown-kind": (unknown_kind, "line 6: a record of unknown kind 'foo' skipped"),
    "not-json": (not_json, "lines 6-18: 13 lines that are not JSON skipped"),
    "nul-bytes": (nul_run, "line 17: 4,096 NUL bytes at the end skipped"),
    "schema-break": (schema_break, "line 6: a record that breaks the schema skipped (field 'loss' is missing)"),
}


def report(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The printed report, less the ``wrote`` lines (whose folder differs from run to run)."""
    return [line for line in result.stdout.splitlines() if not line.startswith("wrote ")]


def warnings(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The ``warning:`` lines on stderr."""
    return [line for line in result.stderr.splitlines() if line.startswith("warning: ")]


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_journal_is_shown_with_one_warning_naming_file_line_and_count(tmp_path: Path, case: str) -> None:
    """Each damage in rank 0's journal is one warning (file, line, count), exit 0, the report the intact run's."""
    damage, said = DAMAGE[case]
    intact, damaged = tmp_path / "intact", tmp_path / "damaged"
    for folder, rank0 in ((intact, text(lines(0))), (damaged, damage(lines(0)))):
        folder.mkdir()
        (folder / "rank0.jsonl").write_bytes(rank0)
        (folder / "rank1.jsonl").write_bytes(text(lines(1)))
    result = show(damaged, "--out", tmp_path / "d")
    assert result.returncode == 0, result.stderr
    assert warnings(result) == [f"warning: {damaged / 'rank0.jsonl'} {said}"], result.stderr
    if case != "schema-break":  # the broken step is one of five: the others still tell rank 0's story
        assert report(result) == report(show(intact, "--out", tmp_path / "i"))
    assert "rank 0: ended closed after step 5" in result.stdout and "rank 1: ended closed" in result.stdout


def test_a_binary_journal_does_not_hide_an_intact_one(tmp_path: Path) -> None:
    """A binary rank0.jsonl is one warning ("not a journal (binary)"), and rank 1's journal is shown, exit 0; the
    verdict says rank 0 left no journal."""
    (tmp_path / "rank0.jsonl").write_bytes(bytes(range(256)) * 40)
    (tmp_path / "rank1.jsonl").write_bytes(text(lines(1)))
    result = show(tmp_path, "--out", tmp_path / "d")
    assert result.returncode == 0, result.stderr
    assert warnings(result) == [f"warning: {tmp_path / 'rank0.jsonl'}: not a journal (binary) — skipped"]
    assert "rank 1: ended closed after step 5" in result.stdout and "rank 0: no journal (world size 2)" in result.stdout


def test_nul_bytes_over_a_record_then_a_restarted_writer_show_both_calls(tmp_path: Path) -> None:
    """NULs over the end of a record (the crash), then a torchrun restart's records: the cut record is a torn line,
    the NULs one warning (not at the end), and both attempts are shown, exit 0."""
    first, second = lines(0), lines(0, attempt=1)
    path = tmp_path / "rank0.jsonl"
    path.write_bytes(text(first[:-1]) + first[-1][:30].encode() + b"\0" * 100 + b"\n" + text(second))
    result = show(tmp_path, "--out", tmp_path / "d")
    assert result.returncode == 0, result.stderr
    assert f"{path}:16: torn line skipped" in result.stderr
    assert warnings(result) == [f"warning: {path} line 16: 100 NUL bytes skipped"]
    assert "attempt 0" in result.stdout and "attempt 1" in result.stdout


def test_records_of_an_unknown_kind_throughout_a_journal_are_one_warning(tmp_path: Path) -> None:
    """Records of one unknown kind after every step (a newer writer's) make one warning with their count, not one a
    line; records of a second unknown kind make a second."""
    rows = lines(0)
    extra = json.dumps(json.loads(rows[5]) | {"kind": "heartbeat"})
    other = json.dumps(json.loads(rows[5]) | {"kind": "memory"})
    mixed = [row for i, row in enumerate(rows) for row in ([row, extra] if 4 <= i <= 8 else [row])]
    (tmp_path / "rank0.jsonl").write_bytes(text([*mixed, other]))
    result = show(tmp_path, "--out", tmp_path / "d")
    assert result.returncode == 0, result.stderr
    path = tmp_path / "rank0.jsonl"
    assert warnings(result) == [
        f"warning: {path} lines 6-14: 5 records of unknown kind 'heartbeat' skipped",
        f"warning: {path} line 22: a record of unknown kind 'memory' skipped",
    ]


def test_nothing_readable_in_any_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Only damaged journals: one line on stderr, naming the first problem and counting the others, exit 2."""
    (tmp_path / "rank0.jsonl").write_bytes(bytes(range(256)) * 40)
    (tmp_path / "rank1.jsonl").write_bytes(b"\0" * 4096)
    result = show(tmp_path, "--out", tmp_path / "d")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"no journal records in {tmp_path}: {tmp_path / 'rank0.jsonl'}: not a journal (binary) — skipped"
        " (and 1 more problems skipped)"
    ]


@pytest.mark.parametrize("case", [*DAMAGE, "binary"])
def test_strict_refuses_any_damage_as_before(tmp_path: Path, case: str) -> None:
    """``--strict``: each damage exits 2 with ``cannot read the journal: file:line: ...`` and no report (the refusal
    show made of every damaged journal before issue 37)."""
    rank0 = bytes(range(256)) * 40 if case == "binary" else DAMAGE[case][0](lines(0))
    (tmp_path / "rank0.jsonl").write_bytes(rank0)
    (tmp_path / "rank1.jsonl").write_bytes(text(lines(1)))
    result = show(tmp_path, "--out", tmp_path / "d", "--strict")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"cannot read the journal: {tmp_path / 'rank0.jsonl'}:"), result.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
