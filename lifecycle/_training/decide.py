"""The decision after a failed attempt: restart, or stop (exit 93) and why. Pure: no torch, no I/O.

One function, ``decide(history, policy)``, of the job's attempt history (``Attempt``:
each failed attempt's typed facts, oldest first, the one just failed last) and a
``RestartPolicy``; it returns a ``Decision``. The in-process retry loop (``Decider``,
``lifecycle._training.retry``), the demo's ``--retry`` and the torchrun restart path
all call it with the same facts, so they decide alike. The rules, in the order they
are checked (the first that applies is the decision):

1. ``not_restartable``: the failure is one a restart meets again (a ``ConfigError``,
   a refused checkpoint, misuse of a session: ``exits._not_worth_restarting``).
2. ``reproducible``: the same failure (kind, exception type, innermost frame outside
   lifecycle and torch, phase, step) in the last two attempts, where the second
   replayed that step from an earlier state (a checkpoint before it, or the start):
   a bug, not a fault.
3. ``repeated_culprit``: the same host (or, hosts unknown, the same rank) caused the
   last ``culprit_limit`` failed attempts: a scheduler should exclude that host.
4. ``budget``: the job's restarts reached ``max_restarts``, or ``window_restarts``
   restarts fell within ``window_s`` seconds.
5. ``no_progress``: ``no_progress_limit`` attempts in a row committed no new step.

Otherwise ``restart`` (reason ``may_recover``): a restart from the last committed
checkpoint may get further.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lifecycle._training.exits import NO_PROGRESS_LIMIT, ExitCode
from lifecycle.journal.evidence import RAISED_KINDS, Kind

RESTART, STOP = "restart", "stop"
"""The two actions."""

REASONS = ("may_recover", "not_restartable", "reproducible", "repeated_culprit", "budget", "no_progress")
"""Every reason a ``Decision`` may give (``may_recover`` with ``restart``, the others with ``stop``)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """A frame of a traceback: ``file``, ``function``, ``line``."""

    file: str
    function: str
    line: int

    def words(self) -> str:
        """``train.py:42 in loss``."""
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True, slots=True)
class Attempt:
    """The facts of one failed attempt of the job, as every rank and agent knows them (the cause's, not a victim's).

    ``kind``: the cause's ``Kind`` value (``raised``, ``died``, ``hang``...); ``exception``:
    its exception's type name ("" when nothing raised: a death, a hang); ``frame``: the
    innermost frame of its traceback outside lifecycle and torch (None: unknown or none);
    ``phase``, ``step``: where it failed (None: before any step); ``host``, ``rank``: the
    culprit's ("" / None: unknown); ``resumed_from``: the committed step the attempt
    started from (0: the start); ``committed``: the last committed step when it ended
    (None: none); ``ended``: wall-clock time its last rank ended; ``fatal``: a failure
    no restart can fix (``exits._not_worth_restarting``); ``nodes``: how many hosts the
    job runs on (0: unknown). On one host every failure is that host's: the culprit
    rule then names the rank.
    """

    kind: str
    exception: str = ""
    frame: Frame | None = None
    phase: str = ""
    step: int | None = None
    host: str = ""
    rank: int | None = None
    resumed_from: int = 0
    committed: int | None = None
    ended: float = 0.0
    fatal: bool = False
    nodes: int = 0

    def signature(self) -> tuple[object, ...]:
        """What "the same failure" compares: kind, exception type, frame, phase, step."""
        return (self.kind, self.exception, self.frame, self.phase, self.step)

    @property
    def progressed(self) -> bool:
        """Whether the attempt committed a step after the one it resumed from."""
        return self.committed is not None and self.committed > self.resumed_from

    def culprit(self) -> str:
        """``host h1`` or ``rank 1``; "" when neither is known."""
        return f"host {self.host}" if self.host else ("" if self.rank is None else f"rank {self.rank}")

    def where(self) -> str:
        """``RuntimeError at step 40, phase step (train.py:42 in loss)``: the failure in words."""
        what = self.exception or self.kind
        at = "" if self.step is None else f" at step {self.step}"
        phase = f", phase {self.phase}" if self.phase else ""
        frame = f" ({self.frame.words()})" if self.frame is not None else ""
        return f"{what}{at}{phase}{frame}"

    def to_json(self) -> dict[str, Any]:
        """Every field, as JSON (``frame`` an object or null)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attempt:
        """The attempt ``to_json`` wrote; fields it does not know are ignored, missing ones take defaults."""
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        frame = known.get("frame")
        known["frame"] = (
            None if frame is None else Frame(str(frame["file"]), str(frame["function"]), int(frame["line"]))
        )
        return cls(**known)


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """The limits ``decide`` applies; every one job-wide (all agents, all nodes, all in-process retries).

    - ``max_restarts`` (8): restarts in the job's life. torchrun's ``--max-restarts`` is
      per agent, so N nodes that fail in turn restart N times as often; this is the
      job's. 8 lets a long job ride out a few faults of the kind that hits any large
      cluster, and ends one that keeps failing.
    - ``window_restarts`` (3) within ``window_s`` (1800 s): a burst of failures within
      half an hour is not a run of independent faults; three is torchrun's usual
      ``--max-restarts`` and NVRx's no-progress count.
    - ``culprit_limit`` (3): one failure on a host may be chance and two a coincidence;
      three in a row on the same host is the host.
    - ``no_progress_limit`` (``NO_PROGRESS_LIMIT``, 3): as ``exit_code`` has always applied it.

    A limit of 0 turns its rule off.
    """

    max_restarts: int = 8
    window_restarts: int = 3
    window_s: float = 1800.0
    culprit_limit: int = 3
    no_progress_limit: int = NO_PROGRESS_LIMIT


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do after failed attempt ``attempt`` (0-based, job-wide): ``action`` (``restart`` / ``stop``) and why.

    ``reason``: one of ``REASONS``; ``words``: the reason in a sentence; ``details``:
    its facts (the culprit's ``host`` / ``rank`` for ``repeated_culprit``, counts and
    limits for ``budget``...), JSON values only. ``cause``: the failure's ``Kind`` value as
    ``decide_after`` found it ("" when unknown); not part of the record, nor compared.
    """

    action: str
    reason: str
    attempt: int
    words: str
    details: dict[str, Any] = field(default_factory=dict)
    cause: str = field(default="", compare=False)

    @property
    def cause_lives(self) -> bool:
        """Whether the failure's rank raised it and lives (``RAISED_KINDS``): no process of the job is gone, so no
        launcher stops the survivors. False when the cause is unknown."""
        return Kind.named(self.cause) in RAISED_KINDS

    @property
    def stop(self) -> bool:
        """Whether the job must not be restarted."""
        return self.action == STOP

    @property
    def exit_code(self) -> ExitCode:
        """``DO_NOT_RESTART`` (93) for a stop, ``RESTART`` (1) for a restart."""
        return ExitCode.DO_NOT_RESTART if self.stop else ExitCode.RESTART

    def line(self) -> str:
        """``stop (reproducible): ...``: how ``show`` and the demo say it."""
        return f"{self.action} ({self.reason}): {self.words}"

    def to_json(self) -> dict[str, Any]:
        """The decision as one JSON object: ``decision``, ``reason``, ``attempt``, ``words``, then the details."""
        head = {"decision": self.action, "reason": self.reason, "attempt": self.attempt, "words": self.words}
        return head | {key: value for key, value in self.details.items() if key not in head}

    def json_line(self) -> str:
        """``to_json`` on one line (what a scheduler's hook reads from stderr or the journal folder)."""
        return json.dumps(self.to_json(), sort_keys=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Decision:
        """The decision ``to_json`` wrote."""
        head = ("decision", "reason", "attempt", "words")
        details = {key: value for key, value in data.items() if key not in head}
        return cls(str(data["decision"]), str(data["reason"]), int(data["attempt"]), str(data["words"]), details)


def decide(history: Sequence[Attempt], policy: RestartPolicy | None = None) -> Decision:
    """The decision after the last attempt of ``history`` (the job's failed attempts, oldest first); never raises
    for a non-empty history (``ValueError`` for an empty one).

    Only failed attempts are listed: a job's attempts are its failures plus the one
    running. The rules and their order are the module's; ``policy`` defaults to
    ``RestartPolicy()``.
    """
    if not history:
        raise ValueError("decide needs the attempt that just failed")
    policy = RestartPolicy() if policy is None else policy
    last, index = history[-1], len(history) - 1
    if last.fatal:
        return _stop("not_restartable", index, f"{last.where()}: a restart meets it again; fix it first")
    found = _reproducible(history)
    if found is not None:
        return found
    found = _repeated_culprit(history, policy.culprit_limit)
    if found is not None:
        return found
    found = _budget(history, policy)
    if found is not None:
        return found
    limit = policy.no_progress_limit
    if limit > 0 and len(history) >= limit and not any(a.progressed for a in history[-limit:]):
        return _stop(
            "no_progress",
            index,
            f"{limit} attempts in a row committed no new step (NO_PROGRESS_LIMIT): a restart would fail the same way",
            limit=limit,
        )
    return Decision(
        RESTART, "may_recover", index, f"{last.where()}: a restart from the last committed checkpoint may get further"
    )


def _stop(reason: str, index: int, words: str, **details: Any) -> Decision:
    return Decision(STOP, reason, index, words, details)


def _reproducible(history: Sequence[Attempt]) -> Decision | None:
    """Stop when the last two attempts failed the same way and the second replayed the failing step."""
    if len(history) < 2:
        return None
    before, last = history[-2], history[-1]
    named = Kind.named(last.kind)
    if not last.exception or last.step is None or (named is not None and named.consequence):
        return None  # nothing raised (a death, a hang) or only a consequence: no failure of code to compare
    if before.signature() != last.signature() or last.resumed_from >= last.step:
        return None
    start = "the start" if last.resumed_from == 0 else f"the checkpoint of step {last.resumed_from}"
    words = (
        f"the same failure, {last.where()}, in attempts {len(history) - 2} and {len(history) - 1}, the second "
        f"replayed step {last.step} from {start}: a bug, not a fault; fix it first"
    )
    return _stop("reproducible", len(history) - 1, words, step=last.step, exception=last.exception)


def _repeated_culprit(history: Sequence[Attempt], limit: int) -> Decision | None:
    """Stop when the last ``limit`` attempts named the same culprit host (or, hosts unknown, rank)."""
    if limit <= 0 or len(history) < limit:
        return None
    recent = history[-limit:]
    last = history[-1]
    if last.host and last.nodes != 1 and all(a.host == last.host for a in recent):
        details: dict[str, Any] = {"host": last.host}
        words = f"host {last.host} caused the last {limit} failed attempts: exclude it and resubmit"
    elif (not last.host or last.nodes == 1) and last.rank is not None and all(a.rank == last.rank for a in recent):
        details = {"rank": last.rank} | ({"host": last.host} if last.host else {})
        on = f" (host {last.host})" if last.host else ""
        words = f"rank {last.rank}{on} caused the last {limit} failed attempts: look at what it alone does or has"
    else:
        return None
    return _stop("repeated_culprit", len(history) - 1, words, **details)


def _budget(history: Sequence[Attempt], policy: RestartPolicy) -> Decision | None:
    """Stop when one more restart would pass the job's budget, or the window's."""
    index, restarts = len(history) - 1, len(history) - 1  # every earlier failed attempt was restarted
    if policy.max_restarts > 0 and restarts >= policy.max_restarts:
        words = f"the job restarted {restarts} times, its budget (max_restarts {policy.max_restarts})"
        return _stop("budget", index, words, restarts=restarts, max_restarts=policy.max_restarts)
    if policy.window_restarts > 0:
        since = history[-1].ended - policy.window_s
        within = sum(1 for a in history if a.ended >= since)  # each would be (or was) restarted
        if within > policy.window_restarts:
            words = (
                f"{within} failures within {policy.window_s:g} s, more than window_restarts "
                f"{policy.window_restarts}: not independent faults"
            )
            return _stop("budget", index, words, failures=within, window_s=policy.window_s)
    return None
