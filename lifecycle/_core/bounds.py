"""The bounds lifecycle sets on waits for a peer, all derived from the group timeout in one place, each in its order.

The group timeout (``DistributedConfig.timeout_s``, written T here) is the one number a
user tunes: how long a rank waits for a peer in a collective before it fails. Every
other wait lifecycle bounds on a peer's account follows from it (and, for liveness, from
``patience``), so that a healthy rank is never cut short by one bound while another
still allows what it waits for, and a wedged rank is named before a healthy one's
timeout fires. Each property says its value, the order it keeps and why.

Bounds on rank-local work (freeing a group, a worker thread's exit, a store read a
signal handler makes) are constants where they are used: no peer's pace enters them.
NVRx's Wrapper timeouts are derived from T too, with their own order (soft, hard,
watchdog), in ``lifecycle.restart.wrapper_timeouts``. docs/liveness.md ("Bounds from the
group timeout") has the table; a test keeps it equal to this module.

Standard library only: no torch (``_core``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["LAUNCHER_MARGIN_S", "SHUTDOWN_VARIABLE", "STOP_MARGIN_S", "Bounds"]

STOP_MARGIN_S = 30.0
"""What the stop grace adds to its two group timeouts: the teardown and exit after the final commit.

Rank-local work (an abort, freeing the groups, the journal's last records, the
interpreter's exit), plus one look and the kill of a rank convicted late in the stop."""

LAUNCHER_MARGIN_S = 10.0
"""How much longer than the stop grace a launcher that forwarded the stop to torchrun waits before it kills torchrun:
torchrun's own SIGKILL of its ranks comes first, and torchrun collects them and exits."""

SHUTDOWN_VARIABLE = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
"""torchrun's time between the SIGTERM it forwards to its ranks and its SIGKILL (whole seconds; torch's default 30).

Read by torchrun (``LaunchConfig``) where its ``--shutdown-timeout`` is not given; a
torchrun that predates it ignores the variable and keeps 30 s."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """The bounds that follow from a group timeout of ``group_timeout_s`` (and liveness ``patience``).

    Inputs only: every bound is a property, so no two of them can disagree. The order
    they keep (each property's docstring says why)::

        write_timeout_s < group_timeout_s = store_timeout_s = unresponsive_s
        conviction_floor_s < group_timeout_s < finalize_s < release_timeout_s < stop_grace_s < launcher_grace_s
    """

    group_timeout_s: float
    patience: float = 1.0

    @property
    def store_timeout_s(self) -> float:
        """The rendezvous store's timeout (every call of the ``TCPStore`` client, and its connect retry): T.

        A store wait is a wait for a peer (the group's rendezvous, the attempt the ranks
        agree on, a barrier in the store), as a collective is: the same bound, so a rank
        late to the rendezvous fails its peers at the same time it would in a
        collective. Above the conviction floor, like T: a rank wedged before the
        rendezvous is judged by its monitor before its peers' store waits give up.
        """
        return self.group_timeout_s

    @property
    def write_timeout_s(self) -> float:
        """How long a checkpoint finalize waits for this rank's own write before it reports it failed: T / 2.

        Below T (``AsyncCheckpointer`` refuses ``write_timeout_s`` at or above it): its
        peers already wait in the commit's collective, for at most T; a rank that
        reports its failed write after that finds nobody to hear it, and the peers'
        timeouts, not ``SaveFailed`` on every rank, end the attempt. Half of T leaves
        the other half for the commit itself (rank 0's manifest and fsync).
        """
        return self.group_timeout_s / 2

    @property
    def finalize_s(self) -> float:
        """The longest a healthy checkpoint finalize takes on any rank: T / 2 + T.

        The ranks enter it together; its ``all_gather`` completes once the slowest
        rank's write is done (within ``write_timeout_s``), then the peers wait for rank
        0's commit (manifest, ``latest``, clean-up) in a broadcast, for at most T: a
        commit longer than that fails on every rank. Not a timer of its own:
        ``release_timeout_s`` and ``stop_grace_s`` must stay above it.
        """
        return self.write_timeout_s + self.group_timeout_s

    @property
    def release_timeout_s(self) -> float:
        """The longest one teardown step may run before it is left running (``Session``'s default for torch): 2 T.

        Above ``finalize_s``: the success plan's first step finalizes the saves in
        flight, and a healthy finalize waiting on a slow peer's write must not be left
        running (the session would end ``failed`` on a healthy run). Everything torch
        waits for is bounded by T already, so this catches only what has no bound of
        its own (a user release on a hung mount, a C++ call that never returns).
        """
        return 2 * self.group_timeout_s

    @property
    def conviction_floor_s(self) -> float:
        """The least a rank must stand still, the evidence holding, before its monitor convicts it: patience × T / 3.

        Below T (``LivenessConfig.check_against`` refuses a ``patience`` of 3 or more):
        a rank wedged before a collective must be convicted before its peers'
        collectives time out, or a victim's timeout is the first failure and the
        culprit is never named. A third of T leaves the verdict's publication, the
        peers' acknowledgements and the kill (a few intervals) well inside T.
        """
        return self.patience * self.group_timeout_s / 3

    @property
    def unresponsive_s(self) -> float:
        """How long a monitor's beat may be silent before it is published unresponsive (failure notice 1): T.

        Not below T: a silent monitor (a network blip, a starved core) may watch a
        healthy rank, and a notice published for it would make that rank the "first
        failure" of any later, unrelated one. By T every collective waiting for a rank
        that is really gone has timed out anyway.
        """
        return self.group_timeout_s

    @property
    def stop_grace_s(self) -> float:
        """How long a requested stop may take before the launcher SIGKILLs the ranks: 2 T + ``STOP_MARGIN_S``.

        Above ``finalize_s`` + ``STOP_MARGIN_S``: a healthy stop's final save (its write
        and commit) and its teardown fit, with T / 2 left for the step in progress.
        Above T + the conviction floor: a rank that fails during the stop (a peer's
        collective timing out, or a rank wedged there and convicted by its monitor)
        journals why before the SIGKILL, instead of every rank dying unexplained. A
        bound, not a promise: a stop that must first commit a save still in flight, or
        whose step takes longer than T / 2, can need more (then set
        ``SHUTDOWN_VARIABLE``: the caller's value wins). Given to torchrun as
        ``SHUTDOWN_VARIABLE``; torch's default, 30 s, is below T at ``pretrain``'s 60 s.
        """
        return 2 * self.group_timeout_s + STOP_MARGIN_S

    @property
    def launcher_grace_s(self) -> float:
        """How long a launcher before torchrun waits after it forwarded a stop: stop grace + ``LAUNCHER_MARGIN_S``."""
        return self.stop_grace_s + LAUNCHER_MARGIN_S

    def shutdown_timeout(self, environment: Mapping[str, str]) -> str:
        """The ``SHUTDOWN_VARIABLE`` value for torchrun: ``environment``'s own if set, else the stop grace (whole s).

        A value the caller set wins; one below the stop grace, or not a number, is
        warned about (``RuntimeWarning``), not refused: a requested stop whose final
        save is quick still ends well within it, and the caller may know it is.
        """
        given = environment.get(SHUTDOWN_VARIABLE)
        grace = str(math.ceil(self.stop_grace_s))
        if given is None:
            return grace
        try:
            seconds = float(given)
        except ValueError:
            seconds = math.nan
        if not seconds >= self.stop_grace_s:
            warnings.warn(
                f"{SHUTDOWN_VARIABLE}={given!r} in the environment is below the stop grace lifecycle derives "
                f"({grace} s = 2 x the {self.group_timeout_s:g} s group timeout + {STOP_MARGIN_S:g} s): after a "
                "requested stop torchrun SIGKILLs a rank still in its final save or its teardown, or still waiting "
                f"for a peer within the group timeout; unset it, or set it to {grace} or more",
                RuntimeWarning,
                stacklevel=2,
            )
        return given
