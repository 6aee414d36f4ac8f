"""lifecycle: the life of a distributed training session as an explicit state machine.

``import lifecycle`` loads no torch, megatron-core or NVRx: the vocabulary, table,
ledger, plans, ``Session`` and the configuration come from modules that import none of
them. The names that need torch (``TorchActions``, ``pretrain``) load it on first use.
"""

from typing import TYPE_CHECKING, Any

from lifecycle._core.errors import (
    AlreadyHeld,
    AttemptDisagreement,
    ConfigError,
    ForeignResource,
    InvalidTransition,
    LifecycleError,
    MissingResource,
    ResourceMismatch,
    ResourceRefused,
    SessionFinished,
    StaleResource,
    StepTimedOut,
    StoreHostLost,
    UnfinishedSession,
)
from lifecycle._core.events import (
    FailureEvent,
    JournalEntry,
    ReclaimEvent,
    SessionEvent,
    TeardownEvent,
    TransitionEvent,
)
from lifecycle._core.executor import StepFailure, StepRecord, TeardownError, TeardownReport
from lifecycle._core.ownership import Ledger, LedgerEntry
from lifecycle._core.plans import LeftReason, Outcome, Plan, RestartMode, Step, Teardown, plan_teardown, teardown
from lifecycle._core.resources import (
    Handler,
    Releases,
    Resource,
    StepKind,
    WrapperRole,
    declare_resource,
    declared_resources,
    live_resources,
    undeclare_resource,
)
from lifecycle._core.seams import Announcement, CheckpointWriter, DistributedActions
from lifecycle._core.session import Session
from lifecycle._core.shield import TeardownInterrupted
from lifecycle._core.states import Owner, State, Trigger
from lifecycle._core.table import TRANSITIONS, Edge, edges_from, reachable_states
from lifecycle._training.callbacks import Callback, ExitReason, ProgressLog, SessionHandle, TrainContext
from lifecycle._training.config import (
    CheckpointConfig,
    ExitConfig,
    FaultInjection,
    FaultKind,
    InjectedFault,
    LivenessConfig,
    LivenessMode,
    ModelConfig,
    Phase,
    PretrainConfig,
    TrainingConfig,
)
from lifecycle._training.exits import ExitCode, StoppedByLauncher, exit_code
from lifecycle._training.providers import BatchProvider, ForwardStepFunc, ModelProvider

if TYPE_CHECKING:
    from lifecycle._torch.actions import TorchActions
    from lifecycle._torch.config import DistributedConfig, ParallelConfig
    from lifecycle._training.pretrain import PretrainResult, pretrain

_LAZY = {
    "DistributedConfig": "lifecycle._torch.config",
    "ParallelConfig": "lifecycle._torch.config",
    "TorchActions": "lifecycle._torch.actions",
    "pretrain": "lifecycle._training.pretrain",
    "PretrainResult": "lifecycle._training.pretrain",
}


def _public_names_for_errors() -> None:
    """Give each exported exception the module users import it from, so a traceback reads ``lifecycle.InjectedFault``.

    Pickling stays exact (``lifecycle`` has every one of them as an attribute); the class is the
    same object, so ``except`` clauses and ``isinstance`` are unaffected.
    """
    for value in list(globals().values()):
        if isinstance(value, type) and issubclass(value, BaseException) and value.__module__.startswith("lifecycle._"):
            value.__module__ = "lifecycle"


_public_names_for_errors()


def __getattr__(name: str) -> Any:
    """Load the names that need torch (or their configuration) on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lifecycle' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "TRANSITIONS",
    "AlreadyHeld",
    "Announcement",
    "AttemptDisagreement",
    "BatchProvider",
    "Callback",
    "CheckpointConfig",
    "CheckpointWriter",
    "ConfigError",
    "DistributedActions",
    "DistributedConfig",
    "Edge",
    "ExitCode",
    "ExitConfig",
    "ExitReason",
    "FailureEvent",
    "FaultInjection",
    "FaultKind",
    "ForeignResource",
    "ForwardStepFunc",
    "Handler",
    "InjectedFault",
    "InvalidTransition",
    "JournalEntry",
    "Ledger",
    "LedgerEntry",
    "LeftReason",
    "LifecycleError",
    "LivenessConfig",
    "LivenessMode",
    "MissingResource",
    "ModelConfig",
    "ModelProvider",
    "Outcome",
    "Owner",
    "ParallelConfig",
    "Phase",
    "Plan",
    "PretrainConfig",
    "PretrainResult",
    "ProgressLog",
    "ReclaimEvent",
    "Releases",
    "Resource",
    "ResourceMismatch",
    "ResourceRefused",
    "RestartMode",
    "Session",
    "SessionEvent",
    "SessionFinished",
    "SessionHandle",
    "StaleResource",
    "State",
    "Step",
    "StepFailure",
    "StepKind",
    "StepRecord",
    "StepTimedOut",
    "StoppedByLauncher",
    "StoreHostLost",
    "Teardown",
    "TeardownError",
    "TeardownEvent",
    "TeardownInterrupted",
    "TeardownReport",
    "TorchActions",
    "TrainContext",
    "TrainingConfig",
    "TransitionEvent",
    "Trigger",
    "UnfinishedSession",
    "WrapperRole",
    "declare_resource",
    "declared_resources",
    "edges_from",
    "exit_code",
    "live_resources",
    "plan_teardown",
    "pretrain",
    "reachable_states",
    "teardown",
    "undeclare_resource",
]
