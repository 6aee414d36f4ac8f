"""In-process restart: sessions run by NVIDIA Resiliency Extension's ``inprocess.Wrapper``.

Under the Wrapper a failure on any rank restarts the wrapped function on every rank,
in the same processes. The session releases on a failure only what is rank-local
(in-flight checkpoints, user resources, signal handlers) and leaves the process group
and the Megatron-core globals to the Wrapper, which runs this module's ``abort()`` (in
its monitor thread, to unblock a main thread stuck in a collective) and then
``finalize()`` (in the main thread, before the next iteration). Both run the steps of
the ordinary failure plan for what the session deferred (``wrapper_plan``).

A session learns that it runs under the Wrapper from the ``CallWrapper`` the Wrapper
injects into the wrapped function (``session_for``); the iteration comes from it too.

No ``from __future__ import annotations`` here, on purpose: the Wrapper finds the
parameter to inject its ``CallWrapper`` into by evaluating annotations at run time,
and fails on string or subscripted annotations. ``run`` gives it a thin entry
function with one plainly annotated parameter.
"""

import dataclasses
import datetime
import gc
import inspect
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
from nvidia_resiliency_ext.inprocess import CallWrapper, Compose, Wrapper
from nvidia_resiliency_ext.inprocess.abort import Abort
from nvidia_resiliency_ext.inprocess.exception import HealthCheckError, RestartAbort
from nvidia_resiliency_ext.inprocess.finalize import Finalize
from nvidia_resiliency_ext.inprocess.health_check import HealthCheck
from nvidia_resiliency_ext.inprocess.initialize import RetryController
from torch.distributed import Store  # type: ignore[attr-defined]  # re-exported at runtime

from lifecycle._core.bounds import Bounds
from lifecycle._core.errors import ConfigError, ForeignResource, check_number
from lifecycle._core.executor import raise_failures
from lifecycle._core.exports import publish
from lifecycle._core.plans import RestartMode
from lifecycle._core.resources import WrapperRole, live_resources
from lifecycle._core.seams import DistributedActions
from lifecycle._core.session import Session
from lifecycle._core.wrapped import ATTEMPTS, teardown_table, wrapper_plan
from lifecycle._torch.actions import TorchActions
from lifecycle._torch.config import LOOPBACK, validate
from lifecycle._torch.store import open_store
from lifecycle._training.callbacks import Callback
from lifecycle._training.config import PretrainConfig
from lifecycle._training.decide import RestartPolicy
from lifecycle._training.pretrain import BatchProvider, ForwardStepFunc, ModelProvider, PretrainResult, pretrain
from lifecycle.journal import run_id
from lifecycle.restart._decisions import DecideAfterFailure, Decisions, RestartStopped, StopWhenDecided
from lifecycle.restart._nvml import NvmlHealthChecksOff, drop_nvml_health_checks

__all__ = [
    "CudaHealthCheck",
    "NvmlHealthChecksOff",
    "RestartStopped",
    "SessionAbort",
    "SessionFinalize",
    "abort",
    "finalize",
    "make_wrapper",
    "restart_mode_from",
    "run",
    "session_for",
    "teardown_table",
    "wrapped_pretrain",
    "wrapper_plan",
    "wrapper_timeouts",
]

T = TypeVar("T")

_ENV_KEYS = ("RANK", "WORLD_SIZE")  # the Wrapper rewrites these


# -- sessions under the Wrapper ------------------------------------------------------------


def restart_mode_from(call_wrapper: CallWrapper | None) -> tuple[RestartMode, int]:
    """Return ``(INPROCESS, call_wrapper.iteration)`` under the Wrapper, ``(ORDINARY, 0)`` for None.

    ``call_wrapper`` must be the object the Wrapper injected (a ``CallWrapper``):
    anything else raises ``TypeError``, so a stray flag cannot switch the mode.
    """
    if call_wrapper is None:
        return RestartMode.ORDINARY, 0
    if not isinstance(call_wrapper, CallWrapper):
        raise TypeError(f"expected the Wrapper's CallWrapper or None, got {type(call_wrapper).__name__}")
    return RestartMode.INPROCESS, int(call_wrapper.iteration)


def session_for(
    call_wrapper: CallWrapper | None, actions_factory: Callable[[str | None], DistributedActions]
) -> Session:
    """Build the session of this call of the wrapped function (one per call).

    Under the Wrapper (``call_wrapper`` is its ``CallWrapper``): the actions are built
    with a store prefix unique to this Wrapper call and iteration (all ranks make the
    same Wrapper calls, so their prefixes agree); the session has restart mode
    ``inprocess`` and the Wrapper's iteration (journaled by ``init_distributed``); it
    refuses a process group or Megatron globals the caller created; and it becomes the
    live attempt whose deferred resources ``abort()`` and ``finalize()`` release. With
    None: an ordinary session, actions built with no prefix, nothing registered.
    """
    mode, iteration = restart_mode_from(call_wrapper)
    if mode is RestartMode.ORDINARY:
        return Session(actions_factory(None))
    return ATTEMPTS.begin(call_wrapper, iteration, actions_factory)


# -- the Wrapper's abort and finalize ------------------------------------------------------


class SessionAbort(Abort):  # type: ignore[misc]  # NVRx is untyped
    """The Wrapper's ``abort``: in its monitor thread, unblock the live attempt's main thread.

    Runs the steps of ``wrapper_plan`` whose kind ``unblocks``: abandon in-flight
    checkpoints (rank-local), then abort every process group without waiting on
    outstanding collectives. Never a collective, never a barrier. Does nothing without a live
    attempt. Step failures are kept and raised by ``SessionFinalize``.
    """

    def __call__(self, state: Any) -> Any:
        """Run the abort steps; return ``state`` unchanged (the Wrapper chains it)."""
        attempt = ATTEMPTS.attempt
        if attempt is not None:
            attempt.release(unblocking_only=True)
        return state


class SessionFinalize(Finalize):  # type: ignore[misc]  # NVRx is untyped
    """The Wrapper's ``finalize``: in the main thread, release what the failed attempt still owes.

    Runs every step of ``wrapper_plan`` that ``SessionAbort`` did not: destroy the
    rerun state machine, the microbatch calculator and the model-parallel state (and
    the abort steps too, if no abort ran), so the next iteration can create them again,
    and forgets the attempt. Raises ``TeardownError`` grouping every step of this
    attempt's abort or finalize that failed (an interruption of a step is raised after,
    from the group): the Wrapper then stops instead of restarting on top of live state.
    """

    def __call__(self, state: Any) -> Any:
        """Run the remaining steps; return ``state`` unchanged, or raise ``TeardownError``."""
        attempt = ATTEMPTS.take()
        ATTEMPTS.last_failure = f"iteration {state.iteration} failed with {state.fn_exception!r}"
        if attempt is not None:
            attempt.release(unblocking_only=False)
            raise_failures(attempt.failures)
        return state


def abort() -> SessionAbort:
    """A new ``SessionAbort``, for the Wrapper's ``abort=`` parameter."""
    return SessionAbort()


def finalize() -> SessionFinalize:
    """A new ``SessionFinalize``, for the Wrapper's ``finalize=`` parameter."""
    return SessionFinalize()


class CudaHealthCheck(HealthCheck):  # type: ignore[misc]  # NVRx is untyped
    """The Wrapper's health check on CUDA: before each iteration, this rank's device must finish its work and run more.

    A no-op until CUDA is initialized in this process (the first iteration, a CPU run).
    Otherwise, on the current device (the one the session bound, see
    ``cuda_device_index``): wait up to ``timeout_s`` for its pending work
    (``torch.cuda.synchronize`` in a daemon thread: a hung kernel cannot be cancelled),
    then run one small kernel and synchronize again, which raises on a corrupted
    context. Raises NVRx's ``HealthCheckError`` otherwise: the Wrapper then ends this
    rank instead of restarting on a broken device. NVRx's own ``CudaHealthCheck`` picks
    the device ``LOCAL_RANK``, which does not exist with one visible GPU per process.
    """

    def __init__(self, timeout_s: float = 30.0) -> None:
        """Wait at most ``timeout_s`` seconds for the device's pending work."""
        self.timeout_s = timeout_s

    def __call__(self, state: Any) -> Any:
        """Check the device; return ``state`` unchanged (the Wrapper chains it), or raise ``HealthCheckError``."""
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):  # type: ignore[no-untyped-call]
            return state
        device = torch.cuda.current_device()
        failures: list[BaseException] = []

        def drain() -> None:
            try:
                torch.cuda.synchronize(device)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread below
                failures.append(exc)

        thread = threading.Thread(target=drain, name="lifecycle-cuda-health", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            raise HealthCheckError(f"CUDA device {device}: pending work did not finish within {self.timeout_s} s")
        try:
            if failures:
                raise failures[0]
            probe = torch.ones(1, device=device) + 1
            torch.cuda.synchronize(device)
            if probe.item() != 2.0:
                raise RuntimeError(f"1 + 1 gave {probe.item()}")
        except Exception as exc:
            raise HealthCheckError(f"CUDA device {device} is not usable: {exc!r}") from exc
        return state


# -- running under the Wrapper -------------------------------------------------------------

_TIMEOUTS = ("soft_timeout", "hard_timeout", "barrier_timeout", "completion_timeout")
_INTERVALS = ("monitor_thread_interval", "monitor_process_interval", "progress_watchdog_interval")
_WATCHDOG_MARGIN = datetime.timedelta(seconds=5)
"""With nccl: how much earlier than the watchdog the Wrapper's hard-timeout kill is done, by default."""


def _nvrx_default(name: str) -> datetime.timedelta:
    default: datetime.timedelta = inspect.signature(Wrapper).parameters[name].default
    return default


def wrapper_timeouts(
    group_timeout_s: float, backend: str = "gloo", overrides: Mapping[str, Any] | None = None
) -> dict[str, datetime.timedelta]:
    """The Wrapper's soft, hard, barrier and completion timeouts for groups of ``group_timeout_s``, in order.

    ``overrides`` (the Wrapper's keyword arguments) win over the computed values; the
    order is checked after them, and ``ConfigError`` names the timeout that breaks it.

    gloo: a stuck gloo collective raises in the main thread at the group timeout, so
    the group fails first: soft = group + 10 s, hard = group + 20 s; refused: soft <= group.

    nccl: the watchdog (the group timeout) must come last (NVRx's requirement): were it
    first, it would act on a hang before NVRx does, killing the process
    (``TORCH_NCCL_ASYNC_ERROR_HANDLING`` 1 or 3, which the session refuses) or aborting the
    communicators under the running iteration (2). NVRx's hard-timeout kill ends by
    hard + ``monitor_process_interval`` + ``termination_grace_time`` (NVRx's defaults, or
    the overrides): hard = group - those - 5 s, soft = hard - 10 s; refused: a kill that
    ends at or after the group timeout, or a computed soft timeout not above the
    monitoring intervals (a group timeout too short: raise it, or pass both timeouts).

    Both: barrier and completion = group + 40 s. NVRx itself checks soft < hard < barrier.
    """
    group = datetime.timedelta(seconds=group_timeout_s)
    given = dict(overrides or {})
    if backend == "nccl":
        interval = given.get("monitor_process_interval", _nvrx_default("monitor_process_interval"))
        grace = given.get("termination_grace_time", _nvrx_default("termination_grace_time"))
        hard = group - interval - grace - _WATCHDOG_MARGIN
        computed = {"soft_timeout": hard - datetime.timedelta(seconds=10), "hard_timeout": hard}
    else:
        computed = {
            "soft_timeout": group + datetime.timedelta(seconds=10),
            "hard_timeout": group + datetime.timedelta(seconds=20),
        }
    computed["barrier_timeout"] = computed["completion_timeout"] = group + datetime.timedelta(seconds=40)
    timeouts = {name: given.get(name, computed[name]) for name in _TIMEOUTS}
    if backend != "nccl":
        if not group < timeouts["soft_timeout"]:
            raise ConfigError("soft_timeout", f"must exceed the group timeout {group_timeout_s} s")
        return timeouts
    kill_done = timeouts["hard_timeout"] + interval + grace
    if not kill_done < group:
        raise ConfigError(
            "hard_timeout",
            f"with nccl the watchdog (group timeout {group_timeout_s} s) must outlast NVRx's hard timeout "
            f"({timeouts['hard_timeout'].total_seconds()} s) plus its monitor_process_interval "
            f"({interval.total_seconds()} s) and termination_grace_time ({grace.total_seconds()} s), or it can "
            "take the rank down before NVRx restarts it; raise DistributedConfig.timeout_s (the group timeout) "
            "or lower hard_timeout",
        )
    # NVRx requires each monitoring interval to be below the soft timeout.
    floor = max(given.get(name, _nvrx_default(name)) for name in _INTERVALS)
    if "soft_timeout" not in given and not floor < timeouts["soft_timeout"]:
        shortest = (floor + interval + grace + _WATCHDOG_MARGIN + datetime.timedelta(seconds=10)).total_seconds()
        raise ConfigError(
            "group_timeout_s",
            f"{group_timeout_s} s is too short for nccl under the Wrapper: its soft timeout would be "
            f"{timeouts['soft_timeout'].total_seconds()} s; use a group timeout above {shortest} s, or pass "
            "soft_timeout and hard_timeout",
        )
    return timeouts


def make_wrapper(
    *,
    max_restarts: int,
    store_port: int | None = None,
    store_host: str | None = None,
    group_timeout_s: float = 60.0,
    backend: str = "gloo",
    journal_dir: str | os.PathLike[str] | None = None,
    policy: RestartPolicy | None = None,
    **wrapper_kwargs: Any,
) -> Wrapper:
    """Build an ``inprocess.Wrapper`` that runs lifecycle sessions.

    ``max_restarts`` (required, >= 0) bounds the restarts: the wrapped function runs at
    most ``max_restarts + 1`` times, then the Wrapper raises ``RestartAbort``. Its store
    listens on ``store_port`` (default ``MASTER_PORT + 1``: never the port of the
    default group's store) at ``store_host`` (default ``MASTER_ADDR``; 127.0.0.1 in a
    world of one). Its abort and finalize are ``abort()`` and ``finalize()``, run before
    any ``abort``, ``finalize`` or ``initialize`` given in ``wrapper_kwargs``. Its timeouts
    are ordered against ``group_timeout_s`` (each group's timeout) for ``backend`` by
    ``wrapper_timeouts``: with gloo the group times out first (soft = group + 10 s), with
    nccl last (the watchdog outlasts NVRx's hard-timeout kill); ``wrapper_kwargs`` may
    override them (and the intervals) but not break that order. With nccl a
    ``CudaHealthCheck`` runs before each iteration, before any ``health_check`` given.
    NVRx 0.5+ adds NVML GPU and NVLink checks before each restart when ``LOCAL_RANK``
    is set; where NVML does not load (no NVIDIA driver: a CPU host) they would fail every
    restart, so they are turned off with an ``NvmlHealthChecksOff`` warning (see
    ``lifecycle.restart._nvml``). Raises ``ConfigError`` for a bad value.

    With a ``journal_dir`` (the ranks' journal folder, shared by the ranks of a host,
    with one run id: ``lifecycle.journal.run_id``) the job decides after every failed
    iteration, in the Wrapper's finalize, as ``lifecycle.lowlevel.decide_after`` does for
    a retry loop (``policy``: default ``RestartPolicy`` with ``max_restarts`` as its
    budget when above 0): journaled, the same on every rank; a ``stop`` ends the
    restarts at the start of the next iteration, every rank raising ``RestartStopped``
    (exit 93's meaning, with the reason), before NVRx's own limit is checked.
    """
    check_number("max_restarts", max_restarts, at_least=0)
    if store_port is None:
        master = os.environ.get("MASTER_PORT")
        if not master:
            raise ConfigError("store_port", "not given, and MASTER_PORT is not set in the environment")
        store_port = int(master) + 1
    if store_host is None:
        store_host = os.environ.get("MASTER_ADDR") or None
    if store_host is None and os.environ.get("WORLD_SIZE", "1") != "1":
        raise ConfigError("store_host", "not given, and MASTER_ADDR is not set in the environment")
    options: dict[str, Any] = {**wrapper_kwargs, **wrapper_timeouts(group_timeout_s, backend, wrapper_kwargs)}
    store_kwargs = {"port": store_port, "host_name": store_host or LOOPBACK}
    options["store_kwargs"] = {**store_kwargs, **options.get("store_kwargs", {})}
    retry: Any = RetryController(max_iterations=max_restarts + 1)
    done: Any = finalize()
    if journal_dir is not None:
        if policy is None:
            policy = RestartPolicy(max_restarts=max_restarts) if max_restarts > 0 else RestartPolicy()
        decisions = Decisions(journal_dir, policy)
        retry, done = _then(StopWhenDecided(decisions), retry), _then(done, DecideAfterFailure(decisions))
    options["initialize"] = _then(retry, options.get("initialize"))
    options["abort"] = _then(abort(), options.get("abort"))
    options["finalize"] = _then(done, options.get("finalize"))
    if backend == "nccl":
        options["health_check"] = _then(CudaHealthCheck(), options.get("health_check"))
    wrapper = Wrapper(**options)
    drop_nvml_health_checks(wrapper)
    return wrapper


def _then(first: Any, second: Any) -> Any:
    """``first``, then ``second`` if one is given (``Compose`` calls its last argument first)."""
    return first if second is None else Compose(second, first)


def _refuse_foreign_state() -> None:
    """Raise ``ForeignResource`` if a process group or Megatron-core globals exist already."""
    found = [resource for resource in live_resources() if resource.wrapper is WrapperRole.RELEASES]
    if found:
        # The Wrapper owns the failure path of the group and the globals, and creates
        # nothing itself: each iteration's session must create them (NVRx's own check
        # only says "enforce_value(not torch.distributed.is_initialized())").
        names = ", ".join(resource.value for resource in found)
        raise ForeignResource(
            names,
            "in-process restart needs a process with no process group or Megatron-core globals; "
            "found these, created by the caller: release them, or run without the Wrapper",
        )


def run(
    job: Callable[[CallWrapper], T],
    *,
    max_restarts: int,
    store_port: int | None = None,
    store_host: str | None = None,
    group_timeout_s: float = 60.0,
    backend: str = "gloo",
    **wrapper_kwargs: Any,
) -> T:
    """Run ``job(call_wrapper)`` under a ``make_wrapper(...)`` Wrapper; return what its last iteration returned.

    ``job`` builds its session with ``session_for(call_wrapper, ...)``; ``backend`` is its
    groups' backend (timeouts and health check: ``make_wrapper``). A failure on any
    rank restarts it on every rank, at most ``max_restarts`` times; then the Wrapper's
    ``RestartAbort`` propagates (with a note naming the last failure). With
    ``journal_dir`` in ``wrapper_kwargs`` the job decides after each failed iteration
    (``make_wrapper``): a stop raises ``RestartStopped`` instead. Restart exceptions are
    never caught here.

    A process group or Megatron globals that already exist are refused with
    ``ForeignResource`` before the Wrapper starts. A ``BaseException`` that is not an
    ``Exception`` (Ctrl-C, ``SystemExit``) ends the Wrapper without a restart and
    without its abort or finalize: what the failed attempt deferred to the Wrapper is
    then released here, rank-locally, before it propagates unchanged. Afterwards
    ``RANK`` and ``WORLD_SIZE`` are as they were before (the Wrapper rewrites them) and
    no attempt stays registered.
    """
    _refuse_foreign_state()
    wrapper = make_wrapper(
        max_restarts=max_restarts,
        store_port=store_port,
        store_host=store_host,
        group_timeout_s=group_timeout_s,
        backend=backend,
        **wrapper_kwargs,
    )

    # Plain annotations only: the Wrapper injects its CallWrapper by this parameter's type.
    def entry(call_wrapper: CallWrapper | None = None) -> T:
        return job(call_wrapper)

    # Reference cycles (the tracebacks of failed iterations) keep a Wrapper call's store,
    # and so its server on ``store_port``, alive until they are collected; a call on the
    # same port would then join that stale server (BarrierOverflow). Collect before
    # this call and after it.
    gc.collect()
    with _restored_env(_ENV_KEYS):
        ATTEMPTS.last_failure = None
        try:
            result: T = wrapper(entry)()
        except BaseException as exc:
            # The Wrapper restarts only on an Exception; any other BaseException (Ctrl-C,
            # SystemExit) ends it without its abort or finalize, so what the attempt
            # deferred to it is still live: release it here, rank-locally.
            attempt = ATTEMPTS.attempt
            if attempt is not None:
                attempt.release(unblocking_only=False)
                for failure in attempt.failures:
                    exc.add_note(f"lifecycle: teardown step {failure.step} also failed: {failure.error!r}")
            if isinstance(exc, RestartAbort) and ATTEMPTS.last_failure is not None:
                exc.add_note(f"lifecycle: the last restart {ATTEMPTS.last_failure}")
            raise
        finally:
            ATTEMPTS.take()
            gc.collect()  # see above
    return result


@contextmanager
def _restored_env(keys: tuple[str, ...]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in keys}
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def wrapped_pretrain(
    config: PretrainConfig,
    forward_step_func: ForwardStepFunc | None = None,
    callbacks: Iterable[Callback] | None = None,
    *,
    max_restarts: int,
    store_port: int | None = None,
    model_provider: ModelProvider | None = None,
    batch_provider: BatchProvider | None = None,
    actions: Callable[[str, Store], DistributedActions] | None = None,
    policy: RestartPolicy | None = None,
    **wrapper_kwargs: Any,
) -> PretrainResult:
    """Run ``pretrain`` under the Wrapper: a failure on any rank restarts it on every rank, in the same processes.

    Each iteration is one ``pretrain`` call (same arguments, ``attempt`` = the
    iteration) whose session runs in ``inprocess`` mode (``session_for``): a fresh
    default group on a per-iteration store prefix, released by the Wrapper on a
    failure. Ranks and world size are read from the environment each iteration (the
    Wrapper sets them); ``config.distributed.rank`` / ``world_size``, if given, only seed
    ``RANK`` / ``WORLD_SIZE``. The Wrapper's store listens on ``store_port`` (default: the
    group's port + 1) and its timeouts are ordered against ``config.distributed.timeout_s``
    for ``config.distributed.backend`` (``wrapper_timeouts``; nccl adds ``CudaHealthCheck``).
    Returns the ``PretrainResult`` of the successful iteration; after ``max_restarts``
    restarts the Wrapper's ``RestartAbort`` propagates. With a ``config.journal_dir``
    the job decides after every failed iteration, as a retry loop's ``decide_after``
    does (``make_wrapper``; ``policy``: default ``RestartPolicy(max_restarts=max_restarts)``):
    a stop raises ``RestartStopped`` (exit 93's meaning, its ``decision`` the reason)
    instead of restarting, so a failure raised at the same step in two iterations in a
    row ends the call after the second ("reproducible"). The ranks' journals then carry
    rank 0's run id (``lifecycle.journal.run_id``), agreed through the store, so that
    they decide about one job. ``config.fault`` fires in every iteration: inject a
    one-off fault with a callback.
    One rendezvous store is opened before the Wrapper starts and kept for all its
    iterations (rank 0 hosts it at the group's port), each iteration under its own
    prefix; it is dropped when this call returns or raises. ``actions`` builds the
    actions of each iteration from its store prefix and that store (they must use it
    and not close it); None: ``TorchActions`` of the config (``config.distributed``,
    ``config.parallel``).
    """
    distributed = config.distributed
    if store_port is None and distributed.master_port is not None:
        store_port = distributed.master_port + 1
    seed_env = {"RANK": distributed.rank, "WORLD_SIZE": distributed.world_size}
    per_iteration = dataclasses.replace(
        config, distributed=dataclasses.replace(distributed, rank=None, world_size=None)
    )

    kept: Store | None = None

    def iteration_actions(prefix: str | None) -> DistributedActions:
        assert prefix is not None and kept is not None  # under the Wrapper, every iteration has both
        if actions is None:
            return TorchActions(per_iteration.distributed, per_iteration.parallel, store_prefix=prefix, store=kept)
        return actions(prefix, kept)

    def job(call_wrapper: CallWrapper) -> PretrainResult:
        session = session_for(call_wrapper, iteration_actions)
        return pretrain(
            per_iteration,
            forward_step_func,
            callbacks,
            model_provider=model_provider,
            batch_provider=batch_provider,
            attempt=session.iteration,
            session=session,
        )

    with _restored_env(tuple(seed_env)):
        os.environ.update({key: str(value) for key, value in seed_env.items() if value is not None})
        # Refused before the store opens: a host refusing at once would leave its
        # peers retrying a connection to a server that is gone, for the whole timeout.
        _refuse_foreign_state()
        # One store for every iteration (as Megatron-Bridge keeps one): a failed
        # iteration's teardown never takes the peers' rendezvous server with it.
        rendezvous = validate(per_iteration.distributed, per_iteration.parallel)
        kept = open_store(rendezvous, datetime.timedelta(seconds=Bounds(distributed.timeout_s).store_timeout_s))
        try:
            with _restored_env(("LIFECYCLE_RUN_ID",)):
                if config.journal_dir is not None:
                    os.environ["LIFECYCLE_RUN_ID"] = _shared_run_id(kept)
                return run(
                    job,
                    max_restarts=max_restarts,
                    store_port=store_port,
                    store_host=distributed.master_addr,
                    group_timeout_s=distributed.timeout_s,
                    backend=distributed.backend,
                    journal_dir=config.journal_dir,
                    policy=policy,
                    **wrapper_kwargs,
                )
        finally:
            kept = None  # the server stops listening with its last reference


_RUN_ID_KEY = "lifecycle/wrapper/run_id"


def _shared_run_id(store: Store) -> str:
    """Rank 0's run id, published in ``store`` by rank 0 and read (waited for) by the others."""
    if int(os.environ.get("RANK", "0")) == 0:
        store.set(_RUN_ID_KEY, run_id())
    return bytes(store.get(_RUN_ID_KEY)).decode()


publish(globals())  # each name reads as lifecycle.restart.NAME where its home is private
