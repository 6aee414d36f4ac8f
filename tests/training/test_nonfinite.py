"""A step whose loss is not finite fails, is skipped or is warned about (``TrainingConfig.on_nonfinite_loss``)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from support.configs import config_of_one

from lifecycle import (
    ConfigError,
    FaultInjection,
    FaultKind,
    NonfiniteLoss,
    OnNonfiniteLoss,
    Phase,
    PretrainConfig,
    pretrain,
)
from lifecycle.checkpoint import latest_checkpoint
from lifecycle.journal import Failure, StepSkipped, read
from lifecycle.journal.evidence import Kind

NAN_AT_3 = FaultInjection(Phase.STEP, rank=0, step=3, kind=FaultKind.NAN)


def with_policy(config: PretrainConfig, policy: OnNonfiniteLoss, **training: int) -> PretrainConfig:
    """``config`` with ``training.on_nonfinite_loss`` set to ``policy`` (and any other training fields)."""
    return replace(config, training=replace(config.training, on_nonfinite_loss=policy, **training))


def test_a_nan_loss_fails_by_default_naming_rank_and_step_and_the_last_save_holds_finite_weights(
    tmp_path: Path,
) -> None:
    """NaN at step 3: NonfiniteLoss names rank 0, step 3 and nan; step 2's save is committed, step 3 never."""
    with pytest.raises(NonfiniteLoss, match=r"the loss of step 3 is nan on rank 0") as caught:
        pretrain(config_of_one(tmp_path, iterations=6, interval=2, fault=NAN_AT_3))
    assert (caught.value.step, caught.value.rank, caught.value.ranks) == (3, 0, 1)
    assert math.isnan(caught.value.value)
    failure = next(r for r in read([tmp_path / "journal"]) if isinstance(r, Failure))
    assert failure.evidence is not None and failure.evidence.what is Kind.NONFINITE_LOSS  # a kind of its own
    found = latest_checkpoint(tmp_path / "ckpt")
    assert found is not None and found[0] == 2
    again = config_of_one(tmp_path, iterations=4, interval=2)
    resumed = pretrain(replace(again, checkpoint=replace(again.checkpoint, resume=True)))
    assert resumed.start_step == 2  # the retry resumes from step 2, whose weights train to finite losses
    assert all(math.isfinite(loss) for _, loss in resumed.losses)


def test_skip_drops_the_update_on_every_rank_and_counts_it(tmp_path: Path) -> None:
    """``skip``: step 3's update is not applied, training finishes, the journal holds one step_skipped for step 3."""
    config = with_policy(config_of_one(tmp_path, iterations=5, interval=0, fault=NAN_AT_3), OnNonfiniteLoss.SKIP)
    result = pretrain(config)
    assert result.final_step == 5
    assert [loss for step, loss in result.losses if not math.isfinite(loss)] and all(
        math.isfinite(loss) for step, loss in result.losses if step != 3
    )
    skipped = [r for r in read([tmp_path / "journal"]) if isinstance(r, StepSkipped)]
    assert [(r.step, r.ranks, r.consecutive, r.culprit) for r in skipped] == [(3, 1, 1, 0)]
    assert skipped[0].failure_kind is Kind.NONFINITE_LOSS


def test_skip_fails_after_too_many_skipped_steps_in_a_row(tmp_path: Path) -> None:
    """Every loss NaN under ``skip`` with a limit of 2: the 2nd skip in a row fails with NonfiniteLoss."""

    def nan_forward(batch: object, model: torch.nn.Module) -> torch.Tensor:
        return model.weight.sum() * float("nan")  # type: ignore[operator]

    config = with_policy(config_of_one(tmp_path, iterations=5), OnNonfiniteLoss.SKIP, max_consecutive_skipped_steps=2)
    with pytest.raises(NonfiniteLoss, match="after 2 skipped steps in a row") as caught:
        pretrain(
            config, nan_forward, model_provider=lambda config: torch.nn.Linear(2, 2), batch_provider=lambda s, i: i
        )
    assert caught.value.step == 2


def test_warn_applies_the_update_and_trains_on(tmp_path: Path) -> None:
    """``warn``: a NaN at step 3 is applied (later losses are NaN too) and the run ends normally."""
    config = with_policy(config_of_one(tmp_path, iterations=4, interval=0, fault=NAN_AT_3), OnNonfiniteLoss.WARN)
    result = pretrain(config)
    assert result.final_step == 4
    assert math.isnan(dict(result.losses)[4])


def test_a_nonfinite_policy_is_read_from_its_name() -> None:
    """``on_nonfinite_loss`` accepts its value's name; an unknown one is refused naming the field."""
    assert with_policy(PretrainConfig(), "skip").training.on_nonfinite_loss is OnNonfiniteLoss.SKIP  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"training\.on_nonfinite_loss"):
        with_policy(PretrainConfig(), "ignore")  # type: ignore[arg-type]
