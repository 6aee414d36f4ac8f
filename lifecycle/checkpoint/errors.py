"""The errors of ``lifecycle.checkpoint``, and how a storage fault becomes one."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from lifecycle._core.errors import LifecycleError, ResourceMismatch, ResourceRefused, StaleResource, chain
from lifecycle._core.ownership import Resource
from lifecycle.journal.evidence import Kind

__all__ = [
    "CheckpointError",
    "CheckpointMismatch",
    "CheckpointUnreadable",
    "SaveFailed",
    "SaveFailures",
    "ShardCorrupt",
    "StaleCheckpointer",
    "os_error_text",
    "storage_error",
]


class CheckpointError(LifecycleError):
    """A checkpoint could not be saved, committed or loaded; the message names the path."""


class SaveFailed(CheckpointError):
    """One save of ``step`` was not committed, and every rank of the commit knows it (one decision).

    Raised by ``AsyncCheckpointer.finalize`` on every rank alike, only once the commit's
    collectives completed: a rank's write failed (a full disk, ``EIO``, a write past
    ``write_timeout_s``) or rank 0 could not commit. ``failures`` holds one text per
    failed rank (naming the rank, its file and the OS error) or rank 0's commit error.
    The writer stays usable: the next ``save`` is tried. A collective that itself fails
    (a lost peer) raises a plain ``CheckpointError``, never this: nothing was agreed. Its
    ``failure_kind`` is ``Kind.SAVE_FAILED``.
    """

    failure_kind = Kind.SAVE_FAILED

    def __init__(self, step: int, failures: tuple[str, ...], message: str) -> None:
        self.step = step
        self.failures = failures
        self._fields = (step, failures, message)
        super().__init__(message)


class SaveFailures(CheckpointError):
    """The attempt stops saving: ``failures`` (``SaveFailed``, oldest first) in a row, or a final save that failed.

    ``last_committed`` is the newest step this attempt's checkpoints hold (the resumed
    one if it committed none; None without any): a restart resumes there. The message
    names every failure with its rank and OS error. Its ``failure_kind`` is ``Kind.SAVE_FAILED``.
    """

    failure_kind = Kind.SAVE_FAILED

    def __init__(self, failures: tuple[SaveFailed, ...], last_committed: int | None, why: str) -> None:
        self.failures = failures
        self.last_committed = last_committed
        self.why = why
        listed = "; ".join(f"step {f.step}: {' | '.join(f.failures)}" for f in failures)
        good = f"step {last_committed}" if last_committed is not None else "none"
        self._fields = (failures, last_committed, why)
        super().__init__(f"{why}; the last committed checkpoint is {good}; failed saves: {listed}")


class CheckpointUnreadable(CheckpointError):
    """A checkpoint's manifest or a shard's size could not be read (an I/O error such as ESTALE or EIO).

    Unlike a missing or invalid manifest, this says nothing about whether the
    checkpoint is complete: it is not loaded now, but clean-up keeps it.
    """


class ShardCorrupt(CheckpointError):
    """A data file's content differs from what its rank wrote (a checksum fails); the message names the file."""


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


def os_error_text(exc: BaseException) -> str:
    """The OS error behind ``exc`` as ``"[Errno 28 ENOSPC] No space left on device"``; else ``repr``-like text.

    Follows ``__cause__`` and ``__context__``: ``torch.save`` reports a failed write as a
    ``RuntimeError`` whose context is the ``OSError``.
    """
    for current in chain(exc):
        if isinstance(current, OSError) and current.errno is not None:
            code = current.errno
            name = errno.errorcode.get(code, "?")
            return f"[Errno {code} {name}] {current.strerror or os.strerror(code)}"
    return f"{type(exc).__name__}: {exc}"


def storage_error(action: str, path: Path, exc: BaseException) -> CheckpointError:
    """A ``CheckpointError`` saying which ``action`` on ``path`` failed and the OS error text behind ``exc``."""
    return CheckpointError(f"cannot {action} {path}: {os_error_text(exc)}")
