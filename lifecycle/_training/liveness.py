"""``pretrain``'s side of liveness: the rank's monitor, started on the store the default group was created on."""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path

import torch.distributed as dist
from torch.distributed import PrefixStore  # type: ignore[attr-defined]  # re-exported at runtime

from lifecycle import journal as _journal
from lifecycle._core.events import FailureEvent
from lifecycle._core.plans import RestartMode
from lifecycle._core.session import Session
from lifecycle._liveness.rank import RankMonitor, start_monitor
from lifecycle._training.config import LivenessMode, PretrainConfig
from lifecycle._training.journaling import RunJournal

logger = logging.getLogger("lifecycle.pretrain")


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
    folder = Path(config.journal_dir) if config.journal_dir is not None else Path(tempfile.gettempdir())
    monitor = start_monitor(
        rank=rank,
        world_size=world_size,
        host=server[0],
        port=server[1],
        prefix=prefix,
        interval_s=live.interval_s,
        floor_s=live.floor_s,
        default_s=live.default_deadline_s,
        explicit=dict(live.deadlines),
        mode=mode.value,
        stacks=folder / f"rank{rank}.stacks.txt",
        attempt=journal.origin.attempt,
        journal=None if config.journal_dir is None else _journal.journal_path(config.journal_dir, journal.origin.rank),
        origin=dataclasses.asdict(journal.origin),
    )
    session.add_observer(lambda event: monitor.marks.done() if isinstance(event, FailureEvent) else None)
    return monitor


def store_server() -> tuple[str, int] | None:
    """The address and port of the ``TCPStore`` under the default group's store (None: another kind of store)."""
    store: object = dist.distributed_c10d._get_default_store()
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if isinstance(host, str) and isinstance(port, int):
        return host, port
    return None
