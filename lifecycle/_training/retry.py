"""The decision after a failed ``pretrain`` call, made once for the job and kept in the journal folder.

``decide_after(error, journal_dir)`` is what a retry loop calls when ``pretrain`` raised:
a user's own ``while`` loop, the demo's ``--retry``, and a worker torchrun restarted (it
reads ``last_decision`` before it trains). It reads the attempt's facts from this rank's
journal (its ``failure`` record: the cause's kind, rank, step and phase, a peer's when a
peer failed first; its ``end`` record: the committed step) and from ``error`` (the
exception type and the innermost frame outside lifecycle and torch, when this rank is
the cause), then applies ``decide`` (``lifecycle._training.decide``) to the job's
history: every earlier attempt's facts, read back from ``<journal_dir>/decisions/``.

Made once: each attempt has one record file there (``<run>.<restart>.<attempt>.json``,
created exclusively). The rank whose own failure is the cause writes it at once; the
others wait up to ``wait_s`` (1 s) for it and read it, so every rank acts on the same
decision; if none comes (the cause's process died), the first of them to create the
file decides. A stop also leaves ``STOP_FILE`` (the decision as one JSON line) in the
folder and prints that line on stderr, for a scheduler's hook. The rank that recorded the
decision (it won the store's compare-and-set, or created the folder's file) also appends it
to its own journal, a ``decision`` record (``lifecycle.journal.JobDecision``) of the attempt
that failed: once per attempt, which ``show`` prints in that attempt's account. No torch import here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from lifecycle._core.errors import StoreHostLost, chain
from lifecycle._liveness.judgement import append_line
from lifecycle._training.decide import Attempt, Decision, Frame, RestartPolicy, decide
from lifecycle._training.exits import _not_worth_restarting
from lifecycle._training.memory import remove_rank_copies
from lifecycle.journal import Failure, JobDecision, Origin, RunEnd, RunStart, TrainStep, journal_path, load, run_id
from lifecycle.journal.evidence import RAISED_KINDS, Kind, kind_of

DECISIONS = "decisions"
"""The folder, in the journal folder, holding one record per failed attempt of the job: its facts and decision."""

STOP_FILE = "decision.json"
"""In the journal folder after a stop: the decision as one JSON line (``{"decision": "stop", "reason": ...}``)."""

DECISION_WAIT_S = 1.0
"""How long a rank that is not the cause waits for the cause's rank to record the decision before deciding itself."""

STORE_PREFIX = "lifecycle/decisions/"
"""The store keys of the job's decisions: ``<prefix><run>.<restart>.<attempt>`` (a record), ``<prefix><run>/count``
and ``<prefix><run>/count/<i>`` (the i-th attempt decided)."""

CAUSE_WAIT_S = 10.0
"""The most a rank waits for the cause's rank (still tearing down) to record the decision."""

_POLL_S = 0.02
"""The longest pause between two reads of the cause's record: the first come 1 ms apart, each pause doubling up to
it (a retry's peers find a decision made within milliseconds at once, not at the next 20 ms tick). Where the store
has ``wait`` (torch's), a peer waits on it instead and is woken as the record is made."""
_CHECK_S = 0.1
"""How often a rank waiting for the cause's record looks whether the cause's rank has ended (its journal)."""
logger = logging.getLogger("lifecycle.retry")
_LIBRARIES = ("torch", "megatron", "nvidia_resiliency_ext", "transitions")


class DecisionStore(Protocol):
    """What ``decide_after`` uses of a store (``torch.distributed.Store`` has it): torchrun's agent store outlives
    worker restarts and is shared by every node, so the job's decisions live there when one is given."""

    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def check(self, keys: list[str]) -> bool: ...
    def add(self, key: str, value: int) -> int: ...
    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...


def decide_after(
    error: BaseException,
    journal_dir: str | os.PathLike[str] | None,
    *,
    rank: int | None = None,
    policy: RestartPolicy | None = None,
    wait_s: float = DECISION_WAIT_S,
    store: DecisionStore | None = None,
) -> Decision:
    """The job's decision after the ``pretrain`` call that raised ``error`` on this rank; the same on every rank.

    ``journal_dir``: the config's ``journal_dir`` (shared by the ranks of a node; None:
    no journal, so no history: this attempt alone is judged, on this rank);
    ``rank``: default the ``RANK`` environment variable, else 0; ``store``: where the
    job's decisions live when its ranks span nodes (torchrun's agent store:
    ``lifecycle._torch.store.job_store``); without one, the journal folder holds them.
    Either way each decision is also left in the journal folder (``DECISIONS``), for
    ``show`` and the node's next workers. Returns at once if the decision is already
    recorded (or this rank is the cause), else within ``wait_s`` after the cause's rank
    ended. Exit with ``decision.exit_code`` when ``decision.stop``; otherwise call
    ``pretrain`` again (in this process or a new one). Never raises for a missing or
    unreadable journal or store: it decides from what it has (``error`` alone, at worst).
    The decision's ``cause`` is the recorded cause's kind (``Decision.cause_lives``: no
    process of the job is gone, so a retry here need not wait for a launcher's stop).

    On the main thread a SIGTERM or SIGINT that arrives meanwhile (torchrun stops the
    survivors of a dead rank at once) is held until the decision is recorded, then
    delivered again to the handler that was in place: the job's decision is never lost
    to the launcher's stop.
    """
    with stop_requests_held():
        return _decide_after(error, journal_dir, rank, policy, wait_s, store)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""What ``decide_after`` holds while it decides: a launcher's stop, a terminal's Ctrl-C."""


@contextlib.contextmanager
def stop_requests_held() -> Iterator[None]:
    """Hold ``STOP_SIGNALS`` that arrive in the block; afterwards, deliver each again to the handler in place before.

    For a retry loop's handling of a failed attempt (``decide_after`` holds them itself):
    nested blocks hand a held signal outwards. Off the main thread (where no handler can
    be installed) the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    known = [number for number in STOP_SIGNALS if signal.getsignal(number) is not None]  # None: set outside Python
    before = {number: signal.signal(number, lambda number, _frame: came.append(number)) for number in known}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
        for held in dict.fromkeys(came):
            signal.raise_signal(held)


def _decide_after(
    error: BaseException,
    journal_dir: str | os.PathLike[str] | None,
    rank: int | None,
    policy: RestartPolicy | None,
    wait_s: float,
    store: DecisionStore | None,
) -> Decision:
    """``decide_after``'s body, with the stop requests held."""
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    if store is not None and _store_host_lost(error):
        # The store's host stopped answering (torchrun's agent hosts both stores): a torch store call to a stopped
        # host blocks past its timeout, so the journal folder holds the decision.
        store = None
    if journal_dir is None and store is None:
        alone = _facts(error, None, rank)[0]
        return dataclasses.replace(decide([alone], policy), cause=alone.kind)
    folder = None if journal_dir is None else Path(journal_dir)
    facts, key, mine, origin = _facts(error, folder, rank, store)
    name = f"{_safe(run_id())}.{key}"
    ledger = _Ledger(folder, store)
    found = ledger.read(name)
    if found is None and not mine:
        found = _wait_for_cause(ledger, name, folder, facts, wait_s)
    if found is None:
        decision = decide([*ledger.history(name), facts], policy)
        found = ledger.claim(name, json.dumps({"attempt": facts.to_json(), "decision": decision.to_json()}))
    if found is None:
        return dataclasses.replace(decision, cause=facts.kind)
    created = ledger.mirror(name, found)
    if found[1].stop:  # the job ends: this rank's copy in node memory goes (``lifecycle._training.memory``)
        remove_rank_copies(run_id(), rank)
    if ledger.recorded and folder is not None and origin is not None:  # the journal's record: once, by the recorder
        _journal_decision(folder, origin, found[1])
    if created and found[1].stop and folder is not None:  # once per journal folder: a node's
        with contextlib.suppress(OSError):
            (folder / STOP_FILE).write_text(found[1].json_line() + "\n", encoding="utf-8")
        print(found[1].json_line(), file=sys.stderr, flush=True)
    return dataclasses.replace(found[1], cause=found[0].kind)


def _store_host_lost(error: BaseException) -> bool:
    """Whether ``error`` (or one it was raised from, or during) is a ``StoreHostLost``."""
    return any(isinstance(found, StoreHostLost) for found in chain(error))


class _Ledger:
    """The job's record of decisions: ``store`` when given (the journal folder its mirror), else the folder."""

    def __init__(self, folder: Path | None, store: DecisionStore | None) -> None:
        self.folder = None if folder is None else folder / DECISIONS
        self.store = store
        self._created = False
        self.recorded = False  # claim recorded this rank's decision: it won the store's compare-and-set, or the file

    def _key(self, name: str) -> str:
        return f"{STORE_PREFIX}{name}"

    def _count(self, name: str) -> str:
        return f"{STORE_PREFIX}{name.split('.', 1)[0]}/count"

    def read(self, name: str) -> tuple[Attempt, Decision] | None:
        """The record of attempt ``name``, if made."""
        if self.store is None:
            return None if self.folder is None else _parse(self.folder / f"{name}.json")
        try:
            if not self.store.check([self._key(name)]):
                return None
            return _loads(bytes(self.store.get(self._key(name))).decode())
        except Exception:  # noqa: BLE001 - a store that is gone: decide from what is here
            self.store = None
            return self.read(name)

    def wait(self, name: str, seconds: float) -> bool:
        """Wait up to ``seconds`` for the record of ``name``, woken as it is made, where the store can (torch's
        ``Store.wait``); False where it cannot (no store, or one without ``wait``): nothing waited."""
        waiter = getattr(self.store, "wait", None)
        if waiter is None:
            return False
        began = time.monotonic()
        try:
            waiter([self._key(name)], timedelta(seconds=seconds))
        except Exception:  # noqa: BLE001 - timed out, or the store is gone (``read`` tells): never sooner than asked
            time.sleep(max(0.0, seconds - (time.monotonic() - began)))
        return True

    def history(self, name: str) -> list[Attempt]:
        """The job's attempts recorded before ``name``, oldest first."""
        if self.store is None:
            return [] if self.folder is None else [attempt for _, attempt, _ in _history(self.folder, f"{name}.json")]
        try:
            count = self.store.add(self._count(name), 0)
            names = [bytes(self.store.get(f"{self._count(name)}/{i}")).decode() for i in range(count)]
            records = [_loads(bytes(self.store.get(self._key(n))).decode()) for n in names if n != name]
        except Exception:  # noqa: BLE001 - a store that is gone: the folder's record
            self.store = None
            return self.history(name)
        return [record[0] for record in records if record is not None]

    def claim(self, name: str, record: str) -> tuple[Attempt, Decision] | None:
        """Record ``record`` for ``name`` unless a record is there: the one that stays (None: nowhere to record)."""
        if self.store is not None:
            try:
                kept = bytes(self.store.compare_set(self._key(name), "", record)).decode()
                if kept == record:
                    self.recorded = True
                    index = self.store.add(self._count(name), 1) - 1
                    self.store.set(f"{self._count(name)}/{index}", name)
                return _loads(kept)
            except Exception:  # noqa: BLE001 - a store that is gone: the folder decides
                self.store = None
        if self.folder is None:
            return None
        path = self.folder / f"{name}.json"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(path, "x", encoding="utf-8") as out:
                out.write(record + "\n")
        except FileExistsError:  # another rank decided first: its decision is the job's
            return _read_record(path, DECISION_WAIT_S)
        except OSError:
            return _loads(record)
        self._created = self.recorded = True
        return _loads(record)

    def mirror(self, name: str, record: tuple[Attempt, Decision]) -> bool:
        """Leave ``record`` in the journal folder; whether this call (or ``claim``) created the folder's file."""
        if self._created:
            return True
        if self.folder is None:
            return self.store is not None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(self.folder / f"{name}.json", "x", encoding="utf-8") as out:
                out.write(json.dumps({"attempt": record[0].to_json(), "decision": record[1].to_json()}) + "\n")
        except OSError:
            return False
        return True


def last_decision(
    journal_dir: str | os.PathLike[str] | None, run: str | None = None, *, store: DecisionStore | None = None
) -> Decision | None:
    """The decision recorded last for run ``run`` (default: this run's id): in ``store`` when given (and reachable),
    else in ``journal_dir``; None if none.

    A worker torchrun (re)started reads it before it trains: a ``stop`` means exit with its ``exit_code``.
    Read from ``store``, the job's decisions are also left in ``journal_dir`` (those made on other nodes, or
    after this node's ranks died), with ``STOP_FILE`` for a stop.
    """
    safe = _safe(run_id() if run is None else run)
    if store is not None:
        with contextlib.suppress(Exception):
            count = store.add(f"{STORE_PREFIX}{safe}/count", 0)
            names = [bytes(store.get(f"{STORE_PREFIX}{safe}/count/{i}")).decode() for i in range(count)]
            found = [(name, _loads(bytes(store.get(f"{STORE_PREFIX}{name}")).decode())) for name in names]
            ledger = _Ledger(None if journal_dir is None else Path(journal_dir), store)
            for name, record in found:  # this node's folder gets the job's every decision, even one made elsewhere
                if record is not None and ledger.mirror(name, record) and record[1].stop and journal_dir is not None:
                    (Path(journal_dir) / STOP_FILE).write_text(record[1].json_line() + "\n", encoding="utf-8")
            last = found[-1][1] if found else None
            return None if last is None else last[1]
    if journal_dir is None:
        return None
    records = _history(Path(journal_dir) / DECISIONS, None, safe)
    return records[-1][2] if records else None


def recorded_decisions(folders: Iterable[str | os.PathLike[str]]) -> dict[tuple[str, int, int], Decision]:
    """Every decision recorded in ``folders`` (journal folders; a file names its folder), by (run id with every
    character but letters, digits, ``_`` and ``-`` made ``_``, torchrun restart, attempt): what ``show`` prints."""
    found: dict[tuple[str, int, int], Decision] = {}
    for given in folders:
        folder = Path(given) if Path(given).is_dir() else Path(given).parent
        try:
            paths = sorted((folder / DECISIONS).glob("*.json"))
        except OSError:
            continue
        for path in paths:
            parts = path.name[: -len(".json")].rsplit(".", 2)
            parsed = _parse(path)
            if parsed is not None and len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                found[(parts[0], int(parts[1]), int(parts[2]))] = parsed[1]
    return found


def decision_key(run: str, restart: int, attempt: int) -> tuple[str, int, int]:
    """The key of ``recorded_decisions`` for ``attempt`` of torchrun restart ``restart`` of run ``run``."""
    return _safe(run), restart, attempt


def user_frame(error: BaseException) -> Frame | None:
    """The innermost frame of ``error``'s traceback outside lifecycle, torch and megatron-core; None if none."""
    roots = [Path(__file__).resolve().parents[1]]
    for name in _LIBRARIES:
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None)
        if where:
            roots.append(Path(where).resolve().parent)
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        try:
            path = Path(frame.filename).resolve()
        except (OSError, RuntimeError):
            continue
        if not any(path.is_relative_to(root) for root in roots):
            return Frame(str(path), frame.name, frame.lineno or 0)
    return None


def _wait_for_cause(
    ledger: _Ledger, name: str, journal_dir: Path | None, facts: Attempt, wait_s: float
) -> tuple[Attempt, Decision] | None:
    """The record the cause's rank makes for ``name``, waited for up to ``wait_s`` after that rank ended.

    The cause's rank ended once its journal (in ``journal_dir``: ranks of this node)
    has the attempt's ``end`` record; a cause whose journal is elsewhere is waited for
    ``wait_s`` from now; never longer than ``CAUSE_WAIT_S`` in all. None: not recorded.
    """
    start = time.monotonic()
    deadline, checked = start + wait_s, 0.0
    running = facts.rank is not None and journal_dir is not None and journal_path(journal_dir, facts.rank).exists()
    pause = 0.001
    while True:
        found = ledger.read(name)
        now = time.monotonic()
        if found is not None or now >= start + CAUSE_WAIT_S or (now >= deadline and not running):
            return found
        if running and now - checked >= _CHECK_S and facts.rank is not None and journal_dir is not None:
            checked = now
            if _ended(journal_dir, facts.rank, name):
                running, deadline = False, now + wait_s
        limit = start + CAUSE_WAIT_S if running else min(start + CAUSE_WAIT_S, deadline)
        if not ledger.wait(name, max(0.001, min(_CHECK_S, limit - now))):
            time.sleep(pause)
            pause = min(2 * pause, _POLL_S)


def _ended(journal_dir: Path, rank: int, name: str) -> bool:
    """Whether ``rank``'s journal has the ``end`` record of the attempt ``name`` (``<run>.<restart>.<attempt>``)."""
    parts = name.rsplit(".", 2)
    try:
        records = load([journal_path(journal_dir, rank)]).records
    except (OSError, ValueError):
        return True  # nothing to wait on
    return any(
        isinstance(r, RunEnd)
        and _safe(r.origin.run_id) == parts[0]
        and f"{r.origin.restart_count}.{r.origin.attempt}" == f"{parts[1]}.{parts[2]}"
        for r in records
    )


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)


def _facts(
    error: BaseException, journal_dir: Path | None, rank: int, store: DecisionStore | None = None
) -> tuple[Attempt, str, bool, Origin | None]:
    """This attempt's facts, its key (``<restart>.<attempt>``), whether this rank's own failure is the cause, and
    the attempt's origin in this rank's journal (None: no end record)."""
    run = run_id()
    try:
        path = None if journal_dir is None else journal_path(journal_dir, rank)
        records = [] if path is None else [r for r in load([path]).records if r.origin.run_id == run]
    except (OSError, ValueError):
        records = []
    ends = [r for r in records if isinstance(r, RunEnd)]
    origin = ends[-1].origin if ends else None
    mine = [r for r in records if r.origin == origin]
    failure = next((r for r in reversed(mine) if isinstance(r, Failure)), None)
    end = ends[-1] if ends else None
    steps = [r.step for r in mine if isinstance(r, TrainStep)]
    resumed_from = steps[0] - 1 if steps else (end.final_step if end is not None else 0)
    cause = None if failure is None else (failure.first or failure.evidence)
    own = cause is None or cause.rank == rank
    # Only a consequence (a lost connection) and no peer named: the cause is unknown, never this rank.
    unknown = own and kind_of(error).consequence and (failure is None or failure.first is None)
    kind = kind_of(error).value if own or cause is None else cause.kind
    key = f"{origin.restart_count}.{origin.attempt}" if origin is not None else f"{os.getpid()}.0"
    facts = Attempt(
        kind=kind,
        exception=type(error).__name__ if own else "",
        frame=user_frame(error) if own else None,
        phase=cause.phase if cause is not None else (failure.phase if failure is not None else ""),
        step=cause.step if cause is not None else (failure.step if failure is not None else None),
        host="" if unknown else _host(journal_dir, rank if own or cause is None else cause.rank, run, store),
        rank=None if unknown else (rank if own or cause is None else cause.rank),
        resumed_from=max(0, resumed_from),
        committed=end.checkpoint_step if end is not None else None,
        ended=time.time(),
        fatal=own and _not_worth_restarting(error),
        nodes=_nodes(),
    )
    # The cause decides when it can: its own raise (it knows its exception and frame); a cause
    # that cannot (a death, a hang its monitor killed) leaves it to whichever rank comes first.
    alive = cause is None or Kind.named(cause.kind) in RAISED_KINDS
    return facts, key, (own and not kind_of(error).consequence) or not alive, origin


def _journal_decision(folder: Path, origin: Origin, decision: Decision) -> None:
    """Append ``decision`` to the journal of ``origin``'s rank in ``folder`` as a ``JobDecision`` record of the
    attempt ``origin`` (one write: a monitor's records never interleave with it); a write error is logged."""
    record = JobDecision(
        origin=origin,
        action=decision.action,
        reason=decision.reason,
        after_attempt=decision.attempt,
        words=decision.words,
        details=decision.details,
        exit_code=decision.exit_code.value,
        time=time.time(),
    )
    try:
        append_line(str(journal_path(folder, origin.rank)), (json.dumps(record.to_json()) + "\n").encode())
    except (OSError, TypeError, ValueError) as exc:  # a full disk, or a detail JSON cannot hold: the folder has it
        logger.warning("lifecycle: could not journal the decision after attempt %d: %s", decision.attempt, exc)


def _nodes() -> int:
    """How many hosts the job runs on: torchrun's ``WORLD_SIZE`` over ``LOCAL_WORLD_SIZE`` (0: unknown)."""
    try:
        world, local = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return 0
    return world // local if local > 0 else 0


def agent_store(timeout_s: float = 5.0) -> DecisionStore | None:
    """A client of torchrun's agent store (it outlives worker restarts; every node's workers reach it): where
    ``decide_after``, ``last_decision``, ``join_round`` and ``note_host`` keep the job's record across nodes. None
    outside torchrun's agent store or when it cannot be reached within ``timeout_s``. Loads torch on first call."""
    from lifecycle._torch.store import job_store  # torch: only when asked

    return job_store(timeout_s=timeout_s)


def join_round(store: DecisionStore, rank: int | None = None) -> int:
    """Make this worker's restart count job-wide: the number of times global rank ``rank`` started in this job,
    counted in ``store`` (torchrun's agent store), set as ``TORCHELASTIC_RESTART_COUNT`` in this process; returned.

    torchrun's own count is per agent: an agent that restarts its workers because
    another node rejoined does not count it, so after a crash on one node the agents'
    counts differ, and with them the store prefixes (``lifecycle._torch.store.generation``)
    and the decisions' keys: the restarted ranks never agree on an attempt. Every round
    starts each global rank once, so this count is the same on every rank of a round.
    Call it first thing in a worker, before ``pretrain``. ``rank``: default ``RANK``, else 0.
    """
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    count = store.add(f"{STORE_PREFIX}{_safe(run_id())}/starts/{rank}", 1) - 1
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(count)
    return count


def host_name() -> str:
    """This process's host, as decisions name it: ``LIFECYCLE_HOST`` if set (a scheduler's node name), else the
    host name."""
    return os.environ.get("LIFECYCLE_HOST") or socket.gethostname()


def note_host(store: DecisionStore, rank: int | None = None) -> None:
    """Publish this rank's host (``host_name``) in ``store``, so that a peer deciding after this rank died can name
    it (``decide_after``'s culprit); ``rank``: default ``RANK``, else 0. Never raises."""
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    with contextlib.suppress(Exception):
        store.set(f"{STORE_PREFIX}{_safe(run_id())}/host/{rank}", host_name())


def _host(journal_dir: Path | None, rank: int, run: str, store: DecisionStore | None = None) -> str:
    """The host ``rank`` ran on: this process's, the one it published (``note_host``), or its journal's ``run``
    record in ``journal_dir``; "" if none says."""
    if rank == int(os.environ.get("RANK", "0")):
        return host_name()
    if store is not None:
        with contextlib.suppress(Exception):
            key = f"{STORE_PREFIX}{_safe(run)}/host/{rank}"
            if store.check([key]):
                return bytes(store.get(key)).decode()
    try:
        path = None if journal_dir is None else journal_path(journal_dir, rank)
        records = [] if path is None else load([path]).records
        starts = [r for r in records if isinstance(r, RunStart) and r.origin.run_id == run]
    except (OSError, ValueError):
        starts = []
    return starts[-1].host if starts else ""


def _read_record(path: Path, wait_s: float = 0.0) -> tuple[Attempt, Decision] | None:
    """The record in ``path`` (waiting up to ``wait_s`` for a file being written); None if none."""
    deadline = time.monotonic() + wait_s
    while True:
        found = _parse(path)
        if found is not None or time.monotonic() >= deadline:
            return found
        time.sleep(_POLL_S)


def _loads(text: str) -> tuple[Attempt, Decision] | None:
    """A record's text read back (None: not one)."""
    try:
        data: dict[str, Any] = json.loads(text)
        return Attempt.from_json(data["attempt"]), Decision.from_json(data["decision"])
    except (ValueError, KeyError, TypeError):
        return None


def _parse(path: Path) -> tuple[Attempt, Decision] | None:
    """The record in the file ``path`` (None: none, or not one)."""
    try:
        return _loads(path.read_text(encoding="utf-8"))
    except OSError:
        return None


def _history(folder: Path, before: str | None, run: str | None = None) -> list[tuple[str, Attempt, Decision]]:
    """The run's recorded attempts in ``folder``, oldest first (by restart, then attempt), those named before
    ``before`` only when it is given; the run is ``before``'s, or ``run``."""
    prefix = (before.rsplit(".", 3)[0] if before is not None else run or "") + "."
    try:
        names = [p.name for p in folder.iterdir() if p.name.startswith(prefix) and p.name.endswith(".json")]
    except OSError:
        return []

    def order(name: str) -> tuple[int, int]:
        parts = name[len(prefix) : -len(".json")].split(".")
        try:
            return int(parts[0]), int(parts[1])
        except (IndexError, ValueError):
            return (sys.maxsize, sys.maxsize)

    limit = order(before) if before is not None else (sys.maxsize, sys.maxsize)
    found = []
    for name in sorted(names, key=order):
        if order(name) < limit:
            parsed = _parse(folder / name)
            if parsed is not None:
                found.append((name, *parsed))
    return found
