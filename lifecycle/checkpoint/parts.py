"""The checkpoint writer's parts: the commit's rows and their text, a save's state on its way, the bounds.

Used by ``lifecycle.checkpoint.writer`` (``AsyncCheckpointer``).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lifecycle._core.bounds import Bounds

TEXT_WORDS = 64
"""int64 words of error text each rank carries in the commit's collectives (512 bytes)."""
ROW = 8 + TEXT_WORDS
"""Length of the int64 row each rank contributes to finalize's all_gather."""
VERDICT = 1 + TEXT_WORDS
"""Length of the int64 verdict rank 0 broadcasts: committed or not, and why not."""


def encode_text(text: str) -> torch.Tensor:
    """``text`` as ``TEXT_WORDS`` int64 words (UTF-8, cut to fit, NUL-padded), for the commit's collectives."""
    raw = text.encode()[: TEXT_WORDS * 8]
    buf = bytearray(TEXT_WORDS * 8)
    buf[: len(raw)] = raw
    return torch.frombuffer(buf, dtype=torch.int64).clone()


def decode_text(words: torch.Tensor) -> str:
    """The text ``encode_text`` put in ``words``."""
    return words.numpy().tobytes().rstrip(b"\0").decode(errors="replace")


class Shard:
    """What the writer thread reports for one rank's written file (``written`` False: a replica wrote none)."""

    def __init__(self, size: int, sha256: bytes, *, written: bool = True) -> None:
        self.size, self.sha256, self.written = size, sha256, written


WROTE, REPLICA = 1, 2
"""Row status words: this rank wrote its shard; this rank is a replica and wrote none (0: it failed)."""


class Pending:
    """One in-flight save: its step, its file (None: a replica writes none), the future the writer thread resolves."""

    def __init__(self, step: int, token: int, file: Path | None) -> None:
        self.step = step
        self.token = token
        self.file = file
        self.future: Future[Shard] = Future()
        self.abandoned = threading.Event()


WAKE_S = 0.05
"""How often a finalize() waiting for its local write looks for an abort() from another thread."""


def group_timeout_s(group: dist.ProcessGroup | None, device: torch.device) -> float:
    """The timeout of ``group``'s collectives on ``device``, in seconds; torch's default when it cannot be read.

    Reads ``ProcessGroup._get_backend(device).options._timeout`` (private; there is no
    public getter in torch 2.13 or 2.15; tested on both stacks). None: torch's default
    (``torch.distributed.default_pg_timeout``).
    """
    if group is not None:
        try:
            timeout = group._get_backend(device).options._timeout
            if isinstance(timeout, datetime.timedelta):
                return timeout.total_seconds()
        except (AttributeError, RuntimeError, ValueError):
            pass
    return float(dist.default_pg_timeout.total_seconds())


def write_bound(requested: float | None, group_timeout: float) -> float:
    """``write_timeout_s`` as given (validated: above 0, below the group timeout), or ``Bounds.write_timeout_s``."""
    if requested is None:
        return Bounds(group_timeout).write_timeout_s
    if isinstance(requested, bool) or not isinstance(requested, (int, float)) or not 0 < requested < group_timeout:
        raise ValueError(
            f"write_timeout_s must be a number above 0 and below the group timeout ({group_timeout:g} s), "
            f"got {requested!r}: peers wait for this rank's commit report only that long"
        )
    return float(requested)


def stage(value: Any, where: str, copy: bool) -> Any:
    """The state with its tensors on the CPU: copies when ``copy``, so training may mutate its tensors meanwhile.

    Without ``copy`` a CPU tensor is taken as it is (detached): for a save the caller
    waits for. Only types that ``torch.load(weights_only=True)`` accepts are allowed, so
    a save never produces a checkpoint that the safe loader would refuse later.
    """
    if isinstance(value, torch.Tensor):
        return value.detach().to(device="cpu", copy=copy)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"checkpoint key {where}[{k!r}] must be str or int")
            out[k] = stage(v, f"{where}[{k!r}]", copy)
        return out
    if value is None or isinstance(value, (bool, int, float, str, torch.Size, torch.dtype)):
        return value
    if isinstance(value, (list, tuple)):
        items = [stage(v, f"{where}[{i}]", copy) for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise TypeError(f"checkpoint value {where} has unsupported type {type(value).__name__}")
