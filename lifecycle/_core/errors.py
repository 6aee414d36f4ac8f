"""The library's errors. Every one derives from ``LifecycleError``.

A refusal carries its facts as fields (which resource, what was found, what was
wanted), and has its own type wherever a caller would handle it differently: a
finished session (start a new one), a stale or half-made resource (destroy it first),
a resource that disagrees with the configuration (fix one or the other), one the
caller created where the session must (release it, or run without the wrapper), one
that is missing. Every error pickles and copies with its fields (NVRx's Wrapper copies
the exception of a failed iteration).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from lifecycle.journal.evidence import Kind

if TYPE_CHECKING:
    from lifecycle._core.states import State, Trigger


class LifecycleError(Exception):
    """Base class of every error this library raises."""

    _fields: tuple[object, ...]  # a subclass's constructor arguments, for pickling

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuild from the constructor's arguments; the instance dict carries any notes.
        fields = self.__dict__.get("_fields")
        if fields is None:
            return (type(self), self.args, self.__dict__)
        return (type(self), fields, self.__dict__)


def chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, then the one it was raised from (``__cause__``) or else during (``__context__``), and so on, as a
    traceback prints them; each once (a cycle ends it)."""
    seen: set[int] = set()
    found: BaseException | None = error
    while found is not None and id(found) not in seen:
        seen.add(id(found))
        yield found
        found = found.__cause__ or found.__context__


def describe(error: BaseException) -> str:
    """``"Type: message"`` for ``error``, never raising: a broken ``__str__`` gives its ``__repr__``, then its type."""
    name = type(error).__name__
    for text in (str, repr):
        try:
            return f"{name}: {text(error)}"
        except Exception:  # noqa: BLE001 - an error being handled must never be replaced by its own text
            continue
    return f"{name} (its str() and repr() raise)"


class InvalidTransition(LifecycleError):
    """``trigger`` was pulled in ``state``, which declares no edge for it; nothing was done."""

    def __init__(self, state: State, trigger: Trigger) -> None:
        self.state = state
        self.trigger = trigger
        self._fields = (state, trigger)
        super().__init__(f"trigger {trigger.value!r} is not valid in state {state.value!r}")


class SessionFinished(LifecycleError):
    """``action`` was asked of a session that is already ``closed`` or ``failed``; nothing was done.

    A session is used once: start a new one.
    """

    def __init__(self, state: State, action: str) -> None:
        self.state = state
        self.action = action
        self._fields = (state, action)
        super().__init__(f"{action}: the session is already {state.value!r}; start a new session")


class UnfinishedSession(LifecycleError):
    """A session block ended normally in ``state``, before training started; the session took the failure edge."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._fields = (state,)
        super().__init__(f"the session block ended in state {state.value!r} without finishing")


class StepTimedOut(LifecycleError, TimeoutError):
    """Teardown step ``step`` did not return within ``timeout_s``: it was left running, and the plan went on.

    Recorded as that step's error (in the report, the journal and ``show``: ``StepTimedOut``);
    what the step was releasing stays claimed until it returns (a later session that would
    acquire that kind waits for it, within a bound, or is refused naming it).
    """

    def __init__(self, step: str, timeout_s: float) -> None:
        self.step = step
        self.timeout_s = timeout_s
        self._fields = (step, timeout_s)
        super().__init__(f"teardown step {step} did not return within {timeout_s:g} s: left running, plan went on")


class StoreHostLost(LifecycleError):
    """The rendezvous store's host stopped answering: raised into the training thread by the rank's liveness monitor.

    Its ``failure_kind`` is ``Kind.STORE_HOST_LOST``.

    The store's host is torchrun's agent under torchrun (rank 0 under lifecycle's own
    launcher). Its monitor found the store silent for longer than the phase's deadline plus
    four intervals (``LivenessConfig``), and the session had not finished: without the
    store no failure can be announced and no restart agreed, so the rank fails instead
    of training on unsupervised. ``host`` names the store's host; the message (``detail``)
    names it too and says for how long it was silent. Raised only in ``kill`` mode, from a signal handler
    (``pretrain`` installs it on the main thread).
    """

    failure_kind = Kind.STORE_HOST_LOST

    def __init__(self, host: str, detail: str) -> None:
        self.host = host
        self.detail = detail
        self._fields = (host, detail)
        super().__init__(detail)


class MonitorLost(LifecycleError):
    """The rank's liveness monitor was lost and could not be kept: raised into the training thread (``kill`` mode).

    A monitor that exits while its rank trains is started again once; when that one is
    lost too (or cannot be started), a rank in ``kill`` mode fails with this rather than
    train on unsupervised (``report`` mode goes on without). ``rank`` is the rank,
    ``detail`` says how each monitor ended. Raised from the same signal handler as
    ``StoreHostLost`` (``pretrain`` installs it on the main thread). Its ``failure_kind``
    is ``Kind.MONITOR_LOST``.
    """

    failure_kind = Kind.MONITOR_LOST

    def __init__(self, rank: int, detail: str) -> None:
        self.rank = rank
        self.detail = detail
        self._fields = (rank, detail)
        super().__init__(detail)


class ResourceRefused(LifecycleError):
    """Base of the refusals about one existing (or missing) resource: ``resource`` names it, ``detail`` says why."""

    def __init__(self, resource: str, detail: str) -> None:
        self.resource = resource
        self.detail = detail
        self._fields = (resource, detail)
        super().__init__(f"{resource}: {detail}")


class StaleResource(ResourceRefused):
    """``resource`` exists but belongs to an earlier world, or is half-made: destroy it before starting a session."""


class ResourceMismatch(ResourceRefused):
    """``resource`` exists, created by the caller, but disagrees with the configuration (``found`` vs ``wanted``).

    ``remedy``, if given, ends the message: how to make them agree for this resource.
    """

    def __init__(self, resource: str, found: object, wanted: object, what: str = "", remedy: str = "") -> None:
        self.found = found
        self.wanted = wanted
        self.what = what
        self.remedy = remedy
        label = f"{what} " if what else ""
        detail = f"already exists with {label}{found!r}, but the configuration says {wanted!r}"
        super().__init__(resource, f"{detail}; {remedy}" if remedy else detail)
        self._fields = (resource, found, wanted, what, remedy)


class ForeignResource(ResourceRefused):
    """``resource`` was created by the caller where the session must create it (under in-process restart)."""


class AlreadyHeld(ResourceRefused):
    """This session already holds ``resource`` (signal handlers installed twice, a user name registered twice)."""


class MissingResource(ResourceRefused):
    """``resource`` is needed (by ``detail``'s action) and does not exist."""


class ConfigError(LifecycleError, ValueError):
    """A configuration value is invalid; raised before anything is acquired.

    ``field`` is the value's dotted path from what the caller passed: a config
    section's field is ``section.field``, named as ``PretrainConfig`` and
    ``TorchActions`` name the section (``training.iterations``,
    ``distributed.world_size``, ``parallel.tensor_model_parallel_size``); a function's
    own argument is its name (``max_restarts``); an environment variable is its name
    (``TORCH_NCCL_ASYNC_ERROR_HANDLING``). ``message`` says what is wrong with it.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        self._fields = (field, message)
        super().__init__(f"{field}: {message}")


def check_number(
    field: str,
    value: object,
    *,
    integer: bool = True,
    at_least: float | None = None,
    at_most: float | None = None,
    above: float | None = None,
    unit: str = "",
    optional: bool = False,
) -> None:
    """Raise ``ConfigError(field, ...)`` unless ``value`` is a number within the bounds: every config's number check.

    ``integer`` (the default): ``value`` must be an ``int`` (a ``bool`` is not one);
    otherwise an ``int`` or a finite ``float``. ``at_least`` and ``at_most`` are
    inclusive bounds, ``above`` an exclusive one; None leaves that side open. ``unit``
    (``"seconds"``) goes into the message, which says what was expected and what was
    given: ``must be an integer in 0..65535, got 70000``. ``optional``: None passes too
    (it means "not set", e.g. read from the environment later).
    """
    if optional and value is None:
        return
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (isinstance(value, int) or (not integer and math.isfinite(value)))
        and (at_least is None or value >= at_least)
        and (at_most is None or value <= at_most)
        and (above is None or value > above)
    ):
        return
    what = "an integer" if integer else "a finite number"
    if unit:
        what += f" of {unit}"
    if at_least is not None and at_most is not None:
        limits = [f"in {_bound(at_least)}..{_bound(at_most)}"]
    else:
        given = ((">=", at_least), (">", above), ("<=", at_most))
        limits = [f"{sign} {_bound(bound)}" for sign, bound in given if bound is not None]
    raise ConfigError(field, f"must be {' '.join([what, *limits])}, got {value!r}")


def _bound(bound: float) -> str:
    """A bound as a message shows it: ``0`` for ``0.0``, ``65535`` as it is."""
    return f"{bound:g}" if isinstance(bound, float) and bound.is_integer() and abs(bound) < 1e15 else str(bound)


class AttemptDisagreement(LifecycleError):
    """The ranks could not agree on an attempt number through the rendezvous store within ``timeout_s``.

    ``proposals`` maps each rank of the world to the attempt it last proposed (None:
    no proposal from it reached the store); ``joined`` is how many ranks were present
    when this one gave up. A rank that never came, or came to another store, is named
    there. Only one rank gathers every proposal (the last to give up); the others'
    ``proposals`` hold their own, and ``elsewhere`` says where the whole list is.
    """

    def __init__(
        self, where: str, timeout_s: float, proposals: dict[int, int | None], joined: int, elsewhere: str = ""
    ) -> None:
        self.where = where
        self.timeout_s = timeout_s
        self.proposals = dict(proposals)
        self.joined = joined
        self.elsewhere = elsewhere
        self._fields = (where, timeout_s, self.proposals, joined, elsewhere)
        by_value: dict[int | None, list[int]] = {}
        for rank, value in sorted(proposals.items()):
            by_value.setdefault(value, []).append(rank)
        shown = "; ".join(
            f"{'no proposal' if value is None else f'proposed {value}'}: {_ranges(ranks)}"
            for value, ranks in sorted(by_value.items(), key=lambda item: -1 if item[0] is None else item[0])
        )
        if elsewhere:
            (rank, value), *_ = proposals.items()
            text = f"ranks present: {joined}; rank {rank} proposed {value}; {elsewhere}"
        else:
            text = f"{joined} of {len(proposals)} present; proposals: {shown}"
        super().__init__(
            f"the ranks did not agree on an attempt through the store at {where} within {timeout_s:g} s ({text})"
        )


def _ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"ranks 0-2, 5"`` (sorted input)."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


class NonfiniteLoss(LifecycleError):
    """The loss of ``step`` was not finite on ``ranks`` rank(s); no update of that step was applied or saved.

    ``rank`` and ``value``: the rank whose loss was not finite and that loss (NaN, ±inf)
    when it was one rank (None: several; ``value`` is then not finite all the same).
    ``skipped``: steps skipped in a row before it gave up (0 under ``fail``). Its
    ``failure_kind`` is ``Kind.NONFINITE_LOSS``.
    """

    failure_kind = Kind.NONFINITE_LOSS

    def __init__(self, step: int, rank: int | None, value: float, ranks: int, skipped: int) -> None:
        self.step, self.rank, self.value, self.ranks, self.skipped = step, rank, value, ranks, skipped
        self._fields = (step, rank, value, ranks, skipped)
        where = f"rank {rank}" if rank is not None else f"{ranks} ranks"
        why = f" after {skipped} skipped steps in a row (training.max_consecutive_skipped_steps)" if skipped else ""
        super().__init__(
            f"the loss of step {step} is {value} on {where}{why}: its update was not applied and no checkpoint "
            "of it is committed (training.on_nonfinite_loss)"
        )
