"""``pretrain``'s checkpoint saves under ``CheckpointConfig.on_save_error``: a failed save is an event, not a death.

``AsyncCheckpointer.finalize`` raises ``SaveFailed`` on every rank alike (the verdict
travels in the commit's own ``all_gather`` and broadcast), so every rank takes the same
branch here: drop the save and train on, or fail. Nothing of a failed save is ever
committed; the writer removed its own files, and the next commit's clean-up
(``lifecycle.checkpoint.hygiene``) removes whatever other partial files remain.
"""

from __future__ import annotations

import logging
import time

from lifecycle._training.config import CheckpointConfig, OnSaveError
from lifecycle._training.journaling import RunJournal
from lifecycle.checkpoint import AsyncCheckpointer, SaveFailed, SaveFailures
from lifecycle.journal import FailedSave

__all__ = ["Saves"]

logger = logging.getLogger("lifecycle.pretrain")


class Saves:
    """Commits ``pretrain``'s saves and applies the policy to a failed one; ``committed`` is the newest good step.

    ``committed`` starts at the resumed step (None: nothing to resume from).
    ``failed`` lists every save of this attempt that failed, oldest first;
    ``in_a_row`` those since the last commit.
    """

    def __init__(self, config: CheckpointConfig, journal: RunJournal, rank: int, committed: int | None) -> None:
        self.config = config
        self.journal = journal
        self.rank = rank
        self.committed = committed
        self.failed: list[SaveFailed] = []
        self.in_a_row: list[SaveFailed] = []

    def commit(self, checkpointer: AsyncCheckpointer, *, final: bool = False) -> int | None:
        """COLLECTIVE: finalize the save in flight; the committed step (None: none in flight, or a tolerated failure).

        A ``SaveFailed`` (the same on every rank) is recorded in the journal and then:
        re-raised under ``on_save_error="fail"``; raised as ``SaveFailures`` when
        ``final`` (the loop's last save: the run's end would otherwise promise a
        checkpoint it does not have) or at the ``max_consecutive_save_failures``-th in a
        row; else warned (rank 0's log, once per failure) and dropped.
        """
        try:
            step = checkpointer.finalize()
        except SaveFailed as exc:
            self._failed(exc, final)
            return None
        if step is not None:
            self.committed = step
            self.in_a_row.clear()
        return step

    def _failed(self, exc: SaveFailed, final: bool) -> None:
        """Record ``exc``; raise unless the policy tolerates it (``commit``)."""
        self.failed.append(exc)
        self.in_a_row.append(exc)
        limit = self.config.max_consecutive_save_failures
        error: Exception | None = None
        if self.config.on_save_error is OnSaveError.FAIL:
            error = exc
        elif final:
            error = SaveFailures(
                tuple(self.in_a_row),
                self.committed,
                f"the final checkpoint (step {exc.step}) failed, so the attempt fails rather than end without it",
            )
        elif len(self.in_a_row) >= limit:
            error = SaveFailures(
                tuple(self.in_a_row),
                self.committed,
                f"{len(self.in_a_row)} checkpoint saves failed in a row (checkpoint.max_consecutive_save_failures "
                f"is {limit})",
            )
        self.journal.write(
            FailedSave(
                origin=self.journal.origin,
                step=exc.step,
                error=str(exc),
                consecutive=len(self.in_a_row),
                action="failed" if error is not None else "continued",
                time=time.time(),
            )
        )
        if error is exc:
            raise exc
        if error is not None:
            raise error from exc
        if self.rank == 0:
            good = f"step {self.committed}" if self.committed is not None else "none"
            logger.warning(
                "checkpoint save of step %d failed (%d of %d in a row), training goes on; last committed: %s; %s",
                exc.step,
                len(self.in_a_row),
                limit,
                good,
                "; ".join(exc.failures),
            )
