"""lifecycle: the life of a distributed training session as an explicit state machine.

This module exports the names a training script, a loop of your own and a test suite
use (the README, docs/tutorial.md and docs/howto.md use nothing else), with their
configuration and error types; the machinery under them (ledger, plans, steps, events,
seams, resource declarations, the transition table) is in ``lifecycle.lowlevel``.
tests/test_surface.py derives this list from the documents' code and pins ``__all__`` to it.

``import lifecycle`` loads no torch, megatron-core or NVRx: the vocabulary, ``Session``
and the configuration come from modules that import none of them. The names that need
torch (``TorchActions``, ``pretrain``, ``PretrainResult``) load it on first use. Every
exported class and function reads as ``lifecycle.NAME`` (``__module__``), and pickles by it.
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
    MonitorLost,
    NonfiniteLoss,
    ResourceMismatch,
    ResourceRefused,
    SessionFinished,
    StaleResource,
    StepTimedOut,
    StoreHostLost,
    UnfinishedSession,
)
from lifecycle._core.executor import StepFailure, TeardownError
from lifecycle._core.exports import publish, publish_one
from lifecycle._core.session import Session
from lifecycle._core.shield import TeardownInterrupted
from lifecycle._core.states import Owner, State, Trigger
from lifecycle._torch.config import DistributedConfig, ParallelConfig
from lifecycle._training.callbacks import Callback, ExitReason, SessionHandle, TrainContext
from lifecycle._training.config import (
    CheckpointConfig,
    ExitConfig,
    FaultInjection,
    FaultKind,
    InjectedFault,
    LivenessConfig,
    LivenessMode,
    ModelConfig,
    OnNonfiniteLoss,
    OnSaveError,
    Phase,
    PretrainConfig,
    TrainingConfig,
)
from lifecycle._training.exits import ExitCode, StoppedByLauncher, exit_code
from lifecycle._training.providers import BatchProvider, ForwardStepFunc, ModelProvider

if TYPE_CHECKING:
    from lifecycle._torch.actions import TorchActions
    from lifecycle._training.pretrain import PretrainResult, pretrain

_LAZY = {
    "TorchActions": "lifecycle._torch.actions",
    "pretrain": "lifecycle._training.pretrain",
    "PretrainResult": "lifecycle._training.pretrain",
}


def __getattr__(name: str) -> Any:
    """Load the names that need torch on first use, giving each its public path as it loads."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lifecycle' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    publish_one(value, __name__, name)
    globals()[name] = value
    return value


__all__ = [
    "AlreadyHeld",
    "AttemptDisagreement",
    "BatchProvider",
    "Callback",
    "CheckpointConfig",
    "ConfigError",
    "DistributedConfig",
    "ExitCode",
    "ExitConfig",
    "ExitReason",
    "FaultInjection",
    "FaultKind",
    "ForeignResource",
    "ForwardStepFunc",
    "InjectedFault",
    "InvalidTransition",
    "LifecycleError",
    "LivenessConfig",
    "LivenessMode",
    "MissingResource",
    "ModelConfig",
    "ModelProvider",
    "MonitorLost",
    "NonfiniteLoss",
    "OnNonfiniteLoss",
    "OnSaveError",
    "Owner",
    "ParallelConfig",
    "Phase",
    "PretrainConfig",
    "PretrainResult",
    "ResourceMismatch",
    "ResourceRefused",
    "Session",
    "SessionFinished",
    "SessionHandle",
    "StaleResource",
    "State",
    "StepFailure",
    "StepTimedOut",
    "StoppedByLauncher",
    "StoreHostLost",
    "TeardownError",
    "TeardownInterrupted",
    "TorchActions",
    "TrainContext",
    "TrainingConfig",
    "Trigger",
    "UnfinishedSession",
    "exit_code",
    "pretrain",
]

publish(globals())
