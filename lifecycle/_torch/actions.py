"""``TorchActions``: the real ``DistributedActions``, on torch.distributed and megatron-core.

The facade the session drives: ``handler(kind)`` gives each built-in kind's ``Handler``,
made of this object's ``init_*`` and release methods; ``store``, ``groups`` and
``megatron`` beside it hold the pieces. Every ``init_*`` either acquires its one
resource and reports who owns it, or raises having acquired nothing; every release
tolerates partial state.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import (  # type: ignore[attr-defined]  # re-exported at runtime
    PrefixStore,
    Store,
)

from lifecycle._core.bounds import Bounds
from lifecycle._core.errors import ConfigError, LifecycleError, ResourceMismatch
from lifecycle._core.frames import clear_frames_of
from lifecycle._core.ownership import Owner, Resource
from lifecycle._core.resources import Handler, StepKind
from lifecycle._core.seams import Announcement
from lifecycle._torch.config import (
    DistributedConfig,
    ParallelConfig,
    Rendezvous,
    cuda_device_index,
    set_nccl_environment,
    validate,
)
from lifecycle._torch.groups import abort_group, destroy_world
from lifecycle._torch.megatron import live_resources
from lifecycle._torch.megatron_actions import MegatronActions
from lifecycle._torch.notice import publish, store_name
from lifecycle._torch.store import (
    agree_attempt,
    attempt_prefix,
    generation,
    next_store_prefix,
    open_store,
    rendezvoused_through,
)

__all__ = ["TorchActions", "live_resources", "next_store_prefix"]

_ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], Any]

_NO_GROUP_YET = "this rank failed before its process group existed: the ranks had no attempt to publish in yet"


class TorchActions(MegatronActions):
    """``DistributedActions`` on real torch.distributed process groups and megatron-core globals.

    ``distributed`` says how to create the default group, ``parallel`` how to lay out
    Megatron's model-parallel state.

    The rendezvous store: ``init_store`` opens one (rank 0 hosts it, unless torchrun's
    agent serves it) and ``close_store`` drops it; or the caller passes ``store``, one
    it keeps across sessions (then lifecycle never closes it). ``store_prefix`` names
    this attempt's keys in the store; it must differ from every earlier attempt's on the
    same store (the in-process restart wrapper passes one per iteration), so it serves
    one group creation. None: the ranks agree on the attempt through the store at each
    creation (``agree_attempt``) and its prefix is ``attempt_prefix(attempt, generation)``.

    Each ``init_*`` returns ``Owner.SESSION`` if it created its resource and
    ``Owner.CALLER`` if it found it already there (after checking that it agrees with
    the configuration, else ``ResourceMismatch``; ``StaleResource`` if it is left from
    an earlier world or half-made); if it raises, it has acquired nothing. Each
    release method releases exactly its one resource, tolerates it being partly or
    wholly gone, and never runs a collective, except ``barrier`` (and, on the success
    path only, the group destroy that follows it).

    One object can serve several sessions in turn, one at a time.
    """

    def __init__(
        self,
        distributed: DistributedConfig,
        parallel: ParallelConfig,
        *,
        store_prefix: str | None = None,
        store: Store | None = None,
    ) -> None:
        """Bind the configuration; acquire nothing (validation happens in ``init_store``)."""
        self.distributed = distributed
        self.parallel = parallel
        self._fixed_prefix = store_prefix
        self._fixed_prefix_used = False
        self._prefix: str | None = None
        self._attempt: int | None = None
        self._created_group = False
        self._kept_store = store
        # The store in use; whether this object opened it (then close_store drops it, so
        # a hosted server stops listening and a client's socket closes); whether
        # init_process_group opened it on its own (then the group's release drops it).
        self._store: Store | None = None
        self._opened_store = False
        self._store_with_group = False
        self._hosts_store = False
        # (hook before init, hook torch installed): init_process_group wraps
        # sys.excepthook on every call, so without restoring it each retry nests one more.
        self._hooks: tuple[_ExceptHook, _ExceptHook] | None = None
        # Where this attempt's failure notices go (this rank, the group's prefix, who hosts the
        # store), or why nowhere. Never the store itself: close_store must drop the last reference.
        self._notices: tuple[int, str, str] | str = _NO_GROUP_YET

    # -- read-only views -------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's rank in the default group; ``MissingResource`` if there is none."""
        self._require_group("rank")
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        """The default group's size; ``MissingResource`` if there is none."""
        self._require_group("world_size")
        return dist.get_world_size()

    @property
    def store_prefix(self) -> str | None:
        """The store prefix of the group this object created last, or None if it never created one."""
        return self._prefix

    @property
    def release_timeout_s(self) -> float:
        """The longest one teardown step may run before it is left running: twice the group timeout.

        A safety net (``BoundsReleases``; ``Session(release_timeout_s=...)`` overrides it),
        above a healthy checkpoint finalize (``Bounds.release_timeout_s`` says why).
        """
        return Bounds(self.distributed.timeout_s).release_timeout_s

    @property
    def attempt(self) -> int | None:
        """The attempt the ranks agreed on for the group this object created last (None: none, or not agreed)."""
        return self._attempt

    # -- one handler per built-in kind ----------------------------------------------------

    def handler(self, resource: Resource) -> Handler:
        """The ``Handler`` of a built-in kind, bound to this object (``DistributedActions``); ``LookupError`` otherwise.

        The store's and the group's handlers check the fixed ``store_prefix`` before
        anything of ``init_distributed`` is acquired (``check_store_prefix``).
        """
        handlers: dict[Resource, Callable[[], Handler]] = {
            Resource.RENDEZVOUS_STORE: lambda: Handler(
                self.init_store, {StepKind.CLOSE_STORE: self.close_store}, self.check_store_prefix
            ),
            Resource.PROCESS_GROUP: lambda: Handler(
                self.init_process_group,
                {
                    StepKind.BARRIER: self.barrier,
                    StepKind.DESTROY_PROCESS_GROUP: self.destroy_process_group,
                    StepKind.ABORT_PROCESS_GROUP: self.abort_process_group,
                },
                self.check_store_prefix,
            ),
            Resource.MODEL_PARALLEL: lambda: Handler(
                self.init_model_parallel,
                {
                    StepKind.DESTROY_MODEL_PARALLEL: self.destroy_model_parallel,
                    StepKind.ABORT_MODEL_PARALLEL: self.abort_model_parallel,
                },
            ),
            Resource.MICROBATCH_CALCULATOR: lambda: Handler(
                self.init_microbatch_calculator,
                {StepKind.DESTROY_MICROBATCH_CALCULATOR: self.destroy_microbatch_calculator},
            ),
            Resource.RERUN_STATE_MACHINE: lambda: Handler(
                self.init_rerun_state_machine,
                {StepKind.DESTROY_RERUN_STATE_MACHINE: self.destroy_rerun_state_machine},
            ),
        }
        make = handlers.get(resource)
        if make is None:
            raise LookupError(f"TorchActions has no handler for the resource kind {resource.value!r}")
        return make()

    def check_store_prefix(self) -> None:
        """``ConfigError`` if the fixed ``store_prefix`` already served a group (one prefix serves one attempt).

        A refusal: checked before the store is opened or the group created.
        """
        if self._fixed_prefix is not None and self._fixed_prefix_used and not dist.is_initialized():
            # A second creation under one prefix could read the first one's keys.
            raise ConfigError(
                "store_prefix",
                f"{self._fixed_prefix!r} was already used for a group (one prefix serves one attempt, else the new "
                "group could read the old one's keys); pass a new one per attempt, or None to agree on one "
                "through the store at each creation",
            )

    # -- the rendezvous store ----------------------------------------------------------

    def init_store(self) -> Owner:
        """Open the rendezvous store (``Owner.SESSION``), or take the caller's (``Owner.CALLER``).

        The caller's: the ``store`` given to the constructor, or none at all when a
        default group already exists (the caller's group needs no rendezvous). Otherwise
        the whole configuration is validated first (``ConfigError`` naming the field),
        then rank 0 hosts a ``TCPStore`` at ``master_addr:master_port`` (listening on
        every interface) and the other ranks connect to it, retrying until
        ``timeout_s``; under torchrun every rank connects to its agent's store. The
        server hosted here lives until ``close_store`` (and the group made on it) drop it.
        """
        self._notices = _NO_GROUP_YET
        if dist.is_initialized() or self._kept_store is not None:
            self._store = self._kept_store
            return Owner.CALLER
        rendezvous = validate(self.distributed, self.parallel)
        self._store = open_store(rendezvous, timedelta(seconds=Bounds(self.distributed.timeout_s).store_timeout_s))
        self._opened_store = True
        self._hosts_store = rendezvous.rank == 0 and not rendezvous.use_agent_store
        return Owner.SESSION

    def close_store(self) -> None:
        """Drop the store this object opened (a no-op for the caller's); rank-local, never waits.

        A hosted server stops listening once nothing else holds it: a group made on it
        holds it until the group is destroyed or aborted (released before this).
        """
        if self._opened_store:
            self._store = None
            self._opened_store = False

    # -- the default process group ---------------------------------------------------

    def init_process_group(self) -> Owner:
        """Create the default group (``Owner.SESSION``), or find one (``Owner.CALLER``).

        Found: its world size and rank must agree with the configuration (or the
        environment), else ``ResourceMismatch``. Otherwise the whole configuration is
        validated first (``ConfigError`` naming the field; ``store_prefix`` if the fixed
        prefix was already used for a group), then the store (see ``init_store``; it
        opens one itself if that was not called, and then the group's release drops
        it) is wrapped in a ``PrefixStore`` unique to this attempt (agreed by all ranks
        through the store, unless a fixed ``store_prefix`` was given), and the group is
        created on it with ``timeout_s``. For nccl the CUDA device (``cuda_device_index``:
        ``local_rank``, or the one visible device) is selected first, the NCCL defaults
        are set (``set_nccl_environment``), and the device is bound to the group. If
        creation raises, the half-made group (if any) is aborted before the error
        propagates; ``AttemptDisagreement`` if the ranks do not agree on an attempt
        within ``timeout_s``.
        """
        self._notices = _NO_GROUP_YET
        if dist.is_initialized():
            self._check_found_group()
            self._created_group = False
            self._notices = "the default process group is the caller's: lifecycle agreed on no attempt to publish in"
            return Owner.CALLER
        rendezvous = validate(self.distributed, self.parallel)
        device = self._select_device(rendezvous)
        self.check_store_prefix()
        if self._store is None:  # used on its own, without init_store: the group's release drops it
            self.init_store()
            self._store_with_group = self._opened_store
        hook_before = sys.excepthook
        try:
            prefix = self._create_group(rendezvous, device)
        except BaseException as exc:
            self._undo_failed_init(hook_before, exc, rendezvous)
            raise
        self._prefix = prefix
        self._created_group = True
        self._hooks = (hook_before, sys.excepthook)
        self._notices = self._notice_target(rendezvous, prefix)
        return Owner.SESSION

    def announce_failure(self, error: BaseException, *, phase: str, step: int | None, time: float) -> Announcement:
        """Tell the other ranks this one failed, through the store of the group it created (``AnnouncesFailures``).

        The notice (``lifecycle._torch.notice``) goes under the group's store prefix, the
        attempt the ranks agreed on, through this rank's client of the store: quick on a
        live store (see docs/benchmarks.md, notice-live-store), at once when its server is
        gone (its host failed), never more than ``notice.DEADLINE_S``, and never an
        ``Exception``. Nothing is published before this object created a group, on a
        caller's group, or once the store is closed (``unpublished`` says which).
        """
        if isinstance(self._notices, str):
            return Announcement(None, self._notices)
        store = self._store
        if store is None:
            return Announcement(None, "the rendezvous store was already closed")
        rank, prefix, hosted_by = self._notices
        name = store_name(store, hosted_by)
        return publish(store, prefix, name=name, rank=rank, error=error, phase=phase, step=step, at=time)

    def barrier(self) -> None:
        """Wait until every rank of the default group arrives (success teardown only)."""
        dist.barrier()

    def destroy_process_group(self) -> None:
        """Destroy the default group (and every group left in it); a no-op if there is none.

        The success plan runs ``barrier`` right before this, so no peer is still using it.
        gloo groups are freed in parallel (``groups.destroy_world``), not a tick of gloo's
        socket loop per group and peer one after the other.
        """
        try:
            if dist.is_initialized():
                destroy_world()
        finally:
            self._forget_group()

    def abort_process_group(self) -> None:
        """Failure path: abort every group now: no barrier, no collective, no wait on outstanding work.

        Afterwards ``torch.distributed.is_initialized()`` is False (else ``LifecycleError``),
        so a new session can start in this process, and peers blocked in a collective
        with this rank get a connection error instead of waiting for the timeout. With
        gloo that needs the groups' last references gone: torch's and megatron-core's
        are (see ``destroy_model_parallel``), but a group kept elsewhere (a model, a
        local variable in the failing frame) keeps its connections open until it goes.
        """
        try:
            if dist.is_initialized():
                abort_group(None)
        finally:
            self._forget_group()
        if dist.is_initialized():
            raise LifecycleError(
                f"{Resource.PROCESS_GROUP.value}: the default process group is still initialized after abort"
            )

    # -- internals -------------------------------------------------------------------

    def _check_found_group(self) -> None:
        world, rank = self.distributed.resolve_world()
        have_world, have_rank = dist.get_world_size(), dist.get_rank()
        if world is not None and world != have_world:
            raise ResourceMismatch(
                Resource.PROCESS_GROUP.value,
                have_world,
                world,
                "world size",
                "the default process group is the caller's: create it with the configured world size, "
                "or configure the one it has (DistributedConfig.world_size, or WORLD_SIZE)",
            )
        if rank is not None and rank != have_rank:
            raise ResourceMismatch(
                Resource.PROCESS_GROUP.value,
                have_rank,
                rank,
                "rank",
                "this process has that rank in the caller's default process group: create the group with "
                "the configured rank, or configure the one it has (DistributedConfig.rank, or RANK)",
            )
        self.parallel.check_world(have_world)

    def _select_device(self, rendezvous: Rendezvous) -> torch.device | None:
        """For nccl: pick the CUDA device (``cuda_device_index``), select it, set the NCCL defaults; None for gloo."""
        if self.distributed.backend != "nccl":
            return None
        if not torch.cuda.is_available():
            raise ConfigError("distributed.backend", "nccl needs CUDA, and torch.cuda.is_available() is False")
        index = cuda_device_index(rendezvous.local_rank, torch.cuda.device_count())
        # Before the group exists: torch reads these at each nccl group's creation.
        set_nccl_environment()
        # Before the group exists, so NCCL and every later CUDA call land on this device.
        torch.cuda.set_device(index)
        return torch.device("cuda", index)

    def _create_group(self, rendezvous: Rendezvous, device: torch.device | None) -> str:
        """Agree on the attempt (unless the prefix is fixed), then create the group on its prefix; return the prefix."""
        assert self._store is not None
        self._attempt = None
        if self._fixed_prefix is not None:
            prefix = self._fixed_prefix
            self._fixed_prefix_used = True
        elif rendezvous.world_size == 1:
            prefix = next_store_prefix()  # nobody to agree with
        else:
            self._attempt = agree_attempt(
                self._store,
                rank=rendezvous.rank,
                world_size=rendezvous.world_size,
                generation=generation(),
                timeout_s=self.distributed.timeout_s,
                where=f"{rendezvous.master_addr}:{rendezvous.master_port}",
            )
            prefix = attempt_prefix(self._attempt, generation())
        # From here this session's rendezvous uses the store's server: the next session
        # must wait for the host's next one, even if this one fails before the group exists.
        rendezvoused_through(self._store)
        kwargs: dict[str, Any] = {} if device is None else {"device_id": device}
        world = dist.distributed_c10d._world
        if not world.pg_map:
            # torch names groups by a process-wide count, reset when the default group is
            # destroyed but not when its creation fails; a rank whose last creation failed
            # would name its groups one ahead of its peers', and their rendezvous keys
            # would never meet (measured: both ranks wait for the timeout).
            world.group_count = 0
        dist.init_process_group(
            backend=self.distributed.backend,
            store=PrefixStore(prefix, self._store),
            rank=rendezvous.rank,
            world_size=rendezvous.world_size,
            timeout=timedelta(seconds=self.distributed.timeout_s),
            **kwargs,
        )
        return prefix

    def _undo_failed_init(self, hook_before: _ExceptHook, exc: BaseException, rendezvous: Rendezvous) -> None:
        """Leave nothing behind after ``init_process_group`` raised: no group, no hook (no store it opened itself)."""
        if dist.is_initialized():
            try:
                abort_group(None)
            except Exception as cleanup:  # noqa: BLE001 - the original error is the one to raise
                exc.add_note(f"lifecycle: aborting the half-made process group also failed: {cleanup!r}")
        installed = sys.excepthook
        if installed is not hook_before and getattr(installed, "__name__", "") == "_distributed_excepthook":
            sys.excepthook = hook_before
        if isinstance(exc, dist.DistNetworkError) and self._opened_store and not self._hosts_store:
            host = "torchrun's agent" if rendezvous.use_agent_store else "rank 0"
            attempt = "" if self._attempt is None else f" of attempt {self._attempt}"
            exc.add_note(
                f"lifecycle: the rendezvous store at {rendezvous.master_addr}:{rendezvous.master_port} (hosted by "
                f"{host}) went away while this rank was in the rendezvous{attempt}: {host} failed or stopped "
                "during its own setup; its log or journal has the cause"
            )
        if self._store_with_group:
            self._store_with_group = False
            self.close_store()
        # torch's failed frames still reference the store through their locals; clear
        # those (and only those: never the caller's) so a hosted server stops listening
        # now, not when the exception is collected. The traceback's lines are kept.
        clear_frames_of(exc, ("torch",))

    def _notice_target(self, rendezvous: Rendezvous, prefix: str) -> tuple[int, str, str]:
        """Where the failure notices of the group just created on ``prefix`` go: (rank, prefix, who hosts the store)."""
        hosted_by = ""
        if self._opened_store:
            hosted_by = "torchrun's agent" if rendezvous.use_agent_store else "rank 0"
        return rendezvous.rank, prefix, hosted_by

    def _forget_group(self) -> None:
        """After the default group is gone: drop a store opened with it, restore ``sys.excepthook``."""
        if self._store_with_group:
            self._store_with_group = False
            self.close_store()
        self._created_group = False
        if self._hooks is not None:
            before, installed = self._hooks
            if sys.excepthook is installed:  # leave a hook someone set since alone
                sys.excepthook = before
            self._hooks = None
