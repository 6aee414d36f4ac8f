"""What a rank tells its liveness monitor: one record, built once and passed whole.

``pretrain`` builds a ``Settings`` from ``LivenessConfig`` and the run (its store, its
attempt, its journal) and hands it to ``lifecycle._liveness.rank.start_monitor``, which
passes it, as JSON on the command line, to the monitor process
(``lifecycle._liveness.monitor``), which reads it back with ``from_json``. A field keeps
its ``LivenessConfig`` name all the way; a value derived from others is derived here.

Standard library only: the monitor runs as a script and imports this module from its own
folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from dataclasses import dataclass, field

DUMP_SIGNAL = signal.SIGRTMIN + 6
"""The signal the rank's ``faulthandler`` answers with every thread's Python stack (the monitor sends it)."""
LOST_SIGNAL = signal.SIGRTMIN + 7
"""The signal the monitor sends its rank when the store's host has stopped answering (its words are in the page)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a rank's monitor is told; frozen, and the same record on both sides of the process boundary.

    ``host``/``port``: the rendezvous store's server; ``prefix``: the attempt's store
    prefix (failure notices and beats go under it). ``mode`` (``kill`` or ``report``),
    ``interval_s``, ``floor_s``, ``default_deadline_s`` and ``deadlines`` (phase,
    seconds) are ``LivenessConfig``'s. ``stacks``: the side file the rank's Python stacks
    are dumped into (appended to). ``attempt``: the attempt the rank's marks name.
    """

    rank: int
    world_size: int
    host: str
    port: int
    prefix: str
    mode: str
    interval_s: float
    floor_s: float
    default_deadline_s: float
    stacks: str
    deadlines: tuple[tuple[str, float], ...] = ()
    attempt: int = 0
    store_timeout_s: float = 0.0
    """The longest one of the monitor's store calls may take; 0 (the default) means half of ``interval_s``."""
    journal: str = ""
    """The rank's journal file, which a verdict is appended to ("" if it keeps none)."""
    origin: dict[str, object] = field(default_factory=dict)
    """The rank's journal ``Origin`` fields (``lifecycle.journal``), written in each verdict record."""
    store_host: str = ""
    """Who hosts the store, in words ("torchrun's agent"; "": say its address only)."""
    lost_signal: int = 0
    """The signal that tells the rank its store's host stopped answering (``kill`` mode; 0: none)."""
    dump_signal: int = int(DUMP_SIGNAL)
    """The signal the rank registers with ``faulthandler`` and the monitor sends for a stack dump."""
    pid: int = field(default_factory=os.getpid)
    """The process the monitor watches: by default the one that builds the settings (the rank)."""
    conviction_floor_s: float = 0.0
    """The least a position must stand still before a suspicion on it convicts (0: the phase's deadline alone)."""
    group_timeout_s: float = 0.0
    """The collectives' group timeout: a silent monitor is published unresponsive only past it (0: never)."""

    def __post_init__(self) -> None:
        """Derive the store calls' bound from the interval when none is given."""
        if not self.store_timeout_s:
            object.__setattr__(self, "store_timeout_s", self.interval_s / 2)

    def to_json(self) -> str:
        """The settings as one JSON object (``from_json`` reads it back equal)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Settings:
        """The settings ``to_json`` wrote (JSON has no tuples: ``deadlines`` is rebuilt as pairs)."""
        fields = json.loads(text)
        fields["deadlines"] = tuple((phase, seconds) for phase, seconds in fields["deadlines"])
        return cls(**fields)
