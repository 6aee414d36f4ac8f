"""``Saves``, pretrain's policy for a failed save: which errors it tolerates."""

from __future__ import annotations

import pytest

from lifecycle import CheckpointConfig
from lifecycle._training.saves import Saves
from lifecycle.checkpoint import CheckpointError, SaveFailed


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
