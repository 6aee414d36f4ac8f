"""The slots of the copy in node memory (``lifecycle._training.memory``): format, publication, refusals. Torch-free."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lifecycle._training import memory
from lifecycle._training.memory import (
    FAILURE_SLOT,
    MAGIC,
    CopyHeader,
    NoRoom,
    RankCopies,
    read_copy,
    remove_rank_copies,
    sweep,
)


def slots(tmp_path: Path, run: str = "run-1", rank: int = 0, world: int = 2) -> RankCopies:
    """Opened slots of ``run``'s ``rank`` under ``tmp_path``."""
    copies = RankCopies(run, rank, world, tmp_path)
    copies.open()
    return copies


def test_a_header_round_trips_and_a_foreign_start_is_no_header() -> None:
    """The header encodes after ``MAGIC`` and decodes back with the payload's offset; other bytes are not one."""
    header = CopyHeader("run/1", "0.2", 1, 2, 17, 5, 99)
    raw = header.encode() + b"hello"
    assert raw.startswith(MAGIC)
    assert CopyHeader.decode(raw) == (header, len(raw) - 5)
    assert CopyHeader.decode(b"PK\x03\x04") is None
    assert CopyHeader.decode(MAGIC + b"\x05\x00\x00\x00{bad}") is None


def test_copies_alternate_between_two_slots_and_the_newest_two_are_kept(tmp_path: Path) -> None:
    """Each copy replaces the slot not holding the newest: after steps 1, 2, 3 the slots hold 2 and 3, readable."""
    copies = slots(tmp_path)
    for step in (1, 2, 3):
        copies.write(step, "0.0", [f"state {step}".encode()], cap=None)
    assert sorted(copies.newest()) == [2, 3]
    assert copies.read(3) == b"state 3" and copies.read(1) is None
    assert not list(copies.folder.glob("*.tmp-*"))


def test_a_torn_copy_is_never_read(tmp_path: Path) -> None:
    """A slot cut short is not listed (its length); one with a changed byte is listed from its header, but never
    read (its checksum): ``read`` gives None."""
    copies = slots(tmp_path)
    path = copies.write(5, "0.0", [b"x" * 1000], cap=None)
    whole = path.read_bytes()
    path.write_bytes(whole[:-1])
    assert copies.newest() == {} and copies.read(5) is None
    path.write_bytes(whole[:-1] + b"y")
    assert list(copies.newest()) == [5] and copies.read(5) is None
    path.write_bytes(whole)
    assert list(copies.newest()) == [5] and copies.read(5) == b"x" * 1000


def test_a_copy_of_another_run_rank_or_world_size_is_never_read(tmp_path: Path) -> None:
    """The header must name this run, this rank and this world size."""
    path = slots(tmp_path, "other").write(4, "0.0", [b"payload"], cap=None)
    for run, rank, world in (("mine", 0, 2), ("other", 1, 2), ("other", 0, 4)):
        assert read_copy(path, run, rank, world) is None
    assert read_copy(path, "other", 0, 2) is not None


def test_a_copy_over_the_cap_or_the_free_space_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``NoRoom`` before any byte is written: two copies over the cap, or one over the file system's free space."""
    copies = slots(tmp_path)
    with pytest.raises(NoRoom, match="exceed the cap"):
        copies.write(1, "0.0", [b"x" * 100], cap=150)
    real = os.statvfs(tmp_path)

    class Full:
        f_bavail, f_frsize, f_blocks = 0, real.f_frsize, real.f_blocks

    monkeypatch.setattr(memory.os, "statvfs", lambda _path: Full)
    with pytest.raises(NoRoom, match="does not fit"):
        copies.write(1, "0.0", [b"x"], cap=None)
    assert sorted(p.name for p in copies.folder.iterdir()) == [".lock"]


def test_slots_are_written_with_write_never_through_a_memory_map() -> None:
    """The module imports no ``mmap``: a full /dev/shm gives ``write`` ENOSPC, a mapped write SIGBUS."""
    tree = ast.parse(Path(memory.__file__).read_text(encoding="utf-8"))
    names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert "mmap" not in names and "mmap" not in {getattr(n, "module", None) for n in ast.walk(tree)}


def test_opening_removes_this_ranks_torn_temporary_files(tmp_path: Path) -> None:
    """A writer killed mid-write leaves ``<slot>.tmp-<pid>``: the next open of that rank removes it, no other's."""
    folder = tmp_path / "run-1"
    folder.mkdir()
    (folder / "rank0.slot1.tmp-123").write_bytes(b"torn")
    (folder / "rank1.slot1.tmp-123").write_bytes(b"torn")
    slots(tmp_path, rank=0)
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "rank1.slot1.tmp-123"]


def test_sweep_removes_other_runs_no_process_holds(tmp_path: Path) -> None:
    """Another run's folder whose lock a live process holds stays; one nobody holds (its job was killed) goes; the
    sweeping run's own folder stays."""
    slots(tmp_path, "held").write(1, "0.0", [b"p"], cap=None)  # this process holds its lock
    orphan = tmp_path / "orphan"
    orphan.mkdir()
    (orphan / ".lock").touch()
    (orphan / "rank0.slot0").write_bytes(b"p")
    (tmp_path / "mine").mkdir()
    assert sweep("mine", tmp_path) == [orphan]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held", "mine"]


def test_a_lock_held_by_a_live_process_keeps_the_folder_until_it_ends(tmp_path: Path) -> None:
    """A folder locked by another process is not swept while it runs; it is once the process has ended."""
    folder = tmp_path / "other"
    folder.mkdir()
    code = (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_SH); "
        "print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(folder / ".lock")], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        assert sweep("mine", tmp_path) == []
    finally:
        holder.communicate(b"", timeout=10)
    assert sweep("mine", tmp_path) == [folder]


def test_removing_a_ranks_copies_removes_the_folder_once_no_process_holds_it(tmp_path: Path) -> None:
    """``remove`` deletes this rank's slots, releases the lock, and the folder (all left in it) once no lock is held."""
    copies = slots(tmp_path, rank=0)
    copies.write(1, "0.0", [b"p"], cap=None)
    (copies.folder / "rank1.slot0").write_bytes(b"p")
    remove_rank_copies("run-1", 0, tmp_path)
    assert not copies.folder.exists()


def test_the_root_goes_with_the_last_runs_folder_and_comes_back_with_the_next(tmp_path: Path) -> None:
    """Removing one run's copies keeps a root another run's folder is in; removing the last removes the root too."""
    root = tmp_path / "copies"
    first, second = slots(root, "first"), slots(root, "second")
    first.write(1, "0.0", [b"p"], cap=None)
    first.remove()
    assert sorted(p.name for p in root.iterdir()) == ["second"]
    second.remove()
    assert not root.exists()
    again = slots(root, "third")
    again.write(2, "0.0", [b"q"], cap=None)
    assert sorted(again.newest()) == [2]
    again.remove()
    assert list(tmp_path.iterdir()) == []


def test_opening_makes_the_root_again_when_another_run_removes_it_between_the_mkdirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The root removed by another run's last remove just after this open made it: the open makes it again."""
    root = tmp_path / "copies"
    made = Path.mkdir
    raced: list[Path] = []

    def mkdir_then_lose_the_root(self: Path, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        if self == root and not raced:  # the parent made, the run's folder not yet: another run's rmdir lands
            raced.append(self)
            root.rmdir()

    monkeypatch.setattr(Path, "mkdir", mkdir_then_lose_the_root)
    copies = slots(root, "run-1")
    assert raced == [root]
    copies.write(1, "0.0", [b"p"], cap=None)
    assert sorted(copies.newest()) == [1]


@pytest.mark.parametrize("at_exit", [True, False], ids=["removed-at-exit", "kept"])
def test_copies_marked_remove_at_exit_are_gone_when_the_process_exits(tmp_path: Path, at_exit: bool) -> None:
    """A process that marked its rank's copies ``remove_at_exit`` (a run id its own) leaves no file when it exits,
    failed or not; unmarked (a job's run id: a restart resumes from them) they stay."""
    code = (
        "import sys; from pathlib import Path; from lifecycle._training.memory import RankCopies\n"
        "copies = RankCopies('local-1', 0, 1, Path(sys.argv[1])); copies.open()\n"
        "copies.write(1, '0.0', [b'p'], cap=None)\n"
        "if sys.argv[2] == 'yes': copies.remove_at_exit()\n"
        "raise SystemExit('the call failed')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), "yes" if at_exit else "no"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "the call failed" in done.stderr, done.stderr
    left = sorted(p.name for p in tmp_path.rglob("*"))
    assert left == ([] if at_exit else [".lock", "local-1", "rank0.slot0"]), left


def test_a_failures_copy_goes_to_its_own_slot_and_evicts_neither_of_the_others(tmp_path: Path) -> None:
    """Copies of steps 4 and 5, then a failure's copy of 6: all three are held (a peer that died holds 4 and 5);
    the next copies go on taking turns in slots 0 and 1."""
    copies = slots(tmp_path)
    for step in (4, 5):
        copies.write(step, "0.0", [f"state {step}".encode()], cap=None)
    path = copies.write(6, "0.0", [b"state 6"], cap=None, failure=True)
    assert path == copies.slot(FAILURE_SLOT) and sorted(copies.newest()) == [4, 5, 6]
    copies.write(7, "0.0", [b"state 7"], cap=None)
    assert sorted(copies.newest()) == [5, 6, 7] and copies.read(6) == b"state 6"


def test_a_copy_is_written_over_the_old_copys_file_not_a_new_one(tmp_path: Path) -> None:
    """The slot a copy replaces becomes the spare the next copy is written into: its file (inode) is used again,
    so tmpfs need not allocate its pages; where no exchange is possible, a rename publishes it all the same."""
    (tmp_path / "a").write_bytes(b"a")
    (tmp_path / "b").write_bytes(b"b")
    if not memory._exchange(tmp_path / "a", tmp_path / "b"):
        pytest.skip("this file system cannot exchange two names (renameat2): the rename's test covers it")
    assert (tmp_path / "a").read_bytes() == b"b"
    copies = slots(tmp_path)
    copies.write(1, "0.0", [b"x" * 5000], cap=None)
    copies.write(2, "0.0", [b"y" * 5000], cap=None)
    replaced = os.stat(copies.slot(0)).st_ino  # step 1's file: the next copy replaces it
    copies.write(3, "0.0", [b"z" * 4000], cap=None)
    assert os.stat(copies.spare()).st_ino == replaced  # old code: no spare; a new file each time
    copies.write(4, "0.0", [b"w" * 3000], cap=None)
    assert os.stat(copies.slot(1)).st_ino == replaced
    assert copies.read(4) == b"w" * 3000 and copies.read(3) == b"z" * 4000  # a shorter copy is cut to its length


def test_without_an_exchange_a_rename_publishes_the_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A system without ``renameat2``'s exchange: each copy is renamed into its slot, and reads back whole."""
    monkeypatch.setattr(memory, "_exchange", lambda first, second: False)
    copies = slots(tmp_path)
    for step in (1, 2, 3):
        copies.write(step, "0.0", [f"state {step}".encode()], cap=None)
    assert sorted(copies.newest()) == [2, 3] and copies.read(3) == b"state 3"
    assert not copies.spare().exists()


def test_a_copy_of_the_same_replica_set_stands_in_for_a_rank_without_one(tmp_path: Path) -> None:
    """Rank 1 holds no copy; rank 0's copies name the replica set rank 1 is in: they stand in (checksum verified);
    a copy of another set, of another world size, or a file without a set never does."""
    mine = RankCopies("run-1", 1, 2, tmp_path, replica="1x1:0")
    mine.open()
    peer = RankCopies("run-1", 0, 2, tmp_path, replica="1x1:0")
    peer.open()
    peer.write(7, "0.0", [b"state 7"], cap=None)
    peer.write(8, "0.0", [b"state 8"], cap=None, failure=True)
    assert mine.newest() == {} and sorted(mine.stand_ins()) == [7, 8]
    assert mine.read_stand_in(8) == (0, b"state 8") and mine.read_stand_in(6) is None
    for rank, world, replica in ((2, 4, "1x1:0"), (3, 2, "1x1:1"), (4, 2, "")):
        other = RankCopies("run-1", rank, world, tmp_path, replica=replica)
        other.open()
        other.write(9, "0.0", [b"state 9"], cap=None)
    assert sorted(mine.stand_ins()) == [7, 8]
    assert RankCopies("run-1", 1, 2, tmp_path).stand_ins() == {}  # no replica set: nothing stands in
    other = RankCopies("run-1", 5, 2, tmp_path, replica="1x1:0")  # a second replica of the set, with step 8 too
    other.open()
    other.write(8, "0.0", [b"state 8"], cap=None)
    slot = peer.slot(FAILURE_SLOT)
    slot.write_bytes(slot.read_bytes()[:-1])  # torn: its header still says step 8, its checksum fails
    assert mine.read_stand_in(8) == (5, b"state 8")  # the next one stands in
    other.slot(0).write_bytes(b"")
    assert mine.read_stand_in(8) is None


def test_a_header_without_a_replica_set_reads_as_none() -> None:
    """A copy written before replica sets existed decodes with ``replica`` "" (it never stands in)."""
    fields = {"run_id": "r", "attempt": "0.0", "rank": 0, "world_size": 2, "step": 3, "length": 1, "checksum": 0}
    data = json.dumps(fields).encode()
    found = CopyHeader.decode(MAGIC + len(data).to_bytes(4, "little") + data + b"x")
    assert found is not None and found[0].replica == "" and found[0].step == 3


def test_the_rng_kept_at_each_step_reads_back_and_a_torn_record_is_none(tmp_path: Path) -> None:
    """``keep_rng`` keeps the last two steps' RNG states (by parity): each reads back; an older step, another
    step's record or a torn record is None; ``remove`` takes the file too."""
    copies = RankCopies("run-1", 1, 2, tmp_path, replica="1x1:0")
    copies.open()
    for step in (4, 5, 6):
        copies.keep_rng(step, bytes([step]) * 5056)
    assert copies.rng(6) == bytes([6]) * 5056 and copies.rng(5) == bytes([5]) * 5056
    assert copies.rng(4) is None and copies.rng(7) is None
    path = copies.folder / "rank1.rng"
    raw = bytearray(path.read_bytes())
    raw[memory.RNG_RECORD + 100] ^= 0xFF  # step 5's record (odd), damaged
    path.write_bytes(bytes(raw))
    assert copies.rng(5) is None and copies.rng(6) is not None
    copies.remove()
    assert not path.exists()
