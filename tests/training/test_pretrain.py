"""pretrain: failures leave nothing live and re-raise the original; exits are graceful; resume is exact."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import signal
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from support.configs import config_of_one
from support.launch import REPO, free_port, run_bounded
from support.probes import alive
from support.torch_internals import default_forward_step, default_model_provider  # pretrain's own defaults

import lifecycle
from lifecycle import (
    Callback,
    CheckpointConfig,
    ConfigError,
    ExitConfig,
    ExitReason,
    FaultInjection,
    InjectedFault,
    ModelConfig,
    ParallelConfig,
    Phase,
    SessionHandle,
    State,
    TrainContext,
    TrainingConfig,
    pretrain,
)
from lifecycle.checkpoint import latest_checkpoint
from lifecycle.journal import VERSION, read
from lifecycle.testing import torchrun_command

NOTHING_LIVE = dict.fromkeys(alive(), False)


def ends(journal_dir: Path) -> list[dict[str, Any]]:
    """The ``end`` records of a journal folder, in order, as their JSON objects."""
    return [r.to_json() for r in read([journal_dir]) if r.kind == "end"]


def raising_callback(hook: str, error: BaseException) -> Callback:
    """A callback whose hook ``hook`` raises ``error`` (per-step hooks: from step 2 on)."""

    def raise_error(self: Callback, session: SessionHandle, *args: Any) -> None:
        if not isinstance(args[0], int) or args[0] >= 2:
            raise error

    raising: Callback = type("Raising", (Callback,), {hook: raise_error})()
    return raising


class RequestExitAt(Callback):
    """Calls ``request_exit`` on the hook's ``SessionHandle`` at the end of ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        if step == self.step:
            session.request_exit("test")


@pytest.mark.parametrize("phase", list(Phase))
def test_a_failure_at_each_phase_leaves_nothing_live_and_a_retry_succeeds(tmp_path: Path, phase: Phase) -> None:
    """An injected failure re-raises, releases every global and the SIGTERM handler, and a retry then works."""
    handler_before = signal.getsignal(signal.SIGTERM)
    config = config_of_one(tmp_path, fault=FaultInjection(phase, rank=0, step=2))
    with pytest.raises(InjectedFault) as caught:
        pretrain(config)
    assert caught.value.phase is phase
    assert alive() == NOTHING_LIVE
    assert signal.getsignal(signal.SIGTERM) is handler_before
    assert ends(tmp_path / "journal")[-1]["state"] == State.FAILED.value
    result = pretrain(config_of_one(tmp_path))
    assert (result.final_step, result.exit_reason) == (3, ExitReason.ITERATIONS)
    assert result.journal[-1].dest is State.CLOSED
    assert alive() == NOTHING_LIVE


@pytest.mark.parametrize("memory_copy", [False, True], ids=["checkpoints", "memory-copy"])
def test_a_failed_calls_model_is_freed_once_the_caller_drops_its_error(
    tmp_path: Path, memory_copy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the caller drops a failed call's exception, its model's parameters (and the optimizer holding them) are
    freed at once, by reference counts, with the garbage collector off: a retry never holds two models."""
    monkeypatch.setenv("LIFECYCLE_COPY_ROOT", str(tmp_path / "shm"))  # the failed call's copy stays for a retry
    parameters: list[weakref.ref[torch.Tensor]] = []

    def provider(config: Any) -> torch.nn.Module:
        model = default_model_provider(config)
        parameters.extend(weakref.ref(p) for p in model.parameters())
        return model

    checkpoint = CheckpointConfig(
        dir=str(tmp_path / "ckpt"), interval=2, resume=True, memory_copy=memory_copy, memory_interval=1
    )
    config = config_of_one(tmp_path, iterations=6, checkpoint=checkpoint, fault=FaultInjection(Phase.STEP, step=4))
    gc.collect()
    gc.disable()
    try:
        with contextlib.suppress(InjectedFault):  # the error dropped here
            pretrain(config, model_provider=provider)
        kept = [ref for ref in parameters if ref() is not None]
    finally:
        gc.enable()
    assert parameters
    assert not kept, f"{len(kept)} of {len(parameters)} parameters of the failed call's model are still alive"
    assert alive() == NOTHING_LIVE


@pytest.mark.parametrize("same", [True, False], ids=["same-model", "another-model"])
def test_a_retry_here_takes_the_copy_interval_its_run_derived_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, same: bool
) -> None:
    """A call that fails after deriving the copies' interval leaves it to the run's next call in this process, with
    the same model, batches and budget: it copies at that interval from its start, not each of its first steps to
    measure again; another model measures again."""
    monkeypatch.setenv("LIFECYCLE_COPY_ROOT", str(tmp_path / "shm"))
    monkeypatch.setattr("lifecycle._training.copies._INTERVALS", {})  # this process's earlier tests derived some
    checkpoint = CheckpointConfig(dir=str(tmp_path / "ckpt"), interval=4, resume=True, memory_copy=True)
    first = config_of_one(tmp_path, iterations=12, checkpoint=checkpoint, fault=FaultInjection(Phase.STEP, step=10))
    with caplog.at_level(logging.INFO, logger="lifecycle.pretrain"), contextlib.suppress(InjectedFault):
        pretrain(first)
    derived = [r.getMessage() for r in caplog.records if "steps (budget" in r.getMessage()]
    assert len(derived) == 1, derived
    caplog.clear()
    model = first.model if same else dataclasses.replace(first.model, hidden_size=2 * first.model.hidden_size)
    second = dataclasses.replace(first, fault=None, model=model)
    if not same:
        second = dataclasses.replace(second, checkpoint=dataclasses.replace(checkpoint, dir=str(tmp_path / "other")))
    with caplog.at_level(logging.INFO, logger="lifecycle.pretrain"):
        pretrain(second)
    messages = [r.getMessage() for r in caplog.records]
    carried = [m for m in messages if "as derived by this run's previous call" in m]
    measured = [m for m in messages if "steps (budget" in m]
    assert (len(carried), len(measured)) == ((1, 0) if same else (0, 1)), messages


def test_a_failed_steps_graph_and_groups_are_let_go_before_the_teardown(tmp_path: Path) -> None:
    """A failed call's error keeps no lifecycle frame's locals (the step's loss and its autograd graph, whose
    megatron-core nodes hold the tensor-parallel group) and no model module keeps a group: the teardown's threads,
    not the caller's, free the aborted groups."""
    seen: list[torch.nn.Module] = []

    def provider(config: Any) -> torch.nn.Module:
        model = default_model_provider(config)
        seen.append(model)
        return model

    config = config_of_one(tmp_path, iterations=4, fault=FaultInjection(Phase.STEP, step=2))
    with pytest.raises(InjectedFault) as caught:
        pretrain(config, model_provider=provider)
    frames, tb = [], caught.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    package = str(Path(lifecycle.__file__).resolve().parent)
    ours = [f for f in frames if f.f_code.co_filename.startswith(package) and f.f_code.co_name != "pretrain"]
    assert any(f.f_code.co_name == "train_step" for f in ours), [f.f_code.co_name for f in frames]
    assert all(not f.f_locals for f in ours), {f.f_code.co_name: list(f.f_locals) for f in ours if f.f_locals}
    assert seen and not [
        (n, v) for m in seen[0].modules() for n, v in vars(m).items() if isinstance(v, torch.distributed.ProcessGroup)
    ]


@pytest.mark.parametrize(
    "where",
    [
        "model_provider",
        "forward_step",
        "on_setup_end",
        "on_train_start",
        "on_step_end",
        "on_eval_end",
        "on_checkpoint_saved",
        "on_train_end",
    ],
)
def test_the_caller_gets_the_original_exception_object(tmp_path: Path, where: str) -> None:
    """Whatever user code raises (provider, forward step, any hook) reaches the caller as the same object."""
    error = RuntimeError(f"boom in {where}")

    def provider(config: Any) -> torch.nn.Module:
        if where == "model_provider":
            raise error
        return default_model_provider(config)

    def forward(batch: Any, model: torch.nn.Module) -> torch.Tensor:
        if where == "forward_step":
            raise error
        return default_forward_step(batch, model)

    with pytest.raises(RuntimeError) as caught:
        pretrain(config_of_one(tmp_path), forward, [raising_callback(where, error)], model_provider=provider)
    assert caught.value is error
    assert alive() == NOTHING_LIVE


def test_a_requested_exit_saves_a_final_checkpoint_and_closes(tmp_path: Path) -> None:
    """request_exit in step 5's hook stops after step 6 (the next all-reduce), with a final checkpoint, closed."""
    result = pretrain(config_of_one(tmp_path, iterations=10, interval=4), callbacks=[RequestExitAt(5)])
    assert (result.final_step, result.exit_reason, result.exit_detail) == (6, ExitReason.REQUESTED, "test")
    assert result.checkpoint_step == 6
    found = latest_checkpoint(tmp_path / "ckpt")
    assert found is not None and found[0] == 6
    assert result.journal[-1].dest is State.CLOSED
    assert alive() == NOTHING_LIVE


def test_the_time_limit_is_a_graceful_exit(tmp_path: Path) -> None:
    """exit.max_duration_s ends the loop after the step that ran out of time, with a final checkpoint."""
    config = config_of_one(tmp_path, iterations=50, exit=ExitConfig(max_duration_s=1e-6))
    result = pretrain(config)
    assert (result.final_step, result.exit_reason, result.checkpoint_step) == (1, ExitReason.MAX_DURATION, 1)


def test_resume_after_a_failure_follows_the_uninterrupted_trajectory(tmp_path: Path) -> None:
    """A run that failed at step 10 resumes from its last committed checkpoint (8) with the same losses."""
    whole = pretrain(config_of_one(tmp_path / "whole", iterations=12, interval=4))
    broken = config_of_one(tmp_path / "broken", iterations=12, interval=4, fault=FaultInjection(Phase.STEP, step=10))
    with pytest.raises(InjectedFault):
        pretrain(broken)
    resumed_config = config_of_one(
        tmp_path / "broken",
        iterations=12,
        checkpoint=CheckpointConfig(dir=str(tmp_path / "broken" / "ckpt"), interval=4, resume=True),
    )
    resumed = pretrain(resumed_config)
    assert resumed.start_step == 8
    expected = dict(whole.losses)
    assert [step for step, _ in resumed.losses] == [9, 10, 11, 12]
    for step, loss in resumed.losses:
        assert loss == pytest.approx(expected[step], rel=1e-5, abs=1e-6)


def test_a_corrupt_latest_checkpoint_is_skipped_with_a_warning_naming_it(tmp_path: Path) -> None:
    """A shard whose bytes changed is skipped with a warning naming the file: the run resumes at step 2."""
    pretrain(config_of_one(tmp_path, iterations=4))
    step, folder = latest_checkpoint(tmp_path / "ckpt") or (None, None)
    assert step == 4 and folder is not None
    shard = next(folder.glob("__0_*.distcp"))  # rank 0's DCP data file
    shard.write_bytes(b"\0" * shard.stat().st_size)
    config = config_of_one(tmp_path, iterations=6, checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt"), resume=True))
    with pytest.warns(RuntimeWarning, match=f"{shard} is corrupt"):
        result = pretrain(config)
    assert result.start_step == 2
    assert alive() == NOTHING_LIVE


def test_a_partial_newer_checkpoint_falls_back_to_the_last_complete_one(tmp_path: Path) -> None:
    """A newer step folder without a manifest (a crash mid-save) is skipped: the run resumes from step 4."""
    pretrain(config_of_one(tmp_path, iterations=4))
    partial = tmp_path / "ckpt" / "step_0000000006"
    partial.mkdir()
    (partial / "rank00000-0000000000000000.pt").write_bytes(b"half a shard")
    (tmp_path / "ckpt" / "latest").write_text(json.dumps({"step": 6}))
    config = config_of_one(tmp_path, iterations=6, checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt"), resume=True))
    with pytest.warns(RuntimeWarning, match="using step 4"):
        result = pretrain(config)
    assert (result.start_step, result.final_step) == (4, 6)


def test_the_default_model_learns_its_synthetic_data(tmp_path: Path) -> None:
    """With the default model and data (the demo's batch size), the loss falls by more than half in 60 steps."""
    config = config_of_one(
        tmp_path,
        model=ModelConfig(),
        parallel=ParallelConfig(micro_batch_size=8),
        training=TrainingConfig(iterations=60, log_interval=0),
        checkpoint=CheckpointConfig(),
    )
    losses = [loss for _, loss in pretrain(config).losses]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first / 2, (first, last)


def test_callbacks_see_every_hook_in_order_and_can_register_a_resource(tmp_path: Path) -> None:
    """Hooks run setup → start → steps/evals/saves → end, and a registered resource is released at close."""
    seen: list[str] = []

    class Recorder(Callback):
        def on_setup_end(self, session: SessionHandle, ctx: TrainContext) -> None:
            seen.append(f"setup:{session.state.value}")
            session.register("recorder", lambda: seen.append("released"))

        def on_train_start(self, session: SessionHandle, ctx: TrainContext) -> None:
            seen.append(f"start:{session.state.value}")

        def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
            seen.append(f"step{step}")

        def on_eval_end(self, session: SessionHandle, step: int, loss: float) -> None:
            seen.append(f"eval{step}")

        def on_checkpoint_saved(self, session: SessionHandle, step: int, directory: Path) -> None:
            seen.append(f"save{step}")

        def on_train_end(self, session: SessionHandle, step: int, reason: ExitReason) -> None:
            seen.append(f"end{step}:{reason.value}:{session.state.value}")

    pretrain(config_of_one(tmp_path), callbacks=[Recorder()])
    assert seen == [
        "setup:globals_ready",
        "start:training",
        "step1",
        "step2",
        "eval2",
        "save2",
        "step3",
        "eval3",
        "save3",
        "end3:iterations:finalizing",
        "released",
    ]


def test_the_journal_records_transitions_teardown_and_outcome(tmp_path: Path) -> None:
    """Each call appends, in the order they happened, its start, transitions, steps, teardown and end."""
    with pytest.raises(InjectedFault):
        pretrain(config_of_one(tmp_path, fault=FaultInjection(Phase.EVAL, step=2)))
    pretrain(config_of_one(tmp_path), attempt=1)
    records = [r.to_json() for r in read([tmp_path / "journal"])]
    assert {r["version"] for r in records} == {VERSION} and len({r["run_id"] for r in records}) == 1
    assert {(r["rank"], r["restart_mode"], r["iteration"]) for r in records} == {(0, "ordinary", 0)}
    order0 = [r["kind"] for r in records if r["attempt"] == 0]
    assert order0[:4] == ["run", "transition", "transition", "transition"] and order0[-2:] == ["transition", "end"]
    assert [(r["step"], r["kind"]) for r in records if r["attempt"] == 0 and r["kind"] in ("step", "eval")] == [
        (1, "step"),
        (2, "step"),
    ]
    assert [r["step"] for r in records if r["attempt"] == 1 and r["kind"] == "step"] == [1, 2, 3]
    timed = [r for r in records if "start" in r and "end" in r and r["start"] is not None]
    assert all(r["start"] <= r["end"] for r in timed)
    assert [r["end"] for r in timed] == sorted(r["end"] for r in timed)  # appended as they happened
    end0, end1 = ends(tmp_path / "journal")
    assert (end0["state"], end0["final_step"], end0["error"]) == ("failed", 2, str_fault(Phase.EVAL, 2))
    assert (end1["state"], end1["exit_reason"], end1["final_step"]) == ("closed", "iterations", 3)
    teardown0 = [r["step"] for r in records if r["kind"] == "teardown" and r["attempt"] == 0]
    assert "barrier" not in teardown0 and teardown0[-3:] == [
        "abort_process_group",
        "close_store",
        "restore_signal_handlers",
    ]


def str_fault(phase: Phase, step: int) -> str:
    """How the journal writes an injected fault at ``phase`` on rank 0."""
    return f"InjectedFault: {InjectedFault(phase, 0, step)}"


@pytest.mark.parametrize(
    ("field", "make"),
    [
        ("training.iterations", lambda: TrainingConfig(iterations=-1)),
        ("checkpoint.dir", lambda: CheckpointConfig(resume=True)),
        ("exit.max_duration_s", lambda: ExitConfig(max_duration_s=0)),
        ("fault.phase", lambda: FaultInjection("nowhere")),  # type: ignore[arg-type]
        ("model.vocab_size", lambda: ModelConfig(vocab_size=30)),
        ("checkpoint.memory_copy", lambda: CheckpointConfig(dir="ckpt", memory_copy=True)),
        ("checkpoint.memory_interval", lambda: CheckpointConfig(memory_interval=-1)),
        ("checkpoint.memory_budget", lambda: CheckpointConfig(memory_budget=1.5)),
        ("checkpoint.memory_cap_mb", lambda: CheckpointConfig(memory_cap_mb=0)),
    ],
)
def test_a_bad_config_value_is_rejected_naming_its_field(field: str, make: Any) -> None:
    """Config classes raise ConfigError naming the field, before anything is acquired."""
    with pytest.raises(ConfigError) as caught:
        make()
    assert caught.value.field == field


@pytest.mark.timeout(120)
def test_sigterm_on_one_of_two_ranks_stops_both_at_the_same_step(tmp_path: Path) -> None:
    """A SIGTERM on rank 1 only: both ranks stop after the same step, commit a final checkpoint, close, exit 0."""
    script = [str(REPO / "tests" / "workers" / "pretrain_sigterm_worker.py"), str(tmp_path), "1", "4"]
    done = run_bounded(torchrun_command(2, "127.0.0.1", free_port(), script), timeout=100, cwd=tmp_path)
    assert done.returncode == 0, done.stdout
    results = [json.loads((tmp_path / f"result-rank{r}.json").read_text()) for r in (0, 1)]
    # The signal lands in rank 1's step-4 hook; step 5's all-reduce tells every rank.
    step = 5
    assert [r["final_step"] for r in results] == [step, step], results
    assert all(r["exit_reason"] == "requested" and r["checkpoint_step"] == step for r in results)
    assert results[1]["exit_detail"] == "SIGTERM"
    assert all(r["sigterm_handler_restored"] for r in results)
    found = latest_checkpoint(tmp_path / "ckpt")
    assert found is not None and found[0] == step
    assert [e["state"] for e in ends(tmp_path / "journal")] == ["closed", "closed"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
