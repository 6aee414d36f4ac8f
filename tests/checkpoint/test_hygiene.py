"""Checkpoint hygiene: what a commit removes (only in a folder this run owns), retention, setup probes.

Single-process tests use the real writer on real files; the abort/finalize race runs two
real gloo ranks (``tests/workers/ckpt_race_worker.py``).
"""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import pytest
import torch
from support.configs import config_of_one
from support.launch import worker_reports

from lifecycle import CheckpointConfig, ConfigError, pretrain
from lifecycle.checkpoint import AsyncCheckpointer, CheckpointError, latest_checkpoint, load_checkpoint
from lifecycle.journal import run_id


def _commit(directory: Path, step: int, *, keep_last: int | None = None) -> None:
    writer = AsyncCheckpointer(directory, keep_last=keep_last)
    writer.save(step, {"w": torch.full((2,), float(step))})
    assert writer.finalize() == step


def _steps(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("step_*"))


def _leave_a_mess(directory: Path) -> tuple[Path, Path, Path]:
    """What failures leave: an aborted save, a crashed save's folder and tmp file, a retry's stray shard."""
    gate = threading.Event()
    aborted = AsyncCheckpointer(directory)
    aborted._before_write = gate.wait
    aborted.save(3, {"w": torch.ones(2)})
    aborted.abort()
    gate.set()  # the abandoned write finishes late and removes its own file
    crashed = directory / "step_0000000004"
    crashed.mkdir()
    (crashed / "rank00000-00000000000000aa.pt").write_bytes(b"a shard whose save never committed")
    (crashed / ".rank00000-00000000000000bb.pt.tmp").write_bytes(b"half a shard")
    stray = directory / "step_0000000001" / "rank00000-00000000000000cc.pt"
    stray.write_bytes(b"a shard of an attempt that failed before its commit")
    (directory / ".probe-rank00001-0000dead.tmp").write_bytes(b"a probe of a writer killed while it was built")
    return directory / "step_0000000003", crashed, stray


def test_the_next_commit_removes_partial_folders_and_unreferenced_shards(tmp_path: Path) -> None:
    """After a commit, this run's partial step folders and stray shards are gone; committed ones load (was: kept)."""
    _commit(tmp_path, 1)
    assert json.loads((tmp_path / ".lifecycle-owner").read_text())["run_id"] == run_id()
    aborted, crashed, stray = _leave_a_mess(tmp_path)
    assert aborted.is_dir() and crashed.is_dir() and stray.is_file()
    _commit(tmp_path, 2)
    assert _steps(tmp_path) == ["step_0000000001", "step_0000000002"]
    assert not stray.exists()
    manifest = json.loads((tmp_path / "step_0000000001" / "manifest.json").read_text())
    listed = {manifest["shards"][0]["file"], manifest["metadata"]["file"]} | {
        d["file"] for d in manifest["shards"][0]["data"]
    }
    assert {p.name for p in (tmp_path / "step_0000000001").iterdir()} == listed | {"manifest.json"}
    assert not list(tmp_path.rglob("*.tmp"))
    target = {"w": torch.zeros(2)}
    assert load_checkpoint(tmp_path, target) == 2 and torch.equal(target["w"], torch.full((2,), 2.0))


def test_a_folder_owned_by_another_run_is_never_cleaned_only_warned_about(tmp_path: Path) -> None:
    """Another run id in .lifecycle-owner: nothing is removed and the warning names that run and the file."""
    (tmp_path / ".lifecycle-owner").write_text(json.dumps({"run_id": "someone-else"}))
    _commit(tmp_path, 1)
    _, crashed, stray = _leave_a_mess(tmp_path)
    with pytest.warns(RuntimeWarning, match=r"owned by run 'someone-else' \(.*\.lifecycle-owner\), not this run"):
        _commit(tmp_path, 2)
    assert crashed.is_dir() and stray.is_file()
    assert json.loads((tmp_path / ".lifecycle-owner").read_text())["run_id"] == "someone-else"


def test_a_partial_folder_holding_foreign_files_is_left_with_a_warning(tmp_path: Path) -> None:
    """A step folder without a manifest that holds a file lifecycle never writes is not removed."""
    _commit(tmp_path, 1)
    odd = tmp_path / "step_0000000005"
    odd.mkdir()
    (odd / "notes.txt").write_text("mine")
    with pytest.warns(RuntimeWarning, match=r"step_0000000005 not removed: .*\['notes.txt'\]"):
        _commit(tmp_path, 2)
    assert (odd / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("code", [errno.ESTALE, errno.EIO], ids=["ESTALE", "EIO"])
def test_a_manifest_read_error_during_a_commit_keeps_that_checkpoint_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """An I/O error reading an older step's manifest once is not "partial": the step is kept (was: removed)."""
    _commit(tmp_path, 1)
    manifest = tmp_path / "step_0000000001" / "manifest.json"
    read_bytes = Path.read_bytes
    failures: list[Path] = []

    def flaky(path: Path) -> bytes:
        if path == manifest and not failures:  # the first read fails, as on a stale NFS handle
            failures.append(path)
            raise OSError(code, os.strerror(code), str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", flaky)
    with pytest.warns(RuntimeWarning, match=rf"step_0000000001 kept: cannot read .*\[Errno {code} "):
        _commit(tmp_path, 2)
    assert failures == [manifest]
    assert _steps(tmp_path) == ["step_0000000001", "step_0000000002"]
    (tmp_path / "latest").write_text(json.dumps({"step": 1}))
    target = {"w": torch.zeros(2)}
    assert load_checkpoint(tmp_path, target) == 1 and torch.equal(target["w"], torch.full((2,), 1.0))


def test_keep_last_keeps_the_newest_and_never_the_just_committed_one_less(tmp_path: Path) -> None:
    """keep_last=2 keeps the 2 newest steps; after going back to an older step, it is kept and newer ones left."""
    for step in range(1, 6):
        _commit(tmp_path, step, keep_last=2)
    assert _steps(tmp_path) == ["step_0000000004", "step_0000000005"]
    for step in range(1, 3):
        _commit(tmp_path, step)  # without keep_last nothing is removed
    assert len(_steps(tmp_path)) == 4
    # A run that went back to step 2 (say step 4 and 5 were unusable) commits step 3 with keep_last=1:
    _commit(tmp_path, 3, keep_last=1)
    assert _steps(tmp_path) == ["step_0000000003", "step_0000000004", "step_0000000005"]
    assert latest_checkpoint(tmp_path) == (3, tmp_path / "step_0000000003")
    with pytest.raises(ValueError, match="keep_last"):
        AsyncCheckpointer(tmp_path, keep_last=0)


def test_pretrain_keeps_only_keep_last_checkpoints(tmp_path: Path) -> None:
    """CheckpointConfig(keep_last=2) reaches the writer: after 4 steps saved every step, steps 3 and 4 remain."""
    ckpt = tmp_path / "ckpt"
    config = config_of_one(tmp_path, iterations=4, checkpoint=CheckpointConfig(dir=str(ckpt), interval=1, keep_last=2))
    assert pretrain(config).checkpoint_step == 4
    assert _steps(ckpt) == ["step_0000000003", "step_0000000004"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"dir": "ckpt", "keep_last": 0}, "checkpoint.keep_last"), ({"keep_last": 2}, "checkpoint.dir")],
    ids=["zero", "no-dir"],
)
def test_keep_last_is_validated_in_the_config(fields: dict[str, object], field: str) -> None:
    """keep_last below 1, or without a directory, is a ConfigError naming the field."""
    with pytest.raises(ConfigError, match=field):
        CheckpointConfig(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("problem", ["a-file", "under-a-file"])
def test_a_checkpoint_dir_that_is_a_file_is_refused_by_the_config(tmp_path: Path, problem: str) -> None:
    """CheckpointConfig(dir=<a file, or under one>): a ConfigError saying which is a file (was: "File exists" later)."""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    path = blocker if problem == "a-file" else blocker / "ckpt"
    with pytest.raises(ConfigError) as raised:
        CheckpointConfig(dir=str(path))
    assert (raised.value.field, raised.value.message) == ("checkpoint.dir", f"{blocker} is a file, not a folder")
    assert CheckpointConfig(dir=str(tmp_path / "new" / "ckpt")).dir  # a folder yet to be made is fine


@pytest.mark.parametrize("problem", ["a-file", "under-a-file"])
def test_a_folder_that_cannot_hold_checkpoints_fails_at_construction(tmp_path: Path, problem: str) -> None:
    """A checkpoint path that is a file, or lies under one, raises CheckpointError naming it and the OS error."""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    path = blocker if problem == "a-file" else blocker / "ckpt"
    with pytest.raises(CheckpointError, match=rf"{path}.*\[Errno (17 EEXIST|20 ENOTDIR)\]"):
        AsyncCheckpointer(path)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_abort_racing_finalize_never_commits_a_manifest_missing_a_shard(tmp_path: Path) -> None:
    """A thread aborts while finalize runs (seeded, 150 runs): no manifest lacks a shard (was: one, latest moved)."""
    reports = worker_reports("ckpt_race_worker", str(tmp_path), "150", "7", timeout_s=100)
    rank_0 = reports[0]
    assert rank_0["bad"] == [], rank_0["bad"][:3]
    # Each outcome happened: abort before finalize, abort during it (not committed), abort too late (committed).
    assert rank_0["outcomes"]["none"] > 0 and rank_0["outcomes"]["failed"] > 0 and rank_0["outcomes"]["committed"] > 0
    assert reports[1]["outcomes"]["committed"] == rank_0["outcomes"]["committed"]
