"""Overlapping sessions on real gloo worlds, and refusals decided before anything is acquired (DESIGN.md §8).

What a live session holds is never reclaimed by another session in the same process:
an inner session finds the outer's group and Megatron state as the caller's, and the
outer's next collective still works. A refusal (a fixed ``store_prefix`` used again)
comes before the store is opened.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from support.configs import ONE
from support.launch import run_workers
from support.probes import NOTHING_ALIVE, alive
from support.session import drive
from support.torch_internals import HOSTED, open_store
from support.torch_internals import actions as torch_actions

from lifecycle import ConfigError, Owner, ParallelConfig, Session, State, TorchActions, Trigger
from lifecycle.lowlevel import declared_resources, live_resources
from lifecycle.testing import release_everything

ACQUIRED = tuple(r for r in declared_resources() if r.acquired_by in (Trigger.INIT_DISTRIBUTED, Trigger.INIT_GLOBALS))
"""The kinds the triggers up to ``training`` acquire, from the declarations (the store, the group, Megatron's)."""


def owners(session: Session) -> dict[str, Owner | None]:
    """Each kind in ``ACQUIRED`` → the owner ``session``'s ledger records (None: not recorded)."""
    return {kind.value: session.ledger.owner(kind) for kind in ACQUIRED}


def assert_nothing_left() -> None:
    """No group, no Megatron state, no hosted store: observed from torch, megatron-core and the store registry."""
    assert not dist.is_initialized()
    assert not parallel_state.model_parallel_is_initialized()
    assert len(HOSTED) == 0
    assert alive() == NOTHING_ALIVE and live_resources() == ()
    assert release_everything() == []  # the suite's force-release found nothing either


@pytest.mark.timeout(60)
def test_an_inner_session_leaves_the_live_outer_sessions_group_alone_world_of_one() -> None:
    """An inner session finds a live outer's group and Megatron state as the caller's; the outer's all-reduce works."""
    outer = Session(TorchActions(ONE, ParallelConfig()), label="outer")
    try:
        drive(outer, State.TRAINING)
        inner = Session(TorchActions(ONE, ParallelConfig()), label="inner")
        with inner:
            drive(inner, State.TRAINING)
            found = owners(inner)
        assert inner.state is State.CLOSED
        assert found == dict.fromkeys(found, Owner.CALLER), found
        assert inner.reclaimed == ()
        assert set(owners(outer).values()) == {Owner.SESSION}
        value = torch.tensor([3.0])
        dist.all_reduce(value)  # the default group, still the outer's
        assert value.item() == 3.0
        outer.finish()
        outer.close()
        assert outer.state is State.CLOSED
    finally:
        if not outer.state.is_final:
            outer.fail(RuntimeError("the test failed before the outer session closed"))
        gone = live_resources() == ()
        if not gone:
            release_everything()
    assert gone
    assert_nothing_left()


@pytest.mark.timeout(120)
def test_an_inner_session_leaves_the_live_outer_sessions_group_alone_world_of_two(tmp_path: Path) -> None:
    """On two gloo ranks an inner session takes the outer's world as the caller's; the outer's all-reduce sums to 3."""
    results = run_workers("overlap_worker", timeout_s=90, env={"RESULTS": str(tmp_path)})
    assert all(result.ok for result in results), "\n".join(map(str, results))
    for rank in (0, 1):
        record: dict[str, Any] = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "error" not in record, record.get("traceback")
        assert record["inner_owners"] == dict.fromkeys(record["inner_owners"], Owner.CALLER.value), record
        assert record["inner_reclaimed"] == [], record
        assert set(record["outer_owners"].values()) == {Owner.SESSION.value}, record
        assert record["sum"] == 3.0, record
        assert (record["inner_state"], record["outer_state"]) == ("closed", "closed"), record
        assert not record["dist_initialized"] and not record["model_parallel_initialized"], record
        assert record["hosted_stores"] == 0 and record["alive"] == NOTHING_ALIVE and record["left"] == [], record


@pytest.mark.timeout(60)
def test_a_reused_fixed_store_prefix_is_refused_before_any_store_is_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second session on one fixed ``store_prefix`` is refused (ConfigError) before any store is opened or hosted."""
    opened: list[object] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        opened.append(args)
        return open_store(*args, **kwargs)

    monkeypatch.setattr(torch_actions, "open_store", counting)
    actions = TorchActions(ONE, ParallelConfig(), store_prefix="fixed/")  # a world of one, short timeouts
    with Session(actions, label="first") as first:
        drive(first, State.TRAINING)
    assert first.state is State.CLOSED and len(opened) == 1
    assert_nothing_left()

    second = Session(actions, label="second")
    try:
        with pytest.raises(ConfigError) as refused:
            second.init_distributed()
        assert refused.value.field == "store_prefix"
        assert "fixed/" in str(refused.value)
        assert second.ledger.entries == ()  # nothing acquired, not even the store
        assert len(opened) == 1 and len(HOSTED) == 0  # no TCPStore was opened for it, none is hosted
        assert second.state is State.UNINITIALIZED
    finally:
        if not second.state.is_final:
            second.fail(RuntimeError("end"))
    assert second.report is not None and second.report.ran == ()  # nothing to release
    assert_nothing_left()
