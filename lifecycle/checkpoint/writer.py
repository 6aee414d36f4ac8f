"""Asynchronous checkpoints that can be finalized collectively or aborted rank-locally.

The on-disk layout is in ``lifecycle.checkpoint.layout`` (docs/checkpoint-format.md):
each committed step folder is a torch Distributed Checkpoint (DCP), written by the parts
in ``lifecycle.checkpoint.dcp_format``; resuming (by agreement of every rank) in
``lifecycle.checkpoint.loader``; what a commit removes in ``lifecycle.checkpoint.hygiene``.

Why not ``torch.distributed.checkpoint.async_save``: measured here (torch 2.13, gloo,
2 ranks) its background thread runs ``gather_object``, ``scatter_object_list`` and
``broadcast_object_list``, in a non-daemon ``ThreadPoolExecutor`` thread. With a peer
that never joins, neither ``destroy_process_group()`` nor ``_abort_process_group()``
releases that thread and interpreter exit waits for the whole group timeout, so
abandoning it is not rank-local. Its loader also unpickles non-tensor values with
``weights_only=False`` and it keeps one copy of plain (replicated) tensors, not each
rank's. So here ``save()`` plans on the caller's thread, the background thread only
writes this rank's files, and every collective happens in ``finalize()``, on the
caller's thread; rank 0 writes DCP's global ``.metadata`` there, from every writing
rank's record.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from concurrent.futures import wait as wait_for
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lifecycle import journal
from lifecycle.checkpoint import hygiene
from lifecycle.checkpoint.dcp_format import (
    Planned,
    data_name,
    plan_save,
    read_record,
    record_name,
    slice_key,
    write_global_metadata,
    write_planned,
)
from lifecycle.checkpoint.errors import (
    CheckpointError,
    CheckpointMismatch,
    SaveFailed,
    StaleCheckpointer,
    os_error_text,
)
from lifecycle.checkpoint.layout import (
    DCP_METADATA,
    FORMAT,
    MANIFEST,
    MARKER,
    ShardLayout,
    describe_layout,
    probe_directory,
    sha256,
    step_dir,
    write_atomic,
)
from lifecycle.checkpoint.loader import collective_device, latest_checkpoint, load_checkpoint
from lifecycle.checkpoint.parts import (
    REPLICA,
    ROW,
    VERDICT,
    WAKE_S,
    WROTE,
    Pending,
    Shard,
    decode_text,
    encode_text,
    group_timeout_s,
    stage,
    write_bound,
)

__all__ = [
    "AsyncCheckpointer",
    "CheckpointError",
    "CheckpointMismatch",
    "SaveFailed",
    "StaleCheckpointer",
    "latest_checkpoint",
    "load_checkpoint",
]


class AsyncCheckpointer:
    """Writes checkpoints asynchronously under `directory`, one subfolder per step.

    The process group is resolved once, here: ``process_group``, else the default
    group if one exists, else none (single process, no collectives). A writer whose
    group was destroyed cannot commit; a retry must create a new writer. At most one
    save is in flight. ``save``, ``finalize`` and ``save_sync`` belong to the training thread;
    ``abort`` may be called from any thread, at any time (a lock orders it against
    ``finalize``, which works on a snapshot of the group taken under that lock).

    The constructor creates ``directory`` and writes, fsyncs and removes a probe file
    in it: a folder that cannot hold checkpoints (not a directory, not writable, a
    read-only file system) raises ``CheckpointError`` naming the path and the OS error
    here, before training. ``keep_last``: after each commit rank 0 keeps only that many
    complete steps (the one just committed always among them); None keeps all. What a
    commit removes, and only in a directory this run owns, is in
    ``lifecycle.checkpoint.hygiene``.

    ``layout`` (a ``ShardLayout``; its sizes' product must be the group's size): only
    the first data-parallel replica of each model-parallel slice writes a shard, and
    the manifest records the layout (see ``lifecycle.checkpoint.layout``); every rank
    still calls ``save`` and ``finalize`` together. None: every rank writes its own.
    The commit's collectives run on the group with tensors on its device
    (``collective_device``: the current CUDA device for nccl, else the CPU).

    ``write_timeout_s``: how long ``finalize()`` waits for this rank's own write (a hung
    file system) before it reports the write as failed in the commit, so that its peers,
    which wait in the commit's collective for at most the group timeout, are still there
    to hear it. Default: half the group's timeout (without a group, half of torch's
    default, 30 min); ``ValueError`` unless above 0 and below the group timeout.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        process_group: dist.ProcessGroup | None = None,
        keep_last: int | None = None,
        layout: ShardLayout | None = None,
        write_timeout_s: float | None = None,
    ) -> None:
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(f"keep_last must be None or an int >= 1, got {keep_last!r}")
        self.directory = Path(directory)
        self.keep_last = keep_last
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
        if layout is not None and layout.shards * layout.data != self._world:
            raise ValueError(
                f"layout {describe_layout(layout.sizes())} needs {layout.shards * layout.data} ranks, "
                f"the group has {self._world}"
            )
        self.layout = layout
        self._device = collective_device(process_group) if process_group is not None else torch.device("cpu")
        self.write_timeout_s = write_bound(write_timeout_s, group_timeout_s(process_group, self._device))
        probe_directory(self.directory, self._rank)
        self._lock = threading.Lock()  # orders abort() (any thread) against save()/finalize()
        self._pending: Pending | None = None
        self._finalizing: Pending | None = None
        self._aborted = False
        self._owner: str | None = None  # the directory's owner run id, once rank 0 read or wrote it
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
        read back, CheckpointError naming the folder and the OS error if the step folder
        cannot be created. The first save of a run on rank 0 claims the directory (its
        owner file) if no run owns it yet.
        """
        self._start(step, state_dict, copy=True)

    def save_sync(self, step: int, state_dict: dict[str, Any]) -> int | None:
        """Synchronous save, COLLECTIVE: write `state_dict` for `step` and commit it; return once committed.

        ``save`` then ``finalize``, with the same errors, except that tensors already on
        the CPU are not copied first: the caller waits, so they do not change while they
        are written. (A write that outlives ``write_timeout_s`` keeps reading them after
        this call raised; what it writes is never committed, and its files are removed.)
        Returns the committed step, or None when an abort() from another thread
        abandoned the save before finalize() took it (an abort after that fails the
        commit: finalize()'s CheckpointError).
        """
        self._start(step, state_dict, copy=False)
        return self.finalize()

    def _start(self, step: int, state_dict: dict[str, Any], *, copy: bool) -> None:
        """Stage (``copy``: a CPU copy of every tensor), plan and start the writer thread of one save."""
        self._refuse_if_aborted()
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if self._pending is not None:
            self.finalize()
        if self.layout is not None and not self.layout.writes:
            # A replica: the slice's first replica writes the same state. Nothing to stage.
            replica = Pending(step, 0, None)
            try:
                if self._before_write is not None:
                    self._before_write()  # the fault seam: a replica's "write" can fail too
            except Exception as exc:  # noqa: BLE001 - reported in the commit, like a writer's failure
                replica.future.set_exception(
                    CheckpointError(f"rank {self._rank} (a replica) failed its save: {os_error_text(exc)}")
                )
            else:
                replica.future.set_result(Shard(0, bytes(32), written=False))
            with self._lock:
                self._refuse_if_aborted()
                self._pending = replica
            return
        staged = stage(state_dict, "state_dict", copy)
        folder = step_dir(self.directory, step)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            # Not raised here: this rank alone would leave the save its peers finalize. The
            # commit reports it to every rank, and they fail this save together (SaveFailed).
            failed = Pending(step, 0, folder / record_name(self._rank, 0))
            failed.future.set_exception(
                CheckpointError(f"rank {self._rank} cannot create checkpoint folder {folder}: {os_error_text(exc)}")
            )
            with self._lock:
                self._refuse_if_aborted()
                self._pending = failed
            return
        if self._rank == 0 and self._owner is None:
            self._owner = hygiene.claim(self.directory, journal.run_id())
        token = secrets.randbits(62)
        pending = Pending(step, token, folder / record_name(self._rank, token))
        # Planned here, on the caller's thread: DCP's planner for this rank's keys alone, no collective.
        planned = plan_save(
            staged, slice_key(self.layout, self._rank, self._world), data_name(self._rank, token), pending.abandoned
        )
        with self._lock:
            self._refuse_if_aborted()
            self._pending = pending  # from here on, abort() reaches this save
        # A daemon thread: it only touches local files, never a peer, and an abandoned
        # one must not keep the interpreter alive. If it is killed mid-write only files
        # no manifest lists are left, which nothing reads and the next commit removes.
        go = threading.Event()
        threading.Thread(
            target=self._write,
            args=(pending, planned, folder, self._before_write, go),
            name=f"lifecycle-ckpt-step{step}-rank{self._rank}",
            daemon=True,
        ).start()
        # The new thread waits for this: else it runs on holding the GIL as start() returns,
        # and the caller waits out its time slice (sys.getswitchinterval()) before save() returns.
        go.set()

    def _refuse_if_aborted(self) -> None:
        if self._aborted:
            raise StaleCheckpointer(
                f"the checkpointer for {self.directory} was aborted and never saves again; create a new one"
            )

    def _write(
        self,
        pending: Pending,
        planned: Planned,
        folder: Path,
        hook: Callable[[], object] | None,
        go: threading.Event,
    ) -> None:
        assert pending.file is not None  # a replica starts no writer
        record = pending.file
        go.wait()
        try:
            try:
                if hook is not None:
                    hook()  # the fault seam: what it raises is this write's failure
            except Exception as exc:
                raise CheckpointError(
                    f"rank {self._rank} could not write its shard {record}: {os_error_text(exc)}"
                ) from exc
            if pending.abandoned.is_set():
                raise CheckpointError(f"save of {record} was aborted before it started")
            try:
                write_planned(planned, folder, record, pending.step, self._rank)
            except Exception as exc:
                if pending.abandoned.is_set():
                    raise CheckpointError(f"save of {record} was aborted while it was written") from exc
                # torch.save turns a failed write into a RuntimeError; the OSError is its context.
                raise CheckpointError(
                    f"rank {self._rank} could not write its shard {record}: {os_error_text(exc)}"
                ) from exc
            if pending.abandoned.is_set():
                raise CheckpointError(f"save of {record} was aborted")
            pending.future.set_result(Shard(record.stat().st_size, sha256(record)))
        except BaseException as exc:  # noqa: BLE001 - always resolve the future, or finalize() waits forever
            # Nobody will ever list them in a manifest: the record and this attempt's data files.
            for leftover in (record, *folder.glob(f"{planned.prefix}*.distcp")):
                with contextlib.suppress(OSError):  # the error below already says what went wrong
                    leftover.unlink(missing_ok=True)
            if not isinstance(exc, Exception):
                exc = CheckpointError(f"writer of {record} stopped: {exc!r}")
            # The traceback holds this frame: `pending` (whose future holds the error) and
            # `self` (its process group) would form a cycle only the GC frees, and gloo
            # closes an aborted group's sockets only once the group object is freed.
            pending.future.set_exception(exc.with_traceback(None))

    def finalize(self) -> int | None:
        """Success path, COLLECTIVE: wait for the in-flight save, then commit it as latest.

        Every rank calls it. Each rank waits for its own write at most
        ``write_timeout_s`` (a write still running then counts as failed; an abort() from
        another thread ends the wait within ``WAKE_S``), then reports it (ok, or the error
        with its OS error text and path) in one all_gather, so a rank whose write failed or
        hung still joins and all ranks raise the same CheckpointError, which quotes every
        failed rank's error naming the rank and its file, instead of hanging: a
        ``SaveFailed``, raised only after the collectives completed, so every rank
        decides alike (the writer stays usable; nothing of that save is ever committed). Only when
        all ranks succeeded does rank 0 check that every listed shard is present with its
        size (from its own view of the folder), write the manifest and then the ``latest`` marker (write-tmp +
        os.replace), and clean up (``lifecycle.checkpoint.hygiene``); a broadcast tells
        the other ranks whether that worked, with rank 0's error text (``SaveFailed`` on
        every rank if not). The same two collectives as a success: no extra one per save. Returns the
        committed step, or None if nothing was in flight or the writer was aborted (then
        no collective runs). Idempotent. It runs on the snapshot of the group taken when
        it starts: an abort() from another thread never turns it into a single-process
        commit; an abort that lands before the all_gather fails the commit on every
        rank. If a peer is gone the collective fails after the group timeout at most, or
        as soon as the peer destroys its group; the save is then abandoned, never
        committed.
        """
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None or self._aborted:
                return None
            self._finalizing = pending
            # The snapshot is the weak reference itself: no frame of this call holds the
            # group (a failed commit's traceback, kept by the caller, would keep its sockets open).
            group_ref = self._group_ref
        try:
            return self._finalize(pending, group_ref)
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
        finally:
            with self._lock:
                self._finalizing = None

    def _await_write(self, pending: Pending) -> Shard:
        """This rank's write result, waited for at most ``write_timeout_s``; an abort() ends the wait.

        Local disk only, never a peer. A write still running at the bound, or abandoned by
        an abort() from another thread (seen within ``WAKE_S``), raises CheckpointError
        naming this rank and its file, and is flagged abandoned: if it ever completes, the
        writer thread removes its file.
        """
        deadline = time.monotonic() + self.write_timeout_s
        while True:
            done, _ = wait_for([pending.future], timeout=max(0.0, min(WAKE_S, deadline - time.monotonic())))
            if done:
                return pending.future.result()
            if pending.abandoned.is_set():
                raise CheckpointError(
                    f"rank {self._rank} aborted the save of {pending.file} while finalize() waited for it"
                )
            if time.monotonic() >= deadline:
                pending.abandoned.set()
                raise CheckpointError(
                    f"rank {self._rank} could not write its shard {pending.file}: the write did not finish "
                    f"within {self.write_timeout_s:g} s (write_timeout_s)"
                )

    def _finalize(self, pending: Pending, group_ref: weakref.ref[dist.ProcessGroup] | None) -> int:
        shard: Shard | None = None
        local_error: Exception | None = None
        try:
            shard = self._await_write(pending)
        except Exception as exc:  # noqa: BLE001 - reported to all ranks below, so none hangs
            local_error = exc
        report = self._report(pending, shard, local_error)
        # Zeros, not empty: a row a peer never filled reads as "write failed".
        out = [torch.zeros_like(report) for _ in range(self._world)]
        group = self._group_of(group_ref) if group_ref is not None else None
        with self._lock:
            aborted = self._aborted
        # From this check to the collective nothing releases the GIL on the success path: an abort()
        # that returned before this rank's report went out has failed its write.
        if shard is not None and aborted:
            local_error = CheckpointError(f"rank {self._rank} aborted the save while finalizing it")
            shard = None
            report = self._report(pending, None, local_error)
        try:
            if group is not None:
                dist.all_gather(out, report, group=group)
            else:  # a writer made without a group: a world of one, never a larger one
                out = [report]
        finally:
            # Never past the collective: a failure's traceback keeps this frame, and a group it
            # references keeps its gloo sockets open, so peers would wait out the timeout.
            group = None
        everyone = [row.cpu() for row in out]
        failed = [r for r, row in enumerate(everyone) if not row[0]]
        if failed:
            # Every rank holds the same rows: all of them raise this, for the same ranks.
            texts = tuple(decode_text(everyone[r][8:]) or f"rank {r}: no report" for r in failed)
            raise SaveFailed(
                pending.step,
                texts,
                f"checkpoint step {pending.step} in {self.directory} not committed: "
                f"ranks {failed} failed to write their shard: {'; '.join(texts)}",
            ) from local_error
        if any(int(row[1]) != pending.step for row in everyone):
            raise CheckpointError(
                f"ranks disagree on the step to commit in {self.directory}: {[int(row[1]) for row in everyone]}"
            )
        verdict = torch.zeros(VERDICT, dtype=torch.int64, device=self._device)
        verdict[0] = 1
        commit_error: Exception | None = None
        if self._rank == 0:
            try:
                self._commit(pending.step, everyone)
            except Exception as exc:  # noqa: BLE001 - peers learn of it by the broadcast
                verdict[0] = 0
                verdict[1:] = encode_text(str(exc)).to(self._device)
                commit_error = exc
        if group_ref is not None:
            dist.broadcast(verdict, group_src=0, group=self._group_of(group_ref))
        if not verdict[0].item():
            text = f"rank 0 could not commit: {decode_text(verdict[1:].cpu())}"
            raise SaveFailed(
                pending.step, (text,), f"checkpoint step {pending.step} in {self.directory} not committed: {text}"
            ) from commit_error
        return pending.step

    def _report(self, pending: Pending, shard: Shard | None, error: Exception | None) -> torch.Tensor:
        """This rank's row of the commit's all_gather, on the group's device: its shard, or ``error``'s text.

        Without a group (a world of one, never a larger one) the row is all there is.
        """
        mine = torch.zeros(ROW, dtype=torch.int64)
        mine[1], mine[2] = pending.step, pending.token
        if shard is not None:
            mine[0] = WROTE if shard.written else REPLICA
            mine[3] = shard.size
            mine[4:8] = torch.frombuffer(bytearray(shard.sha256), dtype=torch.int64)
            mine[8] = self.layout.shard if self.layout is not None else self._rank  # where the text goes otherwise
        else:
            mine[8:] = encode_text(str(error))
        return mine.to(self._device)

    def _group_of(self, group_ref: weakref.ref[dist.ProcessGroup]) -> dist.ProcessGroup:
        """The live group behind ``group_ref``, for one call; CheckpointError once it was destroyed."""
        group = group_ref()
        try:
            if group is None:
                raise ValueError("the group object was freed")
            dist.get_rank(group)
        except (ValueError, RuntimeError):
            # A destroyed group object can still run a one-rank collective locally;
            # a writer that outlived its group must not commit through it.
            raise CheckpointError(
                f"process group of the checkpointer for {self.directory} was destroyed; "
                "finalize() must run before the group is destroyed"
            ) from None
        return group

    def _check_seen(self, step: int, folder: Path, files: list[dict[str, Any]], what: str) -> None:
        """CheckpointError unless rank 0 sees each of ``files`` (``what`` they are) in ``folder`` with its size."""
        unseen = []
        for s in files:
            path = folder / str(s["file"])
            try:
                size = path.stat().st_size
            except OSError as exc:
                unseen.append(f"{path} ({os_error_text(exc)})")
                continue
            if size != s["bytes"]:
                who = f"rank {s['rank']}" if "rank" in s else "its rank"
                unseen.append(f"{path} ({size} bytes, {who} wrote {s['bytes']})")
        if unseen:
            raise CheckpointError(
                f"checkpoint step {step} in {self.directory} not committed: rank 0 does not see "
                f"{len(unseen)} of the {len(files)} {what}: {', '.join(unseen)}; every rank must write to "
                "the same shared folder"
            )

    def _commit(self, step: int, everyone: list[torch.Tensor]) -> None:
        if len(everyone) != self._world:
            raise CheckpointError(f"{len(everyone)} shard reports for a world of {self._world}")
        with self._lock:
            if self._aborted:
                raise CheckpointError(f"rank 0 aborted the save of step {step} while finalizing it")
        folder = step_dir(self.directory, step)
        writers = [r for r, row in enumerate(everyone) if int(row[0]) == WROTE]
        shards: list[dict[str, Any]] = [
            {
                "rank": r,
                "file": record_name(r, int(everyone[r][2])),
                "bytes": int(everyone[r][3]),
                "sha256": everyone[r][4:8].numpy().tobytes().hex(),
            }
            for r in writers
        ]
        manifest: dict[str, Any] = {"format": FORMAT, "step": step, "world_size": self._world}
        if self.layout is not None:
            by_shard = {int(everyone[r][8]): s for r, s in zip(writers, shards, strict=True)}
            if sorted(by_shard) != list(range(self.layout.shards)) or len(shards) != self.layout.shards:
                raise CheckpointError(
                    f"checkpoint step {step} in {self.directory} not committed: the writing ranks reported shards "
                    f"{sorted(by_shard)}, the layout {describe_layout(self.layout.sizes())} has "
                    f"{self.layout.shards}"
                )
            shards = [{"shard": i, **by_shard[i]} for i in range(self.layout.shards)]
            manifest["layout"] = self.layout.sizes()
        self._check_seen(step, folder, shards, "shards")
        # Each record's size and SHA-256 came in the all_gather: what rank 0 reads is what its rank wrote.
        records = []
        for s in shards:
            try:
                record = read_record(folder, s)
            except OSError as exc:
                raise CheckpointError(f"rank 0 cannot read {folder / s['file']}: {os_error_text(exc)}") from exc
            s["data"] = record["files"]
            records.append(record)
        self._check_seen(step, folder, [d for s in shards for d in s["data"]], "data files")
        try:
            write_global_metadata(folder, records)
            meta = folder / DCP_METADATA
            manifest["metadata"] = {"file": DCP_METADATA, "bytes": meta.stat().st_size, "sha256": sha256(meta).hex()}
        except OSError as exc:
            raise CheckpointError(f"cannot write {folder / DCP_METADATA}: {os_error_text(exc)}") from exc
        manifest["shards"] = shards
        # The manifest is the commit record, written after every file it lists; the marker only points to it.
        write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1).encode())
        try:
            write_atomic(self.directory / MARKER, json.dumps({"step": step}).encode())
        except BaseException:
            # Every rank will hear that this step failed: it must not look committed on disk either.
            with contextlib.suppress(OSError):  # then it is a committed step that is not latest (docs)
                (folder / MANIFEST).unlink()
            raise
        # Before the broadcast releases the peers: none can have started its next save,
        # whose folder would otherwise look partial here.
        try:
            hygiene.clean(self.directory, step, journal.run_id(), self.keep_last)
        except Exception as exc:  # noqa: BLE001 - the step is committed; cleaning is best effort
            warnings.warn(
                f"checkpoint step {step} in {self.directory} committed, but cleaning up failed: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )

    def abort(self) -> None:
        """Failure path, RANK-LOCAL, from any thread: abandon the in-flight save; it is never committed.

        Never calls a collective and never waits for one (it takes the writer's lock,
        which is never held across a collective or a write): it only flags the save, so
        the writer thread (a daemon, which cannot hold up interpreter exit) deletes its
        file and tmp file instead of reporting them. If finalize() is running in another
        thread, its save is flagged too: unless rank 0 already started writing the
        manifest, no rank commits it. Commits happen only in finalize(), which this
        writer refuses from now on (save() raises, finalize() returns None). Idempotent.
        The last committed checkpoint stays the latest.
        """
        with self._lock:
            self._aborted = True
            self._group_ref = None
            pending, self._pending = self._pending, None
            finalizing = self._finalizing
        for save in (pending, finalizing):
            if save is not None:
                save.abandoned.set()
