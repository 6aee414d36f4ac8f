"""Asynchronous checkpoints: written in the background, committed collectively, aborted rank-locally.

See ``lifecycle.checkpoint.writer`` for the on-disk layout and why the stock writers
do not fit.
"""

from lifecycle.checkpoint.writer import (
    AsyncCheckpointer,
    CheckpointError,
    CheckpointMismatch,
    StaleCheckpointer,
    latest_checkpoint,
    load_checkpoint,
)

__all__ = [
    "AsyncCheckpointer",
    "CheckpointError",
    "CheckpointMismatch",
    "StaleCheckpointer",
    "latest_checkpoint",
    "load_checkpoint",
]
