"""The public surface is exactly what is documented: every public module's ``__all__`` is pinned here or derived."""

from __future__ import annotations

import importlib
import inspect

import pytest

from lifecycle.journal import KINDS


def test_every_public_module_exports_exactly_its_pinned_names() -> None:
    """Each public module's ``__all__`` is exactly its list below (``lifecycle``'s: derived); every name exists."""
    for module_name, pinned in EXPORTS.items():
        module = importlib.import_module(module_name)
        assert sorted(module.__all__) == sorted(pinned), module_name
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module_name}.{name}"


PUBLIC = (
    *("lifecycle", "lifecycle.lowlevel", "lifecycle.checkpoint"),
    *("lifecycle.journal", "lifecycle.restart", "lifecycle.testing"),
)
"""The public modules; every other module of the package is private (a component starts with ``_``)."""


@pytest.mark.parametrize("module_name", PUBLIC)
def test_every_public_callable_has_a_docstring(module_name: str) -> None:
    """Every exported class and function of ``module_name`` documents its contract."""
    module = importlib.import_module(module_name)
    undocumented = [
        name for name in module.__all__ if callable(obj := getattr(module, name)) and not (obj.__doc__ or "").strip()
    ]
    assert undocumented == []


EXPORTS: dict[str, list[str]] = {
    # lifecycle itself: tests/test_surface.py derives its list from the docs' code and pins it.
    "lifecycle.lowlevel": [
        *("TRANSITIONS", "Edge", "edges_from", "reachable_states"),
        *("Ledger", "LedgerEntry", "Plan", "Step", "StepKind", "Teardown", "plan_teardown", "teardown"),
        *("LeftReason", "Outcome", "RestartMode", "StepRecord", "TeardownReport"),
        *("Handler", "Releases", "Resource", "WrapperRole"),
        *("declare_resource", "declared_resources", "live_resources", "undeclare_resource"),
        *("JournalEntry", "SessionEvent", "TransitionEvent", "TeardownEvent", "FailureEvent", "ReclaimEvent"),
        *("ReleaseEvent", "Released", "Releaser"),
        *("Announcement", "CheckpointWriter", "DistributedActions", "ProgressLog", "ProgressSink"),
        *("Attempt", "Decision", "Frame", "RestartPolicy", "decide", "decide_after", "last_decision"),
        *("note_host", "agent_store", "join_round"),
    ],
    "lifecycle.checkpoint": [
        "AsyncCheckpointer",
        "CheckpointError",
        "CheckpointMismatch",
        "SaveFailed",
        "SaveFailures",
        "StaleCheckpointer",
        "latest_checkpoint",
        "load_checkpoint",
    ],
    # Every record kind's class, taken from the kinds the journal declares (a new kind is
    # exported without an edit here), and the names around them.
    "lifecycle.journal": [
        *(cls.__name__ for cls in KINDS.values()),
        *("KINDS", "V1_RUN_ID", "VERSION", "JournalWriter", "Loaded", "Origin", "Problem", "Record", "Skipped"),
        "GroupPosition",  # a field of the collectives record
        *("each_file", "journal_files", "journal_path", "load", "load_each", "parse", "read", "restart_count"),
        *("run_id", "stream"),
    ],
    "lifecycle.restart": [
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

    try:
        raise lifecycle.InjectedFault(lifecycle.Phase.STEP, 1, 3)
    except lifecycle.InjectedFault as exc:
        printed = "".join(traceback.format_exception(exc))
        assert type(pickle.loads(pickle.dumps(exc))) is lifecycle.InjectedFault
    assert "\nlifecycle.InjectedFault: injected failure at phase 'step' on rank 1, step 3" in printed, printed


def _defined_names(module_name: str) -> list[tuple[str, object]]:
    """The classes and functions ``module_name`` exports (its lazy names loaded), each with its exported name."""
    module = importlib.import_module(module_name)
    values = [(name, getattr(module, name)) for name in module.__all__]
    return [(name, value) for name, value in values if isinstance(value, type) or inspect.isfunction(value)]


@pytest.mark.parametrize("module_name", ["lifecycle", "lifecycle.lowlevel", "lifecycle.restart", "lifecycle.testing"])
def test_every_exported_class_and_function_reads_as_a_public_path(module_name: str) -> None:
    """No export reads as a private module; ``lifecycle``'s and ``lowlevel``'s read as their own; all pickle so."""
    import pickle

    for name, value in _defined_names(module_name):
        path = value.__module__  # type: ignore[attr-defined]
        assert not any(part.startswith("_") for part in path.split(".")), f"{module_name}.{name} reads as {path}"
        if module_name in ("lifecycle", "lifecycle.lowlevel"):
            assert (path, value.__qualname__) == (module_name, name)  # type: ignore[attr-defined]
        assert pickle.loads(pickle.dumps(value)) is value, name


def test_exported_values_pickle_by_their_public_path() -> None:
    """An error, every member of every exported enum and a whole configuration pickle and come back equal."""
    import enum
    import pickle

    import lifecycle
    import lifecycle.lowlevel

    members = [
        member
        for module_name in ("lifecycle", "lifecycle.lowlevel")
        for _, value in _defined_names(module_name)
        if isinstance(value, enum.EnumMeta)
        for member in value  # type: ignore[var-annotated]
    ]
    assert lifecycle.Phase.STEP in members and lifecycle.lowlevel.Outcome.SUCCESS in members
    config = lifecycle.PretrainConfig(liveness=lifecycle.LivenessConfig(mode=lifecycle.LivenessMode.KILL))
    error = lifecycle.InvalidTransition(lifecycle.State.CLOSED, lifecycle.Trigger.CLOSE)
    for value in [*members, config, lifecycle.DistributedConfig(timeout_s=5), error]:
        back = pickle.loads(pickle.dumps(value))
        assert type(back) is type(value) and (back == value or str(back) == str(value)), value
    assert b"lifecycle._" not in pickle.dumps(config), "a configuration pickles by a private path"


@pytest.mark.parametrize("module_name", ["lifecycle", "lifecycle.lowlevel"])
def test_exported_classes_type_hints_still_resolve(module_name: str) -> None:
    """Publishing keeps ``typing.get_type_hints`` working on every exported class.

    ``TrainContext`` names ``torch`` and ``AsyncCheckpointer``, imported only for type
    checking where it is defined: those are given, as a type checker finds them.
    """
    import typing

    import torch

    import lifecycle.checkpoint

    known = {"torch": torch, "AsyncCheckpointer": lifecycle.checkpoint.AsyncCheckpointer}
    for name, value in _defined_names(module_name):
        if isinstance(value, type):
            assert isinstance(typing.get_type_hints(value, localns=known), dict), name
