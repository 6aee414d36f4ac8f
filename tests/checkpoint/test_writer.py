"""lifecycle.checkpoint: async save, collective finalize, rank-local abort, safe load.

Multi-rank tests run ``tests/workers/checkpoint_worker.py`` as real gloo ranks; each
prints one JSON line with what it observed.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support.launch import worker_reports
from support.probes import TORCH_COLLECTIVES, TorchCalls

from lifecycle import ResourceMismatch, StaleResource
from lifecycle.checkpoint import (
    AsyncCheckpointer,
    CheckpointError,
    CheckpointMismatch,
    StaleCheckpointer,
    latest_checkpoint,
    load_checkpoint,
)


def _trained(seed: int) -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(2, 4)).sum().backward()
    optim.step()
    return model, optim


def _state(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optim": optim.state_dict(), "step_in_epoch": 7}


def _fresh() -> tuple[torch.nn.Linear, torch.optim.AdamW, dict[str, Any]]:
    model = torch.nn.Linear(4, 3)
    optim = torch.optim.AdamW(model.parameters(), lr=0.5)
    return model, optim, _state(model, optim)


def _commit(directory: Path, step: int, seed: int) -> torch.nn.Linear:
    model, optim = _trained(seed)
    writer = AsyncCheckpointer(directory)
    writer.save(step, _state(model, optim))
    assert writer.finalize() == step
    return model


def _only_shard(folder: Path) -> Path:
    """Rank 0's DCP data file in a one-rank step folder."""
    (shard,) = folder.glob("__0_*_0.distcp")
    return shard


def _only_record(folder: Path) -> Path:
    """Rank 0's record (what a CheckpointMismatch names) in a one-rank step folder."""
    (record,) = folder.glob("__0_*.json")
    return record


def _same(a: Any, b: Any) -> bool:
    """True if two state dicts hold equal keys, tensors (dtype, shape, values) and values."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return bool(a == b)


def _wait_done(writer: AsyncCheckpointer) -> Callable[[], BaseException | None]:
    """Return a function that waits for the writer's current background write to end."""
    pending = writer._pending
    assert pending is not None
    return lambda: pending.future.exception(timeout=20)


@pytest.fixture
def world_of_one(tmp_path: Path) -> Iterator[None]:
    """A real one-rank gloo default group, destroyed afterwards if still alive."""
    assert not dist.is_initialized(), "another test leaked a default process group"
    store = dist.FileStore(str(tmp_path / "store"), 1)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=20))
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture
def collective_calls() -> Iterator[TorchCalls]:
    """Record every torch.distributed collective called from any thread (calls pass through)."""
    with TorchCalls(TORCH_COLLECTIVES) as calls:
        yield calls


def test_single_rank_roundtrip_restores_model_and_optimizer(tmp_path: Path) -> None:
    """save → finalize → load restores equal tensors as they were when save() returned."""
    model, optim = _trained(0)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    writer = AsyncCheckpointer(tmp_path)
    writer.save(3, _state(model, optim))
    assert writer.in_flight
    with torch.no_grad():
        model.weight.add_(100.0)  # training goes on; the staged copy must not see it
    assert writer.finalize() == 3
    assert not writer.in_flight
    assert writer.finalize() is None
    assert latest_checkpoint(tmp_path) == (3, tmp_path / "step_0000000003")

    new_model, new_optim, target = _fresh()
    assert load_checkpoint(tmp_path, target) == 3
    new_optim.load_state_dict(target["optim"])
    for key, value in new_model.state_dict().items():
        assert torch.equal(value, expected[key])
    assert target["step_in_epoch"] == 7
    assert new_optim.param_groups[0]["lr"] == 0.01
    ref = optim.state[model.weight]
    got = new_optim.state[new_model.weight]
    assert torch.equal(got["exp_avg"], ref["exp_avg"]) and torch.equal(got["step"], ref["step"])


def test_abort_of_an_in_flight_save_keeps_the_previous_latest(tmp_path: Path) -> None:
    """A save in flight at abort() is never committed; step 1 stays latest and loads."""
    model_1 = _commit(tmp_path, 1, seed=1)
    gate = threading.Event()
    writer = AsyncCheckpointer(tmp_path)
    writer._before_write = gate.wait
    writer.save(2, _state(*_trained(2)))
    done = _wait_done(writer)
    assert writer.in_flight
    writer.abort()
    writer.abort()
    assert not writer.in_flight
    gate.set()  # the abandoned write now completes late
    assert isinstance(done(), CheckpointError)
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "step_0000000001")
    assert list((tmp_path / "step_0000000002").iterdir()) == []
    assert writer.finalize() is None
    with pytest.raises(StaleCheckpointer) as refused:
        writer.save(3, {})
    assert isinstance(refused.value, CheckpointError) and isinstance(refused.value, StaleResource)
    assert refused.value.resource == "async_checkpoint"
    assert str(tmp_path) in refused.value.detail
    assert list((tmp_path / "step_0000000003").glob("*")) == []  # the refused save wrote nothing
    new_model, _, target = _fresh()
    assert load_checkpoint(tmp_path, target) == 1
    assert torch.equal(new_model.weight, model_1.weight)


@pytest.mark.usefixtures("world_of_one")
def test_abort_calls_no_collective_while_finalize_does(tmp_path: Path, collective_calls: TorchCalls) -> None:
    """abort() and the writer thread call no collective; finalize() does (the recorder works)."""
    writer = AsyncCheckpointer(tmp_path)
    writer.save(1, {"w": torch.ones(2)})
    assert writer.finalize() == 1
    assert collective_calls.named() == ["all_gather", "broadcast"]
    collective_calls.calls.clear()

    gate = threading.Event()
    writer = AsyncCheckpointer(tmp_path)
    writer._before_write = gate.wait
    writer.save(2, {"w": torch.zeros(2)})
    done = _wait_done(writer)
    writer.abort()
    gate.set()
    done()
    assert collective_calls.named() == []
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "step_0000000001")


@pytest.mark.usefixtures("world_of_one")
def test_abort_works_after_the_group_is_destroyed_and_finalize_then_errors(tmp_path: Path) -> None:
    """Once the group is gone abort() still returns at once; finalize() raises instead of hanging."""
    gate = threading.Event()
    gate.set()
    aborting = AsyncCheckpointer(tmp_path)
    aborting._before_write = gate.wait
    aborting.save(1, {"w": torch.ones(2)})
    finalizing = AsyncCheckpointer(tmp_path)
    finalizing.save(2, {"w": torch.ones(2)})
    dist.destroy_process_group()
    start = time.monotonic()
    aborting.abort()
    assert time.monotonic() - start < 0.5
    with pytest.raises(CheckpointError, match=r"was destroyed; finalize\(\) must run before"):
        finalizing.finalize()
    assert latest_checkpoint(tmp_path) is None


def _hung(writer: AsyncCheckpointer) -> threading.Event:
    """Make ``writer``'s next write hang until the returned event is set (the writer's test seam)."""
    gate = threading.Event()
    writer._before_write = gate.wait
    return gate


def test_a_hung_write_fails_finalize_at_its_bound_and_its_late_file_is_removed(tmp_path: Path) -> None:
    """finalize() waits write_timeout_s for a hung write, then raises naming the rank and file; latest stays."""
    _commit(tmp_path, 1, seed=1)
    writer = AsyncCheckpointer(tmp_path, write_timeout_s=0.5)
    gate = _hung(writer)
    writer.save(2, {"w": torch.ones(2)})
    done = _wait_done(writer)
    start = time.monotonic()
    with pytest.raises(CheckpointError) as caught:
        writer.finalize()
    elapsed = time.monotonic() - start
    assert 0.5 <= elapsed < 1.5, elapsed
    assert "ranks [0] failed to write their shard: rank 0 could not write its shard " in str(caught.value)
    assert f"{tmp_path / 'step_0000000002'}/__0_" in str(caught.value)
    assert "did not finish within 0.5 s (write_timeout_s)" in str(caught.value)
    gate.set()  # the write completes late: abandoned, it removes its own file
    assert isinstance(done(), CheckpointError)
    assert list((tmp_path / "step_0000000002").iterdir()) == []
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "step_0000000001")


@pytest.mark.usefixtures("world_of_one")
def test_the_write_bound_defaults_to_half_the_group_timeout_and_stays_below_it(tmp_path: Path) -> None:
    """write_timeout_s: half the group timeout (20 s) unless given; at or above it, or not above 0, is refused."""
    assert AsyncCheckpointer(tmp_path).write_timeout_s == 10.0
    assert AsyncCheckpointer(tmp_path, write_timeout_s=19.5).write_timeout_s == 19.5
    for bad in (20, 25.0, 0, -1, True):
        with pytest.raises(ValueError, match=r"below the group timeout \(20 s\)"):
            AsyncCheckpointer(tmp_path, write_timeout_s=bad)


@pytest.mark.usefixtures("world_of_one")
def test_abort_from_another_thread_wakes_a_waiting_finalize(tmp_path: Path) -> None:
    """finalize() waiting for a hung write returns within 0.5 s of abort() from another thread, committing nothing."""
    _commit(tmp_path, 1, seed=1)
    writer = AsyncCheckpointer(tmp_path)  # bound: 10 s
    gate = _hung(writer)
    writer.save(2, {"w": torch.ones(2)})
    aborted_at: list[float] = []

    def abort_soon() -> None:
        time.sleep(0.3)
        aborted_at.append(time.monotonic())
        writer.abort()

    aborter = threading.Thread(target=abort_soon)
    aborter.start()
    with pytest.raises(CheckpointError, match=r"rank 0 aborted the save of .*/__0_.* while finalize"):
        writer.finalize()
    woke = time.monotonic() - aborted_at[0]
    aborter.join()
    gate.set()
    assert woke < 0.5, woke
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "step_0000000001")


@pytest.mark.usefixtures("world_of_one")
def test_a_writer_never_keeps_its_group_alive(tmp_path: Path) -> None:
    """The writer holds its group weakly: gloo closes a group's sockets only once the group is freed."""
    import gc
    import sys

    writer = AsyncCheckpointer(tmp_path)
    group = dist.group.WORLD
    assert not any(value is group for value in vars(writer).values())
    before = sys.getrefcount(group)
    gc.collect()
    writer.save(1, {"w": torch.ones(2)})
    assert writer.finalize() == 1  # the weak reference still reaches the live group
    assert sys.getrefcount(group) == before
    writer.save(2, {"w": torch.ones(2)})
    writer.abort()
    assert writer.finalize() is None


def test_save_while_a_save_is_in_flight_finalizes_the_previous_one_first(tmp_path: Path) -> None:
    """A second save() commits the in-flight one before starting; only one save is ever in flight."""
    writer = AsyncCheckpointer(tmp_path)
    writer.save(1, {"w": torch.ones(2)})
    writer.save(2, {"w": torch.full((2,), 2.0)})
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "step_0000000001")
    assert writer.in_flight
    assert writer.finalize() == 2
    with pytest.raises(ValueError, match="non-negative int"):
        writer.save(-1, {})


def test_a_partial_step_folder_is_never_latest(tmp_path: Path) -> None:
    """A step folder without a manifest (crash mid-write, or never finalized) is never returned."""
    _commit(tmp_path, 1, seed=1)
    crashed = AsyncCheckpointer(tmp_path)
    crashed.save(3, {"w": torch.ones(2)})
    _wait_done(crashed)()  # the shard is fully written, but finalize never ran
    partial = tmp_path / "step_0000000005"
    partial.mkdir()
    (partial / "rank00000-00000000000000aa.pt").write_bytes(b"half a file")
    (partial / ".rank00000-00000000000000aa.pt.tmp").write_bytes(b"half")
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "step_0000000001")
    (tmp_path / "latest").unlink()
    with pytest.warns(RuntimeWarning, match="marker is missing; using step 1"):
        assert latest_checkpoint(tmp_path) == (1, tmp_path / "step_0000000001")


@pytest.mark.parametrize(
    ("marker", "why"),
    [(b"{not json", "marker is unusable"), (b'{"step": 9}', "step_0000000009")],
    ids=["garbage", "names-missing-step"],
)
def test_a_bad_marker_falls_back_to_the_newest_complete_checkpoint(tmp_path: Path, marker: bytes, why: str) -> None:
    """A corrupt marker, or one naming a missing checkpoint, warns naming the directory and falls back."""
    _commit(tmp_path, 1, seed=1)
    _commit(tmp_path, 2, seed=2)
    (tmp_path / "latest").write_bytes(marker)
    with pytest.warns(RuntimeWarning, match=why) as record:
        assert latest_checkpoint(tmp_path) == (2, tmp_path / "step_0000000002")
    assert str(tmp_path) in str(record[0].message)


def test_a_truncated_shard_makes_latest_fall_back(tmp_path: Path) -> None:
    """A committed step whose shard lost bytes is skipped with a warning; the previous one loads."""
    model_1 = _commit(tmp_path, 1, seed=1)
    _commit(tmp_path, 2, seed=2)
    shard = _only_shard(tmp_path / "step_0000000002")
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.warns(RuntimeWarning, match=str(tmp_path)):
        assert latest_checkpoint(tmp_path) == (1, tmp_path / "step_0000000001")
    new_model, _, target = _fresh()
    with pytest.warns(RuntimeWarning, match="wrong size"):
        assert load_checkpoint(tmp_path, target) == 1
    assert torch.equal(new_model.weight, model_1.weight)


def _flip_a_byte(shard: Path) -> None:
    """Corrupt ``shard`` in place: same size, one byte flipped."""
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_a_corrupt_shard_falls_back_with_a_warning_naming_it(tmp_path: Path) -> None:
    """A same-size bit flip fails the checksum: the previous step loads, a warning names the shard (was: an error)."""
    model_1 = _commit(tmp_path, 1, seed=1)
    _commit(tmp_path, 2, seed=2)
    shard = _only_shard(tmp_path / "step_0000000002")
    _flip_a_byte(shard)
    new_model, _, target = _fresh()
    with pytest.warns(RuntimeWarning, match=f"step 2 is unusable: shard {shard} is corrupt.*resuming from step 1"):
        assert load_checkpoint(tmp_path, target) == 1
    assert torch.equal(new_model.weight, model_1.weight)


def test_a_corrupt_only_checkpoint_starts_from_scratch_and_leaves_state_untouched(tmp_path: Path) -> None:
    """With no intact step left, load warns naming the shard, returns None and restores nothing."""
    _commit(tmp_path, 1, seed=1)
    shard = _only_shard(tmp_path / "step_0000000001")
    _flip_a_byte(shard)
    new_model, _, target = _fresh()
    before = {k: v.clone() for k, v in new_model.state_dict().items()}
    with pytest.warns(RuntimeWarning, match=f"{shard} is corrupt.*starting from scratch"):
        assert load_checkpoint(tmp_path, target) is None
    assert all(torch.equal(v, before[k]) for k, v in new_model.state_dict().items())


class _NotATensor:
    """An arbitrary class: a safe loader must refuse to unpickle it."""


def test_load_never_unpickles_arbitrary_objects(tmp_path: Path) -> None:
    """A committed shard holding a custom object is refused by the weights_only loader (a warning, nothing loaded)."""
    _commit(tmp_path, 1, seed=1)
    folder = tmp_path / "step_0000000001"
    shard, record = _only_shard(folder), _only_record(folder)
    torch.save([torch.zeros(1), _NotATensor()], shard)  # a whole zip, one storage: every tensor's bytes now
    # unpickle a custom object beside a tensor
    entry = json.loads(record.read_text())
    for tensor in entry["tensors"]:
        tensor["chunks"][0].update(offset=0, length=shard.stat().st_size)
    entry["files"][0].update(bytes=shard.stat().st_size)  # the members' CRC-32 are torch.save's: intact
    record.write_text(json.dumps(entry))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["shards"][0].update(bytes=record.stat().st_size, sha256=hashlib.sha256(record.read_bytes()).hexdigest())
    manifest["shards"][0]["data"] = entry["files"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    # The safe unpickler's refusal is the shard's corruption (ShardCorrupt), said with torch's reason.
    with pytest.warns(
        RuntimeWarning, match=r"(?s)step 1 is unusable: shard .* is corrupt: .*Weights only load failed.*_NotATensor"
    ):
        assert load_checkpoint(tmp_path, {"model": {}}) is None
    with pytest.raises(TypeError, match="_NotATensor"):
        AsyncCheckpointer(tmp_path / "other").save(1, {"x": _NotATensor()})


def test_a_mismatched_state_dict_is_not_half_restored(tmp_path: Path) -> None:
    """If any tensor does not fit, load raises CheckpointMismatch naming the entry before copying any tensor."""
    writer = AsyncCheckpointer(tmp_path)
    writer.save(1, {"a": torch.ones(2), "b": torch.ones(3), "nested": {"n": torch.ones(1)}})
    writer.finalize()
    shard = str(_only_record(tmp_path / "step_0000000001"))
    target = {"a": torch.zeros(2), "b": torch.zeros(4)}
    with pytest.raises(CheckpointMismatch) as caught:
        load_checkpoint(tmp_path, target)
    error = caught.value
    assert isinstance(error, CheckpointError) and isinstance(error, ResourceMismatch)
    assert (error.resource, error.path, error.what) == ("async_checkpoint", shard, "state_dict['b']")
    assert (error.found, error.wanted) == ("torch.float32[3]", "torch.float32[4]")
    assert torch.equal(target["a"], torch.zeros(2))


@pytest.mark.parametrize(
    ("target", "what", "found", "wanted"),
    [
        ({"a": torch.zeros(2), "c": torch.zeros(1)}, "keys ['c'] of state_dict", "absent", "present"),
        ({"a": torch.zeros(2, dtype=torch.int64)}, "state_dict['a']", "torch.float32[2]", "torch.int64[2]"),
        ({"nested": torch.zeros(1)}, "state_dict['nested']", "dict", "Tensor"),
        ({"nested": {"n": torch.zeros(3)}}, "state_dict['nested']['n']", "torch.float32[1]", "torch.float32[3]"),
    ],
    ids=["missing-key", "dtype", "type", "nested-shape"],
)
def test_each_way_a_state_dict_can_disagree_is_a_checkpoint_mismatch(
    tmp_path: Path, target: dict[str, Any], what: str, found: str, wanted: str
) -> None:
    """Missing keys, dtype, type and nested shape each raise CheckpointMismatch with what, found and wanted."""
    writer = AsyncCheckpointer(tmp_path)
    writer.save(1, {"a": torch.ones(2), "b": torch.ones(3), "nested": {"n": torch.ones(1)}})
    writer.finalize()
    before = copy.deepcopy(target)
    with pytest.raises(CheckpointMismatch) as caught:
        load_checkpoint(tmp_path, target)
    assert (caught.value.what, caught.value.found, caught.value.wanted) == (what, found, wanted)
    assert caught.value.path == str(_only_record(tmp_path / "step_0000000001"))
    assert _same(target, before)  # nothing was loaded


def test_a_rank_without_a_shard_is_a_world_size_mismatch(tmp_path: Path) -> None:
    """Loading as a rank the checkpoint has no shard for raises CheckpointMismatch on the saved world size."""
    _commit(tmp_path, 1, seed=1)
    with pytest.raises(CheckpointMismatch) as caught:
        load_checkpoint(tmp_path, {}, rank=3)
    error = caught.value
    assert error.path == str(tmp_path / "step_0000000001")
    assert (error.what, error.found, error.wanted) == ("world size (no shard for rank 3)", 1, "at least 4")


@pytest.mark.parametrize("how", [pickle.loads, copy.copy, copy.deepcopy], ids=["pickle", "copy", "deepcopy"])
def test_checkpoint_refusals_pickle_and_copy_with_their_fields(how: Callable[[Any], Any]) -> None:
    """CheckpointMismatch and StaleCheckpointer survive pickling and copying with their type, fields and notes."""
    for error in (
        CheckpointMismatch("/ckpt/step_0000000001/rank00000-1.pt", "state_dict['b']", "torch.float32[3]", "x"),
        StaleCheckpointer("the checkpointer for /ckpt was aborted; create a new one"),
    ):
        error.add_note("a note")
        clone = how(pickle.dumps(error)) if how is pickle.loads else how(error)
        assert type(clone) is type(error)
        assert str(clone) == str(error)
        assert vars(clone) == vars(error)


def _write_format_1(directory: Path, step: int, state: dict[str, Any]) -> None:
    """A step folder as lifecycle wrote it before the DCP format: one torch.save shard, a format-1 manifest."""
    folder = directory / f"step_{step:010d}"
    folder.mkdir(parents=True)
    shard = folder / "rank00000-00000000000000ab.pt"
    torch.save(state, shard)
    digest = hashlib.sha256(shard.read_bytes()).hexdigest()
    entry = {"rank": 0, "file": shard.name, "bytes": shard.stat().st_size, "sha256": digest}
    manifest = {"format": 1, "step": step, "world_size": 1, "shards": [entry]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (directory / "latest").write_text(json.dumps({"step": step}))


def test_a_checkpoint_in_the_format_before_dcp_still_resumes_and_is_kept(tmp_path: Path) -> None:
    """A format-1 step loads; after a DCP-format commit it is kept and is the fall-back when the new one is corrupt."""
    model, optim = _trained(1)
    _write_format_1(tmp_path, 1, _state(model, optim))
    new_model, new_optim, target = _fresh()
    assert load_checkpoint(tmp_path, target) == 1
    new_optim.load_state_dict(target["optim"])
    assert torch.equal(new_model.weight, model.weight) and target["step_in_epoch"] == 7
    writer = AsyncCheckpointer(tmp_path)
    writer.save(2, _state(*_trained(2)))
    assert writer.finalize() == 2
    assert (tmp_path / "step_0000000001" / "rank00000-00000000000000ab.pt").is_file()
    assert json.loads((tmp_path / "step_0000000002" / "manifest.json").read_text())["format"] == 2
    _flip_a_byte(_only_shard(tmp_path / "step_0000000002"))
    _, _, target = _fresh()
    with pytest.warns(RuntimeWarning, match="step 2 is unusable: shard .* is corrupt.*resuming from step 1"):
        assert load_checkpoint(tmp_path, target) == 1


def test_nothing_committed_means_none(tmp_path: Path) -> None:
    """An empty or missing directory has no latest checkpoint and load leaves state_dict alone."""
    target = {"w": torch.zeros(1)}
    assert latest_checkpoint(tmp_path / "missing") is None
    assert latest_checkpoint(tmp_path) is None
    assert load_checkpoint(tmp_path, target) is None
    assert torch.equal(target["w"], torch.zeros(1))


def test_an_abandoned_writers_late_completion_never_commits_for_a_retry(tmp_path: Path) -> None:
    """A failed attempt's late write neither moves latest nor replaces a retry's shard (Bridge #5117)."""
    _commit(tmp_path, 1, seed=1)
    gate_2, gate_3 = threading.Event(), threading.Event()
    failed = AsyncCheckpointer(tmp_path)
    failed._before_write = gate_2.wait
    failed.save(2, {"w": torch.full((2,), -1.0)})
    late_2 = _wait_done(failed)
    failed.abort()

    retry = AsyncCheckpointer(tmp_path)  # same process, same directory, same step
    retry.save(2, {"w": torch.full((2,), 2.0)})
    assert retry.finalize() == 2
    gate_2.set()
    assert isinstance(late_2(), CheckpointError)
    target = {"w": torch.zeros(2)}
    assert load_checkpoint(tmp_path, target) == 2
    assert torch.equal(target["w"], torch.full((2,), 2.0))

    # Again, but the late completion lands while the retry's save is still in flight.
    failed = AsyncCheckpointer(tmp_path)
    failed._before_write = gate_3.wait
    failed.save(3, {"w": torch.full((2,), -1.0)})
    late_3 = _wait_done(failed)
    failed.abort()
    retry.save(3, {"w": torch.full((2,), 3.0)})
    gate_3.set()
    late_3()
    assert latest_checkpoint(tmp_path) == (2, tmp_path / "step_0000000002")
    assert retry.finalize() == 3
    assert load_checkpoint(tmp_path, target) == 3
    assert torch.equal(target["w"], torch.full((2,), 3.0))


# ---- two real ranks, in subprocesses --------------------------------------------------


def _run_two_ranks(scenario: str, directory: Path, *args: str, timeout_s: float = 45) -> list[dict[str, Any]]:
    """Run ``checkpoint_worker.py SCENARIO DIRECTORY ARGS`` on 2 ranks; return each rank's last JSON report."""
    return worker_reports("checkpoint_worker", scenario, str(directory), *args, timeout_s=timeout_s)


@pytest.mark.timeout(60)
def test_two_ranks_finalize_and_each_loads_its_own_shard(tmp_path: Path) -> None:
    """Both ranks save and finalize; each rank's own shard (not a replicated copy) loads back."""
    reports = _run_two_ranks("both_finalize", tmp_path)
    for rank, report in enumerate(reports):
        assert report == {"committed": 1, "loaded": 1, "w": [float(rank)] * 3}
    manifest = json.loads((tmp_path / "step_0000000001" / "manifest.json").read_text())
    assert [s["rank"] for s in manifest["shards"]] == [0, 1]


@pytest.mark.timeout(60)
def test_a_hung_write_on_one_rank_fails_finalize_on_every_rank_within_its_bound(tmp_path: Path) -> None:
    """Rank 1's write hangs: both finalize() calls raise one error naming rank 1 and its file, before the timeout."""
    reports = _run_two_ranks("hung_write", tmp_path, "6")
    assert reports[0]["error"] == reports[1]["error"], reports
    error = reports[0]["error"]
    assert "ranks [1] failed to write their shard: rank 1 could not write its shard " in error
    assert f"{tmp_path / 'step_0000000002'}/__1_" in error and "within 3 s (write_timeout_s)" in error
    for report in reports:
        assert report["bound"] == 3.0 and report["latest"] == 1
        assert report["elapsed"] < 5.5, reports  # the group timeout is 6 s: the peer was still there
    assert reports[1]["elapsed"] >= 3.0, reports
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "step_0000000001")


@pytest.mark.timeout(60)
def test_rank_0_finalizing_is_released_when_aborting_rank_1_destroys_its_group(tmp_path: Path) -> None:
    """Rank 1 aborts (write hung) and destroys its group: rank 0's finalize errors fast, latest stays 1."""
    rank_0, rank_1 = _run_two_ranks("peer_aborts", tmp_path, "20", "destroy")
    assert rank_0["error"] is not None and "step 2" in rank_0["error"]
    assert rank_0["elapsed"] < 5.0, rank_0  # group timeout is 20 s; measured ~0.1 s
    assert rank_0["latest"] == 1
    # The hung daemon writer did not hold up rank 1's interpreter exit: it exited 0 in time.
    assert rank_1 == {"aborted": True}
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "step_0000000001")


@pytest.mark.timeout(60)
def test_rank_0_finalizing_errors_within_the_group_timeout_when_rank_1_aborts_and_lingers(tmp_path: Path) -> None:
    """Rank 1 aborts but keeps its group: rank 0's finalize raises after about the 3 s group timeout."""
    rank_0, _ = _run_two_ranks("peer_aborts", tmp_path, "3", "linger")
    assert rank_0["error"] is not None
    assert 2.0 < rank_0["elapsed"] < 10.0, rank_0
    assert rank_0["latest"] == 1
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "step_0000000001")


@pytest.mark.usefixtures("world_of_one")
def test_saves_run_no_collective_off_the_main_thread(tmp_path: Path, collective_calls: TorchCalls) -> None:
    """Three DCP-format saves: no collective from any other thread, the group's C++ count unchanged until finalize()."""
    group = dist.group.WORLD
    assert group is not None
    for step in (1, 2, 3):
        before = group._get_sequence_number_for_group()
        writer = AsyncCheckpointer(tmp_path, layout=None)
        writer.save(step, {"model": torch.nn.Linear(8, 8).state_dict(), "step": step, "rng": torch.get_rng_state()})
        assert _wait_done(writer)() is None  # the background write is over: planned, written, recorded
        assert group._get_sequence_number_for_group() == before  # no collective issued on the group, by anyone
        assert writer.finalize() == step
        assert group._get_sequence_number_for_group() == before + 2  # the commit's all_gather and broadcast
    main = threading.main_thread().name
    assert [c.name for c in collective_calls.calls if c.thread != main] == []
    assert [c.name for c in collective_calls.calls] == ["all_gather", "broadcast"] * 3


def test_an_abort_stops_the_write_at_the_next_tensor_and_removes_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """abort() as the write reaches the 3rd of 16 tensors: no tensor from there on is written, files removed, < 1 s."""
    from lifecycle.checkpoint import dcp_format

    writer = AsyncCheckpointer(tmp_path)
    resolve = dcp_format._CancellablePlanner.resolve_data
    calls: list[float] = []
    watched = threading.Event()  # the test holds the pending write before the abort clears it

    def abort_at_the_third(planner: Any, item: Any) -> Any:
        calls.append(time.monotonic())
        if len(calls) == 3:
            watched.wait(5)
            writer.abort()  # as another thread would, between the 2nd tensor and the 3rd
        return resolve(planner, item)

    monkeypatch.setattr(dcp_format._CancellablePlanner, "resolve_data", abort_at_the_third)
    writer.save(1, {f"t{i:02d}": torch.full((1 << 16,), float(i)) for i in range(16)})
    done = _wait_done(writer)
    watched.set()
    error = done()
    assert isinstance(error, CheckpointError) and "aborted while it was written" in str(error)
    assert len(calls) == 3  # the 3rd tensor was refused: the write ended there
    assert time.monotonic() - calls[2] < 1.0
    assert list((tmp_path / "step_0000000001").iterdir()) == []
    assert latest_checkpoint(tmp_path) is None
