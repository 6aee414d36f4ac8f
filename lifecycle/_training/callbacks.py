"""Callbacks: user code that ``pretrain`` calls at fixed points of a run.

Every hook runs on every rank, on the training thread. An exception raised by a hook
takes the session's failure edge like any other error in the run, and reaches the
caller of ``pretrain`` unchanged. A hook gets a ``SessionHandle``, never the ``Session``
itself: the run drives the session, and a callback can only add to its teardown, ask it
to stop, and read where it is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, final

if TYPE_CHECKING:
    import torch

    from lifecycle._core.session import Session
    from lifecycle._core.states import State
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


@final
class SessionHandle:
    """What a callback may do with the session ``pretrain`` is driving: the hooks' first argument.

    ``register(name, release)`` records a resource of yours: ``release()`` runs at the
    session's teardown, on success and on failure, in reverse registration order
    (``Session.register``). ``request_exit(reason)`` asks every rank to stop gracefully
    after the step in progress; the first reason given is kept (``Session.request_exit``).
    ``state`` is the session's current ``State`` and ``iteration`` its in-process restart
    iteration (0 outside a restart), both read live.

    That is all: the triggers (``init_*``, ``start_training``, ``finish``, ``close``,
    ``fail``), the signal handlers, the ledger and the observers belong to ``pretrain``
    and are not reachable from here. Code that needs more keeps its own reference to the
    session it passed to ``pretrain(session=...)``. One handle serves one run and stays
    bound to that run's session: after the run it still reads the final ``state``, and
    ``register`` then raises ``SessionFinished`` as the session does.
    """

    __slots__ = ("_session",)

    _session: Session

    def __init__(self, session: Session) -> None:
        """Wrap ``session``; ``pretrain`` builds one per run."""
        self._session = session

    def register(self, name: str, release: Callable[[], object]) -> None:
        """Record a user resource ``name``; ``release()`` runs at teardown, on success and on failure."""
        self._session.register(name, release)

    def request_exit(self, reason: str) -> None:
        """Ask the training loop to stop gracefully after the step in progress; the first reason is kept."""
        self._session.request_exit(reason)

    @property
    def state(self) -> State:
        """The session's current state."""
        return self._session.state

    @property
    def iteration(self) -> int:
        """The session's in-process restart iteration (0 for an ordinary run, and for the first attempt)."""
        return self._session.iteration

    def __repr__(self) -> str:
        session = self._session
        return (
            f"<SessionHandle state={session.state.value} restart_mode={session.restart_mode.value}"
            f" iteration={session.iteration} exit_requested={session.exit_requested!r}>"
        )


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

    Each hook's first argument is a ``SessionHandle`` (one per run), not the ``Session``:
    it offers ``register``, ``request_exit``, ``state`` and ``iteration``, nothing else.
    The parameter keeps its name ``session``, so overrides that take it by keyword keep
    working; ``pretrain`` passes every argument positionally.
    """

    def on_setup_end(self, session: SessionHandle, ctx: TrainContext) -> None:
        """Model, optimizer, data and checkpointer are ready (a resumed checkpoint is loaded)."""

    def on_train_start(self, session: SessionHandle, ctx: TrainContext) -> None:
        """The session entered ``training``; the first step comes next."""

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        """Step ``step`` is done; ``loss`` is its training loss averaged over all ranks."""

    def on_eval_end(self, session: SessionHandle, step: int, loss: float) -> None:
        """An evaluation after step ``step`` is done; ``loss`` is the held-out loss averaged over all ranks."""

    def on_checkpoint_saved(self, session: SessionHandle, step: int, directory: Path) -> None:
        """A save of step ``step`` under ``directory`` started; it is committed after the next step (or at the end)."""

    def on_train_end(self, session: SessionHandle, step: int, reason: ExitReason) -> None:
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

    def on_setup_end(self, session: SessionHandle, ctx: TrainContext) -> None:
        """Remember the rank and the tokens a step consumes."""
        self._enabled = ctx.rank == 0 and self.interval > 0
        self._tokens_per_step = ctx.tokens_per_step
        self._iterations = ctx.config.training.iterations
        self._since = (time.monotonic(), ctx.start_step)

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        """Every ``interval`` steps, log the loss and the throughput since the last line."""
        if not self._enabled or step % self.interval:
            return
        now = time.monotonic()
        then, then_step = self._since
        rate = self._tokens_per_step * (step - then_step) / max(now - then, 1e-9)
        self._since = (now, step)
        logger.info("step %5d/%d | loss %.4f | %9.0f tokens/s", step, self._iterations, loss, rate)

    def on_eval_end(self, session: SessionHandle, step: int, loss: float) -> None:
        """Log the held-out loss."""
        if self._enabled:
            logger.info("step %5d | eval loss %.4f", step, loss)

    def on_checkpoint_saved(self, session: SessionHandle, step: int, directory: Path) -> None:
        """Log the save."""
        if self._enabled:
            logger.info("step %5d | checkpoint save started in %s", step, directory)

    def on_train_end(self, session: SessionHandle, step: int, reason: ExitReason) -> None:
        """Log why the loop ended."""
        if self._enabled:
            logger.info("step %5d | training ended: %s", step, reason.value)


def call_hooks(callbacks: list[Callback], hook: str, session: SessionHandle, *args: Any) -> None:
    """Call ``hook(session, *args)`` on every callback, in order; an exception propagates at once."""
    for callback in callbacks:
        getattr(callback, hook)(session, *args)
