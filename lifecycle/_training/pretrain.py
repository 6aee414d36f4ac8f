"""``pretrain``: the training entry point, driving one ``Session`` through every state.

uninitialized → dist_ready → globals_ready → (setup) → training → (loop) → finalizing
→ closed. Any exception on the way takes the failure edge, the session releases what
it owns, and the caller gets the original exception object; the next ``pretrain``
call in the same process starts from a clean slate.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.num_microbatches_calculator import get_num_microbatches

from lifecycle import journal as _journal
from lifecycle._core.errors import ConfigError, InvalidTransition, SessionFinished, describe
from lifecycle._core.events import JournalEntry
from lifecycle._core.executor import TeardownReport
from lifecycle._core.session import Session
from lifecycle._core.states import State, Trigger
from lifecycle._liveness.rank import RankMonitor
from lifecycle._torch.actions import TorchActions
from lifecycle._training.callbacks import Callback, ExitReason, ProgressLog, SessionHandle, TrainContext, call_hooks
from lifecycle._training.config import DATA_FAULTS, STEPPED_PHASES, FaultKind, Phase, PretrainConfig
from lifecycle._training.copies import NodeCopies
from lifecycle._training.exits import STOPPED_BY_LAUNCHER
from lifecycle._training.faults import CallbackFault, enospc_once, fire, hang_in_forward
from lifecycle._training.journaling import RunJournal
from lifecycle._training.liveness import in_force, start_liveness
from lifecycle._training.model import SyntheticTokens, default_forward_step, default_model_provider
from lifecycle._training.nonfinite import NonfiniteGuard, NonfiniteLoss
from lifecycle._training.placement import dp_group, flat_apply, model_device, shard_layout, to_device
from lifecycle._training.providers import BatchProvider, ForwardStepFunc, ModelProvider
from lifecycle._training.saves import Saves
from lifecycle._training.stops import LauncherStops
from lifecycle.checkpoint import AsyncCheckpointer, load_checkpoint
from lifecycle.journal import Eval, Origin, Resumed, RunEnd, TrainStep

__all__ = [
    "BatchProvider",
    "Callback",
    "ForwardStepFunc",
    "ModelProvider",
    "PretrainResult",
    "pretrain",
]

logger = logging.getLogger("lifecycle.pretrain")


@dataclass(frozen=True, slots=True)
class PretrainResult:
    """What a successful ``pretrain`` call did, on this rank.

    ``losses`` and ``eval_losses`` are ``(step, loss)`` pairs, averaged over all ranks.
    ``checkpoint_step`` is the step of the last checkpoint this call committed (None
    if it committed none). ``journal`` and ``report`` are the session's.
    """

    rank: int
    world_size: int
    start_step: int
    final_step: int
    exit_reason: ExitReason
    exit_detail: str | None
    losses: tuple[tuple[int, float], ...]
    eval_losses: tuple[tuple[int, float], ...]
    checkpoint_step: int | None
    journal: tuple[JournalEntry, ...]
    report: TeardownReport


def pretrain(
    config: PretrainConfig,
    forward_step_func: ForwardStepFunc | None = None,
    callbacks: Iterable[Callback] | None = None,
    *,
    model_provider: ModelProvider | None = None,
    batch_provider: BatchProvider | None = None,
    attempt: int = 0,
    session: Session | None = None,
) -> PretrainResult:
    """Train ``model_provider``'s model with ``forward_step_func`` on every rank, tensor- and data-parallel.

    Defaults: the tiny causal LM built from megatron-core's tensor-parallel layers, its
    vocabulary-parallel next-token loss, and synthetic token batches
    (``lifecycle._training.model``): with ``tensor_model_parallel_size`` T each rank holds
    1/T of the weights, and its model-parallel group computes one replica's loss.
    Gradients are averaged over Megatron-core's data-parallel group; each data-parallel
    rank reads different batches, the ranks of one tensor-parallel group the same ones.
    Pipeline and context parallel sizes above 1 are refused when the config is built
    (``PretrainConfig``). With nccl (and CUDA) the model and every batch move to the
    rank's CUDA device; every collective runs with tensors on that device (the rule of
    docs/collectives.md); on CPU nothing moves. Checkpoints follow the layout: the first
    data-parallel replica of each tensor-parallel rank writes its shard, a resume needs
    the same tensor and pipeline sizes and accepts another data-parallel size (see
    ``lifecycle.checkpoint.layout``). Checkpoints, evaluation,
    exits and faults follow ``config``; ``callbacks`` are called as ``Callback`` documents.
    ``attempt`` only labels this call in the journal. ``session`` is the fresh session
    to drive (in ``uninitialized``: a finished one raises ``SessionFinished``, another
    live one ``InvalidTransition``, before anything is done); None builds an ordinary one on
    ``TorchActions(config.distributed, config.parallel)``. Under in-process restart,
    ``lifecycle.restart.wrapped_pretrain`` passes the session of the wrapper's attempt.

    With ``config.journal_dir`` set, this rank's journal records (``lifecycle.journal``)
    are appended as they happen: the run's start, each transition and teardown step,
    each training step and evaluation, and in the end the outcome. Its ``run_id`` is
    ``lifecycle.journal.run_id()`` (``LIFECYCLE_RUN_ID``, else torchrun's run id);
    its attempt is ``attempt`` with the session's restart mode and iteration, and
    torchrun's restart count (``TORCHELASTIC_RESTART_COUNT``): a worker that torchrun
    restarts labels its calls from ``attempt`` 0 again, under the next restart count.
    The move to ``dist_ready`` records the attempt the ranks agreed on and the group's
    store prefix. A journal error is logged as a warning, never raised.

    Returns a ``PretrainResult`` once the session is ``closed``. A requested exit
    (SIGTERM, ``exit.max_duration_s``, ``session.request_exit``) is not a failure: every
    rank stops after the same step, saves a final checkpoint and closes. A SIGTERM that
    follows a peer's failure (torchrun's agent stops every worker once one died) is not
    a requested exit: the rank takes the failure edge at once (``StoppedByLauncher``, or
    the failure already under way marked ``stopped_by_launcher``), with no final save,
    and its journal's end record says ``stopped_by_launcher`` (``lifecycle._training.stops``
    says how the rank knows; ``lifecycle.exit_code`` maps the outcome to an exit code). Any exception
    raised in setup, a step, an evaluation, a checkpoint save or its finalization, or a
    callback takes the failure edge: the session releases what it owns (no collective)
    and the same exception object is re-raised.
    """
    if model_provider is None:  # the default model must split evenly: refuse before anything is acquired
        config.model.check_tensor_parallel(config.parallel.tensor_model_parallel_size)
    if session is None:
        # No store prefix given: TorchActions takes a new one per group it creates.
        session = Session(TorchActions(config.distributed, config.parallel))
    elif session.state.is_final:
        raise SessionFinished(session.state, "pretrain")
    elif session.state is not State.UNINITIALIZED:
        raise InvalidTransition(session.state, Trigger.INIT_DISTRIBUTED)  # pretrain's first trigger
    run = _Run(
        config,
        session,
        forward_step_func or default_forward_step,
        model_provider or default_model_provider,
        batch_provider,
        attempt,
    )
    exit_reason: str | None = None
    error: str | None = None
    failure: BaseException | None = None
    try:
        if config.training.log_interval:
            run.hooks.append(ProgressLog(config.training.log_interval))
        run.hooks += list(callbacks or ())
        if config.fault is not None and config.fault.phase is Phase.CALLBACK:
            run.hooks.append(CallbackFault(run.inject))
        with session:
            try:
                result = run.execute()
            except BaseException as exc:
                run.stops.failed(exc)  # before the failure edge: was a SIGTERM the launcher's?
                run.drop_groups()
                raise
        exit_reason = result.exit_reason.value
        return result
    except BaseException as exc:
        failure = exc
        raise
    finally:
        if run.monitor is not None:
            run.monitor.stop()
        run.stops.close(failure)
        if failure is not None:
            error = describe(failure)
            if run.stops.stopped is not None:
                exit_reason = STOPPED_BY_LAUNCHER
        if failure is not None and run.model is not None:
            run.copies.after_failure(run.state)  # the step the last update left, when no update was under way
        run.copies.close(failure is None)  # after a success, this rank's copies go; after a failure they stay
        run.drop_model()
        end = RunEnd(
            origin=run.journal.origin,
            state=session.state.value,
            exit_reason=exit_reason,
            final_step=run.step,
            checkpoint_step=run.committed,
            error=error,
            end=time.time(),
        )
        run.journal.write(end)
        run.journal.close()
        failure = None  # the exception's traceback holds this frame: no cycle keeps it, or the run, alive


class _Run:
    """The state of one ``pretrain`` call; ``execute`` runs it inside its session."""

    def __init__(
        self,
        config: PretrainConfig,
        session: Session,
        forward: ForwardStepFunc,
        model_provider: ModelProvider,
        batch_provider: BatchProvider | None,
        attempt: int = 0,
    ) -> None:
        self.config = config
        self.session = session
        self.forward = forward
        self.hooks: list[Callback] = []
        self.handle = SessionHandle(session)  # what every hook gets: never the session itself
        self.model_provider = model_provider
        self.batch_provider = batch_provider
        self.attempt = attempt
        self.monitor: RankMonitor | None = None
        self.stops = LauncherStops(session, 0)
        # Until the group exists, the configured (or torchrun's) rank names the journal.
        try:
            world, rank = config.distributed.resolve_world()
        except ConfigError:
            world, rank = None, None
        if rank is None and dist.is_available() and dist.is_initialized():
            world, rank = dist.get_world_size(), dist.get_rank()  # the caller's group
        self.rank, self.world_size = rank or 0, world or 1
        if rank is not None:
            session.label = f"rank {rank}"
        self.stops.rank = self.rank
        origin = Origin(
            run_id=_journal.run_id(),
            rank=self.rank,
            attempt=attempt,
            restart_mode=session.restart_mode.value,
            iteration=session.iteration,
            restart_count=_journal.restart_count(),
        )
        # The session's actions say, once the group exists, which attempt the ranks agreed on.
        self.journal = RunJournal(config.journal_dir, origin, self.world_size, session, in_force(config, session))
        if self.journal.enabled:
            session.add_observer(self.journal.observe)
        self.step = 0
        self.losses: list[tuple[int, float]] = []
        self.eval_losses: list[tuple[int, float]] = []
        self.committed: int | None = None
        self.saved: int | None = None
        self.saves = Saves(config.checkpoint, self.journal, self.rank, None)
        c = config.checkpoint
        label = f"{origin.restart_count}.{attempt}"
        measured = repr((config.model, config.parallel, c.memory_budget))  # what the copies' interval depends on
        self.copies = NodeCopies(c.memory_copy, c.memory_interval, c.memory_budget, c.memory_cap_mb, label, measured)
        self.guard = NonfiniteGuard(config.training, self.journal)
        self.fault_fired = False  # a data fault (DATA_FAULTS) fires once per call
        self.desynced = False  # a desync fault fired in this step: it skips one all_reduce
        self.short = 0  # a desync-size fault fired in this step: one all_reduce is this many elements short
        self.model: torch.nn.Module | None = None
        self.device = torch.device("cpu")
        self.consumed = 0  # train micro-batches all data-parallel ranks consumed before the current step

    def drop_groups(self) -> None:
        """Drop the process-group references the model's modules hold (megatron's layers keep theirs): gloo closes a
        group's connections only once it is freed (a blocked peer would wait the timeout). On a failure, before the
        groups are aborted: the teardown's threads then hold the last references and free them in parallel, not
        this thread one by one (``lifecycle._torch.groups``)."""
        for module in self.model.modules() if self.model is not None else ():
            for name, value in list(vars(module).items()):
                if isinstance(value, dist.ProcessGroup):
                    setattr(module, name, None)

    def drop_model(self) -> None:
        """``drop_groups``, then drop the model."""
        self.drop_groups()
        self.model = None

    def due(self, phase: Phase, step: int | None = None, kind: FaultKind | None = None) -> FaultKind | None:
        """The configured fault's kind if it is due here, on this rank (and of ``kind``, if given: another kind is
        not due, and a data fault of another kind is not used up); a few attribute reads otherwise."""
        fault = self.config.fault
        if fault is None or fault.phase is not phase or fault.rank != self.rank or kind not in (None, fault.kind):
            return None
        if phase in STEPPED_PHASES and (step is None or step < fault.step):
            return None
        if fault.kind in DATA_FAULTS:
            if self.fault_fired:
                return None
            self.fault_fired = True
        return fault.kind

    def inject(self, phase: Phase, step: int | None = None) -> None:
        """Inject the configured fault if it is due here (``fire``); data faults are the caller's (``due``)."""
        if self.config.fault is None or self.config.fault.kind in DATA_FAULTS:
            return
        kind = self.due(phase, step)
        if kind is not None:
            fire(kind, phase, self.rank, step)

    def execute(self) -> PretrainResult:
        """Drive the session from ``uninitialized`` to ``closed``; exceptions propagate to the session block."""
        session = self.session
        session.init_distributed()
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        session.label = f"rank {self.rank}"  # failures are logged with the rank, before teardown
        self.stops.rank = self.saves.rank = self.guard.rank = self.rank
        self.monitor = start_liveness(self.config, session, self.rank, self.world_size, self.journal)
        self.stops.monitor = self.monitor
        session.progress(session.state.value)  # the monitor's first mark: a rank stuck here is named in dist_ready
        self.inject(Phase.DIST)
        session.init_globals()
        session.progress(session.state.value)
        self.inject(Phase.GLOBALS)
        ctx = self.setup()
        self.inject(Phase.SETUP)
        call_hooks(self.hooks, "on_setup_end", self.handle, ctx)
        session.start_training()
        call_hooks(self.hooks, "on_train_start", self.handle, ctx)
        reason = self.loop(ctx)
        if ctx.checkpointer is not None and self.step != self.saved and self.step > ctx.start_step:
            self.save(ctx.checkpointer, self.step)
        session.finish()
        session.progress(Phase.FINALIZE)
        self.inject(Phase.FINALIZE)
        if ctx.checkpointer is not None:
            self.commit(ctx.checkpointer, final=True)
        call_hooks(self.hooks, "on_train_end", self.handle, self.step, reason)
        report = session.close()
        return PretrainResult(
            rank=ctx.rank,
            world_size=ctx.world_size,
            start_step=ctx.start_step,
            final_step=self.step,
            exit_reason=reason,
            exit_detail=session.exit_requested,
            losses=tuple(self.losses),
            eval_losses=tuple(self.eval_losses),
            checkpoint_step=self.committed,
            journal=session.journal,
            report=report,
        )

    # -- setup --------------------------------------------------------------------------

    def setup(self) -> TrainContext:
        """Signal handler, model, optimizer, data, checkpointer; load the checkpoint to resume from."""
        config, session = self.config, self.session
        session.progress(Phase.SETUP)  # where a failure is reported to happen (the notice, the journal)
        if config.exit.handle_sigterm:
            # A SIGTERM after a peer's failure is the launcher's stop, not a request (``stops``).
            session.install_signal_handlers(on_signal=self.stops.on_signal)
        # Same seed on every rank: identical replicas (and each tensor-parallel rank its
        # slice of the same full weights), and a resumed run rebuilds the same model.
        torch.manual_seed(config.training.seed)
        self.device = model_device()
        model = self.model_provider(config)
        self.model = model.to(self.device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self.params, lr=config.training.lr)
        self.dp_rank: int = parallel_state.get_data_parallel_rank()
        self.dp_size: int = parallel_state.get_data_parallel_world_size()
        self.layout = shard_layout(self.world_size)
        self.num_microbatches: int = get_num_microbatches()
        if self.batch_provider is None:
            data = SyntheticTokens(config.model, config.parallel.micro_batch_size, config.training.seed)
            self.batch_provider = data.batch
        if self.dp_size > 1:
            # A custom provider may not be seeded; replicas must start equal all the same.
            src = parallel_state.get_data_parallel_src_rank()
            flat_apply([p.data for p in self.params], lambda f: dist.broadcast(f, src, group=dp_group()))
        checkpointer = None
        start_step = 0
        if config.checkpoint.dir is not None:
            # Probes the folder: an unusable one fails here, before training, naming the OS error.
            checkpointer = AsyncCheckpointer(
                config.checkpoint.dir, keep_last=config.checkpoint.keep_last, layout=self.layout
            )
            session.track_checkpoints(checkpointer)
            # Adam, unsharded: data-parallel replicas hold the same state, and their copies stand in for each other.
            self.copies.open(self.rank, self.world_size, on_cpu=self.device.type == "cpu", replica=self.layout.replica)
            if config.checkpoint.resume:
                start_step = self.load(config.checkpoint.dir)
        self.step = start_step
        probe = self.batch_provider("train", 0)
        tokens = probe.get("tokens") if isinstance(probe, dict) else None
        per_batch = tokens.numel() if isinstance(tokens, torch.Tensor) else 0
        return TrainContext(
            config=config,
            model=model,
            optimizer=self.optimizer,
            rank=self.rank,
            world_size=self.world_size,
            data_parallel_rank=self.dp_rank,
            data_parallel_size=self.dp_size,
            start_step=start_step,
            tokens_per_step=per_batch * self.num_microbatches * self.dp_size,
            checkpointer=checkpointer,
        )

    def state(self, step: int) -> dict[str, Any]:
        """What a checkpoint holds: model, optimizer, step, the micro-batches consumed, this rank's RNG state.

        ``consumed`` (train micro-batches read by all data-parallel ranks together) lets a
        run resumed on another data-parallel size continue the data where it stopped.
        """
        assert self.model is not None  # set in setup
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": step,
            "consumed": self.consumed,
            "rng": torch.get_rng_state(),
        }

    def load(self, directory: str) -> int:
        """Load the checkpoint every rank agrees on under ``directory``; return its step (0 if there is none).

        Collective over the default group: all ranks load the same step or all start from 0.
        Each rank loads its tensor-parallel slice's shard, written by that slice's first
        data-parallel replica; so a replica of another data-parallel size loads it too.
        """
        assert self.model is not None  # set in setup
        state = self.state(0)
        # Agreed by every rank; weights_only, checksummed; the layout's tensor and pipeline sizes must match. A copy in
        # node memory of a newer step that every rank holds comes first (``NodeCopies.resume``).
        load = lambda: load_checkpoint(directory, state, layout=self.layout)  # noqa: E731
        step, source, disk = self.copies.resume(state, directory, load)
        if step is None:
            return 0
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        self.consumed = int(state["consumed"])
        logger.info("resumed from step %d in %s", step, directory if source == "checkpoint" else "node memory")
        self.saved = self.committed = self.saves.committed = step if source == "checkpoint" else disk
        newest = step if source == "checkpoint" else disk
        self.journal.write(
            Resumed(origin=self.journal.origin, step=step, source=source, checkpoint_step=newest, time=time.time())
        )
        return step

    # -- the loop -----------------------------------------------------------------------

    def loop(self, ctx: TrainContext) -> ExitReason:
        """Train until ``iterations`` or an exit all ranks agreed on; return why it ended."""
        training, checkpointer = self.config.training, ctx.checkpointer
        interval = self.config.checkpoint.interval
        limit = self.config.exit.max_duration_s
        started = time.monotonic()
        while self.step < training.iterations:
            step = self.step + 1
            self.session.progress(Phase.STEP, step)
            began = time.time()
            local_loss = self.train_step(step)
            timed_out = limit is not None and time.monotonic() - started >= limit
            # One collective a step, before the update: the mean loss, whether any rank wants
            # to stop (so all ranks stop after the same step: a SIGTERM reaches them at
            # different times) and how many ranks' loss is not finite (``nonfinite``).
            flags = torch.tensor(
                [
                    local_loss,
                    float(self.stops.requested() is not None),
                    float(timed_out),
                    *((1.0, self.rank + 1.0, local_loss) if not math.isfinite(local_loss) else (0.0, 0.0, 0.0)),
                ],
                dtype=torch.float64,
                device=self.device,
            )
            if not (self.desynced and self.dp_size == 1):  # without data parallelism a desync skips this one
                dist.all_reduce(flags[: flags.numel() - (self.short if self.dp_size == 1 else 0)])
            self.desynced, self.short = False, 0
            flags = flags.cpu()
            try:
                bad = int(flags[3].item())
                culprit = int(flags[4].item()) - 1 if bad == 1 else None
                apply = self.guard.apply(step, local_loss, bad, culprit, flags[5].item())
            except NonfiniteLoss:
                if checkpointer is not None and checkpointer.in_flight:
                    self.commit(checkpointer)  # every rank is here: the last good save still lands
                raise
            if apply:
                self.copies.unsettled()
                self.optimizer.step()
            self.consumed += self.num_microbatches * self.dp_size
            self.step = step
            self.copies.settled(step)
            if checkpointer is not None and checkpointer.in_flight:
                # Commit the save started after the previous step: collective, and every
                # rank is at the same step. Its write overlapped this step's compute.
                self.commit(checkpointer)
            self.copies.after_step(step, self.state)  # the copy in node memory, when due
            loss = flags[0].item() / self.world_size
            self.losses.append((step, loss))
            if self.journal.enabled:  # before the hooks: a rank killed in one still shows this step
                self.journal.write(
                    TrainStep(origin=self.journal.origin, step=step, loss=loss, start=began, end=time.time())
                )
            self.session.progress(Phase.CALLBACK)
            call_hooks(self.hooks, "on_step_end", self.handle, step, loss)
            last = step == training.iterations or bool(flags[1] or flags[2])
            if training.eval_interval and (step % training.eval_interval == 0 or last):
                self.evaluate(step)
            if checkpointer is not None and interval and step % interval == 0:
                self.save(checkpointer, step)
            if flags[1]:
                if self.stops.signalled is not None:  # agreed: the SIGTERM was a request after all
                    self.session.request_exit(self.stops.signalled)
                return ExitReason.REQUESTED
            if flags[2]:
                return ExitReason.MAX_DURATION
        return ExitReason.ITERATIONS

    def train_step(self, step: int) -> float:
        """Forward and backward over this step's micro-batches, average gradients over data parallel; the mean loss.
        The update is the loop's, once every rank knows whether each loss was finite."""
        assert self.batch_provider is not None and self.model is not None  # set in setup
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        total: float = 0.0
        for micro in range(self.num_microbatches):
            # Disjoint across data-parallel ranks, a pure function of the micro-batches consumed before: a resumed
            # run reads exactly what an uninterrupted one would, whatever its data-parallel size (same global batch).
            index = self.consumed + micro * self.dp_size + self.dp_rank
            if micro == 0:
                self.session.progress(Phase.BATCH, step)
                self.inject(Phase.BATCH, step)
            batch = to_device(self.batch_provider("train", index), self.device)
            if micro == 0:
                self.session.progress(Phase.STEP, step)
            hang = micro == 0 and self.due(Phase.STEP, step, FaultKind.HANG) is not None
            with hang_in_forward(self.model, self.rank, step, hang):
                loss = self.forward(batch, self.model)
            if micro == 0 and self.due(Phase.STEP, step, FaultKind.NAN):
                logger.warning("rank %d: injecting a nan fault at step %d", self.rank, step)
                loss = loss * float("nan")
            if micro == 0 and self.due(Phase.STEP, step, FaultKind.DESYNC):
                logger.warning("rank %d: injecting a desync fault at step %d: it skips an all_reduce", self.rank, step)
                self.desynced = True
            if micro == 0 and self.due(Phase.STEP, step, FaultKind.DESYNC_SIZE):
                logger.warning("rank %d: injecting a desync fault at step %d: an all_reduce one short", self.rank, step)
                self.short = 1
            (loss / self.num_microbatches).backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            total += loss.item()
        self.inject(Phase.STEP, step)
        if self.dp_size > 1 and not self.desynced:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            flat_apply(grads, lambda f: dist.all_reduce(f[: f.numel() - self.short], group=dp_group()))
            for p, grad in zip(self.params, grads, strict=True):
                p.grad = grad.div_(self.dp_size)
        return total / self.num_microbatches

    def evaluate(self, step: int) -> None:
        """Mean loss over ``eval_iterations`` held-out micro-batches per rank, averaged over all ranks."""
        assert self.batch_provider is not None and self.model is not None  # set in setup
        self.session.progress(Phase.EVAL, step)
        self.inject(Phase.EVAL, step)
        began = time.time()
        count = self.config.training.eval_iterations
        self.model.eval()
        with torch.no_grad():
            # The same held-out batches at every evaluation, different on each data-parallel rank.
            total = sum(
                self.forward(
                    to_device(self.batch_provider("eval", i * self.dp_size + self.dp_rank), self.device), self.model
                ).item()
                for i in range(count)
            )
        mean = torch.tensor([total / count], dtype=torch.float64, device=self.device)
        dist.all_reduce(mean)
        loss = mean.item() / self.world_size
        self.eval_losses.append((step, loss))
        self.journal.write(Eval(origin=self.journal.origin, step=step, loss=loss, start=began, end=time.time()))
        call_hooks(self.hooks, "on_eval_end", self.handle, step, loss)

    def save(self, checkpointer: AsyncCheckpointer, step: int) -> None:
        """Start an async save of ``step`` (committing the previous one); wait for it unless ``async_save``."""
        self.session.progress(Phase.CHECKPOINT, step)
        self.inject(Phase.CHECKPOINT, step)
        if checkpointer.in_flight:
            self.commit(checkpointer)  # under the save policy, not inside save()
        if self.due(Phase.CHECKPOINT, step) is FaultKind.SAVE_ERROR:
            checkpointer._before_write = enospc_once(self.rank, step)  # read once, as the save starts its writer
            try:
                checkpointer.save(step, self.state(step))
            finally:
                checkpointer._before_write = None
        else:
            checkpointer.save(step, self.state(step))
        self.saved = step
        if not self.config.checkpoint.async_save:
            self.commit(checkpointer)
        call_hooks(self.hooks, "on_checkpoint_saved", self.handle, step, checkpointer.directory)

    def commit(self, checkpointer: AsyncCheckpointer, *, final: bool = False) -> None:
        """Collectively finalize the save in flight, if any, under ``checkpoint.on_save_error`` (``Saves.commit``)."""
        self.saves.commit(checkpointer, final=final)
        self.committed = self.saves.committed
