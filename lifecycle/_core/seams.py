"""The seams: what the core asks of the world, as protocols with no torch behind them.

``lifecycle._torch.actions.TorchActions`` implements ``DistributedActions`` on torch.distributed
and megatron-core (and ``AnnouncesFailures``), ``lifecycle.checkpoint.AsyncCheckpointer``
implements ``CheckpointWriter``; ``lifecycle.testing`` ships recording doubles of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from lifecycle._core.states import Owner


class DistributedActions(Protocol):
    """What a session does to torch.distributed and Megatron-core.

    Each ``init_*`` method acquires one resource and returns ``Owner.SESSION`` if it
    created it or ``Owner.CALLER`` if it found it already there; if it raises, it has
    acquired nothing. Each release method releases exactly one resource.
    ``lifecycle.testing.RecordingActions`` is a recording double.
    """

    def init_store(self) -> Owner:
        """Open the rendezvous store (or take the caller's)."""

    def init_process_group(self) -> Owner:
        """Create (or find) the default process group, on the store."""

    def init_model_parallel(self) -> Owner:
        """Create (or find) the model-parallel groups and global memory buffer."""

    def init_microbatch_calculator(self) -> Owner:
        """Create (or find) the microbatch calculator."""

    def init_rerun_state_machine(self) -> Owner:
        """Create (or find) the rerun state machine."""

    def destroy_rerun_state_machine(self) -> None:
        """Destroy the rerun state machine."""

    def destroy_microbatch_calculator(self) -> None:
        """Destroy the microbatch calculator."""

    def destroy_model_parallel(self) -> None:
        """Destroy the model-parallel groups and the global memory buffer."""

    def barrier(self) -> None:
        """Wait for every rank of the default group (success teardown only)."""

    def destroy_process_group(self) -> None:
        """Destroy the default process group after a barrier (success)."""

    def abort_process_group(self) -> None:
        """Abort every process group without waiting on outstanding collectives (failure)."""

    def close_store(self) -> None:
        """Drop the rendezvous store it opened (rank-local, after the group)."""


class CheckpointWriter(Protocol):
    """In-flight checkpoint saves, as the session needs them at teardown."""

    def finalize(self) -> object:
        """Collective: wait for in-flight saves on every rank and commit them."""

    def abort(self) -> None:
        """Rank-local: abandon in-flight saves; never a collective, never commits."""


@dataclass(frozen=True, slots=True)
class Announcement:
    """What came of a failing rank's notice to its peers (see ``AnnouncesFailures``).

    ``seq``: the sequence number the attempt's counter gave this rank's notice (1 = the
    first rank of the attempt to publish one), None if it was not published, and then
    ``unpublished`` says why. ``first_rank``: the peer whose notice has the lowest
    sequence number, when that is not this rank (None otherwise, or unknown). ``note``:
    the note for this rank's exception ("" when this rank's notice came first): a
    peer's failure came first, or the first failure is unknown and why.
    """

    seq: int | None
    unpublished: str = ""
    first_rank: int | None = None
    note: str = ""


@runtime_checkable
class AnnouncesFailures(Protocol):
    """Actions that tell the other ranks of a failure, and learn whose came first (optional for actions)."""

    def announce_failure(self, error: BaseException, *, phase: str, step: int | None, time: float) -> Announcement:
        """Publish that this rank failed with ``error`` in ``phase`` at training ``step`` (``time``: wall clock).

        Bounded in time (a fraction of a second, also when the peers' store is gone) and
        never raises ``Exception``: what could not be done is said in the result.
        """
