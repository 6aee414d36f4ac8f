"""The synchronous save (no staging copy) and how a data file's content is checked.

One rank, no process group: what ``save_sync`` writes, what each record lists (the
zip members' CRC-32 that ``torch.save`` wrote; a whole-file CRC-32 when torch's are
off), and that every kind of checksum a committed folder may carry is checked at load.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from lifecycle.checkpoint import AsyncCheckpointer, CheckpointError, dcp_format, latest_checkpoint, load_checkpoint


def _state(value: float) -> dict[str, Any]:
    return {"model": {"weight": torch.full((64, 64), value), "bias": torch.zeros(64)}, "step": 3}


def _record(folder: Path) -> tuple[Path, dict[str, Any]]:
    (record,) = folder.glob("__0_*.json")
    return record, json.loads(record.read_text())


def _mutate_while_written(writer: AsyncCheckpointer, tensor: torch.Tensor) -> None:
    """Have the writer thread set ``tensor`` to 7 just before it writes: what lands shows whether it was copied."""
    writer._before_write = lambda: tensor.fill_(7.0)


def test_save_sync_commits_and_writes_the_callers_cpu_tensors_without_a_staging_copy(tmp_path: Path) -> None:
    """save_sync returns the committed step and writes the caller's tensor itself; save writes a copy taken before."""
    synchronous = _state(1.0)
    writer = AsyncCheckpointer(tmp_path / "sync")
    _mutate_while_written(writer, synchronous["model"]["weight"])
    assert writer.save_sync(5, synchronous) == 5
    assert latest_checkpoint(tmp_path / "sync") == (5, tmp_path / "sync" / "step_0000000005")
    target = _state(0.0)
    assert load_checkpoint(tmp_path / "sync", target) == 5
    assert torch.equal(target["model"]["weight"], torch.full((64, 64), 7.0))

    staged = _state(1.0)
    writer = AsyncCheckpointer(tmp_path / "async")
    _mutate_while_written(writer, staged["model"]["weight"])
    writer.save(5, staged)
    assert writer.finalize() == 5
    assert load_checkpoint(tmp_path / "async", target) == 5
    assert torch.equal(target["model"]["weight"], torch.full((64, 64), 1.0))


def test_an_abort_during_save_sync_returns_none_and_keeps_the_previous_latest(tmp_path: Path) -> None:
    """An abort() while save_sync writes: None or a CheckpointError, the step never committed, the previous latest."""
    writer = AsyncCheckpointer(tmp_path)
    assert writer.save_sync(1, _state(1.0)) == 1
    writer._before_write = writer.abort
    try:  # None if the abort came before finalize() took the save, else the failed commit's error
        assert writer.save_sync(2, _state(2.0)) is None
    except CheckpointError as exc:
        assert "aborted" in str(exc)
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "step_0000000001")


def _flip_in_weight(folder: Path, record: dict[str, Any]) -> Path:
    """Flip a byte amid ``model.weight``'s bytes in its data file (same size, other content); return the file."""
    (chunk,) = next(t for t in record["tensors"] if t["fqn"] == "model.weight")["chunks"]
    data = folder / chunk["file"]
    raw = bytearray(data.read_bytes())
    raw[chunk["offset"] + chunk["length"] // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    return data


def test_a_data_file_is_checked_by_its_zip_members_crc32_and_a_flipped_byte_fails_it(tmp_path: Path) -> None:
    """A data file is listed as zip-crc32 (its members' CRC-32 are torch.save's); a flipped byte fails the load."""
    writer = AsyncCheckpointer(tmp_path)
    assert writer.save_sync(1, _state(1.0)) == 1
    folder = tmp_path / "step_0000000001"
    _, record = _record(folder)
    assert record["format"] == 2
    (listed,) = record["files"]
    assert listed == {
        "file": listed["file"],
        "bytes": (folder / listed["file"]).stat().st_size,
        "checksum": "zip-crc32",
    }
    assert json.loads((folder / "manifest.json").read_text())["shards"][0]["data"] == [listed]
    data = _flip_in_weight(folder, record)
    with pytest.warns(
        RuntimeWarning, match=rf"shard {data} is corrupt: the bytes loaded for 'model.weight' do not match their CRC-32"
    ):
        assert load_checkpoint(tmp_path, _state(0.0)) is None


def _loads_until_a_weight_byte_flips(directory: Path, record: dict[str, Any], data: Path) -> None:
    """Step 1 loads as written; once a byte of its weight flips, loading it warns that ``data`` is corrupt."""
    target = _state(0.0)
    assert load_checkpoint(directory, target) == 1
    assert torch.equal(target["model"]["weight"], torch.full((64, 64), 1.0))
    _flip_in_weight(directory / "step_0000000001", record)
    with pytest.warns(RuntimeWarning, match=f"shard {data} is corrupt: its checksum does not match"):
        assert load_checkpoint(directory, _state(0.0)) is None


def test_with_torchs_crc32_off_a_data_file_is_listed_with_its_whole_crc32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.serialization's CRC-32 switched off: the record lists the file's own CRC-32; it loads; a flip fails it."""
    monkeypatch.setattr(torch.serialization, "get_crc32_options", lambda: False)  # what the writer reads
    torch.serialization.set_crc32_options(False)
    try:
        writer = AsyncCheckpointer(tmp_path)
        assert writer.save_sync(1, _state(1.0)) == 1
    finally:
        torch.serialization.set_crc32_options(True)
    folder = tmp_path / "step_0000000001"
    _, record = _record(folder)
    (listed,) = record["files"]
    data = folder / listed["file"]
    assert set(listed) == {"file", "bytes", "crc32"}
    assert listed["crc32"] == f"{zlib.crc32(data.read_bytes()):08x}"
    _loads_until_a_weight_byte_flips(tmp_path, record, data)


def test_a_record_that_lists_sha256_checksums_still_loads_and_is_still_verified(tmp_path: Path) -> None:
    """A format-1 record (data files listed with SHA-256, before CRC-32) loads; a flipped byte in its data fails it."""
    writer = AsyncCheckpointer(tmp_path)
    assert writer.save_sync(1, _state(1.0)) == 1
    folder = tmp_path / "step_0000000001"
    record_path, record = _record(folder)
    data = folder / record["files"][0]["file"]
    record["format"] = 1
    record["files"] = [
        {"file": data.name, "bytes": data.stat().st_size, "sha256": hashlib.sha256(data.read_bytes()).hexdigest()}
    ]
    record_path.write_text(json.dumps(record))
    manifest = json.loads((folder / "manifest.json").read_text())
    shard = manifest["shards"][0]
    shard.update(data=record["files"], bytes=record_path.stat().st_size)
    shard["sha256"] = hashlib.sha256(record_path.read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    _loads_until_a_weight_byte_flips(tmp_path, record, data)


def test_every_single_byte_flip_of_a_data_file_is_refused_or_loads_the_very_tensors_written(tmp_path: Path) -> None:
    """Each byte of a data file flipped in turn: the load is refused or returns the very tensors written."""
    written = {"w": torch.arange(3, dtype=torch.float32) + 1, "b": torch.full((2, 2), 2.5, dtype=torch.bfloat16)}
    assert AsyncCheckpointer(tmp_path).save_sync(1, written) == 1
    folder = tmp_path / "step_0000000001"
    _, record = _record(folder)
    data = folder / record["files"][0]["file"]
    original = data.read_bytes()
    loaded_wrong, refused = [], 0
    for i in range(len(original)):
        flipped = bytearray(original)
        flipped[i] ^= 0xFF
        data.write_bytes(bytes(flipped))
        try:
            state = dcp_format.load_shard(folder, record)
        except CheckpointError:  # ShardCorrupt, also where torch's safe unpickler refused or ran out of bytes
            refused += 1
            continue
        if not all(torch.equal(state[k], v) and state[k].dtype == v.dtype for k, v in written.items()):
            loaded_wrong.append(i)
    assert loaded_wrong == []
    assert refused > len(original) / 3  # the members (pickles, tensor bytes) and most headers
