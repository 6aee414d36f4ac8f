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


def test_the_test_toolkit_is_pinned_and_documented() -> None:
    """``lifecycle.testing.__all__`` lists exactly the doubles, ports, launcher and probes; each callable has a doc."""
    assert sorted(lifecycle.testing.__all__) == sorted(TESTING_EXPORTS)
    for name in lifecycle.testing.__all__:
        obj = getattr(lifecycle.testing, name)
        assert not callable(obj) or (obj.__doc__ or "").strip(), name


TESTING_EXPORTS = [
    "COLLECTIVES",
    "TORCH_COLLECTIVES",
    "RankResult",
    "RecordingActions",
    "RecordingCheckpoints",
    "Socket",
    "alive",
    "free_port",
    "free_ports",
    "launch_ranks",
    "megatron_globals",
    "release_everything",
    "run_command",
    "sockets",
    "threads",
    "torchrun_command",
]


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
