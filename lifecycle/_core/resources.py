"""Resource kinds: one declaration each, from which plans, dispatch and the live probe derive.

A ``Resource`` declares everything the library needs to know about one kind of
resource a session can hold: where it sits in the teardown order, the steps that
release it on success and on failure, which trigger acquires it (``acquired_by``), its
``Handler`` (the callables that acquire and release one instance, bound when it is
acquired), whether the in-process restart wrapper releases it on a failure, and how to
see it alive in this process (``probe``). ``declare_resource`` adds a kind; ``declared_resources()`` lists them in
acquisition order. The built-in kinds are declared at the bottom of this module.

No torch here: a probe reads only modules already in ``sys.modules`` (a resource of
a module that was never imported cannot exist).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from lifecycle._core.states import Owner, Trigger


class WrapperRole(StrEnum):
    """What the in-process restart wrapper does with a resource of a kind when an attempt fails."""

    NONE = "none"
    """Nothing: the session releases it, as in an ordinary run."""
    RELEASES = "releases"
    """The wrapper releases it (the session leaves it on a failure); the session must have created it."""
    ABORTS_WHILE_HELD = "aborts_while_held"
    """The session releases it, but the wrapper's abort also reaches it while the session still holds it."""


@dataclass(frozen=True, eq=False)
class StepKind:
    """A teardown action, declared by exactly one resource kind; compared by identity.

    ``unblocks``: rank-local and safe to run from another thread to unblock a main
    thread stuck in a collective (the restart wrapper's abort runs these steps).
    ``releases``: a successful step of this kind releases its resource (a barrier does not).
    ``abandonable``: an escalated interrupt may skip it; False for an instant, local step
    that must never be left undone (restoring the signal handlers: skipping it would leave
    a dead session's handler installed for good). ``main_thread``: it must run on the
    thread that drives the session (only the main thread may set signal handlers), not
    on the worker a teardown runs on.
    """

    value: str
    unblocks: bool = False
    releases: bool = True
    abandonable: bool = True
    main_thread: bool = False

    FINALIZE_CHECKPOINTS: ClassVar[StepKind]
    ABORT_CHECKPOINTS: ClassVar[StepKind]
    RELEASE_USER_RESOURCE: ClassVar[StepKind]
    DESTROY_RERUN_STATE_MACHINE: ClassVar[StepKind]
    DESTROY_MICROBATCH_CALCULATOR: ClassVar[StepKind]
    DESTROY_MODEL_PARALLEL: ClassVar[StepKind]
    ABORT_MODEL_PARALLEL: ClassVar[StepKind]
    BARRIER: ClassVar[StepKind]
    DESTROY_PROCESS_GROUP: ClassVar[StepKind]
    ABORT_PROCESS_GROUP: ClassVar[StepKind]
    CLOSE_STORE: ClassVar[StepKind]
    RESTORE_SIGNAL_HANDLERS: ClassVar[StepKind]

    @property
    def rank(self) -> tuple[int, int]:
        """Position in the canonical teardown order: (its resource's ``order``, index among the resource's steps)."""
        return _STEP_RANK[self]

    @property
    def resource(self) -> Resource:
        """The resource kind that declares this step."""
        return _STEP_OWNER[self]

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"StepKind.{self.value.upper()}"

    def __reduce__(self) -> tuple[object, ...]:
        return (_step_kind, (self.value,))


Releases = Mapping[StepKind, Callable[[], object]]
"""What releases one acquired resource: a callable per step kind of its declaration."""


@dataclass(frozen=True)
class Handler:
    """The callables that acquire and release one instance of a kind, bound together before it is acquired.

    ``acquire()``: creates it and returns ``Owner.SESSION``, or finds one and returns
    ``Owner.CALLER``; if it raises it has created nothing, or what it created is seen by
    the kind's ``probe``/``identity`` (the session then releases it). None for a kind the
    session records without acquiring (``Session.register``). ``releases``: one callable per
    step kind of the declaration (success and failure). ``check()``: a refusal decided
    before anything of the same trigger is acquired (raises; None: nothing to check).
    """

    acquire: Callable[[], Owner] | None
    releases: Releases
    check: Callable[[], None] | None = None


HandlerFactory = Callable[[Any], Handler]
"""Builds a kind's ``Handler`` from the session's context: its ``DistributedActions``."""


@dataclass(frozen=True, eq=False)
class Resource:
    """The declaration of one kind of resource a session can hold; compared by identity.

    ``value``: its public name. ``order``: its place in the teardown order (lower is
    released first). ``success`` / ``failure``: the steps that release it at the end of
    a run of that outcome, in order. ``acquired_by``: the trigger whose work acquires
    it (None: acquired while live, by ``Session.acquire`` or one of the session's own
    methods: ``register``, ``track_checkpoints``, ``install_signal_handlers``).
    ``handler(context)``: its ``Handler``, built from the session's ``DistributedActions``;
    None for the built-in kinds, whose handlers the actions give (``actions.handler(kind)``:
    one implementation per kind, no method per step), and for the kinds the session's own
    methods record. ``wrapper``: see ``WrapperRole``. ``probe()``: True while one exists in this
    process, whoever made it (None: not observable). ``named``: several instances,
    told apart by name, may be held at once. ``identity()``: the live object itself (or
    None), so that what an earlier session left is told apart from what the caller
    created since (held only weakly). ``held_in_frames_of``: packages whose functions
    take it as an argument, so that the frames of a failure's traceback in them keep
    it alive; a failure clears their locals before its teardown (``lifecycle._core.frames``).
    ``retry_release``: a release that raised
    may run again in a later plan (the library's own releases tolerate partial state);
    False: it runs at most once per session, and a failure leaves the resource alone.
    """

    value: str
    order: int
    success: tuple[StepKind, ...]
    failure: tuple[StepKind, ...]
    acquired_by: Trigger | None = None
    handler: HandlerFactory | None = field(default=None, repr=False)
    wrapper: WrapperRole = WrapperRole.NONE
    probe: Callable[[], bool] | None = field(default=None, repr=False)
    named: bool = False
    retry_release: bool = True
    identity: Callable[[], object] | None = field(default=None, repr=False)
    held_in_frames_of: tuple[str, ...] = ()

    RENDEZVOUS_STORE: ClassVar[Resource]
    PROCESS_GROUP: ClassVar[Resource]
    MODEL_PARALLEL: ClassVar[Resource]
    MICROBATCH_CALCULATOR: ClassVar[Resource]
    RERUN_STATE_MACHINE: ClassVar[Resource]
    SIGNAL_HANDLERS: ClassVar[Resource]
    ASYNC_CHECKPOINT: ClassVar[Resource]
    USER: ClassVar[Resource]

    @property
    def steps(self) -> tuple[StepKind, ...]:
        """Every step kind of this resource, success steps first, each once."""
        return tuple(dict.fromkeys(self.success + self.failure))

    def steps_for(self, failure: bool) -> tuple[StepKind, ...]:
        """The steps that release it after a failure (``failure``) or a success."""
        return self.failure if failure else self.success

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"Resource.{self.value.upper()}"

    def __reduce__(self) -> tuple[object, ...]:
        return (_resource, (self.value,))


_DECLARED: dict[str, Resource] = {}
_STEP_RANK: dict[StepKind, tuple[int, int]] = {}
_STEP_OWNER: dict[StepKind, Resource] = {}
_STEPS_BY_NAME: dict[str, StepKind] = {}


def declare_resource(resource: Resource) -> Resource:
    """Add ``resource`` to the declared kinds (after those declared before it) and return it.

    Raises ``ValueError`` if its name or one of its step kinds' names is taken, if a
    step kind is declared twice, if a success or failure list is empty, or if a step
    other than the last of each list ``releases`` (or the last does not).
    """
    if resource.value in _DECLARED:
        raise ValueError(f"a resource kind named {resource.value!r} is already declared")
    if not resource.success or not resource.failure:
        raise ValueError(f"{resource.value}: every resource has at least one success and one failure step")
    for path in (resource.success, resource.failure):
        if [step.releases for step in path] != [False] * (len(path) - 1) + [True]:
            raise ValueError(f"{resource.value}: the last step of each outcome, and only it, releases the resource")
    steps = resource.steps
    if len({step.value for step in steps}) != len(steps):
        raise ValueError(f"{resource.value}: two of its step kinds share a name")
    for step in steps:
        if step.value in _STEPS_BY_NAME:
            raise ValueError(f"step kind {step.value!r} is already declared")
    _DECLARED[resource.value] = resource
    for index, step in enumerate(steps):
        _STEP_RANK[step] = (resource.order, index)
        _STEP_OWNER[step] = resource
        _STEPS_BY_NAME[step.value] = step
    return resource


def undeclare_resource(resource: Resource) -> None:
    """Remove a kind ``declare_resource`` added (tests declare kinds of their own); a no-op if it is not declared."""
    if _DECLARED.get(resource.value) is not resource:
        return
    del _DECLARED[resource.value]
    for step in resource.steps:
        del _STEP_RANK[step], _STEP_OWNER[step], _STEPS_BY_NAME[step.value]


def declared_resources() -> tuple[Resource, ...]:
    """Every declared resource kind, in declaration order (the order a session acquires them in)."""
    return tuple(_DECLARED.values())


def _resource(name: str) -> Resource:
    """The declared kind named ``name`` (for unpickling); ``KeyError`` if none is."""
    return _DECLARED[name]


def _step_kind(name: str) -> StepKind:
    """The declared step kind named ``name`` (for unpickling); ``KeyError`` if none is."""
    return _STEPS_BY_NAME[name]


def live_resources() -> tuple[Resource, ...]:
    """The declared kinds with an observable resource alive in this process now, whoever made it."""
    return tuple(resource for resource in declared_resources() if resource.probe is not None and resource.probe())


# -- probes: read modules already imported, import nothing ------------------------------------


def _module_attr(module: str, name: str) -> Any:
    """``module.name`` if ``module`` is already imported, else None."""
    loaded = sys.modules.get(module)
    return None if loaded is None else getattr(loaded, name, None)


def _process_group_alive() -> bool:
    is_initialized = _module_attr("torch.distributed", "is_initialized")
    return bool(is_initialized is not None and is_initialized())


def _model_parallel_alive() -> bool:
    initialized = _module_attr("megatron.core.parallel_state", "model_parallel_is_initialized")
    return bool(initialized is not None and initialized())


def _global_set(module: str, name: str) -> Callable[[], bool]:
    def probe() -> bool:
        return _module_attr(module, name) is not None

    return probe


def _global(module: str, name: str) -> Callable[[], object]:
    def identity() -> object:
        return _module_attr(module, name)

    return identity


def _store_hosted() -> bool:
    hosted = _module_attr("lifecycle._torch.store", "HOSTED")
    return bool(hosted)


def _default_group() -> object:
    group = _module_attr("torch.distributed", "group")
    return None if group is None or not _process_group_alive() else getattr(group, "WORLD", None)


# -- the built-in kinds, in acquisition order -------------------------------------------------

StepKind.FINALIZE_CHECKPOINTS = StepKind("finalize_checkpoints")
StepKind.ABORT_CHECKPOINTS = StepKind("abort_checkpoints", unblocks=True)
StepKind.RELEASE_USER_RESOURCE = StepKind("release_user_resource")
StepKind.DESTROY_RERUN_STATE_MACHINE = StepKind("destroy_rerun_state_machine")
StepKind.DESTROY_MICROBATCH_CALCULATOR = StepKind("destroy_microbatch_calculator")
StepKind.DESTROY_MODEL_PARALLEL = StepKind("destroy_model_parallel")
StepKind.ABORT_MODEL_PARALLEL = StepKind("abort_model_parallel")
StepKind.BARRIER = StepKind("barrier", releases=False)
StepKind.DESTROY_PROCESS_GROUP = StepKind("destroy_process_group")
StepKind.ABORT_PROCESS_GROUP = StepKind("abort_process_group", unblocks=True)
StepKind.CLOSE_STORE = StepKind("close_store")
StepKind.RESTORE_SIGNAL_HANDLERS = StepKind("restore_signal_handlers", abandonable=False, main_thread=True)

Resource.RENDEZVOUS_STORE = declare_resource(
    Resource(
        "rendezvous_store",
        order=850,
        success=(StepKind.CLOSE_STORE,),
        failure=(StepKind.CLOSE_STORE,),
        acquired_by=Trigger.INIT_DISTRIBUTED,
        # Rank-local and instant, so the session closes it itself, also under the
        # restart wrapper (whose path passes a store it keeps: the caller's, left alone).
        probe=_store_hosted,
        identity=_global("lifecycle._torch.store", "HOSTED"),  # a set: the leak guard compares each store by object
    )
)

Resource.PROCESS_GROUP = declare_resource(
    Resource(
        "process_group",
        order=800,
        success=(StepKind.BARRIER, StepKind.DESTROY_PROCESS_GROUP),
        failure=(StepKind.ABORT_PROCESS_GROUP,),
        acquired_by=Trigger.INIT_DISTRIBUTED,
        wrapper=WrapperRole.RELEASES,
        probe=_process_group_alive,
        identity=_default_group,
        held_in_frames_of=("torch",),
    )
)
Resource.MODEL_PARALLEL = declare_resource(
    Resource(
        "model_parallel",
        order=600,
        success=(StepKind.DESTROY_MODEL_PARALLEL,),
        # Its groups aborted before Megatron's own destroy, which would wait on pending work.
        failure=(StepKind.ABORT_MODEL_PARALLEL,),
        acquired_by=Trigger.INIT_GLOBALS,
        wrapper=WrapperRole.RELEASES,
        probe=_model_parallel_alive,
        identity=_global("megatron.core.parallel_state", "_TENSOR_MODEL_PARALLEL_GROUP"),
        held_in_frames_of=("torch",),
    )
)


def _megatron_global(value: str, order: int, step: StepKind, module: str, name: str) -> Resource:
    """A Megatron-core global held in one module attribute: one step on either outcome, the wrapper's on failure."""
    return Resource(
        value,
        order=order,
        success=(step,),
        failure=(step,),
        acquired_by=Trigger.INIT_GLOBALS,
        wrapper=WrapperRole.RELEASES,
        probe=_global_set(module, name),
        identity=_global(module, name),
    )


Resource.MICROBATCH_CALCULATOR = declare_resource(
    _megatron_global(
        "microbatch_calculator",
        500,
        StepKind.DESTROY_MICROBATCH_CALCULATOR,
        "megatron.core.num_microbatches_calculator",
        "_GLOBAL_NUM_MICROBATCHES_CALCULATOR",
    )
)
Resource.RERUN_STATE_MACHINE = declare_resource(
    _megatron_global(
        "rerun_state_machine",
        400,
        StepKind.DESTROY_RERUN_STATE_MACHINE,
        "megatron.core.rerun_state_machine",
        "_GLOBAL_RERUN_STATE_MACHINE",
    )
)
Resource.SIGNAL_HANDLERS = declare_resource(
    Resource(
        "signal_handlers",
        order=900,
        success=(StepKind.RESTORE_SIGNAL_HANDLERS,),
        failure=(StepKind.RESTORE_SIGNAL_HANDLERS,),
    )
)
Resource.ASYNC_CHECKPOINT = declare_resource(
    Resource(
        "async_checkpoint",
        order=100,
        success=(StepKind.FINALIZE_CHECKPOINTS,),
        failure=(StepKind.ABORT_CHECKPOINTS,),
        wrapper=WrapperRole.ABORTS_WHILE_HELD,
    )
)
Resource.USER = declare_resource(
    Resource(
        "user",
        order=200,
        success=(StepKind.RELEASE_USER_RESOURCE,),
        failure=(StepKind.RELEASE_USER_RESOURCE,),
        named=True,
        retry_release=False,
    )
)
