"""The decision after a failed attempt (``lifecycle._training.decide``): pure, torch-free, every rule and its edges."""

from __future__ import annotations

import json

import pytest

from lifecycle import ExitCode
from lifecycle._training.decide import Attempt, Decision, Frame, RestartPolicy, decide

BUG = Frame("train.py", "loss", 42)


def raised(step: int = 40, resumed_from: int = 30, **more: object) -> Attempt:
    """A raise at ``step`` after resuming from ``resumed_from``."""
    facts: dict[str, object] = {
        "kind": "raised",
        "exception": "RuntimeError",
        "frame": BUG,
        "phase": "step",
        "step": step,
        "rank": 1,
        "host": "h1",
        "resumed_from": resumed_from,
        "committed": resumed_from,
    }
    facts.update(more)
    return Attempt(**facts)  # type: ignore[arg-type]


def test_a_first_failure_restarts() -> None:
    """One failed attempt with nothing against it: restart, exit code 1."""
    decision = decide([raised()])
    assert (decision.action, decision.reason, decision.exit_code) == ("restart", "may_recover", ExitCode.RESTART)


def test_empty_history_is_refused() -> None:
    """There is nothing to decide without the attempt that just failed."""
    with pytest.raises(ValueError):
        decide([])


def test_fatal_stops_at_once() -> None:
    """A failure no restart fixes (a ConfigError) stops after the first attempt."""
    decision = decide([raised(fatal=True)])
    assert (decision.reason, decision.exit_code) == ("not_restartable", ExitCode.DO_NOT_RESTART)


def test_same_raise_replayed_from_a_checkpoint_is_reproducible() -> None:
    """The same raise at the same step, replayed from the checkpoint before it: stop after the second, 'a bug'."""
    decision = decide([raised(resumed_from=0), raised(resumed_from=30)])
    assert decision.stop and decision.reason == "reproducible" and decision.attempt == 1
    assert "a bug, not a fault" in decision.words and "step 40" in decision.words


def test_same_raise_replayed_from_the_start_is_reproducible() -> None:
    """Replaying from the start (no checkpoint) counts as replaying from an earlier state."""
    assert decide([raised(resumed_from=0), raised(resumed_from=0)]).reason == "reproducible"


def test_not_replayed_is_not_reproducible() -> None:
    """A second attempt that resumed at or after the failing step did not replay it: no verdict of a bug."""
    assert decide([raised(resumed_from=30), raised(resumed_from=40)]).action == "restart"


@pytest.mark.parametrize(
    "change",
    [
        {"exception": "ValueError"},
        {"frame": Frame("train.py", "loss", 43)},
        {"phase": "eval"},
        {"step": 41},
        {"kind": "hang"},
    ],
)
def test_a_different_failure_is_not_reproducible(change: dict[str, object]) -> None:
    """Any of kind, exception type, frame, phase or step differing: not the same failure."""
    assert decide([raised(), raised(**change)]).reason != "reproducible"


def test_reproducible_needs_consecutive_attempts() -> None:
    """The same failure two attempts apart, another in between: not 'in two consecutive attempts'."""
    history = [raised(), raised(step=55, host="h2"), raised()]
    assert decide(history).reason != "reproducible"


def test_deaths_are_never_reproducible() -> None:
    """A death at the same step twice has no raise to compare (no exception): the culprit rule judges it."""
    death = {"kind": "died", "exception": "", "frame": None}
    assert decide([raised(**death), raised(**death)]).action == "restart"


def test_a_consequence_is_never_reproducible() -> None:
    """Two attempts whose recorded failure is only a consequence (a lost connection) are not a bug of their own."""
    lost = {"kind": "connection_lost", "exception": "DistBackendError"}
    assert decide([raised(**lost), raised(**lost)]).reason != "reproducible"


def test_same_host_k_times_is_the_culprit() -> None:
    """The same host caused K=3 attempts in a row: stop naming it, the JSON line a scheduler reads."""
    crash = {"kind": "died", "exception": "", "frame": None, "host": "node-b", "rank": 3}
    history = [raised(step=s, **crash) for s in (12, 17, 23)]
    assert decide(history[:2]).action == "restart"
    decision = decide(history)
    assert (decision.reason, decision.details) == ("repeated_culprit", {"host": "node-b"})
    line = json.loads(decision.json_line())
    assert (line["decision"], line["reason"], line["host"]) == ("stop", "repeated_culprit", "node-b")


def test_culprit_rank_when_hosts_are_unknown() -> None:
    """Without hosts the same rank K times is named instead."""
    history = [raised(step=s, host="", rank=2, exception="", kind="hang") for s in (12, 17, 23)]
    decision = decide(history)
    assert (decision.reason, decision.details) == ("repeated_culprit", {"rank": 2})


def test_on_one_host_the_culprit_is_the_rank() -> None:
    """A job on one host (nodes=1): the same host always, so only the same rank K times is a culprit."""
    history = [raised(step=s, rank=r, host="solo", nodes=1, exception="") for s, r in ((12, 0), (17, 1), (23, 1))]
    assert decide(history, RestartPolicy(window_restarts=0, no_progress_limit=0)).action == "restart"
    history = [raised(step=s, rank=1, host="solo", nodes=1, exception="") for s in (12, 17, 23)]
    decision = decide(history)
    assert (decision.reason, decision.details) == ("repeated_culprit", {"rank": 1, "host": "solo"})


def test_alternating_hosts_are_no_culprit() -> None:
    """Hosts taking turns name no culprit."""
    history = [raised(step=s, host=h, exception="") for s, h in ((12, "a"), (17, "b"), (23, "a"))]
    assert decide(history, RestartPolicy(window_restarts=0, no_progress_limit=0)).action == "restart"


def test_job_wide_budget() -> None:
    """After max_restarts restarts the next failure stops (budget), whichever node failed."""
    policy = RestartPolicy(max_restarts=3, window_restarts=0, culprit_limit=0, no_progress_limit=0)
    history = [raised(step=10 + i, host="ab"[i % 2], ended=1000.0 * i) for i in range(4)]
    assert [decide(history[: n + 1], policy).action for n in range(4)] == ["restart"] * 3 + ["stop"]
    assert decide(history, policy).details == {"restarts": 3, "max_restarts": 3}


def test_window_budget() -> None:
    """More than window_restarts failures within window_s stop; the same failures spread out do not."""
    policy = RestartPolicy(culprit_limit=0, no_progress_limit=0)
    quick = [raised(step=10 + i, host="ab"[i % 2], ended=100.0 * i) for i in range(4)]
    assert decide(quick, policy).reason == "budget"
    spread = [raised(step=10 + i, host="ab"[i % 2], ended=1000.0 * i) for i in range(4)]
    assert decide(spread, policy).action == "restart"


def test_no_progress() -> None:
    """NO_PROGRESS_LIMIT attempts in a row without a new committed step stop, as exit_code did."""
    policy = RestartPolicy(window_restarts=0, culprit_limit=0)
    stuck = [raised(step=s, resumed_from=30, committed=30, host="ab"[s % 2]) for s in (31, 32, 33)]
    assert decide(stuck, policy).reason == "no_progress"
    moved = [*stuck[:2], raised(step=45, resumed_from=30, committed=40)]
    assert decide(moved, policy).action == "restart"


def test_a_limit_of_zero_turns_its_rule_off() -> None:
    """Every limit 0: only the reproducible rule and fatal errors stop."""
    off = RestartPolicy(max_restarts=0, window_restarts=0, culprit_limit=0, no_progress_limit=0)
    history = [raised(step=10 + i, committed=30) for i in range(20)]
    assert decide(history, off).action == "restart"


def test_rules_order() -> None:
    """Reproducible wins over culprit and budget: the most specific reason is given."""
    policy = RestartPolicy(max_restarts=1, culprit_limit=2)
    assert decide([raised(resumed_from=0), raised(resumed_from=0)], policy).reason == "reproducible"


def test_json_round_trip() -> None:
    """Attempt and Decision read back what they wrote."""
    attempt = raised()
    assert Attempt.from_json(json.loads(json.dumps(attempt.to_json()))) == attempt
    decision = decide([raised(resumed_from=0), raised(resumed_from=0)])
    assert Decision.from_json(json.loads(decision.json_line())) == decision
