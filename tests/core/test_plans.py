"""``teardown`` (and its projection ``plan_teardown``) over its whole input space."""

from __future__ import annotations

import hashlib
import itertools
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator

import pytest

from lifecycle import Owner
from lifecycle.lowlevel import (
    Ledger,
    LedgerEntry,
    LeftReason,
    Outcome,
    Plan,
    Resource,
    RestartMode,
    Step,
    StepKind,
    plan_teardown,
    teardown,
)

ABSENT = None
GLOBALS = frozenset({Resource.MODEL_PARALLEL, Resource.MICROBATCH_CALCULATOR, Resource.RERUN_STATE_MACHINE})
"""The Megatron-core globals."""


def all_ledgers() -> Iterator[Ledger]:
    """Every ledger shape: each built-in resource absent or held by each owner, 0 or 2 user resources."""
    owners = (ABSENT, *Owner)
    for group, mp, mb, rerun, ckpt, sig, users in itertools.product(
        owners, owners, owners, owners, (ABSENT, Owner.SESSION), (ABSENT, Owner.SESSION), (0, 2)
    ):
        ledger = Ledger()
        held = [
            (Resource.SIGNAL_HANDLERS, sig),
            (Resource.PROCESS_GROUP, group),
            (Resource.MODEL_PARALLEL, mp),
            (Resource.MICROBATCH_CALCULATOR, mb),
            (Resource.RERUN_STATE_MACHINE, rerun),
            (Resource.ASYNC_CHECKPOINT, ckpt),
        ]
        for resource, owner in held:
            if owner is not None:
                ledger = ledger.acquire(LedgerEntry(resource, owner))
        for i in range(users):
            ledger = ledger.acquire(LedgerEntry(Resource.USER, Owner.SESSION, f"user{i}"))
        yield ledger


CASES = [(ledger, mode, outcome) for ledger in all_ledgers() for mode in RestartMode for outcome in Outcome]


def test_the_input_space_is_enumerated() -> None:
    """The exhaustive tests below really cover thousands of combinations."""
    assert len(CASES) == 4**4 * 2 * 2 * 2 * 2 * 2


def test_every_plan_follows_the_canonical_order() -> None:
    """Step kinds never go backwards; only user resources repeat a kind."""
    for ledger, mode, outcome in CASES:
        ranks = [step.kind.rank for step in plan_teardown(ledger, mode, outcome)]
        assert ranks == sorted(ranks)


def test_a_failure_plan_never_has_a_barrier() -> None:
    """No failure plan contains a barrier: a rank-local failure must not hang its peers."""
    for ledger, mode, _ in CASES:
        kinds = {s.kind for s in plan_teardown(ledger, mode, Outcome.FAILURE)}
        assert StepKind.BARRIER not in kinds
        assert StepKind.FINALIZE_CHECKPOINTS not in kinds
        assert StepKind.DESTROY_PROCESS_GROUP not in kinds


def test_a_barrier_comes_right_before_the_group_is_destroyed_and_only_then() -> None:
    """Success plans have a barrier exactly when they destroy the group, immediately before it."""
    for ledger, mode, _ in CASES:
        kinds = [s.kind for s in plan_teardown(ledger, mode, Outcome.SUCCESS)]
        assert (StepKind.BARRIER in kinds) == (StepKind.DESTROY_PROCESS_GROUP in kinds)
        if StepKind.BARRIER in kinds:
            assert kinds[kinds.index(StepKind.BARRIER) + 1] is StepKind.DESTROY_PROCESS_GROUP


def test_caller_owned_resources_get_no_step() -> None:
    """A resource the caller owns is never released by the session, and the teardown says why."""
    for ledger, mode, outcome in CASES:
        stepped = {s.entry for s in plan_teardown(ledger, mode, outcome)}
        for entry in ledger.held():
            if entry.owner is Owner.CALLER:
                assert entry not in stepped
                assert (entry, LeftReason.CALLER) in teardown(ledger, mode, outcome).left


def test_inprocess_failure_leaves_group_and_globals_to_the_wrapper() -> None:
    """Under in-process restart a failure plan touches neither the group nor the Megatron globals."""
    for ledger, _, _ in CASES[:: len(RestartMode) * len(Outcome)]:
        plan = plan_teardown(ledger, RestartMode.INPROCESS, Outcome.FAILURE)
        assert not {s.entry.resource for s in plan} & (GLOBALS | {Resource.PROCESS_GROUP})


def test_wrapper_owned_resources_are_released_by_the_session_on_success() -> None:
    """On success the session releases what it recorded for the wrapper; on failure it leaves it to the wrapper."""
    for ledger, mode, _ in CASES:
        stepped = {s.entry for s in plan_teardown(ledger, mode, Outcome.SUCCESS)}
        for entry in ledger.held():
            if entry.owner is Owner.RESTART_WRAPPER:
                assert entry in stepped
            wrapper_scope = entry.resource in GLOBALS or entry.resource is Resource.PROCESS_GROUP
            in_scope = mode is RestartMode.INPROCESS and wrapper_scope and entry.owner is not Owner.CALLER
            if entry.owner is Owner.RESTART_WRAPPER or in_scope:
                failure = teardown(ledger, mode, Outcome.FAILURE)
                assert (entry, LeftReason.RESTART_WRAPPER) in failure.left
                assert entry in failure.deferred_to_wrapper


def test_every_held_resource_is_either_stepped_once_or_left_with_a_reason() -> None:
    """Each held entry gets exactly one release step, or appears once in the teardown's ``left``."""
    for ledger, mode, outcome in CASES:
        planned = teardown(ledger, mode, outcome)
        assert planned.outcome is outcome and planned.mode is mode
        releases = [s.entry for s in planned.plan if s.kind is not StepKind.BARRIER]
        left = [entry for entry, _ in planned.left]
        assert sorted(map(str, releases + left)) == sorted(map(str, ledger.held()))


def test_user_resources_are_released_in_reverse_registration_order() -> None:
    """The last user resource registered is the first released."""
    ledger = Ledger()
    for name in ("first", "second", "third"):
        ledger = ledger.acquire(LedgerEntry(Resource.USER, Owner.SESSION, name))
    plan = plan_teardown(ledger, RestartMode.ORDINARY, Outcome.FAILURE)
    assert [s.entry.name for s in plan] == ["third", "second", "first"]


def test_released_resources_get_no_step() -> None:
    """A resource already released is not planned again."""
    entry = LedgerEntry(Resource.MODEL_PARALLEL, Owner.SESSION)
    ledger = Ledger().acquire(entry).release(entry)
    assert plan_teardown(ledger, RestartMode.ORDINARY, Outcome.FAILURE) == ()


def test_a_plan_in_another_order_cannot_be_built() -> None:
    """``Plan`` refuses steps out of the canonical order, or a repeated non-user step."""
    group = LedgerEntry(Resource.PROCESS_GROUP, Owner.SESSION)
    mp = LedgerEntry(Resource.MODEL_PARALLEL, Owner.SESSION)
    with pytest.raises(ValueError, match="canonical"):
        Plan((Step(StepKind.DESTROY_PROCESS_GROUP, group), Step(StepKind.DESTROY_MODEL_PARALLEL, mp)))
    with pytest.raises(ValueError, match="canonical"):
        Plan((Step(StepKind.BARRIER, group), Step(StepKind.BARRIER, group)))


def test_every_plan_is_a_checked_plan() -> None:
    """``plan_teardown`` returns a ``Plan`` (order checked at construction), never a bare tuple or list."""
    for ledger, mode, outcome in CASES:
        plan = plan_teardown(ledger, mode, outcome)
        assert type(plan) is Plan
        if len({step.kind for step in plan}) > 1:
            with pytest.raises(ValueError, match="canonical"):
                Plan(tuple(reversed(plan)))


def plan_digest(cases: list[tuple[Ledger, RestartMode, Outcome]]) -> str:
    """One hash of every plan for ``cases``, in order."""
    text = "\n".join(",".join(map(str, plan_teardown(*case))) for case in cases)
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_plan_depends_only_on_the_value_of_its_inputs() -> None:
    """Equal inputs give equal plans (pickled, released or planned in another order); only held entries count."""
    expected = [plan_teardown(*case) for case in CASES]
    for (ledger, mode, outcome), plan in reversed(list(zip(CASES, expected, strict=True))):
        assert plan_teardown(pickle.loads(pickle.dumps(ledger)), mode, outcome) == plan
    entries = [LedgerEntry(Resource.USER, Owner.SESSION, f"user{i}") for i in range(6)]
    acquired = Ledger(tuple(entries))
    forward, backward = acquired, acquired
    for entry in entries[::2]:
        forward = forward.release(entry)
    for entry in reversed(entries[::2]):
        backward = backward.release(entry)
    held_only = Ledger(tuple(forward.held()))
    assert forward == backward != held_only
    for mode, outcome in itertools.product(RestartMode, Outcome):
        everything = plan_teardown(acquired, mode, outcome)
        plans = {plan_teardown(ledger, mode, outcome) for ledger in (forward, backward, held_only)}
        assert len(plans) == 1 and plans != {everything}  # only what is held counts


@pytest.mark.parametrize("seed", ["1", "2"])
def test_plans_are_the_same_in_a_fresh_interpreter_with_another_hash_seed(seed: str) -> None:
    """Every plan, computed in a new process with ``PYTHONHASHSEED`` set, is the one computed here."""
    code = f"import runpy, sys\nmodule = runpy.run_path({__file__!r})\nprint(module['plan_digest'](module['CASES']))\n"
    env = {**os.environ, "PYTHONHASHSEED": seed}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == plan_digest(CASES)


def test_ledger_entries_cannot_be_rewritten() -> None:
    """An entry is frozen, a key is recorded once, and a resource is released at most once."""
    from dataclasses import FrozenInstanceError

    from lifecycle import LifecycleError

    entry = LedgerEntry(Resource.PROCESS_GROUP, Owner.SESSION)
    with pytest.raises(FrozenInstanceError):
        entry.owner = Owner.CALLER  # type: ignore[misc]
    ledger = Ledger().acquire(entry)
    with pytest.raises(LifecycleError, match="already recorded"):
        ledger.acquire(LedgerEntry(Resource.PROCESS_GROUP, Owner.CALLER))
    released = ledger.release(entry)
    with pytest.raises(LifecycleError, match="already released"):
        released.release(entry)
    assert ledger.held() == (entry,) and released.held() == ()
