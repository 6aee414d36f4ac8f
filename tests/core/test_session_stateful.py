"""Random trigger sequences, valid and invalid, against a Session and a model of it."""

from __future__ import annotations

from collections import Counter

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from lifecycle import InvalidTransition, LifecycleError, Owner, Session, State, TeardownError, Trigger
from lifecycle.lowlevel import Edge, Resource, RestartMode, edges_from
from lifecycle.testing import COLLECTIVES, RecordingActions, RecordingCheckpoints

RELEASES = {
    "destroy_rerun_state_machine": Resource.RERUN_STATE_MACHINE,
    "destroy_microbatch_calculator": Resource.MICROBATCH_CALCULATOR,
    "destroy_model_parallel": Resource.MODEL_PARALLEL,
    "abort_model_parallel": Resource.MODEL_PARALLEL,
    "destroy_process_group": Resource.PROCESS_GROUP,
    "abort_process_group": Resource.PROCESS_GROUP,
    "finalize_checkpoints": Resource.ASYNC_CHECKPOINT,
    "abort_checkpoints": Resource.ASYNC_CHECKPOINT,
}
INITS = {
    "init_process_group": Resource.PROCESS_GROUP,
    "init_model_parallel": Resource.MODEL_PARALLEL,
    "init_microbatch_calculator": Resource.MICROBATCH_CALCULATOR,
    "init_rerun_state_machine": Resource.RERUN_STATE_MACHINE,
}
RESOURCES_OF = {
    Trigger.INIT_DISTRIBUTED: [Resource.PROCESS_GROUP],
    Trigger.INIT_GLOBALS: [Resource.MODEL_PARALLEL, Resource.MICROBATCH_CALCULATOR, Resource.RERUN_STATE_MACHINE],
}
HAPPY = [t for t in Trigger if t is not Trigger.FAIL]


def find_edge(state: State, trigger: Trigger) -> Edge | None:
    """The model: the table's edge for ``trigger`` from ``state``, or None."""
    return next((edge for edge in edges_from(state) if edge.trigger is trigger), None)


class SessionMachine(RuleBasedStateMachine):
    """Drives one Session per example; the model is the table plus the double's configuration."""

    @initialize(
        mode=st.sampled_from(RestartMode),
        caller_owns=st.sets(st.sampled_from(list(INITS.values()))),
        failing_releases=st.sets(st.sampled_from(sorted(RELEASES))),
    )
    def start(self, mode: RestartMode, caller_owns: set[Resource], failing_releases: set[str]) -> None:
        self.actions = RecordingActions(
            caller_owns=caller_owns, fail_on={name: RuntimeError(name) for name in failing_releases}
        )
        self.checkpoints = RecordingCheckpoints(calls=self.actions.calls, fail_on=self.actions.fail_on)
        self.session = Session(self.actions, restart_mode=mode)
        self.mode = mode
        self.caller_owns = caller_owns
        self.expected = State.UNINITIALIZED
        self.users = 0

    @rule(trigger=st.sampled_from(HAPPY))
    def pull(self, trigger: Trigger) -> None:
        before = (list(self.actions.calls), self.session.ledger)
        edge = find_edge(self.expected, trigger)
        refused = self.mode is RestartMode.INPROCESS and set(RESOURCES_OF.get(trigger, [])) & self.caller_owns
        try:
            getattr(self.session, trigger.value)()
        except InvalidTransition as exc:
            assert edge is None, f"{trigger} refused from {self.expected}"
            assert exc.state is self.expected and exc.trigger == trigger.value
            assert (list(self.actions.calls), self.session.ledger) == before
            return
        except TeardownError:  # a success teardown step was injected to fail
            assert trigger is Trigger.CLOSE
            self.expected = State.FAILED
            return
        except LifecycleError:
            assert refused
            self.session.fail(RuntimeError("refused"))
            self.expected = State.FAILED
            return
        assert edge is not None and not refused
        self.expected = edge.dest

    @precondition(lambda self: not self.expected.is_final)
    @rule()
    def advance(self) -> None:
        """Pull the one happy-path trigger valid now, so runs often get far."""
        self.pull(next(t for t in HAPPY if find_edge(self.expected, t) is not None))

    @rule()
    def fail(self) -> None:
        try:
            self.session.fail(ValueError("boom"))
        except InvalidTransition:
            assert self.expected.is_final
            return
        assert not self.expected.is_final
        self.expected = State.FAILED

    @precondition(lambda self: not self.expected.is_final)
    @rule()
    def register_user_resource(self) -> None:
        name = f"u{self.users}"
        self.users += 1
        self.session.register(name, lambda: self.actions.calls.append(f"release:{name}"))

    @precondition(
        lambda self: not self.expected.is_final and self.session.ledger.owner(Resource.ASYNC_CHECKPOINT) is None
    )
    @rule()
    def track_checkpoints(self) -> None:
        self.session.track_checkpoints(self.checkpoints)

    @invariant()
    def state_matches_the_model(self) -> None:
        assert self.session.state is self.expected

    @invariant()
    def releases_match_session_owned_acquisitions_and_happen_once(self) -> None:
        created = {INITS[c] for c in self.actions.calls if c in INITS} - self.caller_owns
        released = Counter(RELEASES[c] for c in self.actions.calls if c in RELEASES)
        for resource, times in released.items():
            if resource is not Resource.ASYNC_CHECKPOINT:
                assert resource in created, f"released {resource} the session did not create"
            assert times <= 2, resource  # one failed success step, then the failure plan
        users = Counter(c for c in self.actions.calls if c.startswith("release:"))
        assert all(n == 1 for n in users.values())
        for entry in self.session.ledger.entries:
            assert entry.owner is not Owner.SESSION or entry.resource not in self.caller_owns

    @invariant()
    def a_failure_plan_makes_no_collective(self) -> None:
        report = self.session.report
        if report is not None:
            failure_steps = {r.step.kind.value for r in report.records if r.outcome == "failure"}
            assert not failure_steps & COLLECTIVES
            first_error = next((i for i, r in enumerate(report.records) if r.error is not None), len(report.records))
            assert all(r.outcome == "failure" for r in report.records[first_error + 1 :])  # switched at once

    def teardown(self) -> None:
        event(f"ended in {self.session.state.value}")
        if not self.session.state.is_final:
            self.session.fail(RuntimeError("end of example"))


SessionMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=25, deadline=None)
test_session_against_the_model = SessionMachine.TestCase
test_session_against_the_model.__doc__ = "Any trigger sequence keeps Session, table model and ledger in agreement."
