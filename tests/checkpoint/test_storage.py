"""Storage faults surface with the OS error text and the path: full disk, read-only file system, no permission.

As root (here and in CI) ``chmod`` stops nothing, so the faults are real: a size-limited
tmpfs (ENOSPC), a read-only bind mount (EROFS), and a writer process that dropped to
``nobody`` (EACCES). Where mounts are not permitted the test skips, except under
``CI=true``, where that is a failure.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from support.configs import config_of_one
from support.launch import REPO, run_bounded, worker_reports
from support.probes import alive

from lifecycle import Callback, CheckpointConfig, SessionHandle, pretrain
from lifecycle.checkpoint import AsyncCheckpointer, CheckpointError, latest_checkpoint, load_checkpoint


def _cannot(reason: str) -> None:
    """Skip for ``reason``; under CI=true a skip would hide the test, so fail instead."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: this test must run)")
    pytest.skip(reason)


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=20, check=False)
    if done.returncode:
        _cannot(f"mount {' '.join(args)} is not permitted here: {done.stderr.strip()}")


def _umount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True, timeout=20, check=False).returncode:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=20, check=False)


@contextmanager
def _small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path``, unmounted afterwards."""
    path.mkdir()
    _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    try:
        yield path
    finally:
        _umount(path)


@contextmanager
def _read_only_view(source: Path, path: Path) -> Iterator[Path]:
    """``source`` bind-mounted read-only at ``path``, unmounted afterwards."""
    path.mkdir()
    _mount("--bind", str(source), str(path))
    try:
        _mount("-o", "remount,bind,ro", str(path))
        yield path
    finally:
        _umount(path)


@pytest.mark.timeout(60)
def test_a_full_disk_names_the_os_error_and_the_shard_and_leaves_no_tmp_file(tmp_path: Path) -> None:
    """ENOSPC mid-write: finalize's error quotes the OS error and the shard path; no .tmp is left (was: neither)."""
    with _small_tmpfs(tmp_path / "full", "256k") as full:
        writer = AsyncCheckpointer(full)  # the probe fits
        writer.save(1, {"w": torch.ones(1 << 18)})  # 1 MiB does not
        with pytest.raises(CheckpointError) as caught:
            writer.finalize()
        message = str(caught.value)
        assert "[Errno 28 ENOSPC] No space left on device" in message
        assert f"rank 0 could not write its shard {full / 'step_0000000001' / '__0_'}" in message
        assert [p.name for p in (full / "step_0000000001").iterdir()] == []
        assert latest_checkpoint(full) is None


@pytest.mark.timeout(60)
def test_a_read_only_folder_fails_at_construction_and_still_loads(tmp_path: Path) -> None:
    """EROFS: the writer refuses at construction naming the folder and the OS error; resuming from it still works."""
    source = tmp_path / "source"
    writer = AsyncCheckpointer(source)
    writer.save(1, {"w": torch.full((2,), 1.0)})
    writer.finalize()
    with _read_only_view(source, tmp_path / "ro") as ro:
        with pytest.raises(
            CheckpointError, match=rf"{ro}/\.probe-rank00000-.*\[Errno 30 EROFS\] Read-only file system"
        ):
            AsyncCheckpointer(ro)
        target = {"w": torch.zeros(2)}
        assert load_checkpoint(ro, target) == 1 and torch.equal(target["w"], torch.ones(2))


class _CountSteps(Callback):
    """Counts the steps that ran."""

    def __init__(self) -> None:
        self.steps = 0

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        """Count one step."""
        self.steps += 1


@pytest.mark.timeout(90)
def test_pretrain_refuses_a_read_only_checkpoint_folder_before_training(tmp_path: Path) -> None:
    """A read-only checkpoint dir fails pretrain in setup, before any step, naming the OS error; nothing stays live."""
    (tmp_path / "source").mkdir()
    with _read_only_view(tmp_path / "source", tmp_path / "ro") as ro:
        counter = _CountSteps()
        config = config_of_one(tmp_path, checkpoint=CheckpointConfig(dir=str(ro), interval=1))
        with pytest.raises(CheckpointError, match=rf"{ro}.*Read-only file system"):
            pretrain(config, callbacks=[counter])
        assert counter.steps == 0
    assert not any(alive().values())


_AS_NOBODY = """
import json, os, pwd, sys, torch
from lifecycle.checkpoint import AsyncCheckpointer, CheckpointError
nobody = pwd.getpwnam("nobody")
os.setgroups([])
os.setgid(nobody.pw_gid)
os.setuid(nobody.pw_uid)  # from here on, root's files are out of reach
def attempt(path, save):
    try:
        writer = AsyncCheckpointer(path)
        if save:
            writer.save(1, {"w": torch.ones(2)})
            writer.finalize()
        return None
    except CheckpointError as exc:
        return str(exc)
root_owned, nobody_owned = sys.argv[1], sys.argv[2]
print(json.dumps({
    "create": attempt(os.path.join(root_owned, "ckpt"), False),
    "probe": attempt(root_owned, False),
    "write": attempt(nobody_owned, True),
}))
"""


@pytest.mark.timeout(90)
def test_a_folder_the_writer_may_not_write_names_the_os_error() -> None:
    """EACCES as nobody: creating, probing and writing a shard each fail naming the path and "Permission denied"."""
    base = Path(tempfile.mkdtemp(prefix="lifecycle-eacces-"))  # pytest's tmp_path is 0700 root's: nobody cannot enter
    try:
        _as_nobody_in(base)
    finally:
        shutil.rmtree(base)


def _as_nobody_in(base: Path) -> None:
    base.chmod(0o755)
    root_owned = base / "root-owned"
    root_owned.mkdir(mode=0o755)
    nobody_owned = base / "nobody-owned"
    nobody_owned.mkdir()
    nobody = pwd.getpwnam("nobody")
    os.chown(nobody_owned, nobody.pw_uid, nobody.pw_gid)
    (nobody_owned / "step_0000000001").mkdir(mode=0o755)  # root's: the shard cannot be written in it
    done = run_bounded([sys.executable, "-c", _AS_NOBODY, str(root_owned), str(nobody_owned)], 60, REPO)
    if done.returncode and "Operation not permitted" in done.stdout:
        _cannot(f"cannot switch to nobody here: {done.stdout[-300:]}")
    assert done.returncode == 0, done.stdout
    report = json.loads(done.stdout.strip().splitlines()[-1])
    denied = "[Errno 13 EACCES] Permission denied"
    assert report["create"] == f"cannot create the checkpoint directory {root_owned / 'ckpt'}: {denied}"
    assert report["probe"].startswith(f"cannot write to the checkpoint directory: probe file {root_owned}/.probe-")
    assert report["probe"].endswith(denied)
    step = nobody_owned / "step_0000000001"
    assert f"rank 0 could not write its shard {step}/__0_" in report["write"] and denied in report["write"]


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_peer_sees_the_os_error_of_the_rank_whose_disk_is_full(tmp_path: Path) -> None:
    """Rank 1 hits ENOSPC: rank 0's error quotes rank 1's OS error and shard path (was: "ranks [1] failed" only)."""
    with _small_tmpfs(tmp_path / "full", "512k") as full:
        reports = worker_reports("checkpoint_worker", "own_folders", str(full), str(full), "1", timeout_s=60)
        for report in reports:
            assert report["committed"] is None
            error = report["error"]
            assert "not committed: ranks [1] failed to write their shard: rank 1 could not write its shard" in error
            assert f"{full / 'step_0000000001' / '__1_'}" in error
            assert "[Errno 28 ENOSPC] No space left on device" in error
