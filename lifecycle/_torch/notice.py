"""Failure notices: a failing rank tells its peers through the rendezvous store, and learns whose failure came first.

Under the attempt's store prefix ``P`` (the one its default group was created on), a
failing rank adds 1 to the counter ``P/failures/count``: the result is its sequence
number (1: the first rank of the attempt to fail, as the store saw it). It then writes
its notice, ``P/failures/<seq>`` (JSON: ``rank``, ``host``, ``pid``, ``phase``, ``step``,
``error``, ``time``, ``seq``, ``kind``: a ``lifecycle.journal.evidence.Kind`` value; a
liveness monitor's notice adds its ``evidence``), and, unless it is first, reads notice 1 to name the rank
that failed first: three store requests a rank, whatever the number of ranks failing.
The first rank's notice may lag its count by a moment (it counts, then writes): a later
rank waits for it at most ``PEER_WAIT_S``, on the key (no polling).

The store numbers notices in the order they arrive, which is not always the order the
ranks failed in. A publish that missed its deadline is not counted after the fact (its
worker checks the deadline first); one whose count came back late is written with
``"late": true``, and a later rank does not take its number as the first failure. Nor
does it name a notice 1 whose error is a consequence (``lifecycle.journal.evidence.consequence``: a
broken connection, a timed-out receive, a stop by the launcher) of another rank's failure, whose own notice
may simply have arrived
later; ``lifecycle show`` decides from every rank's journal.

A notice must never hold up a teardown, nor raise: ``publish`` returns within
``DEADLINE_S`` whatever the store does, and reports every error in its result. It uses
the rank's own client of the store, already connected, on a daemon thread it waits for
at most that long. Nothing else is bounded (see docs/benchmarks.md, store-connect-retry,
store-clone and store-connect-stall): a new ``TCPStore`` client connecting to a port
nobody listens on retries after a random delay, whatever its timeout;
``Store.clone()`` reconnects with the original client's timeout; a new client of a
live server on loopback can stall for seconds; and on a connected client, ``add``,
``check`` and ``get`` to a server that is alive but frozen (SIGSTOP) wait until it
dies, whatever ``set_timeout`` says. A server that is gone fails a connected client's
operation at once (its connection is closed).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import timedelta

from torch.distributed import DistStoreError, PrefixStore, Store  # type: ignore[attr-defined]  # re-exported at runtime

from lifecycle._core.errors import chain, describe
from lifecycle._core.seams import Announcement
from lifecycle._core.worker import POOL as WORKERS
from lifecycle._liveness import rank as liveness
from lifecycle.journal.evidence import (
    VERDICT_PREFIX,
    Evidence,
    Kind,
    consequence,
    error_kind,
    kind_of,
    own_failure,
)

DEADLINE_S = 0.25
"""Bound on the whole of ``publish``, whatever the store does."""

PEER_WAIT_S = 0.1
"""How long a later rank waits for the first rank's notice to follow its count (on the key: free unless it lags).

At 4,096 simulated ranks on two cores a first rank's write lagged its count by more
than 20 ms for a third of the later ranks (bench/scale_harness.py)."""

ERROR_CHARS = 300
"""A notice's ``error`` (``"Type: message"``) is its first line, cut to this many characters."""

NAMESPACE = "failures"
"""The notices' keys, under the attempt's store prefix."""

VERDICT_WAIT_MAX_S = 1.0
"""The longest a failing rank waits for a liveness verdict (two monitor intervals, at most this)."""

VERDICTS = "liveness/verdict"
"""The liveness monitors' verdicts (``lifecycle._liveness.monitor``), numbered from 1, under the attempt's prefix."""

_POLL_S = 0.002


def store_name(store: Store, hosted_by: str = "") -> str:
    """How notes name ``store``: ``"the rendezvous store at HOST:PORT, hosted by rank 0,"`` (the parts known)."""
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    at = ""
    if isinstance(host, str) and isinstance(port, int):
        at = f" at [{host}]:{port}" if ":" in host else f" at {host}:{port}"
    by = f", hosted by {hosted_by}," if hosted_by else ""
    return f"the rendezvous store{at}{by}"


@dataclass(frozen=True, slots=True)
class FailureNotice:
    """One rank's notice: it failed with ``error`` in ``phase`` at training ``step`` (None: none), at ``time``.

    ``seq`` is its number in the attempt's count (1 = first); 0 until the store numbered it.
    ``kind``: what the failure is (a ``Kind`` value; ``raised`` in a notice that has none).
    """

    rank: int
    host: str
    pid: int
    phase: str
    step: int | None
    error: str
    time: float
    seq: int
    kind: str = Kind.RAISED.value

    @classmethod
    def parse(cls, text: str) -> FailureNotice:
        """The notice written as ``text`` (``ValueError`` if it is not one)."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"a failure notice is a JSON object, not {type(data).__name__}")
        try:
            given = {name: data[name] for name in cls.__dataclass_fields__ if name != "kind"}
            return cls(**given, kind=str(data.get("kind", Kind.RAISED.value)))
        except KeyError as exc:
            raise ValueError(f"a failure notice without {exc.args[0]!r}") from None

    def where(self) -> str:
        """``"step 30, phase step"``, or ``"phase setup"`` without a step."""
        return f"phase {self.phase}" if self.step is None else f"step {self.step}, phase {self.phase}"

    def words(self) -> str:
        """The kind's words (``lifecycle.journal.evidence``): ``hung``, ``timed out waiting for a peer``."""
        known = Kind.named(self.kind)
        if known is Kind.RAISED or known is None:  # an older notice's kind: its error may say more
            known = error_kind(self.error) or Kind.RAISED
        return known.words

    def evidence(self, written: dict[str, object]) -> Evidence:
        """The notice's typed facts: the ``evidence`` a monitor's notice (``written``: its JSON) carries, else its
        own fields'."""
        facts = written.get("evidence")
        if isinstance(facts, dict):
            with contextlib.suppress(TypeError, ValueError):
                return Evidence.from_json(facts)
        return Evidence(self.kind, self.rank, self.step, self.phase)


def publish(
    store: Store,
    prefix: str,
    *,
    name: str,
    rank: int,
    error: BaseException,
    phase: str,
    step: int | None,
    at: float,
    deadline_s: float = DEADLINE_S,
) -> Announcement:
    """Publish rank ``rank``'s failure notice under ``prefix`` in ``store``, and read whose came first.

    ``store`` is this rank's connected client; ``name`` names it in notes (``store_name``).
    Never raises ``Exception`` and returns within ``deadline_s`` whatever the store does:
    quick on a live store (see docs/benchmarks.md, notice-live-store; plus at most
    ``PEER_WAIT_S`` when the first notice lags its count), at once when its server is
    gone. The work runs on one of lifecycle's workers (``lifecycle._core.worker``,
    started with the session); one still waiting at the deadline (a server alive but
    frozen) is left behind, holding its reference to ``store`` until the server
    answers or dies, and the result says the store did not answer. The result's
    ``note`` names the first rank when it is a peer, or says why the first failure is
    unknown.
    """
    error_line = _line(describe(error), ERROR_CHARS)
    mine = FailureNotice(rank, socket.gethostname(), os.getpid(), phase, step, error_line, at, 0, kind_of(error).value)
    # On a worker started with the session (no thread starts on the failure path). It gets the
    # notice's text, never ``error``: a worker left behind must not keep the failure's frames
    # (and the process groups they reference) alive.
    monitor = liveness.current()
    verdict_wait = min(2 * monitor.settings.interval_s, VERDICT_WAIT_MAX_S) if monitor is not None else 0.0
    bound = deadline_s + verdict_wait
    deadline = time.monotonic() + deadline_s
    read_page = monitor.marks.verdict if monitor is not None else None
    own = _own(error)
    finished, outcome = WORKERS.run_within(
        lambda: _publish(store, prefix, name, mine, verdict_wait, deadline, read_page, own), bound
    )
    if not finished or outcome is None:
        outcome = _unknown(f"{name} did not answer within {bound * 1000:g} ms")
    if monitor is not None and outcome.first_rank is None:
        return _from_page(outcome, monitor.marks.verdict(), rank)
    return outcome


def _from_page(outcome: Announcement, verdict: dict[str, object] | None, rank: int) -> Announcement:
    """``outcome``, naming the rank of the liveness verdict this rank's monitor copied to its page, if a peer's.

    The store may be gone (its host was the rank judged and killed): the page still holds it.
    """
    if verdict is None or not isinstance(verdict.get("rank"), int) or verdict["rank"] == rank:
        return outcome
    note = f"lifecycle: {verdict.get('note')}"
    if outcome.note:
        note += f" (the store said: {outcome.note.removeprefix('lifecycle: ')})"
    return Announcement(outcome.seq, outcome.unpublished, int(str(verdict["rank"])), note, _facts(verdict))


def _facts(verdict: dict[str, object]) -> Evidence | None:
    """The typed facts a liveness verdict (its JSON, from the page) carries; None if it has none."""
    facts = verdict.get("evidence")
    if isinstance(facts, dict):
        with contextlib.suppress(TypeError, ValueError):
            return Evidence.from_json(facts)
    return None


def _publish(
    raw: Store,
    prefix: str,
    name: str,
    mine: FailureNotice,
    verdict_wait: float = 0.0,
    deadline: float | None = None,
    read_page: Callable[[], dict[str, object] | None] | None = None,
    own: bool = False,
) -> Announcement:
    """``publish``'s work, on its thread: count, write, read the first notice; never raises.

    ``raw`` is the rank's client, ``prefix`` the attempt's. Past ``deadline`` (monotonic;
    None: none) nothing is counted: the rank has gone on without a number, and a number
    taken now could be 1. A count that comes back past it is written as late.

    While a liveness monitor runs here (``verdict_wait`` above 0; ``read_page`` reads the
    verdict its monitor copied to the rank's page), a rank whose notice is number 1, or
    whose notice 1 is not a monitor's, waits up to ``verdict_wait`` for a liveness
    verdict, which then names the first rank: a peer that died resets this
    rank's connections (and maybe another survivor's, first) before its heartbeat is
    stale, and its own monitor names it (``lifecycle._liveness``). A failure that is its
    rank's own beyond doubt (``own`` for this rank's, ``own_failure`` for notice 1: a raise
    with no communication in its error) does not wait: no peer's death is behind it.
    """
    store = PrefixStore(prefix, raw)
    if deadline is not None and time.monotonic() >= deadline:
        return _unknown(f"the notice missed its deadline before {name} counted it (not counted, so never first)")
    try:
        seq = int(store.add(f"{NAMESPACE}/count", 1))
    except Exception as exc:  # noqa: BLE001 - the store is gone: say so, never raise
        return _unknown(f"{name} is unreachable: {_brief(exc)}")
    notice = replace(mine, seq=seq)
    late = deadline is not None and time.monotonic() >= deadline
    text = json.dumps({**asdict(notice), "late": True} if late else asdict(notice))
    try:
        store.set(f"{NAMESPACE}/{seq}", text)
    except Exception as exc:  # noqa: BLE001 - counted, but peers will not read it
        return Announcement(seq, f"notice {seq} was counted, but writing it to {name} failed: {_brief(exc)}")
    if seq == 1:
        return _verdict(read_page, seq, verdict_wait) if verdict_wait > 0 and not own else Announcement(seq)
    try:
        found = _get_within(raw, store, f"{NAMESPACE}/1", PEER_WAIT_S)
        if found is None:
            why = f"notice 1 was counted but not written within {PEER_WAIT_S * 1000:g} ms (its rank may have died)"
            return _first_unknown(seq, why)
        first = FailureNotice.parse(found)
        written = json.loads(found)
        first_late = written.get("late") is True
    except Exception as exc:  # noqa: BLE001 - an unreadable first notice: unknown, and why
        return _first_unknown(seq, f"notice 1 could not be read: {_brief(exc)}")
    if first_late:
        found_first = _first_unknown(seq, f"rank {first.rank}'s notice 1 was numbered after its deadline (ignored)")
    elif consequence(first.error, first.kind):
        why = (
            f"notice 1 is rank {first.rank}'s, which {first.words()} ({first.where()}: {first.error}): a consequence"
            " of another rank's failure, never its cause"
        )
        found_first = _first_unknown(seq, why)
    elif first.rank == mine.rank and first.kind == Kind.UNRESPONSIVE.value:
        # A peer's monitor published this rank as silent while it still ran: a stale notice, not its failure.
        why = "notice 1 is a stale notice: a peer's monitor named this rank unresponsive while it still ran"
        found_first = _first_unknown(seq, why)
    else:
        said = "" if first.words() == Kind.RAISED.words else f"; it {first.words()}"  # a raise: its error says it
        note = f"lifecycle: rank {first.rank} failed first ({first.where()}{said}): {first.error}"
        found_first = Announcement(seq, "", first.rank, note, first.evidence(written))
    settled = first.error.startswith(VERDICT_PREFIX) or (not first_late and own_failure(first.error, first.kind))
    if verdict_wait > 0 and not settled:
        # Notice 1 may be a peer that a dead rank reset before the dead rank's monitor spoke.
        return _verdict(read_page, seq, verdict_wait, found_first)
    return found_first


def _own(error: BaseException) -> bool:
    """Whether ``error``, and each error it was raised from or during, is its rank's own failure (``own_failure``)."""
    return all(own_failure(describe(found), kind_of(found).value) for found in chain(error))


def _get_within(raw: Store, store: Store, key: str, wait_s: float) -> str | None:
    """``key`` of ``store`` (on the client ``raw``) once set, waiting at most ``wait_s`` on it; None if not by then."""
    before = raw.timeout  # type: ignore[attr-defined]  # torch's stub lacks it
    raw.set_timeout(timedelta(seconds=wait_s))
    try:
        return bytes(store.get(key)).decode()
    except DistStoreError:  # the wait timed out (a server gone raises DistNetworkError)
        return None
    finally:
        raw.set_timeout(before)


def _verdict(
    read_page: Callable[[], dict[str, object] | None] | None,
    seq: int,
    wait_s: float,
    otherwise: Announcement | None = None,
) -> Announcement:
    """Notice ``seq`` published: wait up to ``wait_s`` for the first liveness verdict, and name its rank.

    The verdict is read from the rank's page (``read_page``), where its monitor copies
    the first one published within an interval: no store request. No verdict by then:
    ``otherwise`` (None: this rank's notice, number 1, stands alone).
    """
    deadline = time.monotonic() + wait_s
    fallback = otherwise if otherwise is not None else Announcement(seq)
    while read_page is not None:
        verdict = read_page()
        if verdict is not None and isinstance(verdict.get("rank"), int):
            note = f"lifecycle: {verdict.get('note')}"
            return Announcement(seq, "", int(str(verdict["rank"])), note, _facts(verdict))
        if time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S * 5)
    return fallback


def _first_unknown(seq: int, why: str) -> Announcement:
    """Published as number ``seq``, but the first notice is unknown: ``why``."""
    note = f"lifecycle: which rank failed first is unknown: this rank's notice is number {seq}; {why}"
    return Announcement(seq, "", None, note)


def _unknown(why: str) -> Announcement:
    """Nothing published: ``why``, and the note that says the first failure is unknown."""
    return Announcement(None, why, None, f"lifecycle: which rank failed first is unknown: {why}")


def _brief(error: BaseException) -> str:
    """``describe(error)`` on one line and cut short: torch's store errors carry C++ backtraces."""
    return _line(describe(error), 200)


def _line(text: str, limit: int) -> str:
    """The first line of ``text``, cut to ``limit`` characters; an ellipsis marks what was left out."""
    first = text.split("\n", 1)[0]
    if len(first) > limit:
        return first[: limit - 1] + "…"
    return first if first == text else first + " …"
