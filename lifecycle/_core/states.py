"""The vocabulary: the states of a session, the triggers that move it, and who owns a resource."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """A state of a training session; the values are the public names."""

    UNINITIALIZED = "uninitialized"
    DIST_READY = "dist_ready"
    GLOBALS_READY = "globals_ready"
    TRAINING = "training"
    FINALIZING = "finalizing"
    CLOSED = "closed"
    FAILED = "failed"

    @property
    def is_final(self) -> bool:
        """True for ``closed`` and ``failed``: no edge leaves them."""
        return self in (State.CLOSED, State.FAILED)


class Trigger(StrEnum):
    """An event that moves a session along one declared edge."""

    INIT_DISTRIBUTED = "init_distributed"
    INIT_GLOBALS = "init_globals"
    START_TRAINING = "start_training"
    FINISH = "finish"
    CLOSE = "close"
    FAIL = "fail"


class Owner(StrEnum):
    """Who releases a resource."""

    SESSION = "session"
    CALLER = "caller"
    RESTART_WRAPPER = "restart_wrapper"
