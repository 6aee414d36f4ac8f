"""``pretrain``'s side of liveness: the rank's monitor, started on the store the default group was created on."""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time
from pathlib import Path
from types import FrameType

import torch.distributed as dist
from megatron.core import parallel_state
from torch.distributed import PrefixStore  # type: ignore[attr-defined]  # re-exported at runtime

from lifecycle import journal as _journal
from lifecycle._core.bounds import Bounds
from lifecycle._core.errors import MonitorLost, StoreHostLost
from lifecycle._core.events import FailureEvent
from lifecycle._core.plans import RestartMode
from lifecycle._core.session import Session
from lifecycle._core.signals import Handler, Link
from lifecycle._core.states import State
from lifecycle._liveness.collectives import Positions
from lifecycle._liveness.rank import RankMonitor, settle, start_monitor
from lifecycle._liveness.settings import LOST_SIGNAL, Settings
from lifecycle._training.config import LivenessMode, PretrainConfig
from lifecycle._training.journaling import RunJournal

logger = logging.getLogger("lifecycle.pretrain")


def in_force(config: PretrainConfig, session: Session) -> str:
    """The liveness deadlines ``config`` puts in force in ``session``, in words; a ``kill`` monitor under an
    in-process restart says ``report`` (``start_liveness`` starts it so). "" when liveness is off."""
    live = config.liveness
    if live.mode is LivenessMode.KILL and session.restart_mode is RestartMode.INPROCESS:
        live = dataclasses.replace(live, mode=LivenessMode.REPORT)
    return live.in_force(config.distributed.timeout_s)


def start_liveness(
    config: PretrainConfig, session: Session, rank: int, world_size: int, journal: RunJournal
) -> RankMonitor | None:
    """Start this rank's liveness monitor if ``config.liveness`` asks for one and lifecycle created the group.

    The monitor reaches the store the group was created on (its server's address and
    port) under the attempt's prefix; on the failure edge the rank tells it it is done
    (the failing rank's teardown is bounded by its own deadlines, not judged). Under an
    in-process restart (NVRx's Wrapper) a ``kill`` monitor only reports: the Wrapper's
    own timeouts end a hung rank and restart every rank; the monitor names the culprit
    (its verdict is the failure notice each rank's exception and journal carry) and never
    dumps or kills a rank the Wrapper is about to restart.
    """
    live = config.liveness
    prefix = getattr(session.actions, "store_prefix", None)
    if live.mode is LivenessMode.OFF or not isinstance(prefix, str):
        return None
    mode = live.mode
    if mode is LivenessMode.KILL and session.restart_mode is RestartMode.INPROCESS:
        logger.info("rank %d: liveness monitor reports only: the in-process restart's timeouts end a hung rank", rank)
        mode = LivenessMode.REPORT
    server = store_server()
    if server is None:
        logger.warning("rank %d: no liveness monitor: the default group's store is not a TCPStore", rank)
        return None
    settle()  # a monitor stopped before and exited since gives its signals back first
    lost = _store_loss_link(session, rank)  # before the monitor starts: it is told whether the rank has a handler
    folder = Path(config.journal_dir) if config.journal_dir is not None else Path(tempfile.gettempdir())
    journal_file = "" if config.journal_dir is None else str(_journal.journal_path(folder, journal.origin.rank))
    bounds = Bounds(config.distributed.timeout_s, live.patience)
    settings = Settings(
        rank=rank,
        world_size=world_size,
        host=server[0],
        port=server[1],
        prefix=prefix,
        mode=mode.value,
        interval_s=live.interval_s,
        floor_s=live.floor_s,
        default_deadline_s=live.default_deadline_s,
        deadlines=live.deadlines,
        stacks=str(folder / f"rank{rank}.stacks.txt"),
        attempt=journal.origin.attempt,
        journal=journal_file,
        origin=dataclasses.asdict(journal.origin),
        store_host="torchrun's agent" if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else "",
        lost_signal=int(LOST_SIGNAL) if lost is not None else 0,
        conviction_floor_s=bounds.conviction_floor_s,
        group_timeout_s=bounds.unresponsive_s,
    )
    try:
        monitor = start_monitor(settings)
    except BaseException:
        if lost is not None:
            lost.link.uninstall()
        raise
    positions = Positions(monitor.marks, group_label)
    try:
        positions.install()
    except (AttributeError, TypeError, ValueError) as exc:  # a torch without what the wrappers read: no positions
        positions.uninstall()
        logger.warning("rank %d: no collective positions (the monitor judges by marks only): %s", rank, exc)
    monitor.on_stop.append(positions.uninstall)
    _mark_progress(session, monitor)

    def failing(event: object) -> None:
        if isinstance(event, FailureEvent):
            monitor.park()  # a retry in this process takes it over (first: before the monitor sees the rank done)
            monitor.marks.done()
            groups, at = positions.snapshot(), monitor.marks.position()
            positions.uninstall()
            if groups and journal.enabled:  # where it stood in each group's collectives, for show
                journal.write(
                    _journal.Collectives(
                        origin=journal.origin,
                        time=time.time(),
                        groups=groups,
                        step=at.step if at is not None else None,
                        phase=at.phase if at is not None else "",
                    )
                )

    session.add_observer(failing)
    if lost is not None:
        lost.monitor = monitor
        monitor.on_lost = lost.fail
        monitor.on_stop.append(lost.link.uninstall)
    return monitor


_GROUPS: tuple[tuple[str, str, dict[str, bool]], ...] = (
    ("tensor-parallel", "get_tensor_model_parallel_group", {}),
    ("pipeline-parallel", "get_pipeline_model_parallel_group", {}),
    ("context-parallel", "get_context_parallel_group", {}),
    ("expert-parallel", "get_expert_model_parallel_group", {}),
    ("data-parallel", "get_data_parallel_group", {}),
    ("data-parallel (gloo)", "get_data_parallel_group_gloo", {}),
    ("data+context-parallel", "get_data_parallel_group", {"with_context_parallel": True}),
    ("model-parallel", "get_model_parallel_group", {}),
)
"""Megatron-core's groups, by the getter that returns each, and its name in words."""


def group_label(pg: dist.ProcessGroup) -> str:
    """``pg``'s label (``page.group_words`` says it): ``default`` for the default group, Megatron-core's name for one
    of its groups (``data-parallel``), else ``group <name> (ranks ...)``; at most 24 bytes."""
    if pg is dist.group.WORLD:
        return "default"
    for label, getter, kwargs in _GROUPS:
        try:
            if getattr(parallel_state, getter)(**kwargs) is pg:
                return label
        except (AssertionError, AttributeError, RuntimeError, TypeError):  # not initialized, or not in this version
            continue
    return f"group {pg.group_name} (ranks {', '.join(map(str, dist.get_process_group_ranks(pg)))})"[:24]


def _mark_progress(session: Session, monitor: RankMonitor) -> None:
    """Make ``session.progress`` write the rank's marks for ``monitor`` until the monitor stops (the core's seam)."""

    def unplug() -> None:
        if session.progress_sink == monitor.marks.mark:
            session.progress_sink = None

    session.progress_sink = monitor.marks.mark
    monitor.on_stop.append(unplug)


_LIVE = (State.DIST_READY, State.GLOBALS_READY, State.TRAINING)
"""The states in which a lost store's host fails the rank (never while it finishes, tears down or is final)."""


class _StoreLoss:
    """The handler of the monitor's ``LOST_SIGNAL``: raises ``StoreHostLost`` on the main thread while the session is
    live and the rank not done; ``monitor`` is set once the monitor runs (nothing is raised before).

    The rank's side sends the same signal to its own process to fail it when its monitor is
    lost for good (``fail``): the handler then raises ``MonitorLost`` instead.
    """

    def __init__(self, session: Session, rank: int) -> None:
        self.session = session
        self.rank = rank
        self.monitor: RankMonitor | None = None
        self.failure: MonitorLost | None = None
        self.link = Link(LOST_SIGNAL, self.lost)

    def fail(self, why: str) -> bool:
        """Fail the rank (any thread): ``MonitorLost`` with ``why``, raised on the main thread while it trains."""
        self.failure = MonitorLost(self.rank, why)
        os.kill(os.getpid(), LOST_SIGNAL)
        return True

    def lost(self, signum: int, frame: FrameType | None, previous: Handler) -> None:
        monitor = self.monitor
        if monitor is None or self.session.state not in _LIVE or monitor.marks.is_done:
            return
        if (failure := self.failure) is not None:
            self.failure = None
            raise failure
        verdict = monitor.marks.verdict() or {}
        found = verdict if verdict.get("kind") == "store" else {}  # another verdict may have been seen first
        host = str(found.get("host") or "the store's host")
        detail = str(found.get("note") or f"{host} has stopped answering this rank's liveness monitor")
        raise StoreHostLost(host, detail)


def _store_loss_link(session: Session, rank: int) -> _StoreLoss | None:
    """Install the handler that makes the monitor's ``LOST_SIGNAL`` raise ``StoreHostLost`` (``_StoreLoss``).

    Off the main thread no handler can be installed: None, and the monitor is told so
    (``lost_signal`` 0): it then only reports a lost store, and never sends the signal.
    The handler is put back when the monitor stops (after which ``RankMonitor.stop``
    ignores the signal until the monitor has exited).
    """
    loss = _StoreLoss(session, rank)
    try:
        loss.link.install()
    except (ValueError, OSError):
        logger.info("no store-loss handler off the main thread: the liveness monitor only reports a lost store")
        return None
    return loss


def store_server() -> tuple[str, int] | None:
    """The address and port of the ``TCPStore`` under the default group's store (None: another kind of store)."""
    store: object = dist.distributed_c10d._get_default_store()
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if isinstance(host, str) and isinstance(port, int):
        return host, port
    return None
