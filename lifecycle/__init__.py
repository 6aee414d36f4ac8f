"""lifecycle: the life of a distributed training session as an explicit state machine.

The vocabulary, table, ledger, plans and ``Session`` import neither torch nor
Megatron-core. The names that need them (``TorchActions``, ``pretrain`` and its
configuration) are loaded on first use.
"""

from typing import TYPE_CHECKING, Any

from lifecycle._callbacks import Callback, ExitReason, ProgressLog, TrainContext
from lifecycle._errors import ConfigError, InvalidTransition, LifecycleError, TeardownError
from lifecycle._executor import DistributedActions, StepFailure, StepRecord, TeardownReport
from lifecycle._ownership import Ledger, LedgerEntry, Owner, Resource
from lifecycle._plans import Outcome, Plan, RestartMode, Step, StepKind, plan_teardown
from lifecycle._session import CheckpointWriter, JournalEntry, Session
from lifecycle._states import State, Trigger
from lifecycle._table import TRANSITIONS, Edge, edges_from, reachable_states
from lifecycle._train_config import (
    CheckpointConfig,
    ExitConfig,
    FaultInjection,
    InjectedFault,
    ModelConfig,
    Phase,
    PretrainConfig,
    TrainingConfig,
)

if TYPE_CHECKING:
    from lifecycle._config import DistributedConfig, ParallelConfig
    from lifecycle._distributed import TorchActions
    from lifecycle._pretrain import PretrainResult, pretrain

_LAZY = {
    "DistributedConfig": "lifecycle._config",
    "ParallelConfig": "lifecycle._config",
    "TorchActions": "lifecycle._distributed",
    "pretrain": "lifecycle._pretrain",
    "PretrainResult": "lifecycle._pretrain",
}


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
    "Callback",
    "CheckpointConfig",
    "CheckpointWriter",
    "ConfigError",
    "DistributedActions",
    "DistributedConfig",
    "Edge",
    "ExitConfig",
    "ExitReason",
    "FaultInjection",
    "InjectedFault",
    "InvalidTransition",
    "JournalEntry",
    "Ledger",
    "LedgerEntry",
    "LifecycleError",
    "ModelConfig",
    "Outcome",
    "Owner",
    "ParallelConfig",
    "Phase",
    "Plan",
    "PretrainConfig",
    "PretrainResult",
    "ProgressLog",
    "Resource",
    "RestartMode",
    "Session",
    "State",
    "Step",
    "StepFailure",
    "StepKind",
    "StepRecord",
    "TeardownError",
    "TeardownReport",
    "TorchActions",
    "TrainContext",
    "TrainingConfig",
    "Trigger",
    "edges_from",
    "plan_teardown",
    "pretrain",
    "reachable_states",
]
