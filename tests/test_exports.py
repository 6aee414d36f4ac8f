"""The public surface is exactly what is documented."""

from __future__ import annotations

import lifecycle
import lifecycle.testing


def test_public_names_are_pinned() -> None:
    """``lifecycle.__all__`` lists exactly these names, and each one exists."""
    assert sorted(lifecycle.__all__) == sorted(EXPORTS)
    for name in lifecycle.__all__:
        assert getattr(lifecycle, name) is not None


def test_every_public_callable_has_a_docstring() -> None:
    """Every exported class and function documents its contract."""
    for name in lifecycle.__all__:
        obj = getattr(lifecycle, name)
        if callable(obj):
            assert (obj.__doc__ or "").strip(), name


def test_the_test_double_is_shipped() -> None:
    """``lifecycle.testing`` offers the recording doubles."""
    assert {"RecordingActions", "RecordingCheckpoints", "COLLECTIVES"} <= set(dir(lifecycle.testing))


EXPORTS = [
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
