"""Configuration of ``pretrain``: typed, frozen, validated before anything is acquired.

No torch import here, so a bad value is reported (``ConfigError`` naming the field)
without loading torch. ``PretrainConfig`` gathers the distributed and parallel layout
(``lifecycle._torch.config``) with the training loop, checkpoint, exit and fault settings.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from lifecycle._core.bounds import Bounds
from lifecycle._core.errors import ConfigError, check_number
from lifecycle._liveness.deadlines import LOOP_PHASES
from lifecycle._torch.config import DistributedConfig, ParallelConfig
from lifecycle.journal.evidence import Kind


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of the default model and its synthetic data (ignored by a custom model provider).

    ``vocab_size`` must be a multiple of 8: the held-out split is the sequences whose
    first token is a multiple of 8 (see ``lifecycle._training.model.SyntheticTokens``).
    """

    vocab_size: int = 64
    seq_length: int = 32
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4

    def __post_init__(self) -> None:
        """Reject a shape the default model cannot build."""
        for name in ("vocab_size", "seq_length", "hidden_size", "num_layers", "num_heads"):
            check_number(f"model.{name}", getattr(self, name), at_least=1)
        if self.vocab_size % 8:
            raise ConfigError("model.vocab_size", f"must be a multiple of 8, got {self.vocab_size}")
        if self.hidden_size % self.num_heads:
            raise ConfigError("model.num_heads", f"must divide hidden_size {self.hidden_size}, got {self.num_heads}")

    def check_tensor_parallel(self, tensor_parallel: int) -> None:
        """Raise ``ConfigError`` naming the field unless the default model splits evenly over ``tensor_parallel`` ranks.

        The vocabulary (embedding and head rows) and the heads (so the hidden size and
        the MLP width) are divided among the ranks of a tensor-parallel group.
        """
        for name in ("vocab_size", "num_heads"):
            value = getattr(self, name)
            if value % tensor_parallel:
                raise ConfigError(
                    f"model.{name}",
                    f"{value} is not divisible by tensor_model_parallel_size {tensor_parallel}: the default model "
                    "splits it across the tensor-parallel group",
                )


class OnNonfiniteLoss(StrEnum):
    """What a step whose loss is not finite (NaN, ±inf) on any rank does (``TrainingConfig.on_nonfinite_loss``)."""

    FAIL = "fail"
    """The attempt fails with ``NonfiniteLoss`` before the update is applied; no checkpoint of that step."""
    SKIP = "skip"
    """The step's update is applied on no rank (its batches are consumed), counted; fail after too many in a row."""
    WARN = "warn"
    """Warn (once a run, then count) and apply the update anyway."""


class OnSaveError(StrEnum):
    """What a failed checkpoint save does (``CheckpointConfig.on_save_error``)."""

    CONTINUE = "continue"
    """Every rank drops the save, it is recorded and warned once, training goes on; fail after too many in a row."""
    FAIL = "fail"
    """The attempt fails at once with the save's ``SaveFailed`` (the behaviour before 0.x)."""


@dataclass(frozen=True, slots=True)
class TrainingConfig:
    """The loop: optimizer steps, learning rate, seed, logging and evaluation cadence.

    ``iterations``: the step to train up to (steps count from 1; a resumed run continues
    from the checkpoint's step). ``log_interval``: rank 0 logs progress every that many
    steps (0: never). ``eval_interval``: evaluate on the held-out split every that many
    steps and after the last one (0: never), over ``eval_iterations`` micro-batches.
    ``on_nonfinite_loss`` (``OnNonfiniteLoss``): what a step does whose loss is NaN or
    infinite on any rank, decided before the optimizer applies it, on the loss every
    rank already all-reduces; ``skip`` fails after ``max_consecutive_skipped_steps``
    skipped steps in a row.
    """

    iterations: int = 100
    lr: float = 3e-3
    seed: int = 1234
    log_interval: int = 10
    eval_interval: int = 0
    eval_iterations: int = 4
    on_nonfinite_loss: OnNonfiniteLoss = OnNonfiniteLoss.FAIL
    max_consecutive_skipped_steps: int = 5

    def __post_init__(self) -> None:
        """Reject values no loop could run with; accept the policy as its name."""
        object.__setattr__(
            self, "on_nonfinite_loss", _member(OnNonfiniteLoss, "training.on_nonfinite_loss", self.on_nonfinite_loss)
        )
        check_number("training.max_consecutive_skipped_steps", self.max_consecutive_skipped_steps, at_least=1)
        check_number("training.iterations", self.iterations, at_least=0)
        check_number("training.lr", self.lr, integer=False, above=0)
        check_number("training.seed", self.seed, at_least=0)
        check_number("training.log_interval", self.log_interval, at_least=0)
        check_number("training.eval_interval", self.eval_interval, at_least=0)
        check_number("training.eval_iterations", self.eval_iterations, at_least=1)


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """Asynchronous checkpoints under ``dir`` (None: no checkpoints at all).

    ``interval``: save every that many steps (0: only the final checkpoint); each save
    is written in the background during the next step and committed after it. A final
    checkpoint is saved whenever the loop ends without failing (steps done, or a
    requested exit). ``async_save`` False waits for each save to be committed before
    training continues. ``resume``: start from the checkpoint every rank agrees on
    (the latest one that is complete and intact on every rank; see
    ``lifecycle.checkpoint.load_checkpoint``) if there is one. ``keep_last``: after each
    commit keep only that many complete steps, the newest verified one always among
    them (None: keep everything). ``dir`` is created and probed (a file written, fsynced
    and removed) at setup, before training; a ``dir`` that is a file, or lies under
    one, is refused here, at construction.

    ``on_save_error`` (``OnSaveError``): ``continue`` (default) drops a save that failed
    on any rank (its write, the commit, a write past its bound) on every rank alike,
    records it (a ``save_failed`` journal record), warns and trains on; the next save is
    tried at its interval. After ``max_consecutive_save_failures`` failed saves in a row
    the attempt fails (``SaveFailures``, naming each failure and the last committed
    step). A final save (the loop's end, a requested exit) that fails always fails the
    attempt: its end would otherwise claim a checkpoint it does not have. ``fail``: the
    first failed save fails the attempt (``SaveFailed``).

    ``memory_copy``: also keep this rank's training state (model, optimizer, step, data
    position, RNG) in node memory (``lifecycle._training.memory``) every
    ``memory_interval`` steps, so that a retry or a restarted process on the same node
    resumes from a step newer than the last checkpoint (docs/checkpoint-format.md, "The
    copy in node memory"); a call that fails outside an update also copies the step the
    last update left, so an in-process retry loses no step. It needs ``dir`` and
    ``resume``: disk checkpoints stay the durable truth. ``memory_interval`` 0 (default)
    derives it from a measured budget: the copy's cost over the first steps against
    ``memory_budget`` (a fraction, default 1%) of a step's time. ``memory_cap_mb``: the
    most one rank's files may take (three slots and a spare; None: half the file system,
    shared by the node's ranks); a copy that does not fit is warned about once and the
    run goes on without copies.
    """

    dir: str | None = None
    interval: int = 0
    async_save: bool = True
    resume: bool = False
    keep_last: int | None = None
    on_save_error: OnSaveError = OnSaveError.CONTINUE
    max_consecutive_save_failures: int = 3
    memory_copy: bool = False
    memory_interval: int = 0
    memory_budget: float = 0.01
    memory_cap_mb: float | None = None

    def __post_init__(self) -> None:
        """Reject intervals below 0, ``keep_last`` below 1, checkpoint options without a directory, and a memory
        copy without ``dir`` and ``resume``, a budget outside (0, 1] or a cap that is not positive."""
        object.__setattr__(self, "on_save_error", _member(OnSaveError, "checkpoint.on_save_error", self.on_save_error))
        check_number("checkpoint.max_consecutive_save_failures", self.max_consecutive_save_failures, at_least=1)
        check_number("checkpoint.interval", self.interval, at_least=0)
        check_number("checkpoint.keep_last", self.keep_last, at_least=1, optional=True)
        if self.dir is not None and not self.dir:
            raise ConfigError("checkpoint.dir", "must not be empty (use None for no checkpoints)")
        if self.dir is None and (self.interval or self.resume or self.keep_last is not None):
            raise ConfigError("checkpoint.dir", "interval, resume and keep_last need a checkpoint directory")
        blocker = None if self.dir is None else _file_in_the_way(Path(self.dir))
        if blocker is not None:
            raise ConfigError("checkpoint.dir", f"{blocker} is a file, not a folder")
        check_number("checkpoint.memory_interval", self.memory_interval, at_least=0)
        check_number("checkpoint.memory_budget", self.memory_budget, integer=False, above=0, at_most=1)
        check_number("checkpoint.memory_cap_mb", self.memory_cap_mb, integer=False, above=0, optional=True)
        if self.memory_copy and (self.dir is None or not self.resume):
            raise ConfigError(
                "checkpoint.memory_copy",
                "needs a checkpoint directory and resume=True: the copy is read only to resume, and disk checkpoints "
                "stay the durable truth",
            )


def _file_in_the_way(folder: Path) -> Path | None:
    """The part of ``folder`` (itself or a parent) that exists and is no folder; None if there is none.

    Only the nearest existing part is looked at (a ``stat`` each, nothing written).
    """
    for part in (folder, *folder.parents):
        try:
            if part.exists():
                return None if part.is_dir() else part
        except OSError:  # unreadable: the probe at setup says why
            return None
    return None


@dataclass(frozen=True, slots=True)
class ExitConfig:
    """When to stop early, gracefully (final checkpoint, every rank ``closed``).

    ``max_duration_s``: stop after the first step that ends this long after training
    started (None: no limit). ``handle_sigterm``: SIGTERM requests such an exit instead
    of killing the process (``pretrain`` must then run on the main thread, where Python
    delivers signals). Ranks decide together at the end of every step (one
    all-reduce carries every rank's loss and stop flags), so all stop after the same step.
    """

    max_duration_s: float | None = None
    handle_sigterm: bool = True

    def __post_init__(self) -> None:
        """Reject a duration that is not a positive number."""
        check_number("exit.max_duration_s", self.max_duration_s, integer=False, above=0, unit="seconds", optional=True)


class Phase(StrEnum):
    """Where a ``FaultInjection`` raises; the values are the demo's ``--fail-at`` names."""

    DIST = "dist"
    """Right after the default process group was created."""
    GLOBALS = "globals"
    """Right after the Megatron-core globals were created."""
    SETUP = "setup"
    """After model, optimizer, data and checkpointer were set up."""
    BATCH = "batch"
    """In a train step, where the batch provider is called for its first micro-batch (a data loader's phase)."""
    STEP = "step"
    """In a train step, after the backward pass, before the gradient all-reduce."""
    EVAL = "eval"
    """In an evaluation."""
    CHECKPOINT = "checkpoint"
    """In a checkpoint save."""
    FINALIZE = "finalize"
    """In the collective finalization of the last checkpoint, after the loop."""
    CALLBACK = "callback"
    """In a callback's ``on_step_end``."""


STEPPED_PHASES = frozenset({Phase.BATCH, Phase.STEP, Phase.EVAL, Phase.CHECKPOINT, Phase.CALLBACK})
"""Phases that run at steps: the fault fires the first time the phase runs at or after ``step``."""


class FaultKind(StrEnum):
    """What a ``FaultInjection`` does when it fires; the values are the demo's ``--fault`` names."""

    RAISE = "raise"
    """Raise ``InjectedFault``: a failure that announces itself."""
    CRASH = "crash"
    """SIGKILL its own process: a rank that dies (an out-of-memory kill, a segfault)."""
    STOP = "stop"
    """SIGSTOP its own process: a rank frozen whole, every thread included."""
    HANG = "hang"
    """Sleep for good in the phase: a rank waiting on something that never comes (a data loader)."""
    SPIN = "spin"
    """Run a regular expression that backtracks for good: C code holding the GIL, no thread runs Python."""
    SAVE_ERROR = "save-error"
    """At phase ``checkpoint``: the rank's write of that one save fails with ``ENOSPC`` (training goes on)."""
    NAN = "nan"
    """At phase ``step``: the rank's loss of that one step becomes NaN (its gradients with it)."""
    DESYNC = "desync"
    """At phase ``step``: the rank skips that one step's gradient all_reduce (without data parallelism, the loop's
    loss all_reduce) and goes on to its next collective, which its peers never pair with it: a desync."""
    DESYNC_SIZE = "desync-size"
    """At phase ``step``: the rank all_reduces that one step's gradients (without data parallelism, the loop's loss
    flags) one element short: the same collective as its peers on another size. On gloo the rank aborts (it receives
    more than its tensor holds: SIGABRT); the verdict on its death names the desync and its peers."""

    @property
    def failure(self) -> Kind:
        """The failure this fault is (``lifecycle.journal.evidence.Kind``): what the verdict, the words and the cause
        call it (``hang`` is ``Kind.HANG`` throughout; ``crash`` a rank that ``died``)."""
        return _FAILURES[self]


DATA_FAULTS: dict[FaultKind, Phase] = {
    FaultKind.SAVE_ERROR: Phase.CHECKPOINT,
    FaultKind.NAN: Phase.STEP,
    FaultKind.DESYNC: Phase.STEP,
    FaultKind.DESYNC_SIZE: Phase.STEP,
}
"""Faults that change what the rank computes or writes, once, instead of stopping it; each at its one phase."""


_FAILURES = {
    FaultKind.RAISE: Kind.RAISED,
    FaultKind.CRASH: Kind.DIED,
    FaultKind.STOP: Kind.STOPPED,
    FaultKind.HANG: Kind.HANG,
    FaultKind.SPIN: Kind.SPINNING,
    # When they fail the attempt (on_save_error="fail"; a NaN loss by default) they raise on every rank.
    FaultKind.SAVE_ERROR: Kind.SAVE_FAILED,
    FaultKind.NAN: Kind.NONFINITE_LOSS,
    FaultKind.DESYNC: Kind.DESYNC,
    FaultKind.DESYNC_SIZE: Kind.DIED,  # gloo aborts the rank: its monitor names the desync it died of
}


@dataclass(frozen=True, slots=True)
class FaultInjection:
    """Inject a fault of ``kind`` at ``phase`` on ``rank`` (for demos and tests).

    For the phases in ``STEPPED_PHASES`` it fires the first time that phase runs at a
    step >= ``step``; the other phases run once per ``pretrain`` call. ``kind``
    (``FaultKind``, default ``raise``) says what it does: raise ``InjectedFault``, or,
    silently, kill, stop, hang or spin the rank's process; the data faults
    (``DATA_FAULTS``: a save's write failing with ``ENOSPC``, a NaN loss, a skipped all_reduce) fire once, at
    their own phase only, and leave the rank running.
    """

    phase: Phase
    rank: int = 0
    step: int = 1
    kind: FaultKind = FaultKind.RAISE

    def __post_init__(self) -> None:
        """Accept a phase and a kind name as strings; reject an unknown one, a negative rank or step < 1."""
        try:
            object.__setattr__(self, "phase", Phase(self.phase))
        except ValueError:
            names = ", ".join(p.value for p in Phase)
            raise ConfigError("fault.phase", f"must be one of {names}, got {self.phase!r}") from None
        try:
            object.__setattr__(self, "kind", FaultKind(self.kind))
        except ValueError:
            names = ", ".join(k.value for k in FaultKind)
            raise ConfigError("fault.kind", f"must be one of {names}, got {self.kind!r}") from None
        check_number("fault.rank", self.rank, at_least=0)
        check_number("fault.step", self.step, at_least=1)
        phase = DATA_FAULTS.get(self.kind)
        if phase is not None and self.phase is not phase:
            raise ConfigError(
                "fault.phase", f"a {self.kind.value} fault fires at phase {phase.value}, got {self.phase.value}"
            )


class InjectedFault(RuntimeError):
    """The failure a ``FaultInjection`` raises; says where it was injected."""

    def __init__(self, phase: Phase, rank: int, step: int | None) -> None:
        """Record where the fault fired (``step`` None outside the loop)."""
        self.phase, self.rank, self.step = phase, rank, step
        at = f", step {step}" if step is not None else ""
        super().__init__(f"injected failure at phase {phase.value!r} on rank {rank}{at}")

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuild from the constructor's arguments: NVRx's Wrapper copies the exception.
        return (type(self), (self.phase, self.rank, self.step), self.__dict__)


class LivenessMode(StrEnum):
    """What a rank's liveness monitor does (``LivenessConfig.mode``)."""

    OFF = "off"
    """No monitor."""
    REPORT = "report"
    """Publish a verdict on a wedged rank (every rank's failure notes name it), never kill it."""
    KILL = "kill"
    """Publish the verdict, dump the wedged rank's Python stacks, kill it: its peers fail at once."""


@dataclass(frozen=True, slots=True)
class LivenessConfig:
    """A monitor process per rank that names a stopped, spinning, hung or dead rank (see docs/liveness.md).

    ``interval_s``: how often the monitor reads the rank's position and beats through
    the store. A phase's deadline is ``max(5 × its slowest duration, floor_s)`` once
    calibrated (the steps of the training loop share one, after two warm-up steps and
    three samples), ``default_deadline_s`` before (setup, the first save, an evaluation,
    finalize), or ``deadlines[phase]`` when given. The group timeout
    (``distributed.timeout_s``) stays the bound for what the monitor cannot see.

    Past its phase's deadline a rank is only *suspected* (journaled, withdrawn when it
    moves); it is convicted (verdict, notice, kill) only if the evidence still holds at
    ``max(deadline, conviction_floor_s(group timeout))``: ``patience`` × a third of the
    group timeout (10 s at 30 s). ``patience`` trades detection time for tolerance of
    healthy pauses (docs/liveness.md); at 3 or more the floor reaches the group timeout
    and ``PretrainConfig`` refuses it (a collective would time out first, on a victim), as
    it refuses a ``floor_s`` at or above the group timeout.
    """

    mode: LivenessMode = LivenessMode.OFF
    interval_s: float = 1.0
    floor_s: float = 2.0
    default_deadline_s: float = 600.0
    deadlines: tuple[tuple[str, float], ...] = ()
    patience: float = 1.0

    def conviction_floor_s(self, group_timeout_s: float) -> float:
        """The least a rank must stand still, evidence holding, before it is convicted: patience × timeout / 3.

        ``Bounds.conviction_floor_s``, where the other bounds that follow from the group timeout are derived.
        """
        return Bounds(group_timeout_s, self.patience).conviction_floor_s

    def __post_init__(self) -> None:
        """Accept the mode as a string; reject an unknown one and non-positive durations."""
        try:
            object.__setattr__(self, "mode", LivenessMode(self.mode))
        except ValueError:
            names = ", ".join(m.value for m in LivenessMode)
            raise ConfigError("liveness.mode", f"must be one of {names}, got {self.mode!r}") from None
        check_number("liveness.interval_s", self.interval_s, integer=False, above=0, unit="seconds")
        check_number("liveness.floor_s", self.floor_s, integer=False, above=0, unit="seconds")
        check_number("liveness.default_deadline_s", self.default_deadline_s, integer=False, above=0, unit="seconds")
        for phase, seconds in self.deadlines:
            check_number(f"liveness.deadlines.{phase}", seconds, integer=False, above=0, unit="seconds")
        check_number("liveness.patience", self.patience, integer=False, above=0, unit="")

    def in_force(self, group_timeout_s: float) -> str:
        """The deadlines in force, in words, for a start line ("" when liveness is off)."""
        if self.mode is LivenessMode.OFF:
            return ""
        floor = self.conviction_floor_s(group_timeout_s)
        return (
            f"{self.mode.value}: every {self.interval_s:g} s; suspected past max(5 x the slowest step, "
            f"{self.floor_s:g} s); convicted past max(that, {floor:.3g} s = patience {self.patience:g} x the "
            f"{group_timeout_s:g} s group timeout / 3)"
        )

    def check_against(self, group_timeout_s: float) -> None:
        """Refuse settings that provably let a victim's timeout come first; warn on those that only may.

        The conviction floor and ``floor_s`` (no deadline is shorter) must stay below the
        group timeout (a rank stuck before a collective is convicted before its peers'
        receive times out: else the victim's timeout is the first failure and the culprit
        is never named): ``ConfigError``.
        An interval at or above the floor is only warned on (``RuntimeWarning``): a rank
        past its deadline is then convicted at the look that first suspects it, as before
        judgement, but no healthy rank is killed that the group timeout would have spared
        (the floor is a third of it: a short group timeout, not the interval, bounds the
        healthy pauses such a run survives).
        So is an explicit ``deadlines`` entry for a phase of the training step (``batch``,
        ``step``, ``callback``) at or above the group timeout: a rank wedged there is
        convicted only after its peers' collectives timed out, but an explicit deadline
        is the caller's choice (the group timeout then decides), and it kills no one.
        """
        if self.mode is LivenessMode.OFF:
            return
        floor = self.conviction_floor_s(group_timeout_s)
        if floor >= group_timeout_s:
            raise ConfigError(
                "liveness.patience",
                f"{self.patience}: the conviction floor ({floor:.1f} s) reaches the group timeout "
                f"({group_timeout_s:.1f} s): a peer's collective times out before the culprit is convicted; "
                "use a patience below 3",
            )
        if self.floor_s >= group_timeout_s:
            raise ConfigError(
                "liveness.floor_s",
                f"{self.floor_s:g}: the least calibrated deadline, not below the group timeout "
                f"({group_timeout_s:g} s): a peer's collective times out before any culprit is convicted; use a "
                "floor below the group timeout",
            )
        if self.interval_s >= floor:
            warnings.warn(
                f"liveness.interval_s {self.interval_s:g} is not below the conviction floor ({floor:.2g} s = "
                f"patience {self.patience:g} x the {group_timeout_s:g} s group timeout / 3): a rank past its "
                "deadline is convicted at the look that first suspects it, with no look between",
                RuntimeWarning,
                stacklevel=4,  # check_against, __post_init__, the dataclass __init__: the caller's line
            )
        for phase, seconds in self.deadlines:
            if phase in LOOP_PHASES and seconds >= group_timeout_s:
                warnings.warn(
                    f"liveness.deadlines.{phase} {seconds:g} is not below the group timeout ({group_timeout_s:g} s): a "
                    f"rank wedged in phase {phase} is convicted only after its peers' collectives timed out, so a "
                    "victim's timeout is the first failure and the culprit is not named; use a deadline below the "
                    "group timeout, or leave the phase to the calibrated deadline",
                    RuntimeWarning,
                    stacklevel=4,
                )


@dataclass(frozen=True, slots=True)
class PretrainConfig:
    """Everything ``pretrain`` needs, each part validated on construction.

    ``journal_dir``: if set, every ``pretrain`` call appends this rank's journal to
    ``<journal_dir>/rank<R>.jsonl`` (see ``lifecycle.journal``), whether it succeeds
    or fails. ``fault``: an optional injected failure (demos and tests). ``liveness``:
    the rank's liveness monitor (off unless its mode says otherwise).

    ``parallel``'s pipeline and context parallel sizes must be 1: ``ConfigError`` at
    construction otherwise. Without CUDA (backend gloo) megatron-core 0.16.1 cannot run
    them at all (its pipeline send/receive allocates on the CUDA device, its
    context-parallel attention is CUDA-only); with nccl, ``pretrain``'s loop has no
    pipeline schedule and its model no context-parallel attention, so every stage
    would train a full replica. Tensor parallelism is the model parallelism it runs.
    """

    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    exit: ExitConfig = field(default_factory=ExitConfig)
    fault: FaultInjection | None = None
    liveness: LivenessConfig = field(default_factory=LivenessConfig)
    journal_dir: str | None = None

    def __post_init__(self) -> None:
        """Refuse a section of the wrong type, and pipeline and context parallel sizes above 1 (class docstring).

        Each section must be an instance of its class (``checkpoint=None`` is refused:
        leave it out for the defaults); ``fault`` may be None; ``journal_dir`` is None, a
        non-empty string (``""`` would be the current folder).
        """
        for name, kind in _SECTIONS.items():
            value = getattr(self, name)
            if not isinstance(value, kind) and not (value is None and name == "fault"):
                allowed = f"a {kind.__name__}" + (" or None" if name == "fault" else " (leave it out for the defaults)")
                raise ConfigError(name, f"must be {allowed}, got {value!r}")
        if self.journal_dir is not None and (not isinstance(self.journal_dir, str) or not self.journal_dir):
            raise ConfigError("journal_dir", f"must be None or a non-empty string, got {self.journal_dir!r}")
        self.liveness.check_against(self.distributed.timeout_s)
        for name in ("pipeline_model_parallel_size", "context_parallel_size"):
            size = getattr(self.parallel, name)
            if size == 1:
                continue
            if self.distributed.backend != "nccl":
                why = (
                    "needs CUDA: megatron-core 0.16.1's pipeline send/receive allocates on the CUDA device"
                    if name.startswith("pipeline")
                    else "needs CUDA: megatron-core 0.16.1's context-parallel attention runs only on CUDA"
                )
                raise ConfigError(f"parallel.{name}", f"{size}: backend {self.distributed.backend!r} {why}; use 1")
            raise ConfigError(
                f"parallel.{name}",
                f"{size}: pretrain has no pipeline schedule or context-parallel attention, so every stage would "
                "train a full replica; use 1 (tensor_model_parallel_size is the model parallelism pretrain runs)",
            )


_E = TypeVar("_E", bound=StrEnum)


def _member(kind: type[_E], path: str, value: object) -> _E:
    """``value`` as a member of ``kind`` (its name accepted as a string); ``ConfigError`` naming ``path`` otherwise."""
    try:
        return kind(str(value)) if not isinstance(value, kind) else value
    except ValueError:
        names = ", ".join(m.value for m in kind)
        raise ConfigError(path, f"must be one of {names}, got {value!r}") from None


_SECTIONS: dict[str, type] = {
    "distributed": DistributedConfig,
    "parallel": ParallelConfig,
    "model": ModelConfig,
    "training": TrainingConfig,
    "checkpoint": CheckpointConfig,
    "exit": ExitConfig,
    "fault": FaultInjection,
    "liveness": LivenessConfig,
}
"""``PretrainConfig``'s sections and the class each must be an instance of."""
