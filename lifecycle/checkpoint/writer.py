"""Asynchronous checkpoints that can be finalized collectively or aborted rank-locally.

Layout under ``directory``::

    step_0000000002/rank00000-<token>.pt   one shard per rank and save attempt
    step_0000000002/manifest.json          commit record: written only by finalize()
    latest                                 JSON marker naming the committed step

A step folder without a valid manifest is a partial checkpoint and is never returned.

Why not ``torch.distributed.checkpoint.async_save``: measured here (torch 2.13, gloo,
2 ranks) its background thread runs ``gather_object``, ``scatter_object_list`` and
``broadcast_object_list``, in a non-daemon ``ThreadPoolExecutor`` thread. With a peer
that never joins, neither ``destroy_process_group()`` nor ``_abort_process_group()``
releases that thread and interpreter exit waits for the whole group timeout, so
abandoning it is not rank-local. Its loader also unpickles non-tensor values with
``weights_only=False`` and it keeps one copy of plain (replicated) tensors, not each
rank's. So here the background thread only writes this rank's file; every collective
happens in ``finalize()``, on the caller's thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lifecycle._core.errors import LifecycleError, ResourceMismatch, ResourceRefused, StaleResource
from lifecycle._core.ownership import Resource

__all__ = [
    "AsyncCheckpointer",
    "CheckpointError",
    "CheckpointMismatch",
    "StaleCheckpointer",
    "latest_checkpoint",
    "load_checkpoint",
]

_MARKER = "latest"
_MANIFEST = "manifest.json"
_STEP_RE = re.compile(r"step_(\d+)")
_FORMAT = 1


class CheckpointError(LifecycleError):
    """A checkpoint could not be saved, committed or loaded; the message names the path."""


class StaleCheckpointer(CheckpointError, StaleResource):
    """This checkpointer was aborted and refuses to save again; nothing was done: create a new one.

    A ``StaleResource`` for ``async_checkpoint`` (``detail`` names the directory), and a
    ``CheckpointError``.
    """

    def __init__(self, detail: str) -> None:
        super().__init__(Resource.ASYNC_CHECKPOINT.value, detail)
        self._fields = (detail,)


_RESUME_REMEDY = (
    "resume with the model, optimizer and world size the checkpoint was saved with, or load from another directory"
)


class CheckpointMismatch(CheckpointError, ResourceMismatch):
    """The checkpoint at ``path`` does not fit this run; nothing was loaded.

    ``what`` is ``found`` in the checkpoint but ``wanted`` in this run: an entry of
    ``state_dict`` (its dtype and shape, its type, or keys the checkpoint lacks), or
    the world size. A ``ResourceMismatch`` for ``async_checkpoint``, and a
    ``CheckpointError``; unlike a corrupt or unreadable checkpoint, another attempt
    with the same configuration refuses it again.
    """

    def __init__(self, path: str, what: str, found: object, wanted: object) -> None:
        self.path = path
        self.found = found
        self.wanted = wanted
        self.what = what
        self.remedy = _RESUME_REMEDY
        # Not ResourceMismatch's wording: what disagrees is a checkpoint, not the configuration.
        ResourceRefused.__init__(
            self,
            Resource.ASYNC_CHECKPOINT.value,
            f"{path} does not fit this run: {what}: {found} in the checkpoint, {wanted} in this run; "
            f"nothing was loaded; {_RESUME_REMEDY}",
        )
        self._fields = (path, what, found, wanted)


class _Shard:
    """What the writer thread reports for one rank's written file."""

    def __init__(self, size: int, sha256: bytes) -> None:
        self.size, self.sha256 = size, sha256


class _Pending:
    """One in-flight save: its step, its file, the future the writer thread resolves."""

    def __init__(self, step: int, token: int) -> None:
        self.step = step
        self.token = token
        self.future: Future[_Shard] = Future()
        self.abandoned = threading.Event()


def _step_dir(directory: Path, step: int) -> Path:
    return directory / f"step_{step:010d}"


def _shard_name(rank: int, token: int) -> str:
    # Unique per save attempt, so a late write from an abandoned save can never
    # overwrite a shard that a newer writer committed for the same step.
    return f"rank{rank:05d}-{token:016x}.pt"


def _fsync_dir(path: Path) -> None:
    # Makes a rename durable; without it a crash can forget the new name.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _sha256(path: Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


def _stage(value: Any, where: str) -> Any:
    """Deep copy to CPU, so training may mutate its tensors while the write runs.

    Only types that ``torch.load(weights_only=True)`` accepts are allowed, so a save
    never produces a checkpoint that the safe loader would refuse later.
    """
    if isinstance(value, torch.Tensor):
        return value.detach().to(device="cpu", copy=True)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"checkpoint key {where}[{k!r}] must be str or int")
            out[k] = _stage(v, f"{where}[{k!r}]")
        return out
    if value is None or isinstance(value, (bool, int, float, str, torch.Size, torch.dtype)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_stage(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise TypeError(f"checkpoint value {where} has unsupported type {type(value).__name__}")


class AsyncCheckpointer:
    """Writes checkpoints asynchronously under `directory`, one subfolder per step.

    The process group is resolved once, here: ``process_group``, else the default
    group if one exists, else none (single process, no collectives). A writer whose
    group was destroyed cannot commit; a retry must create a new writer. At most one
    save is in flight. Not thread-safe: call it from the training thread.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.directory = Path(directory)
        if process_group is None and dist.is_available() and dist.is_initialized():
            process_group = dist.group.WORLD
        # A weak reference: torch's registry keeps the group alive while it exists. Holding
        # it strongly would keep an aborted gloo group's sockets open (they close only when
        # the group object is freed) for as long as this writer lives: a peer blocked on the
        # group would then wait for the group timeout (measured: a rank that finalized its
        # checkpoints, then failed later in its teardown, kept its peer's barrier for 10 s).
        self._group_ref = None if process_group is None else weakref.ref(process_group)
        self._rank = dist.get_rank(process_group) if process_group is not None else 0
        self._world = dist.get_world_size(process_group) if process_group is not None else 1
        self._pending: _Pending | None = None
        self._aborted = False
        # Test seam: called in the writer thread before writing (e.g. to hold a save in flight).
        self._before_write: Callable[[], object] | None = None

    @property
    def in_flight(self) -> bool:
        """True between save() and the finalize() or abort() that ends that save."""
        return self._pending is not None

    def save(self, step: int, state_dict: dict[str, Any]) -> None:
        """Start an async save of `state_dict` for `step`; return once it is staged.

        Staging deep-copies every tensor to CPU before returning, so the caller may keep
        training. If a previous save is still in flight it is finalized first, which is
        COLLECTIVE: all ranks must then call save() together. Raises StaleCheckpointer (a
        CheckpointError) after abort(), TypeError for values the safe loader could not
        read back.
        """
        if self._aborted:
            raise StaleCheckpointer(
                f"the checkpointer for {self.directory} was aborted and never saves again; create a new one"
            )
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if self._pending is not None:
            self.finalize()
        staged = _stage(state_dict, "state_dict")
        folder = _step_dir(self.directory, step)
        folder.mkdir(parents=True, exist_ok=True)
        pending = _Pending(step, secrets.randbits(62))
        hook = self._before_write
        # A daemon thread: it only touches local files, never a peer, and an abandoned
        # one must not keep the interpreter alive. If it is killed mid-write only a
        # hidden tmp file is left, which nothing reads.
        threading.Thread(
            target=self._write,
            args=(pending, staged, folder, hook),
            name=f"lifecycle-ckpt-step{step}-rank{self._rank}",
            daemon=True,
        ).start()
        self._pending = pending

    def _write(self, pending: _Pending, staged: Any, folder: Path, hook: Callable[[], object] | None) -> None:
        name = _shard_name(self._rank, pending.token)
        final = folder / name
        try:
            if hook is not None:
                hook()
            if pending.abandoned.is_set():
                raise CheckpointError(f"save of {final} was aborted before it started")
            tmp = folder / f".{name}.tmp"
            with open(tmp, "wb") as f:
                torch.save(staged, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            _fsync_dir(folder)
            if pending.abandoned.is_set():
                # Nobody will ever list this file in a manifest; drop it.
                final.unlink(missing_ok=True)
                raise CheckpointError(f"save of {final} was aborted")
            pending.future.set_result(_Shard(final.stat().st_size, _sha256(final)))
        except BaseException as exc:  # noqa: BLE001 - always resolve the future, or finalize() waits forever
            if not isinstance(exc, Exception):
                exc = CheckpointError(f"writer of {final} stopped: {exc!r}")
            # The traceback holds this frame: `pending` (whose future holds the error) and
            # `self` (its process group) would form a cycle only the GC frees, and gloo
            # closes an aborted group's sockets only once the group object is freed.
            pending.future.set_exception(exc.with_traceback(None))

    def finalize(self) -> int | None:
        """Success path, COLLECTIVE: wait for the in-flight save, then commit it as latest.

        Every rank calls it. Each rank reports its own write (ok or failed) in one
        all_gather, so a rank whose write failed still joins and all ranks raise the
        same CheckpointError instead of hanging. Only when all ranks succeeded does rank
        0 write the manifest and then the ``latest`` marker (write-tmp + os.replace); a
        broadcast tells the other ranks whether that worked. Returns the committed step,
        or None if nothing was in flight (then no collective runs). Idempotent. If a
        peer is gone the collective fails after the group timeout at most, or as soon as
        the peer destroys its group; the save is then abandoned and never committed.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            return self._finalize(pending)
        except CheckpointError:
            pending.abandoned.set()
            raise
        except Exception as exc:
            pending.abandoned.set()
            raise CheckpointError(
                f"finalizing checkpoint step {pending.step} in {self.directory} failed: {exc}"
            ) from exc
        except BaseException:
            # Ctrl-C / SystemExit while waiting: propagate untouched (the caller takes the
            # failure path); the save can no longer be committed by anyone.
            pending.abandoned.set()
            raise

    def _finalize(self, pending: _Pending) -> int:
        shard: _Shard | None = None
        local_error: Exception | None = None
        try:
            shard = pending.future.result()  # local disk only, never a peer
        except Exception as exc:  # noqa: BLE001 - reported to all ranks below, so none hangs
            local_error = exc
        mine = torch.zeros(8, dtype=torch.int64)
        mine[0], mine[1], mine[2] = int(shard is not None), pending.step, pending.token
        if shard is not None:
            mine[3] = shard.size
            mine[4:] = torch.frombuffer(bytearray(shard.sha256), dtype=torch.int64)
        everyone = self._all_gather(mine)
        failed = [r for r, row in enumerate(everyone) if not row[0]]
        if failed:
            raise CheckpointError(
                f"checkpoint step {pending.step} in {self.directory} not committed: "
                f"ranks {failed} failed to write their shard"
            ) from local_error
        if any(int(row[1]) != pending.step for row in everyone):
            raise CheckpointError(
                f"ranks disagree on the step to commit in {self.directory}: {[int(row[1]) for row in everyone]}"
            )
        committed = torch.ones(1, dtype=torch.int64)
        commit_error: Exception | None = None
        if self._rank == 0:
            try:
                self._commit(pending.step, everyone)
            except Exception as exc:  # noqa: BLE001 - peers learn of it by the broadcast
                committed.zero_()
                commit_error = exc
        group = self._live_group()
        if group is not None:
            dist.broadcast(committed, group_src=0, group=group)
        if not committed.item():
            raise CheckpointError(f"rank 0 could not commit step {pending.step} in {self.directory}") from commit_error
        return pending.step

    def _all_gather(self, mine: torch.Tensor) -> list[torch.Tensor]:
        if self._group_ref is None:
            return [mine]
        group = self._live_group()
        try:
            if group is None:
                raise ValueError("the group object was freed")
            dist.get_rank(group)
        except (ValueError, RuntimeError) as exc:
            # A destroyed group object can still run a one-rank collective locally;
            # a writer that outlived its group must not commit through it.
            raise CheckpointError(
                f"process group of the checkpointer for {self.directory} was destroyed; "
                "finalize() must run before the group is destroyed"
            ) from exc
        # Zeros, not empty: a row a peer never filled reads as "write failed".
        out = [torch.zeros_like(mine) for _ in range(self._world)]
        dist.all_gather(out, mine, group=group)
        return out

    def _live_group(self) -> dist.ProcessGroup | None:
        """The writer's group while it exists; None without one, or once it was freed."""
        return None if self._group_ref is None else self._group_ref()

    def _commit(self, step: int, everyone: list[torch.Tensor]) -> None:
        folder = _step_dir(self.directory, step)
        shards = [
            {
                "rank": r,
                "file": _shard_name(r, int(row[2])),
                "bytes": int(row[3]),
                "sha256": row[4:].numpy().tobytes().hex(),
            }
            for r, row in enumerate(everyone)
        ]
        manifest = {"format": _FORMAT, "step": step, "world_size": self._world, "shards": shards}
        # Manifest first: it is the commit record. The marker is only a pointer to it.
        _write_atomic(folder / _MANIFEST, json.dumps(manifest, indent=1).encode())
        _write_atomic(self.directory / _MARKER, json.dumps({"step": step}).encode())

    def abort(self) -> None:
        """Failure path, RANK-LOCAL: abandon the in-flight save; it is never committed.

        Never calls a collective and never waits: it only flags the save, so a late
        completion of the writer thread (a daemon, which cannot hold up interpreter exit)
        deletes its own file instead of reporting it. Commits happen only in finalize(),
        which this writer refuses from now on (save() raises, finalize() returns None).
        Idempotent. The last committed checkpoint stays the latest.
        """
        self._aborted = True
        self._group_ref = None
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.abandoned.set()


def _read_manifest(folder: Path, step: int) -> dict[str, Any]:
    """Return the folder's manifest if the checkpoint is complete; else raise CheckpointError."""
    path = folder / _MANIFEST
    try:
        manifest = json.loads(path.read_bytes())
        shards = manifest["shards"]
        if manifest["format"] != _FORMAT or manifest["step"] != step:
            raise ValueError("format or step does not match")
        if [s["rank"] for s in shards] != list(range(manifest["world_size"])):
            raise ValueError("shards do not list ranks 0..world_size-1")
        for s in shards:
            name = s["file"]
            if not isinstance(name, str) or Path(name).name != name:
                raise ValueError(f"invalid file name {name!r}")  # never read outside the folder
            shard = folder / name
            if not shard.is_file() or shard.stat().st_size != s["bytes"]:
                raise CheckpointError(f"shard {shard} is missing or has the wrong size")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"no valid manifest at {path}: {exc}") from exc
    return dict(manifest)


def _step_folders(directory: Path) -> list[int]:
    found = (_STEP_RE.fullmatch(p.name) for p in directory.iterdir() if p.is_dir())
    return sorted((int(m.group(1)) for m in found if m), reverse=True)


def latest_checkpoint(directory: str | os.PathLike[str]) -> tuple[int, Path] | None:
    """Return (step, folder) of the newest COMMITTED checkpoint, or None if there is none.

    The ``latest`` marker decides. A step folder counts only with a valid manifest whose
    shards all exist with their recorded sizes, so a partial or truncated checkpoint is
    never returned. If the marker is missing, corrupt, or names such a checkpoint, this
    warns (naming the directory) and falls back to the newest complete one.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return None
    problem = None
    try:
        step = json.loads((directory / _MARKER).read_bytes())["step"]
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"step is {step!r}")
        _read_manifest(_step_dir(directory, step), step)
        return step, _step_dir(directory, step)
    except FileNotFoundError:
        pass  # no marker yet; a crash may still have left a committed manifest
    except (CheckpointError, OSError, ValueError, KeyError, TypeError) as exc:
        problem = exc
    for step in _step_folders(directory):
        try:
            _read_manifest(_step_dir(directory, step), step)
        except CheckpointError:
            continue
        why = f"marker is unusable ({problem})" if problem else "marker is missing"
        warnings.warn(
            f"checkpoint directory {directory}: {why}; using step {step}",
            RuntimeWarning,
            stacklevel=2,
        )
        return step, _step_dir(directory, step)
    if problem is not None:
        warnings.warn(
            f"checkpoint directory {directory}: marker is unusable ({problem}) and no complete checkpoint exists",
            RuntimeWarning,
            stacklevel=2,
        )
    return None


def _plan(
    shard: Path,
    target: Any,
    source: Any,
    where: str,
    copies: list[tuple[torch.Tensor, torch.Tensor]],
    sets: list[tuple[dict[Any, Any], Any, Any]],
) -> None:
    """Validate the whole restore before touching `target` (so it is never half-restored)."""
    missing = [k for k in target if k not in source]
    if missing:
        raise CheckpointMismatch(str(shard), f"keys {missing} of {where}", "absent", "present")
    for k, new in source.items():
        old = target.get(k)
        if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
            if old.shape != new.shape or old.dtype != new.dtype:
                raise CheckpointMismatch(
                    str(shard), f"{where}[{k!r}]", f"{new.dtype}{list(new.shape)}", f"{old.dtype}{list(old.shape)}"
                )
            copies.append((old, new))
        elif isinstance(old, dict) and isinstance(new, dict):
            _plan(shard, old, new, f"{where}[{k!r}]", copies, sets)
        elif isinstance(old, (torch.Tensor, dict)):
            # Replacing it would leave the object it belongs to (a module) unrestored.
            raise CheckpointMismatch(str(shard), f"{where}[{k!r}]", type(new).__name__, type(old).__name__)
        else:
            sets.append((target, k, new))


def load_checkpoint(
    directory: str | os.PathLike[str], state_dict: dict[str, Any], *, rank: int | None = None
) -> int | None:
    """Load the latest committed checkpoint into `state_dict` in place; return its step.

    Returns None (state_dict untouched) if there is no committed checkpoint. Tensors
    present in both are copied into the existing tensors (so ``model.state_dict()``
    entries update the model); other values are replaced or added, so call
    ``optimizer.load_state_dict(state_dict[...])`` afterwards. `rank` defaults to this
    process's default-group rank (0 without one). Uses ``torch.load(weights_only=True)``:
    never unpickles arbitrary objects. A shard whose checksum or format is wrong raises
    CheckpointError naming the path; a checkpoint that does not fit this run (a tensor's
    dtype or shape, a value's type, keys it lacks, no shard for this rank) raises
    CheckpointMismatch (a CheckpointError) with what differs; both before state_dict is
    modified. It does not fall back rank-locally, because ranks could then resume from
    different steps.
    """
    found = latest_checkpoint(directory)
    if found is None:
        return None
    step, folder = found
    world: int | None = None
    if rank is None:
        in_group = dist.is_available() and dist.is_initialized()
        rank = dist.get_rank() if in_group else 0
        world = dist.get_world_size() if in_group else None
    manifest = _read_manifest(folder, step)
    if rank < 0:
        raise CheckpointError(f"checkpoint {folder} has no shard for rank {rank}: a rank cannot be negative")
    if rank >= len(manifest["shards"]):
        wanted = world if world is not None else f"at least {rank + 1}"
        what = f"world size (no shard for rank {rank})"
        raise CheckpointMismatch(str(folder), what, len(manifest["shards"]), wanted)
    entry = manifest["shards"][rank]
    path = folder / entry["file"]
    try:
        digest = _sha256(path).hex()
    except OSError as exc:
        raise CheckpointError(f"cannot read shard {path}: {exc}") from exc
    if digest != entry["sha256"]:
        raise CheckpointError(f"shard {path} is corrupt: checksum does not match {folder / _MANIFEST}")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot load shard {path}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise CheckpointError(f"shard {path} does not hold a dict")
    copies: list[tuple[torch.Tensor, torch.Tensor]] = []
    sets: list[tuple[dict[Any, Any], Any, Any]] = []
    _plan(path, state_dict, loaded, "state_dict", copies, sets)
    with torch.no_grad():
        for old, new in copies:
            old.copy_(new)
    for container, key, value in sets:
        container[key] = value
    return step
