"""The seams: what the core asks of the world, as protocols with no torch behind them.

``lifecycle._torch.actions.TorchActions`` implements ``DistributedActions`` on torch.distributed
and megatron-core (and ``AnnouncesFailures``), ``lifecycle.checkpoint.AsyncCheckpointer``
implements ``CheckpointWriter``; ``lifecycle.testing`` ships recording doubles of them.
``ProgressSink`` is where a session's progress marks go: ``pretrain`` plugs in the rank's
liveness marks (``lifecycle._liveness``, a layer above the core), so the core needs no
feature to say where it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from lifecycle._core.errors import describe
from lifecycle._core.resources import Handler, Resource
from lifecycle.journal.evidence import Evidence


class DistributedActions(Protocol):
    """What a session does to torch.distributed and Megatron-core: one ``Handler`` per built-in kind.

    ``handler(kind)`` returns the ``Handler`` of one of the built-in kinds a trigger
    acquires (``Resource.RENDEZVOUS_STORE``, ``PROCESS_GROUP``, ``MODEL_PARALLEL``,
    ``MICROBATCH_CALCULATOR``, ``RERUN_STATE_MACHINE``), or of any declared kind with no
    ``handler`` of its own; ``LookupError`` for a kind it does not know. Its ``acquire``
    returns ``Owner.SESSION`` if it created the resource or ``Owner.CALLER`` if it found
    it; its ``releases`` release exactly that one resource. The session asks once per
    acquisition, before acquiring anything of the trigger (so ``check`` refusals come
    first). ``lifecycle.testing.RecordingActions`` is a generic recording double;
    ``lifecycle.TorchActions`` the real thing.
    """

    def handler(self, resource: Resource) -> Handler:
        """The handler of ``resource`` bound to this object's state; ``LookupError`` if it has none."""


class CheckpointWriter(Protocol):
    """In-flight checkpoint saves, as the session needs them at teardown."""

    def finalize(self) -> object:
        """Collective: wait for in-flight saves on every rank and commit them."""

    def abort(self) -> None:
        """Rank-local: abandon in-flight saves; never a collective, never commits."""


class ProgressSink(Protocol):
    """Where a session's progress marks go, besides its own record (``Session.progress_sink``).

    Called by ``Session.progress`` on the caller's thread, every time, with the phase
    given and the step the session holds (None until one is given). It is on the
    per-step path: it must be cheap (no system call, no allocation it can avoid) and
    never raise. ``pretrain`` sets it to the rank's liveness marks
    (``lifecycle._liveness.rank.Marks.mark``) while the rank's monitor runs.
    """

    def __call__(self, phase: str, step: int | None, /) -> None:
        """Record that the caller is at ``step`` in ``phase``; never raises."""


@dataclass(frozen=True, slots=True)
class Announcement:
    """What came of a failing rank's notice to its peers (see ``AnnouncesFailures``).

    ``seq``: the sequence number the attempt's counter gave this rank's notice (1 = the
    first rank of the attempt to publish one), None if it was not published, and then
    ``unpublished`` says why. ``first_rank``: the peer whose notice has the lowest
    sequence number, when that is not this rank (None otherwise, or unknown). ``note``:
    the note for this rank's exception ("" when this rank's notice came first): a
    peer's failure came first, or the first failure is unknown and why. ``first``: the
    first failure's typed facts, when a peer's and its notice or verdict carried them.
    """

    seq: int | None
    unpublished: str = ""
    first_rank: int | None = None
    note: str = ""
    first: Evidence | None = None


@runtime_checkable
class BoundsReleases(Protocol):
    """Actions that say how long one teardown step may take (optional for actions; see ``Session``)."""

    @property
    def release_timeout_s(self) -> float | None:
        """The longest one teardown step may run before it is left running (None: no bound)."""


@runtime_checkable
class AnnouncesFailures(Protocol):
    """Actions that tell the other ranks of a failure, and learn whose came first (optional for actions)."""

    def announce_failure(self, error: BaseException, *, phase: str, step: int | None, time: float) -> Announcement:
        """Publish that this rank failed with ``error`` in ``phase`` at training ``step`` (``time``: wall clock).

        Bounded in time (a fraction of a second, also when the peers' store is gone) and
        never raises ``Exception``: what could not be done is said in the result.
        """


def announce(
    actions: DistributedActions, error: BaseException, *, phase: str, step: int | None, time: float
) -> Announcement:
    """What came of telling the other ranks of ``error`` through ``actions``; never raises ``Exception``.

    Actions that cannot announce (not ``AnnouncesFailures``), or whose announcement
    raised, give an ``Announcement`` that says so, with no sequence number.
    """
    if not isinstance(actions, AnnouncesFailures):
        return Announcement(None, "the session's actions cannot announce a failure")
    try:
        return actions.announce_failure(error, phase=phase, step=step, time=time)
    except Exception as exc:  # noqa: BLE001 - announcing must never replace the failure being handled
        return Announcement(None, f"announcing the failure raised {describe(exc)}")
