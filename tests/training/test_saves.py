"""``Saves``, pretrain's policy for a failed save: which errors it tolerates."""

from __future__ import annotations

import pytest

from lifecycle import CheckpointConfig
from lifecycle._training.saves import Saves
from lifecycle.checkpoint import CheckpointError, SaveFailed, SaveFailures
from lifecycle.journal import FailedSave
from lifecycle.journal.evidence import RAISED_KINDS, Evidence, Kind, kind_of


class _Journal:
    """A journal double: keeps what is written."""

    origin = None

    def __init__(self) -> None:
        self.records: list[object] = []

    def write(self, record: object) -> None:
        self.records.append(record)


class _LostPeer:
    """A checkpointer double whose finalize fails as a lost peer's collective does: a plain CheckpointError."""

    def finalize(self) -> int | None:
        raise CheckpointError("finalizing checkpoint step 6 in x failed: Connection closed by peer")


def test_a_commit_whose_collective_failed_is_never_tolerated() -> None:
    """A lost peer (a CheckpointError, no SaveFailed: nothing was agreed) fails the attempt even under continue."""
    journal = _Journal()
    saves = Saves(CheckpointConfig(dir="x"), journal, 0, 4)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="Connection closed by peer") as caught:
        saves.commit(_LostPeer())  # type: ignore[arg-type]
    assert not isinstance(caught.value, SaveFailed)
    assert (saves.committed, saves.failed, journal.records) == (4, [], [])


class _Full:
    """A checkpointer double whose every save fails on rank 1 with ENOSPC, as the commit reports it (SaveFailed)."""

    def __init__(self) -> None:
        self.step = 0

    def finalize(self) -> int | None:
        self.step += 2
        raise SaveFailed(self.step, ("rank 1: x: [Errno 28 ENOSPC]",), f"checkpoint step {self.step} not committed")


def test_a_failed_save_is_its_own_kind_in_the_record_and_the_error() -> None:
    """Failed saves are ``Kind.SAVE_FAILED``: their records, and the SaveFailures that ends the attempt at the 2nd."""
    journal = _Journal()
    saves = Saves(CheckpointConfig(dir="x", max_consecutive_save_failures=2), journal, 0, None)  # type: ignore[arg-type]
    full = _Full()
    assert saves.commit(full) is None  # type: ignore[arg-type]
    with pytest.raises(SaveFailures) as caught:
        saves.commit(full)  # type: ignore[arg-type]
    assert kind_of(caught.value) is Kind.SAVE_FAILED and kind_of(saves.failed[0]) is Kind.SAVE_FAILED
    assert not Kind.SAVE_FAILED.consequence and Kind.SAVE_FAILED in RAISED_KINDS
    records = [r for r in journal.records if isinstance(r, FailedSave)]
    assert [(r.step, r.action, r.failure_kind) for r in records] == [
        (2, "continued", Kind.SAVE_FAILED),
        (4, "failed", Kind.SAVE_FAILED),
    ]
    said = Evidence(Kind.SAVE_FAILED.value, 1, 4, "checkpoint").words()
    assert said == "rank 1 failed to save a checkpoint at step 4, phase checkpoint"
