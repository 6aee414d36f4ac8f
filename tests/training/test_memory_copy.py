"""The copy in node memory on 2 gloo ranks: a crash or a raise resumes from it, exactly; what it must never use.

Each test runs ``tests/workers/copy_worker.py`` (a checkpoint every 4 steps, a copy every step) with its own
run id and copy root, so the suite's runs never meet. The fault's step is drawn from a seeded generator.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from support.launch import run_workers

from lifecycle._training import memory
from lifecycle._training.copies import NodeCopies, _Packer, _unpack
from lifecycle._training.memory import CopyHeader
from lifecycle.checkpoint import latest_checkpoint
from lifecycle.journal import Resumed, read

FAULT_STEP = random.Random(44).randint(6, 11)
"""The step at which rank 1 dies or raises: after its backward pass, so ``FAULT_STEP - 1`` steps completed."""


def env_of(tmp_path: Path, run: str) -> dict[str, str]:
    """The worker's run id and copy root (under ``tmp_path``: never the node's /dev/shm folder)."""
    return {"LIFECYCLE_RUN_ID": run, "LIFECYCLE_COPY_ROOT": str(tmp_path / "shm")}


def launch(mode: str, out: Path, env: dict[str, str]) -> list[Any]:
    """Run the worker's ``mode`` on 2 ranks."""
    return run_workers("copy_worker", mode, str(out), str(FAULT_STEP), timeout_s=90, env=env)


def records(out: Path, rank: int) -> list[dict[str, Any]]:
    """What rank ``rank``'s worker recorded, in order."""
    return [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]


def resumes(out: Path) -> list[Resumed]:
    """The journal's ``resume`` records, every rank's, in order."""
    return [r for r in read([out / "journal"]) if isinstance(r, Resumed)]


def crashed(tmp_path: Path, run: str, **extra: str) -> tuple[Path, dict[str, str]]:
    """A run whose rank 1 was SIGKILLed at ``FAULT_STEP`` (``extra`` in the workers' environment): its folder and
    environment."""
    out, env = tmp_path / "run", {**env_of(tmp_path, run), **extra}
    out.mkdir()
    results = launch("crash", out, env)
    assert results[1].returncode == -9, results[1].output[-2000:]
    assert results[0].returncode == 1, results[0].output[-2000:]
    return out, env


def check_restored(out: Path, step: int) -> None:
    """Each rank's restored state (the last ``start`` record) hashes as it did at the end of ``step``, before."""
    for rank in (0, 1):
        seen = records(out, rank)
        before = next(r for r in seen if r["event"] == "step" and r["step"] == step)
        start = max(i for i, r in enumerate(seen) if r["event"] == "start")
        restored = seen[start]
        position = next(r for r in seen[start:] if r["event"] == "position")
        assert restored["step"] == step
        for part in ("model", "optimizer", "rng"):
            assert restored[part] == before[part], f"rank {rank}: {part} differs from step {step}'s"
        assert position["position"] == before["position"], f"rank {rank}: data position"


def nothing_left(tmp_path: Path) -> None:
    """No file of any run remains under the copy root."""
    root = tmp_path / "shm"
    assert not root.exists() or list(root.rglob("*")) == []


def rewrite(out: Path, tmp_path: Path, run: str, rank: int, **fields: Any) -> None:
    """Rewrite the header of rank ``rank``'s slots in run ``run``'s folder with ``fields`` (payload unchanged)."""
    for path in (tmp_path / "shm" / run).glob(f"rank{rank}.slot?"):
        raw = path.read_bytes()
        found = CopyHeader.decode(raw)
        assert found is not None
        header, offset = found
        changed = CopyHeader(**{**{f: getattr(header, f) for f in CopyHeader.__slots__}, **fields})
        path.write_bytes(changed.encode() + raw[offset:])


@pytest.mark.parametrize("run", [None, "job-1"], ids=["process-local-id", "job-id"])
def test_only_a_process_local_runs_copies_are_removed_at_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: str | None
) -> None:
    """Opened under a run id of the process's own (no LIFECYCLE_RUN_ID, no torchrun) a rank's copies are removed when
    the process exits (nobody else can resume from them); under a job's run id they stay for its restart."""
    for name in ("LIFECYCLE_RUN_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    if run is not None:
        monkeypatch.setenv("LIFECYCLE_RUN_ID", run)
    monkeypatch.setenv("LIFECYCLE_COPY_ROOT", str(tmp_path / "shm"))
    copies = NodeCopies(True, 1, 0.01, None, "0.0")
    copies.open(0, 1, on_cpu=True)
    assert copies.slots is not None
    try:
        assert ((copies.slots.folder, 0) in memory._AT_EXIT) is (run is None)
    finally:
        memory._AT_EXIT.pop((copies.slots.folder, 0), None)
        copies.slots.remove()


@pytest.mark.timeout(30)
def test_the_packed_state_reads_back_equal_whatever_its_dtypes_shapes_and_keys() -> None:
    """Tensors of every dtype and shape (0-d, empty, strided), int keys, tuples and scalars survive a pack."""
    state = {
        "model": {"w": torch.randn(3, 5).t(), "b": torch.zeros(0), "h": torch.ones(7, dtype=torch.bfloat16)},
        "optimizer": {"state": {0: {"step": torch.tensor(3.0), "m": torch.arange(4)}}, "param_groups": [
            {"lr": 1e-3, "betas": (0.9, 0.999), "params": [0], "foreach": None, "amsgrad": False}]},
        "step": 17, "consumed": 68, "rng": torch.get_rng_state(), "mask": torch.tensor([True, False]),
    }  # fmt: skip
    parts = _Packer().pack(state)
    back = _unpack(b"".join(bytes(p) for p in parts))
    assert back.keys() == state.keys() and back["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert list(back["optimizer"]["state"]) == [0] and (back["step"], back["consumed"]) == (17, 68)
    for got, want in (
        [(back["model"][k], state["model"][k]) for k in state["model"]]
        + [(back["optimizer"]["state"][0][k], state["optimizer"]["state"][0][k]) for k in ("step", "m")]
        + [(back["rng"], state["rng"]), (back["mask"], state["mask"])]
    ):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_crash_at_a_random_step_resumes_from_the_copy_exactly(tmp_path: Path) -> None:
    """Rank 1 SIGKILLed at a seeded step: restarted processes resume from the copy, at most one step lost, with the
    model, optimizer, RNG and data position hashing as at that step; no file of the run remains after it ends."""
    out, env = crashed(tmp_path, "crash")
    results = launch("resume", out, env)
    assert all(r.ok for r in results), [r.output[-2000:] for r in results]
    found = resumes(out)
    assert {(r.source, r.step) for r in found} == {("memory", found[0].step)}
    assert found[0].step >= FAULT_STEP - 2, f"more than one step lost: fault at {FAULT_STEP}, resumed {found[0].step}"
    check_restored(out, found[0].step)
    nothing_left(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_whole_job_killed_at_a_random_step_resumes_from_the_copy_and_another_run_sweeps_it(tmp_path: Path) -> None:
    """Every rank SIGKILLed at the end of a seeded step: the job started again resumes from the copy (at most the step
    being written lost) with equal hashes; killed again, its folder is swept by the next start of another run."""
    out, env = tmp_path / "run", env_of(tmp_path, "killed")
    out.mkdir()
    assert [r.returncode for r in launch("kill", out, env)] == [-9, -9]
    results = launch("resume", out, env)
    assert all(r.ok for r in results), [r.output[-2000:] for r in results]
    found = resumes(out)
    assert {(r.source, r.step) for r in found} == {("memory", found[0].step)}
    assert found[0].step >= FAULT_STEP - 1, f"fault at the end of {FAULT_STEP}, resumed from {found[0].step}"
    check_restored(out, found[0].step)
    nothing_left(tmp_path)
    again = tmp_path / "again"
    again.mkdir()
    assert [r.returncode for r in launch("kill", again, env)] == [-9, -9]
    assert (tmp_path / "shm" / "killed").exists()
    other = tmp_path / "other"
    other.mkdir()
    assert all(r.ok for r in launch("resume", other, env_of(tmp_path, "another")))
    nothing_left(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_in_process_retry_resumes_from_the_copy_exactly(tmp_path: Path) -> None:
    """Rank 1 raises at a seeded step; both ranks call pretrain again in-process: resumed from the copy of the last
    completed step, state hashing as at that step; nothing of the run left after the retry succeeds."""
    out = tmp_path / "run"
    out.mkdir()
    results = launch("raise", out, env_of(tmp_path, "retry"))
    assert all(r.ok for r in results), [r.output[-2000:] for r in results]
    found = resumes(out)
    assert {(r.source, r.step) for r in found} == {("memory", FAULT_STEP - 1)}
    check_restored(out, FAULT_STEP - 1)
    nothing_left(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_in_process_retry_resumes_from_the_copy_taken_at_the_failure(tmp_path: Path) -> None:
    """No copy every few steps (an interval past the run): rank 1 raises at a seeded step, and both ranks' copies
    taken on the failure path, of the step the last update left, are what the retry resumes from, exactly."""
    out = tmp_path / "run"
    out.mkdir()
    results = launch("raise", out, {**env_of(tmp_path, "at-failure"), "MEMORY_INTERVAL": "1000"})
    assert all(r.ok for r in results), [r.output[-2000:] for r in results]
    assert {(r.source, r.step) for r in resumes(out)} == {("memory", FAULT_STEP - 1)}  # was the checkpoint's
    check_restored(out, FAULT_STEP - 1)
    nothing_left(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_copies_of_different_steps_on_different_ranks_fall_back_to_the_checkpoint(tmp_path: Path) -> None:
    """Rank 1's copies say steps no rank 0 copy has: the ranks resume together from the committed checkpoint."""
    out, env = crashed(tmp_path, "diverge")
    held = {r["step"] for r in records(out, 1) if r["event"] == "step"}
    rewrite(out, tmp_path, "diverge", 1, step=max(held) + 100, replica="")  # no replica: neither stands in for the
    rewrite(out, tmp_path, "diverge", 0, replica="")  # other (the next test has them stand in)
    committed = latest_checkpoint(out / "ckpt")
    assert committed is not None
    results = launch("resume", out, env)
    assert all(r.ok for r in results), [r.output[-2000:] for r in results]
    assert {(r.source, r.step) for r in resumes(out)} == {("checkpoint", committed[0])}
    check_restored(out, committed[0])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_another_runs_copy_is_never_used_and_is_swept(tmp_path: Path) -> None:
    """Copies whose header names another run are never used (the checkpoint is); another run's folder that no live
    process holds is removed at the start; nothing is left after the run."""
    out, env = crashed(tmp_path, "mine")
    shutil.copytree(tmp_path / "shm" / "mine", tmp_path / "shm" / "other")
    for rank in (0, 1):
        rewrite(out, tmp_path, "mine", rank, run_id="other")
    committed = latest_checkpoint(out / "ckpt")
    assert committed is not None
    results = launch("resume", out, env)
    assert all(r.ok for r in results), [r.output[-2000:] for r in results]
    assert {r.source for r in resumes(out)} == {"checkpoint"}
    assert not (tmp_path / "shm" / "other").exists()
    nothing_left(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_torn_copy_is_never_used(tmp_path: Path) -> None:
    """Rank 0's newest copy cut short (a writer killed mid-write) and a stray temporary file: the torn one is never
    used; the ranks resume from the newest step all the same, rank 0 from rank 1's whole copy of it (its data-parallel
    replica), with its own RNG state of that step."""
    out, env = crashed(tmp_path, "torn", APART_RNG="1")
    folder = tmp_path / "shm" / "torn"
    slots = {CopyHeader.decode(p.read_bytes())[0].step: p for p in folder.glob("rank0.slot?")}  # type: ignore[index]
    newest = max(slots)
    slots[newest].write_bytes(slots[newest].read_bytes()[:-100])
    (folder / "rank0.slot0.tmp-1").write_bytes(b"LCMCOPY1 torn")
    results = launch("resume", out, env)
    assert all(r.ok for r in results), [r.output[-2000:] for r in results]
    found = resumes(out)
    assert {(r.source, r.step) for r in found} == {("memory", newest)}
    check_restored(out, newest)
    nothing_left(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_crashed_rank_without_a_copy_resumes_from_its_replicas_copy_at_the_failure(tmp_path: Path) -> None:
    """No copy every few steps (an interval past the run): rank 1, SIGKILLed at a seeded step, holds none; rank 0's
    copy taken on its failure path stands in for it (its data-parallel replica), with the RNG state rank 1 kept at
    each step: both resume at the step before the fault, no step lost, hashing as rank 1's own state did."""
    out, env = tmp_path / "run", {**env_of(tmp_path, "stand-in"), "MEMORY_INTERVAL": "1000", "APART_RNG": "1"}
    out.mkdir()
    results = launch("crash", out, env)
    assert results[1].returncode == -9 and results[0].returncode == 1, [r.output[-2000:] for r in results]
    assert not list((tmp_path / "shm" / "stand-in").glob("rank1.slot?"))  # rank 1 never copied
    results = launch("resume", out, env)
    assert all(r.ok for r in results), [r.output[-2000:] for r in results]
    assert {(r.source, r.step) for r in resumes(out)} == {("memory", FAULT_STEP - 1)}  # was the checkpoint's
    check_restored(out, FAULT_STEP - 1)
    nothing_left(tmp_path)


def small_run(tmp_path: Path, root: Path, cap_mb: str | None) -> list[Any]:
    """A successful 2-rank run with copies on, its copy root ``root`` (and the cap ``cap_mb``); each rank's result."""
    out = tmp_path / "run"
    out.mkdir()
    env = {"LIFECYCLE_RUN_ID": "small", "LIFECYCLE_COPY_ROOT": str(root), **({"CAP_MB": cap_mb} if cap_mb else {})}
    return launch("resume", out, env)


def one_warning_and_no_copy(results: list[Any], root: Path) -> None:
    """Each rank exited 0 (no SIGBUS) with one warning about the copy, and no copy was kept."""
    for result in results:
        assert result.ok, result.output[-2000:]
        assert result.output.count("no copy of the training state in node memory") == 1, result.output[-2000:]
    assert [p for p in root.rglob("*.slot?")] == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_copy_over_its_cap_warns_once_and_the_run_goes_on_without(tmp_path: Path) -> None:
    """A cap smaller than two copies: one warning on each rank, no copy, the run ends well."""
    one_warning_and_no_copy(small_run(tmp_path, tmp_path / "shm", "0.01"), tmp_path / "shm")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_too_small_dev_shm_warns_once_and_never_kills_with_sigbus(tmp_path: Path) -> None:
    """A 64 KiB tmpfs as the copy root (a full /dev/shm): one warning on each rank, no copy, no SIGBUS."""
    root = tmp_path / "tiny"
    root.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(root)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        one_warning_and_no_copy(small_run(tmp_path, root, "100"), root)
    finally:
        subprocess.run(["umount", str(root)], check=False)
