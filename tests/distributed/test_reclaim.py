"""Nothing unowned: what an interrupted session left live is reclaimed by the next one, never adopted."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from megatron.core import parallel_state
from support.configs import ONE

from lifecycle import Owner, ParallelConfig, Session, State, TorchActions
from lifecycle.lowlevel import Resource


class InterruptedAbort(TorchActions):
    """Real actions whose first group abort is interrupted before it does anything (a Ctrl-C inside it)."""

    interrupted = False

    def abort_process_group(self) -> None:
        if not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        super().abort_process_group()


@pytest.mark.timeout(60)
def test_a_group_left_by_an_interrupted_abort_is_reclaimed_not_adopted() -> None:
    """Ctrl-C inside abort_process_group leaves the group; the next session aborts it first and owns its own."""
    first = Session(InterruptedAbort(ONE, ParallelConfig()), label="first")
    first.init_distributed()
    first.init_globals()
    left_group = dist.group.WORLD
    with pytest.raises(KeyboardInterrupt):
        first.fail(RuntimeError("boom"))
    assert first.state is State.FAILED and dist.is_initialized() and dist.group.WORLD is left_group
    del left_group
    second = Session(TorchActions(ONE, ParallelConfig()), label="second")
    try:
        second.init_distributed()
        second.init_globals()
        assert second.ledger.owner(Resource.PROCESS_GROUP) is Owner.SESSION  # not the caller's
        assert second.ledger.owner(Resource.MODEL_PARALLEL) is Owner.SESSION
        assert [str(r.step) for r in second.reclaimed] == ["abort_process_group"]
        assert all(r.error is None for r in second.reclaimed)
    finally:
        second.fail(RuntimeError("end"))
    assert not dist.is_initialized() and not parallel_state.model_parallel_is_initialized()


@pytest.mark.timeout(60)
def test_a_group_the_caller_creates_after_a_session_is_adopted_not_reclaimed() -> None:
    """A record of a released resource never touches the caller's new one: it is adopted as the caller's."""
    first = Session(InterruptedAbort(ONE, ParallelConfig()))
    first.init_distributed()
    with pytest.raises(KeyboardInterrupt):
        first.fail(RuntimeError("boom"))
    dist.destroy_process_group()  # the caller cleans up by hand ...
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)  # ... and creates its own
    try:
        second = Session(TorchActions(ONE, ParallelConfig()))
        second.init_distributed()
        assert second.ledger.owner(Resource.PROCESS_GROUP) is Owner.CALLER and second.reclaimed == ()
        second.fail(RuntimeError("end"))
        assert dist.is_initialized()  # the caller's group survives
    finally:
        dist.destroy_process_group()
