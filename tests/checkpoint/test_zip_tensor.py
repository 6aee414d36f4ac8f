"""The one-pass reader of a tensor's ``torch.save`` zip: what torch.load returns, or None, never other bytes.

``read_plain`` is the fast way a checkpoint's tensors are loaded; anything it does not
read (damage, another layout, a pickle naming anything but a tensor) goes the careful way.
"""

from __future__ import annotations

import io
import json
import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from lifecycle.checkpoint import AsyncCheckpointer, dcp_format, load_checkpoint
from lifecycle.checkpoint.zip_tensor import read_plain


def _saved(tensor: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape, strides, offset and bytes (NaN-safe: the storages' bytes are compared)."""
    if (a.dtype, a.shape, a.stride(), a.storage_offset()) != (b.dtype, b.shape, b.stride(), b.storage_offset()):
        return False
    return bytes(a.untyped_storage()) == bytes(b.untyped_storage())


TENSORS = {
    "matrix": torch.randn(64, 48, generator=torch.Generator().manual_seed(0)),
    "transposed": torch.randn(5, 7, generator=torch.Generator().manual_seed(1)).t(),
    "scalar": torch.tensor(3.5, dtype=torch.float64),
    "empty": torch.empty(0, 4),
    "bfloat16": torch.randn(33, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16),
    "float16_nan": torch.tensor([1.0, float("nan"), -0.0], dtype=torch.float16),
    "int64": torch.arange(-5, 5),
    "int8": torch.arange(-3, 3, dtype=torch.int8),
    "uint8": torch.arange(0, 255, dtype=torch.uint8),
    "bool": torch.tensor([True, False, True]),
    "int32_3d": torch.arange(24, dtype=torch.int32).reshape(2, 3, 4),
}


@pytest.mark.parametrize("name", list(TENSORS))
def test_a_plain_tensor_reads_as_torch_load_returns_it(name: str) -> None:
    """Each dtype and shape torch.save writes (a scalar, an empty one, a transposed one) reads as torch.load's."""
    data = _saved(TENSORS[name])
    expected = torch.load(io.BytesIO(data), weights_only=True)
    tensor = read_plain(data)
    assert tensor is not None
    assert _same(tensor, expected)
    writable = bytearray(data)
    again = read_plain(writable)  # a writable buffer reads the same, into memory of its own
    writable[:] = bytes(len(writable))
    assert again is not None and _same(again, expected)


def test_every_single_byte_flip_reads_as_none_or_as_the_very_tensor_written() -> None:
    """Each byte of a tensor's zip flipped in turn: None or the tensor written, never other bytes or a raise."""
    written = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]).t()
    original = _saved(written)
    none, same = 0, 0
    for i in range(len(original)):
        flipped = bytearray(original)
        flipped[i] ^= 0xFF
        tensor = read_plain(bytes(flipped))
        if tensor is None:
            none += 1
        else:
            assert _same(tensor, written), f"byte {i} flipped read as {tensor!r}"
            same += 1
    assert none > len(original) / 3  # the members' bytes, names and directory entries at least
    assert same > 0  # bytes no check covers (dates, padding) change nothing read


def test_random_bit_flips_and_cuts_read_as_none_or_as_the_very_tensor_written() -> None:
    """Seeded: random bits flipped (1-4 at once) and zips cut short read as None or the tensor written."""
    rng = random.Random(44)
    written = torch.randn(16, 8, generator=torch.Generator().manual_seed(3))
    original = _saved(written)
    for _ in range(400):
        damaged = bytearray(original)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        tensor = read_plain(bytes(damaged))
        assert tensor is None or _same(tensor, written)
        cut = original[: rng.randrange(len(original))]
        assert read_plain(cut) is None


def _rezipped(data: bytes, compression: int = zipfile.ZIP_STORED, replace: dict[str, bytes] | None = None) -> bytes:
    """``data``'s members written again by ``zipfile`` (optionally compressed, or some replaced)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w", compression) as target:
        for member in source.infolist():
            target.writestr(member.filename, (replace or {}).get(member.filename, source.read(member)))
    return out.getvalue()


class _Runs:
    """A pickle that would call ``print`` if its global were found."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("found",))


def test_what_is_not_the_plain_case_reads_as_none_and_calls_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """A gradient flag, a dict, compressed members, a pickle naming another global: None, and no global is called."""
    plain = _saved(torch.ones(3))
    assert read_plain(_rezipped(plain)) is not None  # zipfile's own stored layout is read too
    assert read_plain(_rezipped(plain, zipfile.ZIP_DEFLATED)) is None
    assert read_plain(_saved(torch.ones(3, requires_grad=True))) is None
    buffer = io.BytesIO()
    torch.save({"a": torch.ones(3)}, buffer)
    assert read_plain(buffer.getvalue()) is None
    assert read_plain(_rezipped(plain, replace={"archive/data.pkl": pickle.dumps(_Runs(), protocol=2)})) is None
    assert read_plain(_rezipped(plain, replace={"archive/byteorder": b"big"})) is None
    assert read_plain(b"") is None
    assert capsys.readouterr().out == ""


def test_a_checkpoints_tensors_load_in_one_pass_and_take_the_careful_way_only_when_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint as written loads without torch.load; a flipped weight byte goes the careful way and is refused."""
    state = {"model": dict(TENSORS), "step": 7}
    assert AsyncCheckpointer(tmp_path).save_sync(1, state) == 1
    careful: list[str] = []
    load_carefully = dcp_format._load_carefully

    def recorded(t: dict[str, Any], *rest: Any) -> Any:
        careful.append(t["fqn"])
        return load_carefully(t, *rest)

    monkeypatch.setattr(dcp_format, "_load_carefully", recorded)
    target = {"model": {k: torch.zeros_like(v) for k, v in TENSORS.items()}, "step": 0}
    assert load_checkpoint(tmp_path, target) == 1
    assert careful == []
    assert all(_same(target["model"][k].contiguous(), v.contiguous()) for k, v in TENSORS.items())
    folder = tmp_path / "step_0000000001"
    (shard,) = json.loads((folder / "manifest.json").read_text())["shards"]
    record = dcp_format.read_record(folder, shard)
    (chunk,) = next(t for t in record["tensors"] if t["fqn"] == "model.matrix")["chunks"]  # 12 KiB of 13: its bytes
    data = folder / chunk["file"]
    raw = bytearray(data.read_bytes())
    raw[chunk["offset"] + chunk["length"] // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    with pytest.warns(RuntimeWarning, match="is corrupt"):
        assert load_checkpoint(tmp_path, target) is None
    assert careful == ["model.matrix"]
