"""pretrain with real tensor parallelism on CPU: sharded weights, the TP=1 loss curve, faults, layout-aware checkpoints.

The multi-rank tests share one launch of ``tests/workers/tensor_parallel_worker.py`` (2
ranks, tensor-parallel size 2, then data-parallel size 2), which runs every ``pretrain``
call in the same processes; the references (tensor-parallel size 1, one rank) and the
resumes on another layout run here, in the test process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.configs import TINY
from support.launch import run_demo, run_workers
from support.probes import alive
from training.collective_table import README, readme_section, rows

from lifecycle import (
    Callback,
    CheckpointConfig,
    ConfigError,
    DistributedConfig,
    ModelConfig,
    ParallelConfig,
    Phase,
    PretrainConfig,
    SessionHandle,
    TrainContext,
    TrainingConfig,
    pretrain,
)
from lifecycle.checkpoint import CheckpointMismatch

ITERATIONS = 6  # the worker's
NOTHING_LIVE = dict.fromkeys(alive(), False)
RUN_ID = "tensor-parallel-test"
"""The workers' run id: a resume here continues their run, and cleans their checkpoint folders as its own."""

FAULT_LIMIT_S = 8.0
"""A failed run's ``pretrain`` call ends within this on every rank: below the workers' 10 s group timeout."""
TP_RTOL = 1e-5
"""TP=2 on 2 ranks against TP=1 on 1 rank, same batches, same seed, no dropout: losses agree to this relative
tolerance at every step (the sharded matmuls and the all-reduces only change the order of float sums)."""


def reports(out: Path, tp: int, world: int, *flags: str) -> list[dict[str, Any]]:
    """Run the worker on ``world`` ranks; each must exit 0; return each rank's JSON report, by rank."""
    results = run_workers(
        "tensor_parallel_worker",
        str(out),
        str(tp),
        *flags,
        world_size=world,
        timeout_s=150,
        env={"LIFECYCLE_RUN_ID": RUN_ID},
    )
    found = []
    for result in results:
        assert result.ok, str(result)
        found.append(json.loads([line for line in result.output.splitlines() if line.startswith("{")][-1]))
    return found


@pytest.fixture(scope="module")
def tp2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """One 2-rank launch of the worker at tensor-parallel size 2: its folder and both ranks' reports."""
    out = tmp_path_factory.mktemp("tp2")
    return out, reports(out, 2, 2, "--keep-errors")


class ShardSize(Callback):
    """Notes how many parameter elements this rank's model holds."""

    numel = 0

    def on_setup_end(self, session: SessionHandle, ctx: TrainContext) -> None:
        self.numel = sum(p.numel() for p in ctx.model.parameters())


def one_rank(tmp_path: Path, micro: int, **fields: Any) -> PretrainConfig:
    """The worker's run as a world of one at tensor-parallel size 1, ``micro`` sequences per micro-batch."""
    base: dict[str, Any] = {
        "distributed": DistributedConfig(world_size=1, rank=0, master_addr="127.0.0.1", master_port=0, timeout_s=20),
        "parallel": ParallelConfig(micro_batch_size=micro, global_batch_size=4),
        "model": TINY,
        "training": TrainingConfig(iterations=ITERATIONS, log_interval=0, eval_interval=3, eval_iterations=1),
        "checkpoint": CheckpointConfig(dir=str(tmp_path / "ckpt"), interval=3),
    }
    base.update(fields)
    return PretrainConfig(**base)


def test_tensor_parallel_2_shards_the_weights_and_follows_the_tp1_loss_curve(
    tp2: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """TP=2 on 2 ranks: each rank holds about half the TP=1 weights, and the losses equal TP=1's within TP_RTOL.

    The old stand-in model gave every rank a full replica (numel equal to TP=1's).
    """
    _, (rank0, rank1) = tp2
    size = ShardSize()
    reference = pretrain(one_rank(tmp_path, 4), callbacks=[size])
    full = size.numel
    for rank in (rank0, rank1):
        # Replicated: layer norms, the position embedding and the row-parallel biases.
        assert 0.45 * full < rank["numel"] < 0.6 * full, (rank["numel"], full)
        assert rank["whole"] == pytest.approx([loss for _, loss in reference.losses], rel=TP_RTOL)
    assert rank0["whole"] == rank1["whole"]


def test_a_fault_in_every_phase_then_a_bit_exact_resume_in_the_same_processes(
    tp2: tuple[Path, list[dict[str, Any]]],
) -> None:
    """TP=2: a fault in each phase fails that run on both ranks; a retry in the same processes resumes bit-exactly.

    The retry resumes from the checkpoint of the run failed at step 5 (step 3) and
    reproduces the uninterrupted run's losses exactly, step for step.
    """
    _, found = tp2
    for rank in found:
        assert set(rank["faults"]) == {phase.value for phase in Phase}
        assert all(error is not None for error in rank["faults"].values()), rank["faults"]
        # Inside the 10 s group timeout on both ranks: nothing waited on a failed peer,
        # though the worker keeps every exception (and so the model) alive. Without
        # pretrain dropping the layers' group references, the ranks fell out of step.
        assert max(rank["fault_s"].values()) < FAULT_LIMIT_S, rank["fault_s"]
        assert [step for step, _ in rank["resumed"]] == [4, 5, 6]
        assert [loss for _, loss in rank["resumed"]] == rank["whole"][3:]


def test_the_collectives_pretrain_issues_are_the_documented_table(tp2: tuple[Path, list[dict[str, Any]]]) -> None:
    """Every (operation, group, device) the runs issue is a row of docs/collectives.md, and every row is issued.

    On CPU the rank's device is the CPU. The old loop issued the same world collectives,
    but no tensor-parallel all_reduce (its model was not sharded).
    """
    _, found = tp2
    wanted = {(op, group, "cpu" if device == "rank" else device) for op, group, device in rows()}
    for rank in found:
        assert {tuple(c) for c in rank["collectives"]} == wanted


def test_the_readme_collective_table_is_generated_from_the_docs() -> None:
    """docs/design.md holds docs/collectives.md's table as tests/training/collective_table.py writes it."""
    assert readme_section() in README.read_text()


def test_a_resume_on_another_data_parallel_size_continues_the_data(
    tp2: tuple[Path, list[dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saved on 2 ranks (data-parallel 2) at step 4, resumed on 1: steps 5-6 have the 2-rank run's losses (1e-5)."""
    out, (rank0, _) = tp2
    assert rank0["dp_part_checkpoint"] == 4
    # The second replica wrote nothing: one shard, by rank 0, and the layout it belongs to.
    manifest = json.loads((out / "dp-part" / "ckpt" / "step_0000000004" / "manifest.json").read_text())
    assert manifest["layout"] == {"tensor": 1, "pipeline": 1, "data": 2}
    assert [(s["shard"], s["rank"]) for s in manifest["shards"]] == [(0, 0)]
    resume = CheckpointConfig(dir=str(out / "dp-part" / "ckpt"), interval=3, resume=True)
    monkeypatch.setenv("LIFECYCLE_RUN_ID", RUN_ID)
    result = pretrain(one_rank(tmp_path, 2, checkpoint=resume))
    assert result.start_step == 4
    assert [loss for _, loss in result.losses] == pytest.approx(rank0["dp"][4:], rel=1e-5)


def test_a_resume_with_another_tensor_parallel_size_is_refused_naming_both_layouts(
    tp2: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """A TP=2 checkpoint resumed at TP=1: CheckpointMismatch naming both layouts, nothing loaded, nothing live."""
    out, _ = tp2
    manifest = json.loads((out / "whole" / "ckpt" / "step_0000000006" / "manifest.json").read_text())
    assert manifest["layout"] == {"tensor": 2, "pipeline": 1, "data": 1}
    assert [(s["shard"], s["rank"]) for s in manifest["shards"]] == [(0, 0), (1, 1)]  # each TP rank its shard
    resume = CheckpointConfig(dir=str(out / "whole" / "ckpt"), resume=True)
    with pytest.raises(CheckpointMismatch) as caught:
        pretrain(one_rank(tmp_path, 4, checkpoint=resume))
    assert "layout" in caught.value.what
    assert (caught.value.found, caught.value.wanted) == ("TP2 PP1 DP1", "TP1 PP1 DP1")
    assert alive() == NOTHING_LIVE


@pytest.mark.parametrize("name", ["pipeline_model_parallel_size", "context_parallel_size"])
def test_pipeline_and_context_parallel_are_refused_without_cuda(name: str) -> None:
    """PP>1 or CP>1 with gloo: ConfigError naming the field and CUDA, when the config is built (nothing acquired)."""
    with pytest.raises(ConfigError, match="needs CUDA") as caught:
        PretrainConfig(parallel=ParallelConfig(**{name: 2}))
    assert caught.value.field == f"parallel.{name}"


def test_a_model_that_does_not_split_over_the_tensor_parallel_size_is_refused_before_anything(tmp_path: Path) -> None:
    """The default model with 2 heads at TP=4: ConfigError naming model.num_heads, before any group exists."""
    config = one_rank(tmp_path, 4, model=ModelConfig(vocab_size=32, hidden_size=32, num_heads=2))
    config = PretrainConfig(
        distributed=config.distributed,
        parallel=ParallelConfig(tensor_model_parallel_size=4, micro_batch_size=4),
        model=config.model,
    )
    with pytest.raises(ConfigError) as caught:
        pretrain(config)
    assert caught.value.field == "model.num_heads"
    assert alive() == NOTHING_LIVE


def test_the_demo_refuses_a_tensor_parallel_size_that_does_not_divide_the_ranks(tmp_path: Path) -> None:
    """``demo --nproc 2 --tp 3``: exit 2 before torchrun starts, the last line naming ``--tp``."""
    done = run_demo("--nproc=2", "--tp=3", timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("demo: --tp "), done.stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_demo_trains_tensor_parallel_and_shows_the_layout_first(tmp_path: Path) -> None:
    """``demo --nproc 2 --tp 2``: its first line names the layout (TP2 PP1 DP1), and every rank closes (exit 0)."""
    done = run_demo("--nproc=2", "--tp=2", "--steps=4", f"--journal-dir={tmp_path / 'j'}", timeout=100, cwd=tmp_path)
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines()[0].startswith("demo: 2 ranks (TP2 PP1 DP1), 4 steps, rendezvous "), done.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tensor_2_by_data_2_on_4_ranks(tmp_path: Path) -> None:
    """TP2×DP2 on 4 ranks: TP=1's losses (1e-5), a fault in every phase, a bit-exact resume, the same collectives.

    The worker keeps every failed run's exception, as a retry loop that logs them does: a
    CheckpointError's cause (gloo's error) kept torch's frames, and with them the aborted
    group's sockets, so a peer blocked in finalize waited the whole group timeout and the
    retry's ranks fell out of step (fixed: ``clear_frames_of`` walks the cause chain).
    """
    found = reports(tmp_path / "tp2dp2", 2, 4, "--slow", "--keep-errors")
    reference = pretrain(one_rank(tmp_path, 2))  # each data-parallel rank reads 2 of the 4 sequences
    wanted = {(op, group, "cpu" if device == "rank" else device) for op, group, device in rows()}
    for rank in found:
        assert rank["whole"] == pytest.approx([loss for _, loss in reference.losses], rel=TP_RTOL)
        assert all(error is not None for error in rank["faults"].values()), rank["faults"]
        assert max(rank["fault_s"].values()) < FAULT_LIMIT_S, rank["fault_s"]
        assert [loss for _, loss in rank["resumed"]] == rank["whole"][3:]
        assert {tuple(c) for c in rank["collectives"]} == wanted
