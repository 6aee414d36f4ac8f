"""The failure edge made sure: ``fail`` again until the session is final, whatever landed before its teardown.

An asynchronous exception (a signal handler's ``KeyboardInterrupt``, NVRx's
``RankShouldRestart``) can land on any bytecode of ``Session.fail`` before its teardown is
protected (before the caller's thread waits for it on a worker): it then propagates with
the session still live. ``fail_surely`` calls ``fail`` again until the session is final
(a teardown already handed to a worker is waited for, never started twice: see
``TeardownRunner.wait``), and raises the first exception that landed, from the failure.
``Session.fail`` and the context manager's exit both end this way.
"""

from __future__ import annotations

from typing import Protocol

from lifecycle._core.shield import TeardownInterrupted
from lifecycle._core.states import State

TRIES = 100
"""The most ``fail`` calls one level of ``fail_surely`` makes: one landing costs one."""


class Failing(Protocol):
    """What ``fail_surely`` drives: a session."""

    @property
    def state(self) -> State:
        """The session's state now."""
        ...

    def fail(self, error: BaseException) -> object:
        """Take the failure edge because of ``error`` (``Session.fail``)."""
        ...

    def final_landings(self, cause: BaseException) -> tuple[TeardownInterrupted | None, list[BaseException]]:
        """Once final: remove the shield; (the escalation if any, what landed on the waiting thread: emptied)."""
        ...


def fail_surely(session: Failing, error: BaseException, landed: list[BaseException]) -> None:
    """``session.fail(error)`` until final, then raise ``landed[0]`` (from ``error``) if anything landed.

    ``landed``: what landed before (``Session.fail`` passes the exception that cut it
    short); what lands meanwhile is appended. Two levels: a landing on the first level's
    own lines is caught by the second.
    """
    try:
        _fail_loop(session, error, landed)
    except BaseException as exc:  # noqa: BLE001 - landed on the loop's own lines: the second level
        landed.append(exc)
        _fail_loop(session, error, landed)
    if landed:
        raise landed[0] from error


def _fail_loop(session: Failing, error: BaseException, landed: list[BaseException]) -> None:
    """Call ``fail(error)`` until final (at most ``TRIES``); what it raises before that goes to ``landed``.

    Once final, the shield is removed here too: a landing can cut ``fail`` short between
    the teardown and the removal. An escalation goes first: it is what the caller asked for.
    """
    for _ in range(TRIES):
        try:
            if session.state.is_final:
                escalation, found = session.final_landings(error)
                landed.extend(found)
                if escalation is not None:
                    landed.insert(0, escalation)
                return
            session.fail(error)
        except BaseException as exc:  # noqa: BLE001 - kept: raised once final
            landed.append(exc)
