"""A failed checkpoint save is an event, not a death (``CheckpointConfig.on_save_error``), in one process."""

from __future__ import annotations

import errno
import os
from dataclasses import replace
from pathlib import Path

import pytest
from support.configs import config_of_one

from lifecycle import (
    Callback,
    CheckpointConfig,
    ConfigError,
    FaultInjection,
    FaultKind,
    OnSaveError,
    Phase,
    SessionHandle,
    TrainContext,
    pretrain,
)
from lifecycle.checkpoint import SaveFailed, SaveFailures, latest_checkpoint
from lifecycle.journal import FailedSave, read

ENOSPC_AT_2 = FaultInjection(Phase.CHECKPOINT, rank=0, step=2, kind=FaultKind.SAVE_ERROR)


class FailEveryWrite(Callback):
    """Makes every write of the run's checkpointer fail with ``EIO`` (the writer's test seam)."""

    def on_setup_end(self, session: SessionHandle, ctx: TrainContext) -> None:
        def fail() -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        assert ctx.checkpointer is not None
        ctx.checkpointer._before_write = fail


def failed_saves(tmp_path: Path) -> list[FailedSave]:
    """The ``save_failed`` records of the run's journal."""
    return [r for r in read([tmp_path / "journal"]) if isinstance(r, FailedSave)]


def test_a_failed_save_is_recorded_and_training_goes_on(tmp_path: Path) -> None:
    """ENOSPC at step 2's save: the run ends normally at step 6, step 6 latest, and the journal names the failure."""
    result = pretrain(config_of_one(tmp_path, iterations=6, interval=2, fault=ENOSPC_AT_2))
    assert (result.final_step, result.checkpoint_step) == (6, 6)
    found = latest_checkpoint(tmp_path / "ckpt")
    assert found is not None and found[0] == 6
    (record,) = failed_saves(tmp_path)
    assert (record.step, record.consecutive, record.action) == (2, 1, "continued")
    assert "rank 0 could not write" in record.error and "ENOSPC" in record.error
    assert not any(p.name.startswith("__0_") for p in (tmp_path / "ckpt" / "step_0000000002").glob("*"))


def test_on_save_error_fail_fails_at_the_first_failed_save(tmp_path: Path) -> None:
    """``on_save_error="fail"``: the attempt fails with SaveFailed naming the rank and ENOSPC; step 2 never latest."""
    config = config_of_one(tmp_path, iterations=6, interval=2, fault=ENOSPC_AT_2)
    config = replace(config, checkpoint=replace(config.checkpoint, on_save_error=OnSaveError.FAIL))
    with pytest.raises(SaveFailed, match=r"rank 0 could not write.*ENOSPC") as caught:
        pretrain(config)
    assert caught.value.step == 2
    assert latest_checkpoint(tmp_path / "ckpt") is None


def test_the_nth_failure_in_a_row_fails_naming_every_failure_and_the_last_committed_step(tmp_path: Path) -> None:
    """Every write fails: the 3rd failed save (step 6) fails the attempt with SaveFailures listing steps 2, 4, 6."""
    config = config_of_one(tmp_path, iterations=10, interval=2)
    with pytest.raises(SaveFailures) as caught:
        pretrain(config, callbacks=[FailEveryWrite()])
    assert [f.step for f in caught.value.failures] == [2, 4, 6]
    assert caught.value.last_committed is None
    assert "3 checkpoint saves failed in a row" in str(caught.value) and "EIO" in str(caught.value)
    assert [(r.step, r.action) for r in failed_saves(tmp_path)] == [(2, "continued"), (4, "continued"), (6, "failed")]


def test_a_failed_final_save_fails_the_attempt_naming_the_last_good_step(tmp_path: Path) -> None:
    """Step 4 committed, then the final save (step 5) fails: SaveFailures names step 4, which stays latest."""
    config = config_of_one(tmp_path, iterations=5, interval=4)
    config = replace(config, fault=FaultInjection(Phase.CHECKPOINT, rank=0, step=5, kind=FaultKind.SAVE_ERROR))
    with pytest.raises(SaveFailures, match="the final checkpoint") as caught:
        pretrain(config)
    assert caught.value.last_committed == 4
    found = latest_checkpoint(tmp_path / "ckpt")
    assert found is not None and found[0] == 4


def test_a_save_policy_is_read_from_its_name() -> None:
    """``on_save_error`` accepts its value's name and refuses an unknown one naming the field."""
    assert CheckpointConfig(dir="x", on_save_error="fail").on_save_error is OnSaveError.FAIL  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"checkpoint\.on_save_error"):
        CheckpointConfig(dir="x", on_save_error="ignore")  # type: ignore[arg-type]


class RequestExitAt(Callback):
    """Requests a graceful exit from ``on_step_end`` at one step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        if step == self.step:
            session.request_exit("test")


def test_a_requested_stop_whose_final_save_fails_becomes_a_failure_naming_the_last_good_step(tmp_path: Path) -> None:
    """A stop requested at step 5 ends after step 6; its final save fails: SaveFailures names step 4, still latest."""
    fault = FaultInjection(Phase.CHECKPOINT, rank=0, step=5, kind=FaultKind.SAVE_ERROR)
    config = config_of_one(tmp_path, iterations=10, interval=4, fault=fault)
    with pytest.raises(SaveFailures, match=r"the final checkpoint \(step 6\) failed") as caught:
        pretrain(config, callbacks=[RequestExitAt(5)])
    assert caught.value.last_committed == 4
    found = latest_checkpoint(tmp_path / "ckpt")
    assert found is not None and found[0] == 4
