"""The torch Distributed Checkpoint (DCP) side of a step folder: what each rank writes, what rank 0 merges.

A committed step folder is a DCP checkpoint: ``torch.distributed.checkpoint.load`` and
``format_utils.dcp_to_torch_save`` read it. DCP's own ``save`` does not fit (its
collectives run wherever it runs, ``async_save``'s in a background thread a rank-local
abort cannot stop; ``no_dist`` writers in one folder overwrite each other's files), so
its public parts are used one by one:

- on the caller's thread, ``plan_save`` turns the staged state into a flat map of tensors
  (the key of each is its path joined with ``.``, as DCP's own flattening names it,
  under this rank's slice key when there are several slices) and a JSON skeleton of
  everything else, and plans the writes with a ``DefaultSavePlanner``;
- in the writer thread, ``write_planned`` writes them with a ``FileSystemWriter`` into
  one data file named for this rank and save attempt, fsyncs it, and writes this rank's
  record (JSON: the skeleton, where each tensor lies, the files' sizes and how their
  content is checked); the planner checks the cancel flag before each tensor, so an
  abort stops the write at the next item;
- at the commit, rank 0 reads every writing rank's record (its size and SHA-256 came in
  the commit's all_gather) and writes the global ``.metadata`` (``write_global_metadata``).

Private torch names used (no public equivalent; tested on torch 2.13 and 2.15):
``torch.distributed.checkpoint.filesystem._StorageInfo`` (where a chunk lies, as
``.metadata`` records it) and ``_StoragePrefix`` (the data file's name prefix a
``FileSystemWriter`` reads from a plan's ``storage_data``).

Checksums. Each tensor's bytes in a data file are one ``torch.save`` zip archive, and
``torch.save`` stores the CRC-32 of every member (the tensor's bytes, its pickle) as
the zip format asks, computed in the same pass that writes them. A data file's listing
says so (``"checksum": "zip-crc32"``) and ``load_shard`` checks every member's CRC-32
as it reads each tensor: in one pass with the tensor's rebuild for the zip torch writes
(``zip_tensor.read_plain``: ``struct``, ``zlib`` and the C unpickler, about a tenth of
the time), else with ``zipfile`` and, for the storage, on the bytes ``torch.load``
returns (torch's zip reader honours header fields ``zipfile`` ignores: one flipped
there made it return other bytes): no second pass over the bytes when saving, and none
before loading. (torch does not check the CRCs itself; any zip tool can.) Only when
torch's CRCs are switched off (``torch.serialization.set_crc32_options(False)``) does
``write_planned`` read the file back once for a whole-file CRC-32 (``"crc32"``); records
written before this listed a whole-file ``"sha256"``, still checked.

What a CRC-32 protects against: accidental damage — a torn or partly written block the
size check misses, bit rot, a stale view of a shared file system. It detects every
error burst up to 32 bits and misses other damage with chance 2^-32 per member. It is no
defence against a deliberate edit, and SHA-256 was none either: whoever can rewrite a
data file can rewrite the record and manifest that list it. The small files (records,
``.metadata``, the manifest) keep SHA-256: the manifest's digest is what the ranks agree
on at resume, and each record's digest travels in the commit's ``all_gather`` row, so
rank 0 merges exactly what each rank wrote.

Non-tensor values never go through pickle: they are in the record's JSON skeleton. A
tensor's own pickle is read by an unpickler that finds nothing but the tensor rebuild,
its storage types and an empty ``OrderedDict`` (``read_plain``), or by
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import threading
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystemWriter, _StorageInfo, _StoragePrefix
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import SavePlan, WriteItem
from torch.distributed.checkpoint.storage import WriteResult

from lifecycle.checkpoint.errors import CheckpointError, ShardCorrupt
from lifecycle.checkpoint.layout import (
    DATA_RE,
    DCP_METADATA,
    RECORD_RE,
    ShardLayout,
    checksum_matches,
    crc32,
    write_new,
)
from lifecycle.checkpoint.zip_tensor import read_plain

__all__ = [
    "DATA_RE",
    "DCP_METADATA",
    "RECORD_RE",
    "Planned",
    "data_name",
    "load_shard",
    "plan_save",
    "read_record",
    "record_name",
    "slice_key",
    "verify_data",
    "verify_step",
    "write_global_metadata",
    "write_planned",
]

RECORD_FORMAT = 2
"""The record format ``write_planned`` writes: data files checked by their zip members' CRC-32 (format 1: SHA-256)."""
RECORD_FORMATS = (1, 2)
"""The record formats ``read_record`` accepts."""
ZIP_CRC32 = "zip-crc32"
"""A data file's ``checksum``: every tensor's bytes are a zip archive whose members carry their CRC-32."""


def record_name(rank: int, token: int) -> str:
    """This rank's record for one save attempt: ``__<rank>_<token>.json``."""
    return f"__{rank}_{token:016x}.json"


def data_name(rank: int, token: int) -> str:
    """The data-file prefix of one rank's save attempt; the ``FileSystemWriter`` appends ``0.distcp``."""
    return f"__{rank}_{token:016x}_"


def slice_key(layout: ShardLayout | None, rank: int, world: int) -> str | None:
    """The top-level key this rank's tensors sit under: None with one slice, else ``tp<t>_pp<p>`` or ``rank<r>``.

    Tensors of different model-parallel slices share their names, so each slice is keyed
    apart; with one slice (no model parallelism) the keys are the state dict's own.
    """
    if layout is not None:
        return None if layout.shards == 1 else f"tp{layout.tensor_rank}_pp{layout.pipeline_rank}"
    return None if world == 1 else f"rank{rank}"


# -- the JSON skeleton -------------------------------------------------------------------

Path_ = tuple[str | int, ...]


def _fqn(path: Path_) -> str:
    return ".".join(str(p) for p in path)


def _encode(value: Any, path: Path_, tensors: dict[str, tuple[Path_, torch.Tensor]]) -> Any:
    """``value`` as JSON, each tensor replaced by ``{"tensor": fqn}`` and collected in ``tensors``.

    Containers are tagged (``{"dict": [[key, value], ...]}``, ``list``, ``tuple``,
    ``size``, ``dtype``), so decoding restores their types and int keys exactly.
    """
    if isinstance(value, torch.Tensor):
        fqn = _fqn(path)
        tensors[fqn] = (path, value)
        return {"tensor": fqn}
    if isinstance(value, Mapping):
        return {"dict": [[k, _encode(v, (*path, str(k)), tensors)] for k, v in value.items()]}
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, (*path, i), tensors) for i, v in enumerate(value)]
        return {"list": items} if isinstance(value, list) else {"tuple": items}
    return value  # None, bool, int, float, str: staging allowed nothing else


def _decode(node: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if not isinstance(node, dict):
        return node
    ((tag, body),) = node.items()
    if tag == "tensor":
        return tensors[body]
    if tag == "dict":
        return {k: _decode(v, tensors) for k, v in body}
    if tag == "list":
        return [_decode(v, tensors) for v in body]
    if tag == "tuple":
        return tuple(_decode(v, tensors) for v in body)
    if tag == "size":
        return torch.Size(body)
    if tag == "dtype":
        dtype = getattr(torch, body)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"not a dtype: {body!r}")
        return dtype
    raise ValueError(f"unknown skeleton tag {tag!r}")


# -- planning (caller's thread) and writing (writer thread) -------------------------------


class _CancellablePlanner(DefaultSavePlanner):
    """A ``DefaultSavePlanner`` that stops the write before the next item once ``cancel`` is set."""

    def __init__(self, cancel: threading.Event) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.cancel = cancel

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        """The item's tensor; ``CheckpointError`` once the save was aborted."""
        if self.cancel.is_set():
            raise CheckpointError("the save was aborted while it was being written")
        return super().resolve_data(write_item)


@dataclasses.dataclass
class Planned:
    """One rank's save, planned on the caller's thread: the skeleton, the tensors and the write plan."""

    skeleton: Any
    tensors: dict[str, tuple[Path_, torch.Tensor]]
    planner: _CancellablePlanner
    plan: SavePlan
    prefix: str


def plan_save(staged: Mapping[str, Any], key: str | None, prefix: str, cancel: threading.Event) -> Planned:
    """Plan the write of ``staged`` (CPU copies) under slice ``key``, to data files named ``prefix<n>.distcp``.

    No collective, no file: DCP's planner runs on this rank's own keys alone.
    """
    tensors: dict[str, tuple[Path_, torch.Tensor]] = {}
    root: Path_ = () if key is None else (key,)
    skeleton = {"dict": [[k, _encode(v, (*root, str(k)), tensors)] for k, v in staged.items()]}
    planner = _CancellablePlanner(cancel)
    planner.set_up_planner({fqn: t for fqn, (_, t) in tensors.items()}, None, True)
    plan = planner.create_local_plan()
    # Private: a FileSystemWriter names its files from the plan's storage_data prefix.
    plan = planner.finish_plan(dataclasses.replace(plan, storage_data=_StoragePrefix(prefix)))
    return Planned(skeleton, tensors, planner, plan, prefix)


def write_planned(planned: Planned, folder: Path, record: Path, step: int, rank: int) -> None:
    """Write the planned tensors into ``folder`` (fsynced), then this rank's ``record`` (fsynced).

    Writer thread only: local files, no collective. Raises whatever the write raised
    (``CheckpointError`` once cancelled); the caller removes what was left. No byte is
    read back while torch's zip CRCs are on (see the module's docstring). Neither name is
    made durable here: the fsync of ``folder`` after the commit's manifest does that.
    """
    zip_crcs = torch.serialization.get_crc32_options()
    writer = FileSystemWriter(folder, single_file_per_rank=True, sync_files=True, thread_count=1)
    # per_thread_copy_ahead=0: the serial loader; the tensors are CPU copies already (no CUDA stream).
    writer.per_thread_copy_ahead = 0
    results: list[WriteResult] = writer.write_data(planned.plan, planned.planner).wait()
    zip_crcs = zip_crcs and torch.serialization.get_crc32_options()  # on for the whole write
    files = sorted({str(r.storage_data.relative_path) for r in results})
    chunks: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        info = r.storage_data
        offsets = list(r.index.offset) if r.index.offset is not None else []
        chunks.setdefault(r.index.fqn, []).append(
            {"offsets": offsets, "file": info.relative_path, "offset": info.offset, "length": info.length}
        )
    tensors = []
    for fqn, (path, tensor) in planned.tensors.items():
        tensors.append(
            {
                "fqn": fqn,
                "path": list(path),
                "dtype": str(tensor.dtype).removeprefix("torch."),
                "size": list(tensor.shape),
                "chunks": chunks[fqn],
            }
        )
    body = {
        "format": RECORD_FORMAT,
        "step": step,
        "rank": rank,
        "state": planned.skeleton,
        "tensors": tensors,
        "files": [_listing(folder / f, zip_crcs) for f in files],
    }
    write_new(record, json.dumps(body).encode())  # the commit checks its size and SHA-256


def _listing(path: Path, zip_crcs: bool) -> dict[str, Any]:
    """A data file's entry in its record: name, size, and how its content is checked."""
    entry: dict[str, Any] = {"file": path.name, "bytes": path.stat().st_size}
    if zip_crcs:
        entry["checksum"] = ZIP_CRC32
    else:
        entry["crc32"] = f"{crc32(path):08x}"
    return entry


# -- reading records, the global metadata, a shard ----------------------------------------


def read_record(folder: Path, entry: Mapping[str, Any]) -> dict[str, Any]:
    """The record a manifest (or commit) ``entry`` names, checked against its size and SHA-256.

    ``CheckpointError`` naming the file if it is missing, of another size or checksum, or
    not a record; ``OSError`` for an I/O error reading it.
    """
    path = folder / str(entry["file"])
    raw = path.read_bytes()
    if len(raw) != entry["bytes"] or hashlib.sha256(raw).hexdigest() != entry["sha256"]:
        raise CheckpointError(f"record {path} is corrupt: its size or checksum does not match what its rank wrote")
    try:
        record = json.loads(raw)
        if record["format"] not in RECORD_FORMATS:
            raise ValueError(f"record format {record['format']!r}")
        for f in record["files"]:
            if not isinstance(f["file"], str) or Path(f["file"]).name != f["file"]:
                raise ValueError(f"invalid file name {f['file']!r}")
            if f.get("checksum", ZIP_CRC32) != ZIP_CRC32 or not {"checksum", "crc32", "sha256"} & f.keys():
                raise ValueError(f"no known checksum for {f['file']!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"record {path} is invalid: {exc}") from exc
    return dict(record)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r} in a checkpoint record")
    return dtype


def write_global_metadata(folder: Path, records: list[dict[str, Any]]) -> None:
    """Rank 0, at the commit: merge every writing rank's record into DCP's ``.metadata`` in ``folder``.

    Written by ``FileSystemWriter.finish`` (tmp file, fsync, rename). The rename is made
    durable by the next fsync of ``folder``: the caller's, when it writes the manifest
    there. ``CheckpointError`` if two records hold the same tensor.
    """
    state_dict_metadata: dict[str, Any] = {}
    planner_data: dict[str, tuple[str | int, ...]] = {}
    results: list[WriteResult] = []
    for record in records:
        for t in record["tensors"]:
            fqn = t["fqn"]
            if fqn in state_dict_metadata:
                raise CheckpointError(f"two ranks wrote the tensor {fqn!r} in {folder}")
            size = torch.Size(t["size"])
            chunks = []
            for c in t["chunks"]:
                offsets = torch.Size(c["offsets"])
                chunks.append(ChunkStorageMetadata(offsets=offsets, sizes=size))
                results.append(
                    WriteResult(
                        index=MetadataIndex(fqn, offsets),
                        size_in_bytes=int(c["length"]),
                        storage_data=_StorageInfo(str(c["file"]), int(c["offset"]), int(c["length"])),
                    )
                )
            state_dict_metadata[fqn] = TensorStorageMetadata(
                properties=TensorProperties(dtype=_dtype(t["dtype"])), size=size, chunks=chunks
            )
            planner_data[fqn] = tuple(t["path"])
    metadata = Metadata(state_dict_metadata=state_dict_metadata, planner_data=planner_data)
    FileSystemWriter(folder, sync_files=True).finish(metadata, [results])


def _zip_intact(data: bytes, path: Path, fqn: str, *, skip_storage: bool) -> int:
    """Check tensor ``fqn``'s chunk ``data`` (a ``torch.save`` zip) member by member; return its storage's CRC-32.

    Every member is read and checked against the CRC-32 the zip records for it, the
    tensor's storage too unless ``skip_storage`` (the caller then checks the storage
    torch loads against the CRC returned). ``ShardCorrupt`` naming ``path`` if a member
    fails, if ``data`` is not a whole zip, or if it holds other than one storage.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
            storages = [m for m in members if m.filename.split("/")[-2:-1] == ["data"]]  # <name>/data/<key>
            if len(storages) != 1:
                raise ShardCorrupt(
                    f"shard {path} is corrupt: the zip of {fqn!r} holds {len(storages)} storages, not one"
                )
            for member in members:
                if not (skip_storage and member is storages[0]):
                    archive.read(member)  # raises BadZipFile when the bytes do not match the member's CRC-32
            return storages[0].CRC
    except ShardCorrupt:
        raise
    except Exception as exc:  # zipfile raises many kinds (BadZipFile, OverflowError, ...) on a damaged archive
        raise ShardCorrupt(f"shard {path} is corrupt: the zip of {fqn!r} fails its check ({exc!r})") from exc


def _storage_crc32(tensor: torch.Tensor) -> int:
    """The CRC-32 of the bytes of ``tensor``'s storage (what ``torch.save`` wrote as its storage member)."""
    raw = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())
    return zlib.crc32(raw.numpy().data)


def _load_carefully(t: Mapping[str, Any], path: Path, data: bytes, zipped: bool) -> Any:
    """Tensor ``t``'s ``data`` loaded by ``torch.load(weights_only=True)``, a zip's members checked by ``zipfile``.

    The way for what ``read_plain`` does not read: a damaged zip (``ShardCorrupt`` naming
    ``path`` and the tensor), another zip layout or pickle, data checked by a whole-file
    checksum (``zipped`` False). The storage ``torch.load`` returns is checked against its
    member's CRC-32, so damage that makes torch's zip reader read other bytes than
    ``zipfile`` checked is caught too.
    """
    crc = _zip_intact(data, path, str(t["fqn"]), skip_storage=True) if zipped else None
    try:
        tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch's zip reader or safe unpickler refused it: a flipped
        # byte surfaces as RuntimeError, UnpicklingError, EOFError, even IndexError (seen in full runs)
        raise ShardCorrupt(f"shard {path} is corrupt: torch cannot read {t['fqn']!r} ({exc})") from exc
    if crc is not None and isinstance(tensor, torch.Tensor) and _storage_crc32(tensor) != crc:
        raise ShardCorrupt(f"shard {path} is corrupt: the bytes loaded for {t['fqn']!r} do not match their CRC-32")
    return tensor


def _chunks(folder: Path, record: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], Path, bytes, bool]]:
    """Each tensor entry of ``record``, the file it lies in, its bytes, and whether they are a checked zip.

    Whole-file checksums (``crc32``, ``sha256``) are checked before a file's first chunk
    (``ShardCorrupt`` naming the file whose content differs); a chunk of a ``zip-crc32``
    file comes with True: its zip's members are the caller's to check.
    ``ValueError``/``KeyError``/``TypeError`` for a record that does not describe its
    data; ``OSError`` for an I/O error.
    """
    listed = {str(f["file"]): f for f in record["files"]}
    handles: dict[str, Any] = {}
    try:
        for t in record["tensors"]:
            (chunk,) = t["chunks"]  # whole tensors only, this round
            name = str(chunk["file"])
            if name not in listed:
                raise ValueError(f"{t['fqn']!r} lies in {name!r}, which the record does not list")
            path = folder / name
            if name not in handles:
                if "checksum" not in listed[name] and not checksum_matches(path, listed[name]):
                    raise ShardCorrupt(f"shard {path} is corrupt: its checksum does not match its record")
                handles[name] = open(path, "rb")  # noqa: SIM115 - closed below
            f = handles[name]
            f.seek(int(chunk["offset"]))
            yield t, path, f.read(int(chunk["length"])), listed[name].get("checksum") == ZIP_CRC32
    finally:
        for f in handles.values():
            f.close()


def verify_data(folder: Path, record: Mapping[str, Any]) -> None:
    """Check the content of every data file ``record`` lists, as ``load_shard`` does, without keeping it.

    ``ShardCorrupt`` naming the first file whose content differs from what was written;
    ``CheckpointError`` if the record does not describe its data.
    """
    try:
        for t, path, data, zipped in _chunks(folder, record):
            if zipped and read_plain(data) is None:
                _zip_intact(data, path, str(t["fqn"]), skip_storage=False)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint record in {folder} does not describe its data: {exc}") from exc


def verify_step(folder: Path, manifest: Mapping[str, Any]) -> None:
    """Check the content of every file a format-2 ``manifest`` lists in ``folder``: records, data, ``.metadata``.

    ``CheckpointError`` (``ShardCorrupt`` for a data file) naming the first file whose
    content differs from what was written; ``OSError`` for an I/O error.
    """
    for shard in manifest["shards"]:
        verify_data(folder, read_record(folder, shard))
    metadata = folder / str(manifest["metadata"]["file"])
    if not checksum_matches(metadata, manifest["metadata"]):
        raise CheckpointError(f"{metadata} is corrupt: its checksum does not match the manifest")


def load_shard(folder: Path, record: Mapping[str, Any]) -> Any:
    """The state one rank saved, rebuilt from its ``record``; no pickle but a tensor's own is read.

    The caller checked the record itself (``read_record``); the data files' content is
    checked here, in the pass that reads it (``ShardCorrupt`` naming the file). A tensor
    whose zip is the plain case torch writes is checked and rebuilt in one pass
    (``zip_tensor.read_plain``); any other, damaged ones included, is checked by
    ``zipfile`` and loaded by ``torch.load(weights_only=True)`` (``_load_carefully``).
    ``CheckpointError`` if the record does not describe its data.
    """
    tensors: dict[str, torch.Tensor] = {}
    try:
        for t, path, data, zipped in _chunks(folder, record):
            tensor = read_plain(data) if zipped else None
            if tensor is None:
                tensor = _load_carefully(t, path, data, zipped)
            if not isinstance(tensor, torch.Tensor) or list(tensor.shape) != t["size"]:
                raise ValueError(f"{t['fqn']!r} is not a tensor of size {t['size']}")
            if str(tensor.dtype).removeprefix("torch.") != t["dtype"]:
                raise ValueError(f"{t['fqn']!r} is not a tensor of dtype {t['dtype']}")
            tensors[t["fqn"]] = tensor
        return _decode(record["state"], tensors)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint record in {folder} does not describe its data: {exc}") from exc
