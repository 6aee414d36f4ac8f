"""Injected faults: what ``FaultInjection`` does to the rank when it fires (demos and tests)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

from lifecycle._training.callbacks import Callback, SessionHandle
from lifecycle._training.config import FaultKind, InjectedFault, Phase

logger = logging.getLogger("lifecycle.pretrain")

_SPIN_PATTERN = re.compile(r"(a+)+$")
"""Backtracks exponentially on ``"a" * n + "b"``: the match runs in C, holding the GIL."""


def fire(kind: FaultKind, phase: Phase, rank: int, step: int | None) -> None:
    """Do what a fault of ``kind`` does; raise ``InjectedFault`` if the process is still running afterwards.

    ``crash`` SIGKILLs this process; ``stop`` SIGSTOPs it (a SIGCONT resumes it still
    wedged: it sleeps for good, as a debugged process would); ``hang`` sleeps for good; ``spin`` matches a regular
    expression that backtracks for about 2**60 steps, in C code that holds the GIL (a
    Python loop would let other threads run; signals still reach Python's handlers).
    """
    logger.warning("rank %d: injecting a %s fault at phase %s, step %s", rank, kind.value, phase.value, step)
    if kind is FaultKind.CRASH:
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind is FaultKind.STOP:
        os.kill(os.getpid(), signal.SIGSTOP)
        while True:  # a SIGCONT resumes it wedged: it never returns to training by itself
            time.sleep(3600)
    elif kind is FaultKind.HANG:
        while True:
            time.sleep(3600)
    elif kind is FaultKind.SPIN:
        _SPIN_PATTERN.match("a" * 60 + "b")
    raise InjectedFault(phase, rank, step)


@contextlib.contextmanager
def hang_in_forward(model: Any, rank: int, step: int, due: bool) -> Iterator[None]:
    """While open, a ``hang`` fault (``fire``) waits inside ``model``'s forward, if ``due`` (else nothing happens).

    Before its last tensor-parallel row layer (megatron-core's ``RowParallelLinear``,
    whose forward all-reduces over the tensor-parallel group: its peers wait in that
    collective), else at the start of the model's forward. A hang placed so is inside a
    layer's forward, where no progress mark can show it.
    """
    if not due:
        yield
        return
    target = model
    for module in model.modules():
        if type(module).__name__ == "RowParallelLinear":
            target = module
    handle = target.register_forward_pre_hook(lambda module, args: fire(FaultKind.HANG, Phase.STEP, rank, step))
    try:
        yield
    finally:
        handle.remove()


def enospc_once(rank: int, step: int) -> Callable[[], None]:
    """A writer-thread hook (``AsyncCheckpointer``'s write seam) that fails this save's write with ``ENOSPC``."""

    def fail() -> None:
        logger.warning("rank %d: injecting a save-error fault (ENOSPC) at the save of step %d", rank, step)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "injected")

    return fail


class CallbackFault(Callback):
    """Calls ``inject(Phase.CALLBACK, step)`` from ``on_step_end``: the configured ``callback`` fault, a failure
    inside a callback."""

    def __init__(self, inject: Callable[[Phase, int | None], None]) -> None:
        self.inject = inject

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        """Inject the fault if it is due at ``step``."""
        self.inject(Phase.CALLBACK, step)
