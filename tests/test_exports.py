"""The public surface is exactly what is documented: every public module's ``__all__`` is pinned here."""

from __future__ import annotations

import importlib

import pytest

from lifecycle.journal import KINDS


def test_every_public_module_exports_exactly_its_pinned_names() -> None:
    """Each public module's ``__all__`` is exactly the list below, and every name in it exists."""
    for module_name, pinned in EXPORTS.items():
        module = importlib.import_module(module_name)
        assert sorted(module.__all__) == sorted(pinned), module_name
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module_name}.{name}"


@pytest.mark.parametrize(
    "module_name", ["lifecycle", "lifecycle.checkpoint", "lifecycle.journal", "lifecycle.restart", "lifecycle.testing"]
)
def test_every_public_callable_has_a_docstring(module_name: str) -> None:
    """Every exported class and function of ``module_name`` documents its contract."""
    module = importlib.import_module(module_name)
    undocumented = [
        name for name in module.__all__ if callable(obj := getattr(module, name)) and not (obj.__doc__ or "").strip()
    ]
    assert undocumented == []


EXPORTS: dict[str, list[str]] = {
    "lifecycle": [
        "TeardownInterrupted",
        "ReclaimEvent",
        "SessionEvent",
        "FailureEvent",
        "Announcement",
        "TeardownEvent",
        "TransitionEvent",
        "AlreadyHeld",
        "AttemptDisagreement",
        "undeclare_resource",
        "teardown",
        "live_resources",
        "declared_resources",
        "declare_resource",
        "WrapperRole",
        "UnfinishedSession",
        "Teardown",
        "StaleResource",
        "StepTimedOut",
        "StoreHostLost",
        "StoppedByLauncher",
        "SessionFinished",
        "ResourceRefused",
        "ResourceMismatch",
        "Releases",
        "MissingResource",
        "LeftReason",
        "ForeignResource",
        "TRANSITIONS",
        "BatchProvider",
        "ForwardStepFunc",
        "ModelProvider",
        "Callback",
        "CheckpointConfig",
        "CheckpointWriter",
        "ConfigError",
        "DistributedActions",
        "DistributedConfig",
        "Edge",
        "ExitConfig",
        "ExitCode",
        "ExitReason",
        "FaultInjection",
        "FaultKind",
        "LivenessConfig",
        "LivenessMode",
        "Handler",
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
        "SessionHandle",
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
        "exit_code",
        "plan_teardown",
        "pretrain",
        "reachable_states",
    ],
    "lifecycle.checkpoint": [
        "AsyncCheckpointer",
        "CheckpointError",
        "CheckpointMismatch",
        "StaleCheckpointer",
        "latest_checkpoint",
        "load_checkpoint",
    ],
    # Every record kind's class, taken from the kinds the journal declares (a new kind is
    # exported without an edit here), and the names around them.
    "lifecycle.journal": [
        *(cls.__name__ for cls in KINDS.values()),
        *("KINDS", "V1_RUN_ID", "VERSION", "JournalWriter", "Loaded", "Origin", "Record"),
        *("journal_files", "journal_path", "load", "load_each", "parse", "read", "restart_count", "run_id"),
    ],
    "lifecycle.restart": [
        "CudaHealthCheck",
        "NvmlHealthChecksOff",
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
    ],
    "lifecycle.testing": [
        "COLLECTIVES",
        "TORCH_COLLECTIVES",
        "LifecycleLeakWarning",
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
    ],
}


def test_pretrain_takes_the_public_provider_protocols() -> None:
    """``pretrain`` and ``wrapped_pretrain`` take the Protocols ``lifecycle`` exports, not private aliases."""
    import typing

    import lifecycle
    from lifecycle import restart

    for function in (lifecycle.pretrain, restart.wrapped_pretrain):
        hints = typing.get_type_hints(function)
        assert hints["forward_step_func"] == lifecycle.ForwardStepFunc | None, function
        assert hints["model_provider"] == lifecycle.ModelProvider | None, function
        assert hints["batch_provider"] == lifecycle.BatchProvider | None, function
    for protocol in (lifecycle.ModelProvider, lifecycle.BatchProvider, lifecycle.ForwardStepFunc):
        assert getattr(protocol, "_is_protocol", False), protocol


def test_exported_errors_print_under_the_public_module() -> None:
    """A traceback names ``lifecycle.InjectedFault``, not its private module; the error pickles by that name."""
    import pickle
    import traceback

    import lifecycle

    errors = [getattr(lifecycle, name) for name in lifecycle.__all__ if name not in ("pretrain", "PretrainResult")]
    errors = [value for value in errors if isinstance(value, type) and issubclass(value, BaseException)]
    assert len(errors) >= 10 and all(error.__module__ == "lifecycle" for error in errors), errors
    try:
        raise lifecycle.InjectedFault(lifecycle.Phase.STEP, 1, 3)
    except lifecycle.InjectedFault as exc:
        printed = "".join(traceback.format_exception(exc))
        assert type(pickle.loads(pickle.dumps(exc))) is lifecycle.InjectedFault
    assert "\nlifecycle.InjectedFault: injected failure at phase 'step' on rank 1, step 3" in printed, printed
