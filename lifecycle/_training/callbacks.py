"""Callbacks: user code that ``pretrain`` calls at fixed points of a run.

Every hook runs on every rank, on the training thread. An exception raised by a hook
takes the session's failure edge like any other error in the run, and reaches the
caller of ``pretrain`` unchanged.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from lifecycle._core.session import Session
    from lifecycle._training.config import PretrainConfig
    from lifecycle.checkpoint import AsyncCheckpointer

logger = logging.getLogger("lifecycle.pretrain")


class ExitReason(StrEnum):
    """Why the training loop ended without failing."""

    ITERATIONS = "iterations"
    """``training.iterations`` steps were done."""
    REQUESTED = "requested"
    """An exit was requested on some rank: a signal or ``session.request_exit``."""
    MAX_DURATION = "max_duration"
    """``exit.max_duration_s`` ran out."""


@dataclass(frozen=True, slots=True)
class TrainContext:
    """What a run set up, handed to ``on_setup_end`` and ``on_train_start``.

    ``start_step``: the last step already done (0, or the resumed checkpoint's step).
    ``tokens_per_step``: tokens consumed by one optimizer step over all data-parallel
    ranks (0 when the batches have no ``tokens`` tensor).
    """

    config: PretrainConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    rank: int
    world_size: int
    data_parallel_rank: int
    data_parallel_size: int
    start_step: int
    tokens_per_step: int
    checkpointer: AsyncCheckpointer | None


class Callback:
    """Base class for ``pretrain`` callbacks: override the hooks you need; each default does nothing.

    Order of calls: ``on_setup_end`` (state ``globals_ready``, everything set up),
    ``on_train_start`` (state ``training``), then per step ``on_step_end``, and when
    they happen ``on_eval_end`` and ``on_checkpoint_saved``; ``on_train_end`` (state
    ``finalizing``, the last checkpoint committed) when the loop ended without failing.
    A failed run calls no further hook: release your resources through
    ``session.register(name, release)``, which runs ``release`` at teardown on success
    and on failure, in reverse registration order. To stop training gracefully, call
    ``session.request_exit(reason)``: every rank learns of it at the end of the step in
    progress (the next one, if asked from ``on_step_end``) and all stop after that step.
    """

    def on_setup_end(self, session: Session, ctx: TrainContext) -> None:
        """Model, optimizer, data and checkpointer are ready (a resumed checkpoint is loaded)."""

    def on_train_start(self, session: Session, ctx: TrainContext) -> None:
        """The session entered ``training``; the first step comes next."""

    def on_step_end(self, session: Session, step: int, loss: float) -> None:
        """Step ``step`` is done; ``loss`` is its training loss averaged over all ranks."""

    def on_eval_end(self, session: Session, step: int, loss: float) -> None:
        """An evaluation after step ``step`` is done; ``loss`` is the held-out loss averaged over all ranks."""

    def on_checkpoint_saved(self, session: Session, step: int, directory: Path) -> None:
        """A save of step ``step`` under ``directory`` started; it is committed after the next step (or at the end)."""

    def on_train_end(self, session: Session, step: int, reason: ExitReason) -> None:
        """The loop ended after step ``step``, for ``reason``; the session is in ``finalizing``."""


class ProgressLog(Callback):
    """Logs step, loss and throughput (tokens/s) on rank 0 every ``interval`` steps (INFO, ``lifecycle.pretrain``)."""

    def __init__(self, interval: int) -> None:
        """Log every ``interval`` steps (and every evaluation and checkpoint)."""
        self.interval = interval
        self._enabled = False
        self._tokens_per_step = 0
        self._iterations = 0
        self._since: tuple[float, int] = (0.0, 0)

    def on_setup_end(self, session: Session, ctx: TrainContext) -> None:
        """Remember the rank and the tokens a step consumes."""
        self._enabled = ctx.rank == 0 and self.interval > 0
        self._tokens_per_step = ctx.tokens_per_step
        self._iterations = ctx.config.training.iterations
        self._since = (time.monotonic(), ctx.start_step)

    def on_step_end(self, session: Session, step: int, loss: float) -> None:
        """Every ``interval`` steps, log the loss and the throughput since the last line."""
        if not self._enabled or step % self.interval:
            return
        now = time.monotonic()
        then, then_step = self._since
        rate = self._tokens_per_step * (step - then_step) / max(now - then, 1e-9)
        self._since = (now, step)
        logger.info("step %5d/%d | loss %.4f | %9.0f tokens/s", step, self._iterations, loss, rate)

    def on_eval_end(self, session: Session, step: int, loss: float) -> None:
        """Log the held-out loss."""
        if self._enabled:
            logger.info("step %5d | eval loss %.4f", step, loss)

    def on_checkpoint_saved(self, session: Session, step: int, directory: Path) -> None:
        """Log the save."""
        if self._enabled:
            logger.info("step %5d | checkpoint save started in %s", step, directory)

    def on_train_end(self, session: Session, step: int, reason: ExitReason) -> None:
        """Log why the loop ended."""
        if self._enabled:
            logger.info("step %5d | training ended: %s", step, reason.value)


def call_hooks(callbacks: list[Callback], hook: str, *args: Any) -> None:
    """Call ``hook`` on every callback, in order; an exception propagates at once."""
    for callback in callbacks:
        getattr(callback, hook)(*args)
