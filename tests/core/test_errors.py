"""The library's errors: each refusal type carries its fields, and pickles and copies with them."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable

import pytest
from support.internals import errors

from lifecycle import (
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
    State,
    StepTimedOut,
    StoreHostLost,
    Trigger,
    UnfinishedSession,
)

# One instance of every error type errors.py defines, built with every field set.
EXAMPLES: list[LifecycleError] = [
    InvalidTransition(State.CLOSED, Trigger.START_TRAINING),
    SessionFinished(State.FAILED, "init_distributed"),
    UnfinishedSession(State.GLOBALS_READY),
    ResourceRefused("process_group", "a detail"),
    StaleResource("model_parallel", "half-made; call destroy_model_parallel() first"),
    ResourceMismatch("microbatch_calculator", (2, 8), (1, 1), "(micro, global) batch size", "destroy it"),
    ResourceMismatch("process_group", 1, 2),
    ForeignResource("process_group", "created by the caller; release it"),
    MissingResource("process_group", "rank needs the default process group"),
    AlreadyHeld("signal_handlers", "this session already holds it"),
    ConfigError("store_prefix", "'p' was already used for a group"),
    AttemptDisagreement("10.0.0.1:29500", 5.0, {0: 2, 1: None, 2: 2, 3: 0}, 1),
    StepTimedOut("destroy_process_group", 5.0),
    StoreHostLost("torchrun's agent (127.0.0.1:29500)", "the store's host … has not answered for 3.0 s"),
    MonitorLost(1, "rank 1's liveness monitor was killed by SIGKILL, and the one started again by SIGKILL"),
    NonfiniteLoss(20, 1, float("inf"), 1, 0),
]

COPIES: dict[str, Callable[[LifecycleError], object]] = {
    "pickle": lambda error: pickle.loads(pickle.dumps(error)),
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
}


@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("error", EXAMPLES, ids=lambda e: type(e).__name__)
def test_every_error_pickles_and_copies_with_its_fields_and_notes(error: LifecycleError, how: str) -> None:
    """A pickled or copied error has the same type, message, fields and notes as the original."""
    error.add_note("lifecycle: a note added on the way up")
    try:
        clone = COPIES[how](error)
    finally:
        del error.__notes__  # EXAMPLES are shared between cases
    assert type(clone) is type(error)
    assert isinstance(clone, LifecycleError)
    assert str(clone) == str(error)
    assert clone.args == error.args
    assert vars(clone) == {**vars(error), "__notes__": ["lifecycle: a note added on the way up"]}


def test_every_error_type_in_the_module_has_a_pickling_example() -> None:
    """Each LifecycleError subclass defined in lifecycle._core.errors is among the pickling examples."""
    defined = {obj for obj in vars(errors).values() if isinstance(obj, type) and issubclass(obj, LifecycleError)}
    assert defined - {LifecycleError} == {type(error) for error in EXAMPLES}


def test_a_refusal_names_its_resource_and_keeps_its_facts_as_fields() -> None:
    """ResourceMismatch exposes resource, found, wanted, what and remedy; its message names them all."""
    error = ResourceMismatch("process_group", 1, 2, "world size", "create it with world size 2")
    assert isinstance(error, ResourceRefused)
    assert (error.resource, error.found, error.wanted, error.what) == ("process_group", 1, 2, "world size")
    assert error.remedy == "create it with world size 2"
    assert str(error) == (
        "process_group: already exists with world size 1, but the configuration says 2; create it with world size 2"
    )
    assert str(ResourceMismatch("process_group", 1, 2)) == (
        "process_group: already exists with 1, but the configuration says 2"
    )


def test_each_refusal_kind_is_its_own_type() -> None:
    """Stale, mismatched, foreign and missing resources are distinct ResourceRefused types; ConfigError is apart."""
    kinds = [StaleResource, ResourceMismatch, ForeignResource, MissingResource]
    assert all(issubclass(kind, ResourceRefused) for kind in kinds)
    assert all(not issubclass(a, b) for a in kinds for b in kinds if a is not b)
    error = ConfigError("store_prefix", "was already used")
    assert isinstance(error, ValueError) and not isinstance(error, ResourceRefused)
    assert (error.field, error.message) == ("store_prefix", "was already used")


def test_an_exception_chain_is_walked_cause_first_each_error_once() -> None:
    """``chain`` yields the error, then its ``__cause__`` (else its ``__context__``), and ends at a cycle."""
    root, context, cause = KeyError("root"), OSError("context"), ValueError("cause")
    top = RuntimeError("top")
    top.__cause__, top.__context__ = cause, context
    cause.__context__ = root
    root.__context__ = top  # a cycle: walked once
    assert list(errors.chain(top)) == [top, cause, root]
    assert list(errors.chain(context)) == [context]
