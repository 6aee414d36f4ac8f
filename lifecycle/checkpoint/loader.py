"""Finding and loading the checkpoint to resume from; with a process group, by agreement of every rank.

``latest_checkpoint`` is one process's view of a directory. ``load_checkpoint`` with a
process group does not trust any single view: rank 0 resolves the step and the SHA-256
of its ``manifest.json`` and broadcasts both; every rank checks that it sees exactly that
manifest and that its own shard's checksum matches and that it fits; one all_gather of
the verdicts decides. A step that is unusable on any rank (a stale directory view, a
corrupt or unreadable shard) is unusable on every rank: all fall back together to the
previous complete step, with a RuntimeWarning naming the file and what was done, until
one is usable on every rank or none is left (then all start from scratch).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from enum import IntEnum
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lifecycle.checkpoint.dcp_format import load_shard, read_record
from lifecycle.checkpoint.errors import CheckpointError, CheckpointMismatch, ShardCorrupt
from lifecycle.checkpoint.layout import (
    MANIFEST,
    MARKER,
    ShardLayout,
    checksum_matches,
    describe_layout,
    read_manifest,
    step_dir,
    step_folders,
)

__all__ = ["collective_device", "latest_checkpoint", "load_checkpoint"]


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where this rank's tensors for a collective on ``group`` (None: the default group) must live.

    The current CUDA device when the group's backend is nccl (it has no CPU backend),
    else the CPU. The checkpoint's control collectives (resume agreement, commit) put
    their tensors here: the rule of docs/collectives.md.
    """
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_Restore = tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[dict[Any, Any], Any, Any]]]


class _Verdict(IntEnum):
    """What one rank found when it checked the proposed checkpoint."""

    OK = 0
    UNUSABLE = 1  # this step cannot be loaded here: every rank falls back to an older one
    MISMATCH = 2  # the checkpoint does not fit this run: an older one would not either


def _read_manifest(folder: Path, step: int) -> dict[str, Any]:
    return read_manifest(folder, step)[0]


def _newest_complete(directory: Path, below: int) -> int | None:
    for step in step_folders(directory):
        if step >= below:
            continue
        try:
            read_manifest(step_dir(directory, step), step)
        except CheckpointError:
            continue
        return step
    return None


def latest_checkpoint(directory: str | os.PathLike[str]) -> tuple[int, Path] | None:
    """Return (step, folder) of the newest COMMITTED checkpoint in this process's view, or None.

    Rank-local: another rank may see the folder differently (an NFS attribute cache);
    ``load_checkpoint`` with a process group makes every rank agree on one step.

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
        step = json.loads((directory / MARKER).read_bytes())["step"]
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"step is {step!r}")
        _read_manifest(step_dir(directory, step), step)
        return step, step_dir(directory, step)
    except FileNotFoundError:
        pass  # no marker yet; a crash may still have left a committed manifest
    except (CheckpointError, OSError, ValueError, KeyError, TypeError) as exc:
        problem = exc
    for step in step_folders(directory):
        try:
            _read_manifest(step_dir(directory, step), step)
        except CheckpointError:
            continue
        why = f"marker is unusable ({problem})" if problem else "marker is missing"
        warnings.warn(
            f"checkpoint directory {directory}: {why}; using step {step}",
            RuntimeWarning,
            stacklevel=2,
        )
        return step, step_dir(directory, step)
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


class _Check:
    """One rank's verdict on one step, and what it would restore if every rank agrees."""

    def __init__(
        self,
        verdict: _Verdict,
        text: str = "",
        mismatch: CheckpointMismatch | None = None,
        restore: _Restore | None = None,
    ) -> None:
        self.verdict, self.text, self.mismatch, self.restore = verdict, text, mismatch, restore

    def report(self) -> tuple[int, str, tuple[str, str, str, str] | None]:
        """What the all_gather carries: plain values only."""
        m = self.mismatch
        fields = None if m is None else (m.path, m.what, str(m.found), str(m.wanted))
        return int(self.verdict), self.text, fields


def _check(
    folder: Path,
    step: int,
    state_dict: dict[str, Any],
    rank: int,
    world: int | None,
    digest: bytes | None,
    layout: ShardLayout | None = None,
) -> _Check:
    """Check that this rank can load its shard of ``step`` into ``state_dict``; touch nothing.

    Its shard: ``rank``'s without a layout; with one, its slice's (``layout.shard``),
    whatever the data-parallel size. The checkpoint's layout must be the same kind, and
    its tensor and pipeline sizes this run's.
    """
    try:
        manifest, raw = read_manifest(folder, step)
    except CheckpointError as exc:
        return _Check(_Verdict.UNUSABLE, f"{exc} (a stale or partial view of the folder)")
    if digest is not None and hashlib.sha256(raw).digest() != digest:
        return _Check(
            _Verdict.UNUSABLE,
            f"{folder / MANIFEST} differs from the one rank 0 read (a stale or inconsistent view of the folder)",
        )
    shards = manifest["shards"]
    if rank < 0:
        raise CheckpointError(f"checkpoint {folder} has no shard for rank {rank}: a rank cannot be negative")
    sizes = manifest.get("layout")
    if layout is not None or sizes is not None:
        mine = None if layout is None else layout.sizes()
        if mine is None or sizes is None or (sizes["tensor"], sizes["pipeline"]) != (mine["tensor"], mine["pipeline"]):
            found = describe_layout(sizes, manifest["world_size"])
            wanted = describe_layout(mine, world)
            what = "layout (tensor and pipeline parallel sizes must match; the data-parallel size may differ)"
            return _Check(_Verdict.MISMATCH, mismatch=CheckpointMismatch(str(folder), what, found, wanted))
        assert layout is not None
        return _check_shard(folder, shards[layout.shard], state_dict, manifest["format"])
    if (world is not None and len(shards) != world) or rank >= len(shards):
        expected = world if world is not None else f"at least {rank + 1}"
        what = f"world size (no shard for rank {rank})" if rank >= len(shards) else "world size"
        return _Check(_Verdict.MISMATCH, mismatch=CheckpointMismatch(str(folder), what, len(shards), expected))
    return _check_shard(folder, shards[rank], state_dict, manifest["format"])


def _check_shard(folder: Path, entry: dict[str, Any], state_dict: dict[str, Any], fmt: int) -> _Check:
    """Check one manifest entry's shard: its checksums, that it loads safely, that it fits ``state_dict``.

    Format 1: one ``torch.save`` file. Format 2: the rank's record (checked against the
    manifest) and its DCP data files; tensors are read from their offsets. Either way
    with ``torch.load(weights_only=True)``: nothing arbitrary is unpickled.
    """
    path = folder / entry["file"]
    try:
        if fmt == 1:
            if not checksum_matches(path, entry):
                return _Check(
                    _Verdict.UNUSABLE, f"shard {path} is corrupt: its checksum does not match {folder / MANIFEST}"
                )
            loaded = torch.load(path, map_location="cpu", weights_only=True)
        else:
            loaded = load_shard(folder, read_record(folder, entry))  # checks each data file as it reads it
    except ShardCorrupt as exc:
        return _Check(_Verdict.UNUSABLE, str(exc))
    except Exception as exc:  # noqa: BLE001 - an unreadable shard makes the step unusable, like a corrupt one
        return _Check(_Verdict.UNUSABLE, f"cannot load shard {path}: {exc}")
    if not isinstance(loaded, dict):
        return _Check(_Verdict.UNUSABLE, f"shard {path} does not hold a dict")
    restore: _Restore = ([], [])
    try:
        _plan(path, state_dict, loaded, "state_dict", *restore)
    except CheckpointMismatch as exc:
        return _Check(_Verdict.MISMATCH, mismatch=exc)
    return _Check(_Verdict.OK, restore=restore)


def _apply(restore: _Restore) -> None:
    copies, sets = restore
    with torch.no_grad():
        for old, new in copies:
            old.copy_(new)
    for container, key, value in sets:
        container[key] = value


def _fell_back(directory: Path, skipped: list[str], outcome: str) -> None:
    warnings.warn(f"checkpoint directory {directory}: {'; '.join(skipped)}; {outcome}", RuntimeWarning, stacklevel=4)


def _propose(directory: Path, below: int | None, proposal: torch.Tensor) -> None:
    """Rank 0: fill ``proposal`` with (1, step, manifest digest) of the step to try next, or leave it zero."""
    if below is None:
        found = latest_checkpoint(directory)
        step = None if found is None else found[0]
    else:
        step = _newest_complete(directory, below) if directory.is_dir() else None
    if step is not None:
        raw = (step_dir(directory, step) / MANIFEST).read_bytes()
        proposal[0], proposal[1] = 1, step
        proposal[2:] = torch.frombuffer(bytearray(hashlib.sha256(raw).digest()), dtype=torch.int64)


def load_checkpoint(
    directory: str | os.PathLike[str],
    state_dict: dict[str, Any],
    *,
    rank: int | None = None,
    process_group: dist.ProcessGroup | None = None,
    layout: ShardLayout | None = None,
) -> int | None:
    """Load the checkpoint to resume from into `state_dict` in place; return its step, or None for none.

    Tensors present in both are copied into the existing tensors (so
    ``model.state_dict()`` entries update the model); other values are replaced or
    added, so call ``optimizer.load_state_dict(state_dict[...])`` afterwards. Uses
    ``torch.load(weights_only=True)``: never unpickles arbitrary objects. Nothing is
    modified unless the whole restore fits.

    COLLECTIVE when ``process_group`` is given, or when ``rank`` is None and a default
    group exists: every rank of the group must call it. Rank 0 resolves the step as
    ``latest_checkpoint`` does and broadcasts it with its manifest's digest; each rank
    checks that it sees that manifest, that its own shard (its rank in the group) is
    intact and fits. If the step is unusable on any rank (missing or different
    manifest, corrupt or unreadable shard), every rank falls back to rank 0's previous
    complete step, and so on, with a RuntimeWarning naming each file and rank and the
    step resumed from; if none is usable, all return None (start from scratch)
    together. So every rank loads exactly the same step, or none does. A checkpoint
    that does not fit this run (a tensor's dtype or shape, a value's type, keys it
    lacks, the world size) raises CheckpointMismatch (a CheckpointError) on every rank,
    naming the rank and what differs.

    Rank-local otherwise (no group, or an explicit ``rank`` without ``process_group``):
    the shard of ``rank`` (default 0) of the latest complete checkpoint. A corrupt or
    unreadable shard of a one-rank checkpoint falls back to the previous one with a
    RuntimeWarning; of a multi-rank checkpoint it raises CheckpointError naming the
    file, since falling back alone could leave ranks on different steps.

    ``layout`` (a ``ShardLayout``, as the checkpoint was saved with one): each rank
    loads its model-parallel slice's shard, so the data-parallel size may differ from
    the saved one (every replica reloads the same state). A checkpoint saved with other
    tensor or pipeline sizes, or saved without a layout when one is given (or the other
    way round), raises CheckpointMismatch naming both layouts. Its collectives put their
    tensors on ``collective_device``.
    """
    directory = Path(directory)
    if process_group is None and (rank is not None or not (dist.is_available() and dist.is_initialized())):
        return _load_alone(directory, state_dict, 0 if rank is None else rank, layout)
    # None: the default group. No frame here holds it: a traceback the caller keeps must
    # not keep a group's sockets open.
    return _load_together(directory, state_dict, process_group, layout)


def _load_alone(directory: Path, state_dict: dict[str, Any], rank: int, layout: ShardLayout | None) -> int | None:
    found = latest_checkpoint(directory)
    skipped: list[str] = []
    while found is not None:
        step, folder = found
        check = _check(folder, step, state_dict, rank, None, None, layout)
        if check.verdict is _Verdict.MISMATCH:
            assert check.mismatch is not None
            raise check.mismatch
        if check.verdict is _Verdict.OK:
            assert check.restore is not None
            _apply(check.restore)
            if skipped:
                _fell_back(directory, skipped, f"resuming from step {step}")
            return step
        if _read_manifest(folder, step)["world_size"] != 1:
            raise CheckpointError(
                f"{check.text}; not falling back alone: the other ranks could resume from another step. "
                f"Load with the process group so that every rank falls back together, or remove {folder}"
            )
        skipped.append(f"step {step} is unusable: {check.text}")
        older = _newest_complete(directory, step)
        found = None if older is None else (older, step_dir(directory, older))
    if skipped:
        _fell_back(directory, skipped, "no usable checkpoint is left: starting from scratch")
    return None


def _load_together(
    directory: Path, state_dict: dict[str, Any], group: dist.ProcessGroup | None, layout: ShardLayout | None
) -> int | None:
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = collective_device(group)
    below: int | None = None  # rank 0: the last step proposed
    skipped: list[str] = []
    while True:  # ends: rank 0 proposes a strictly older step each round, then none
        proposal = torch.zeros(6, dtype=torch.int64)
        failure: Exception | None = None
        if rank == 0:
            try:
                _propose(directory, below, proposal)
            except Exception as exc:  # noqa: BLE001 - the peers wait in the broadcast: tell them
                proposal[0], failure = -1, exc
        proposal = proposal.to(device)
        dist.broadcast(proposal, group_src=0, group=group)
        proposal = proposal.cpu()
        if proposal[0] < 0:
            raise CheckpointError(
                f"rank 0 could not resolve the checkpoint to resume from in {directory}: {failure or 'see rank 0'}"
            ) from failure
        if not proposal[0]:
            if skipped:
                _fell_back(directory, skipped, "no usable checkpoint is left: every rank starts from scratch")
            return None
        step = below = int(proposal[1])
        digest = proposal[2:].numpy().tobytes()
        try:
            check = _check(step_dir(directory, step), step, state_dict, rank, world, digest, layout)
        except Exception as exc:  # noqa: BLE001 - every rank must reach the all_gather
            check = _Check(_Verdict.UNUSABLE, f"cannot check {step_dir(directory, step)}: {exc}")
        reports: list[Any] = [None] * world
        dist.all_gather_object(reports, check.report(), group=group)
        for r, (verdict, _text, fields) in enumerate(reports):
            if verdict == _Verdict.MISMATCH:
                if r == rank and check.mismatch is not None:
                    raise check.mismatch
                path, what, found_s, wanted_s = fields
                raise CheckpointMismatch(path, f"{what} on rank {r}", found_s, wanted_s)
        unusable = [(r, text) for r, (verdict, text, _) in enumerate(reports) if verdict != _Verdict.OK]
        if not unusable:
            assert check.restore is not None
            _apply(check.restore)
            if skipped:
                _fell_back(directory, skipped, f"every rank resumes from step {step}")
            return step
        where = "; ".join(f"on rank {r}: {text}" for r, text in unusable)
        skipped.append(f"step {step} is unusable on every rank ({where})")
