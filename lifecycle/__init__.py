"""lifecycle: the life of a distributed training session as an explicit state machine."""

from lifecycle._errors import ConfigError, InvalidTransition, LifecycleError, TeardownError
from lifecycle._executor import DistributedActions, StepFailure, StepRecord, TeardownReport
from lifecycle._ownership import Ledger, LedgerEntry, Owner, Resource
from lifecycle._plans import Outcome, Plan, RestartMode, Step, StepKind, plan_teardown
from lifecycle._session import CheckpointWriter, JournalEntry, Session
from lifecycle._states import State, Trigger
from lifecycle._table import TRANSITIONS, Edge, edges_from, reachable_states

__all__ = [
    "TRANSITIONS",
    "CheckpointWriter",
    "ConfigError",
    "DistributedActions",
    "Edge",
    "InvalidTransition",
    "JournalEntry",
    "Ledger",
    "LedgerEntry",
    "LifecycleError",
    "Outcome",
    "Owner",
    "Plan",
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
    "Trigger",
    "edges_from",
    "plan_teardown",
    "reachable_states",
]
