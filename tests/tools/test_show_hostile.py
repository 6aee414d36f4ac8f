"""``python -m lifecycle show`` on real-world journals: torn, broken, mixed, badly named, piped into ``head``.

Each case runs the real command in a subprocess (with a timeout) on journal files written here, and fails on the
show of before issue 13 (said per test). Torch-free: ``show`` imports no torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lifecycle.journal import JournalWriter, Left, Origin, Record, RunEnd, RunStart, TrainStep, Transition

TIMEOUT_S = 60


def show(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m lifecycle show ARGS``, run to its end (bounded), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "lifecycle", "show", *map(str, args)],
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=TIMEOUT_S,
        env=env,
        check=False,
    )


def call(run_id: str, rank: int, at: float, *, attempt: int = 0, restarts: int = 0, steps: int = 2) -> list[Record]:
    """One rank's ``pretrain`` call that closed: its start, a transition, ``steps`` steps, its end."""
    o = Origin(run_id, rank, attempt, "ordinary", 0, restart_count=restarts)
    return [
        RunStart(origin=o, world_size=2, pid=1000 + rank, host="h", start=at),
        Transition(origin=o, source="uninitialized", dest="dist_ready", trigger="init_distributed", start=at,
                   end=at + 0.1),
        *(TrainStep(origin=o, step=s, loss=2.0, start=at + s, end=at + s + 0.5) for s in range(1, steps + 1)),
        RunEnd(origin=o, state="closed", exit_reason="iterations", final_step=steps, checkpoint_step=None, error=None,
               end=at + steps + 1),
    ]  # fmt: skip


def lines(records: list[Record]) -> list[str]:
    """``records`` as journal lines (no newlines)."""
    return [json.dumps(r.to_json()) for r in records]


def write(path: Path, records: list[Record]) -> Path:
    """``records`` appended to the journal at ``path`` by the real writer; ``path``."""
    first = records[0]
    assert isinstance(first, RunStart)
    with JournalWriter(path, first) as writer:
        for record in records[1:]:
            writer.write(record)
    return path


def assert_no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    """Neither stream holds a Python traceback."""
    assert "Traceback" not in result.stderr + result.stdout, result.stderr


def test_torn_lines_anywhere_are_skipped_with_file_and_line(tmp_path: Path) -> None:
    """A line cut mid-record is skipped with a warning naming file:line, also mid-file before a record that is no
    writer's start and as the last line with a newline after it (old show rejected such a journal whole, exit 2)."""
    records = lines(call("r", 0, 10.0, steps=3))
    path = tmp_path / "rank0.jsonl"
    torn = [records[0], records[1][:40], *records[2:4], records[4][:30]]  # cut: line 2 and the last, line 5
    path.write_text("\n".join(torn) + "\n")
    result = show(path, "--out", tmp_path / "d")
    assert_no_traceback(result)
    assert result.returncode == 0, result.stderr
    assert f"{path}:2: torn line skipped" in result.stderr and f"{path}:5: torn line skipped" in result.stderr
    assert "rank 0: no end record (killed?) in state uninitialized — last step 2" in result.stdout


def test_a_torchrun_restart_after_a_torn_line_reads_as_the_next_attempt(tmp_path: Path) -> None:
    """A restarted worker appends after the torn last line of the killed one: both calls are shown, the line noted.

    Old show read this case too: this pins it while the reader changed."""
    path = tmp_path / "rank0.jsonl"
    first = call("job", 0, 10.0)
    path.write_text("\n".join(lines(first[:-1])) + "\n" + lines(first[-1:])[0][:25])  # killed writing its end
    write(path, call("job", 0, 20.0, restarts=1))
    result = show(tmp_path, "--out", tmp_path / "d")
    assert_no_traceback(result)
    assert result.returncode == 0 and f"{path}:5: torn line skipped" in result.stderr
    assert "attempt 1 (torchrun restart 1)" in result.stdout and "ended closed after step 2" in result.stdout


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: {k: v for k, v in d.items() if k != "loss"}, "field 'loss' is missing"),
        (lambda d: d | {"step": "two"}, "field 'step' must be int, got 'two'"),
        (lambda d: d | {"kind": "stepp"}, "field 'kind' is 'stepp': unknown record kind"),
        (lambda d: d | {"rank": None}, "field 'rank' must be int, got None"),
        (lambda d: d | {"run_id": "\udcff"}, "field 'run_id' is not valid text"),
    ],
    ids=["missing", "wrong-type", "unknown-kind", "null", "lone-surrogate"],
)
def test_a_record_that_breaks_the_schema_is_named_by_file_line_and_field(
    tmp_path: Path, change: Callable[[dict[str, Any]], dict[str, Any]], message: str
) -> None:
    """A record with a missing, mistyped or unknown field: with ``--strict``, exit 2 with "file:line: field 'x' ...",
    no traceback; without, one warning naming file, line and field (an unknown kind: the kind), the rest shown, exit 0.

    Old show said "missing field 'loss'" and "unknown record kind" without the field, and a lone surrogate ended in a
    UnicodeEncodeError traceback; its wrong-type messages already had this form (pinned here). Before issue 37 show
    refused such a journal without ``--strict`` too."""
    records = lines(call("r", 0, 10.0))
    bad = change(json.loads(records[2]))
    path = tmp_path / "rank0.jsonl"
    path.write_text("\n".join([*records[:2], json.dumps(bad), *records[3:]]) + "\n")
    strict = os.environ | {"PYTHONIOENCODING": "utf-8:strict"}  # a UTF-8 terminal: lone surrogates do not print
    result = show(path, "--out", tmp_path / "d", "--strict", env=strict)
    assert_no_traceback(result)
    assert result.returncode == 2 and result.stdout == ""
    assert f"{path}:3: {message}" in result.stderr
    lenient = show(path, "--out", tmp_path / "d", env=strict)
    assert_no_traceback(lenient)
    assert lenient.returncode == 0 and "rank 0: ended closed after step 2" in lenient.stdout, lenient.stderr
    said = "a record of unknown kind 'stepp'" if bad.get("kind") == "stepp" else "a record that breaks the schema"
    assert f"warning: {path} line 3: {said} skipped" in lenient.stderr
    assert said != "a record that breaks the schema" or f"skipped ({message}" in lenient.stderr


def test_invalid_utf8_names_the_file_line_and_byte(tmp_path: Path) -> None:
    """Bytes that are not UTF-8: with ``--strict``, exit 2 with "file:line: not UTF-8 text: byte 0x.. at column N" (old
    show: the codec's message, "position 26", no column a person can find); without, the line is skipped with a
    warning and the rest shown (before issue 37: refused too)."""
    path = tmp_path / "rank0.jsonl"
    records = lines(call("r", 0, 10.0))
    path.write_bytes(records[0].encode() + b'\n{"version": 2, "kind": "st\xe9p"}\n' + records[1].encode() + b"\n")
    result = show(path, "--strict")
    assert_no_traceback(result)
    assert result.returncode == 2 and result.stdout == ""
    assert f"{path}:2: not UTF-8 text: byte 0xe9 at column 27" in result.stderr
    lenient = show(path, "--out", tmp_path / "d")
    assert lenient.returncode == 0 and f"warning: {path} line 2: a line that is not JSON skipped" in lenient.stderr


def test_a_folder_name_that_is_not_utf8_is_printed_escaped(tmp_path: Path) -> None:
    """Journals in a folder whose name is not UTF-8, on a UTF-8 terminal: the name prints escaped, exit 0 (old show
    died printing "wrote <folder>/attempt0.mmd": UnicodeEncodeError traceback, exit 1)."""
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    write(folder / "rank0.jsonl", call("r", 0, 10.0))
    result = show(folder, env=os.environ | {"PYTHONIOENCODING": "utf-8:strict"})
    assert_no_traceback(result)
    assert result.returncode == 0 and f"wrote {tmp_path}/caf\\udce9/attempt0.mmd" in result.stdout


def test_journals_of_different_runs_are_shown_apart_with_a_warning(tmp_path: Path) -> None:
    """Two runs' journals given together print as two runs and a warning says so (old show: no warning)."""
    for run_id, at in (("run-a", 10.0), ("run-b", 50.0)):
        for rank in (0, 1):
            write(tmp_path / run_id / f"rank{rank}.jsonl", call(run_id, rank, at))
    result = show(tmp_path / "run-a", tmp_path / "run-b", "--out", tmp_path / "d")
    assert result.returncode == 0, result.stderr
    headers = [line for line in result.stdout.splitlines() if not line.startswith((" ", "wrote"))]
    assert headers == ["run run-a", "attempt 0", "run run-b", "attempt 0"]
    assert "warning: these journals are of 2 different runs (run-a, run-b)" in result.stderr
    assert {p.name for p in (tmp_path / "d").glob("*.mmd")} == {"run-a-attempt0.mmd", "run-b-attempt0.mmd"}


def test_two_jobs_that_shared_a_run_id_are_not_merged_into_one_attempt(tmp_path: Path) -> None:
    """Two torchrun jobs at one address without --rdzv-id share the run id: a rank starting attempt 0 again begins
    the second job, shown apart with a warning (old show merged both into one "attempt 0")."""
    shared = "torchrun-127.0.0.1:29500"
    write(tmp_path / "rank0.jsonl", call(shared, 0, 10.0))  # job 1: rank 1 left no journal
    write(tmp_path / "rank0.jsonl", call(shared, 0, 50.0, steps=4))  # job 2, appended
    write(tmp_path / "rank1.jsonl", call(shared, 1, 50.1, steps=4))
    result = show(tmp_path, "--out", tmp_path / "d")
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert [line for line in out if line.startswith("run ")] == [
        f"run {shared} (job 1 of 2 with this run id)",
        f"run {shared} (job 2 of 2 with this run id)",
    ]
    job2 = out[out.index(f"run {shared} (job 2 of 2 with this run id)") :]
    second = [line for line in job2 if not line.startswith("  verdict: ")]  # each attempt's verdict comes first
    assert [line.split(":")[0] for line in second if line.startswith("  rank")] == ["  rank 0", "  rank 1"]
    assert "ended closed after step 4" in second[2] and "+0.000s" in second[3]  # timed from job 2's own start
    assert f"warning: run id {shared} was used by 2 jobs" in result.stderr
    assert {p.name for p in (tmp_path / "d").glob("*.mmd")} == {"job1-attempt0.mmd", "job2-attempt0.mmd"}


def test_a_folder_is_its_rank_files_and_a_named_file_is_read_whatever_its_name(tmp_path: Path) -> None:
    """In a folder only rank<R>.jsonl are journals: a journal-like other *.jsonl gets a note, an unrelated one is
    ignored silently; named, the other file is read (old show read every *.jsonl, exit 2 on metrics.jsonl)."""
    write(tmp_path / "rank0.jsonl", call("this-run", 0, 10.0))
    copy = write(tmp_path / "rank0-yesterday.jsonl", call("old-run", 0, 1.0))
    (tmp_path / "metrics.jsonl").write_text('{"loss": 2.5, "step": 1}\n')
    result = show(tmp_path, "--out", tmp_path / "d")
    assert result.returncode == 0, result.stderr
    assert "run this-run" in result.stdout and "old-run" not in result.stdout
    assert f"{copy}: ignored: it looks like a journal" in result.stderr and "metrics" not in result.stderr
    named = show(copy, "--out", tmp_path / "d")
    assert named.returncode == 0 and "run old-run" in named.stdout


def test_diagrams_that_cannot_be_written_exit_2_after_the_timeline(tmp_path: Path) -> None:
    """An --out that is a file: the timeline is printed, then an error naming it, exit 2 (old show: a traceback)."""
    path = write(tmp_path / "rank0.jsonl", call("r", 0, 10.0))
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    result = show(path, "--out", blocker)
    assert_no_traceback(result)
    assert result.returncode == 2 and "run r" in result.stdout
    assert f"cannot write the diagrams to {blocker}: {blocker} is a file, not a folder" in result.stderr
    assert "--out DIR" not in result.stderr  # the user gave --out: no hint to give it


def test_a_page_under_a_file_names_the_file(tmp_path: Path) -> None:
    """``--html`` under a path whose parent is a file: the error names that file (issue 27; before: "File
    exists")."""
    path = write(tmp_path / "rank0.jsonl", call("r", 0, 10.0))
    blocker = tmp_path / "plain"
    blocker.write_text("")
    result = show(path, "--out", tmp_path / "d", "--html", blocker / "sub" / "page.html")
    assert_no_traceback(result)
    assert result.returncode == 2
    assert f"cannot write the page to {blocker / 'sub' / 'page.html'}: {blocker} is a file, not a folder" in (
        result.stderr
    ), result.stderr


def _read_only_folder(folder: Path) -> bool:
    """Make ``folder`` a read-only tmpfs mount (root) or a mode-0555 folder (others); False where neither holds."""
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return True
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)], capture_output=True)
    return mounted.returncode == 0


def test_journals_in_a_read_only_folder_get_a_hint_to_give_out(tmp_path: Path) -> None:
    """Journals in a read-only folder: the timeline is printed, then exit 2 naming the read-only folder and
    suggesting ``--out DIR`` (issue 27; before: the bare OSError, no hint); with --out elsewhere, exit 0."""
    folder = tmp_path / "ro"
    if not _read_only_folder(folder):
        pytest.skip("neither a read-only mount (root without mount rights) nor a 0555 folder (root) is possible here")
    try:
        if os.geteuid() == 0:
            write(folder / "rank0.jsonl", call("r", 0, 10.0))
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        else:
            folder.chmod(0o755)
            write(folder / "rank0.jsonl", call("r", 0, 10.0))
            folder.chmod(0o555)
        result = show(folder)
        assert_no_traceback(result)
        assert result.returncode == 2 and "run r" in result.stdout
        assert f"cannot write the diagrams to {folder}" in result.stderr
        assert "read-only" in result.stderr or "no permission" in result.stderr, result.stderr
        assert "write them elsewhere with --out DIR" in result.stderr
        assert show(folder, "--out", tmp_path / "d").returncode == 0
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(folder)], check=False)
        else:
            folder.chmod(0o755)


def test_show_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    """``show | head -n 3``: head closes the pipe; show drops the rest, still writes the diagrams, exits 141 with
    nothing on stderr (old show: a BrokenPipeError traceback, exit 1)."""
    o = Origin("big", 0, 0, "ordinary", 0)
    many = [Left(origin=o, resource=f"resource {i}", owner="caller", reason="x" * 500) for i in range(1000)]
    path = write(tmp_path / "rank0.jsonl", [*call("big", 0, 10.0)[:-1], *many])  # ~0.5 MB of timeline: > a pipe
    command = [sys.executable, "-m", "lifecycle", "show", str(path), "--out", str(tmp_path / "d")]
    with open(tmp_path / "stderr", "wb") as stderr:
        shown = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr)
    try:
        assert shown.stdout is not None
        head = subprocess.run(["head", "-n", "3"], stdin=shown.stdout, capture_output=True, timeout=TIMEOUT_S)
        shown.stdout.close()  # head has gone: no reader is left on the pipe
        code = shown.wait(timeout=TIMEOUT_S)
    finally:
        shown.kill()
        shown.wait()
    printed = head.stdout.decode().splitlines()
    assert printed[:2] == ["run big", "attempt 0"] and len(printed) == 3
    assert (code, (tmp_path / "stderr").read_text()) == (141, "")
    assert (tmp_path / "d" / "attempt0.mmd").exists()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
