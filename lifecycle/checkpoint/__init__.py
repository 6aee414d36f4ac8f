"""Asynchronous checkpoints: written in the background, committed collectively, aborted rank-locally.

Modules, in the order they build on each other: ``errors``, ``layout`` (the on-disk
format), ``loader`` (resume by agreement of every rank), ``hygiene`` (directory
ownership, cleanup and retention), ``writer`` (the writer, and why the stock writers do
not fit).
"""

from lifecycle.checkpoint.errors import CheckpointError, CheckpointMismatch, SaveFailed, SaveFailures, StaleCheckpointer
from lifecycle.checkpoint.loader import latest_checkpoint, load_checkpoint
from lifecycle.checkpoint.writer import AsyncCheckpointer

__all__ = [
    "AsyncCheckpointer",
    "CheckpointError",
    "CheckpointMismatch",
    "SaveFailed",
    "SaveFailures",
    "StaleCheckpointer",
    "latest_checkpoint",
    "load_checkpoint",
]
