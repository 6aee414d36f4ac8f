"""A step whose loss is not finite: fail, skip its update, or warn (``TrainingConfig.on_nonfinite_loss``).

Decided on a value every rank already agrees on, before the optimizer applies the
update: each rank whose own loss is NaN or infinite adds ``1``, its rank plus one, and
that loss to three slots of the loop's per-step ``all_reduce`` (the one that carries the
loss and the stop flags), so every rank reads the same count (and, when it is one rank,
which rank and what value) and takes the same branch, at no extra collective.
Why the loss and not the gradient norm: ``pretrain``'s optimizer is a plain
``torch.optim.Adam``, not Megatron's distributed optimizer, so no found-inf flag or
gradient norm is reduced already; computing one would cost a pass over every gradient
and a model-parallel collective each step. A NaN loss gives NaN gradients (which the
data-parallel average spreads to every replica), so the loss is where it shows first.
"""

from __future__ import annotations

import logging
import time

from lifecycle._core.errors import NonfiniteLoss
from lifecycle._training.config import OnNonfiniteLoss, TrainingConfig
from lifecycle._training.journaling import RunJournal
from lifecycle.journal import StepSkipped

__all__ = ["NonfiniteGuard", "NonfiniteLoss"]

logger = logging.getLogger("lifecycle.pretrain")


class NonfiniteGuard:
    """Applies ``on_nonfinite_loss`` to each step, from the count of ranks whose loss was not finite."""

    def __init__(self, config: TrainingConfig, journal: RunJournal) -> None:
        self.config = config
        self.journal = journal
        self.rank = 0
        self.skipped = 0
        self.in_a_row = 0
        self.warned = 0

    def apply(self, step: int, loss: float, ranks: int, culprit: int | None, value: float) -> bool:
        """Whether step ``step``'s update is to be applied; the arguments are the agreed sums (``loss``: this rank's).

        ``ranks``: how many ranks' loss was not finite; ``culprit`` and ``value``: the
        rank and its loss when it was one rank (else None, and a non-finite value).

        Raises ``NonfiniteLoss`` under ``fail``, and under ``skip`` at the
        ``max_consecutive_skipped_steps``-th skip in a row. Same answer on every rank.
        """
        if not ranks:
            self.in_a_row = 0
            return True
        policy = self.config.on_nonfinite_loss
        if policy is OnNonfiniteLoss.FAIL:
            raise NonfiniteLoss(step, culprit, value, ranks, 0)
        if policy is OnNonfiniteLoss.WARN:
            self.warned += 1
            if self.warned == 1 and self.rank == 0:
                logger.warning(
                    "the loss of step %d is not finite on %d rank(s); applying it (training.on_nonfinite_loss=warn)",
                    step,
                    ranks,
                )
            return True
        self.in_a_row += 1
        if self.in_a_row >= self.config.max_consecutive_skipped_steps:
            raise NonfiniteLoss(step, culprit, value, ranks, self.in_a_row)
        self.skipped += 1
        self.journal.write(
            StepSkipped(
                origin=self.journal.origin,
                step=step,
                loss=loss,
                ranks=ranks,
                consecutive=self.in_a_row,
                time=time.time(),
                culprit=culprit,
            )
        )
        if self.rank == 0:
            logger.warning("step %d skipped: its loss is not finite on %d rank(s)", step, ranks)
        return False
