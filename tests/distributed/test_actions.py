"""TorchActions on real gloo process groups and real megatron-core globals (no mocks of either)."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import torch.distributed as dist
from megatron.core import num_microbatches_calculator, parallel_state, rerun_state_machine
from support.configs import GROUP_TIMEOUT_S, ONE
from support.launch import run_workers, worker_reports
from support.probes import MEGATRON_RELEASES, NOTHING_ALIVE, TORCH_COLLECTIVES, TORCH_RELEASES, TorchCalls, alive
from support.session import LIVE_STATES, drive

from lifecycle import (
    AttemptDisagreement,
    ConfigError,
    DistributedConfig,
    MissingResource,
    Owner,
    ParallelConfig,
    ResourceMismatch,
    Session,
    StaleResource,
    State,
    TorchActions,
)
from lifecycle.lowlevel import Resource, live_resources
from lifecycle.testing import free_port, release_everything, sockets, threads

# -- helpers ---------------------------------------------------------------------------


def listening() -> set[int]:
    """The TCP ports this process listens on now."""
    return {s.local[1] for s in sockets() if s.status == "LISTEN"}


def run_to_closed() -> None:
    """A session that trains (one real all-reduce) and closes; asserts it reached ``closed``."""
    session = Session(TorchActions(ONE, ParallelConfig()))
    with session:
        drive(session, State.TRAINING)
        value = torch.ones(1)
        dist.all_reduce(value, group=parallel_state.get_data_parallel_group())
        assert value.item() == 1.0
    assert session.state is State.CLOSED
    assert alive() == NOTHING_ALIVE


def caller_group() -> None:
    """Create the default group as a caller would, without the library."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)


def fake_caller_group(rank: int, world_size: int) -> None:
    """A caller's default group of ``world_size`` ranks in this one process, on torch's ``fake`` backend.

    Its collectives do nothing; it is for checks that only read the group's rank and size.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)


def group_sequence_numbers() -> dict[Any, int]:
    """Every live group and its collective sequence number (each collective, barrier included, adds one)."""
    groups: list[Any] = list(dist.distributed_c10d._world.pg_map)
    return {group: group._get_sequence_number_for_group() for group in groups}


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    """Every test starts and ends with nothing alive, whatever the test before it left."""
    release_everything()
    yield
    release_everything()


@pytest.fixture
def recorder() -> Iterator[TorchCalls]:
    """Record torch.distributed's collectives and the torch / megatron-core release functions (off at first)."""
    with TorchCalls((*TORCH_COLLECTIVES, *TORCH_RELEASES, *MEGATRON_RELEASES)) as calls:
        calls.on = False
        yield calls


# -- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "build"),
    [
        ("distributed.world_size", lambda: DistributedConfig(world_size=0)),
        ("distributed.world_size", lambda: DistributedConfig(world_size=-2)),
        ("distributed.rank", lambda: DistributedConfig(world_size=2, rank=2)),
        ("distributed.rank", lambda: DistributedConfig(rank=-1)),
        ("distributed.backend", lambda: DistributedConfig(backend="mpi")),
        ("distributed.timeout_s", lambda: DistributedConfig(timeout_s=0)),
        ("distributed.timeout_s", lambda: DistributedConfig(timeout_s=float("inf"))),
        ("distributed.master_port", lambda: DistributedConfig(master_port=70000)),
        ("parallel.tensor_model_parallel_size", lambda: ParallelConfig(tensor_model_parallel_size=0)),
        ("parallel.global_batch_size", lambda: ParallelConfig(global_batch_size=0)),
        ("parallel.rerun_mode", lambda: ParallelConfig(rerun_mode="sometimes")),
    ],
)
def test_config_rejects_bad_value_at_construction(field: str, build: Callable[[], object]) -> None:
    """A value wrong on its own raises ConfigError naming its field when the config is built."""
    with pytest.raises(ConfigError) as caught:
        build()
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("field", "distributed", "parallel", "env"),
    [
        ("distributed.world_size", DistributedConfig(), ParallelConfig(), {"WORLD_SIZE": "0", "RANK": "0"}),
        ("distributed.world_size", DistributedConfig(), ParallelConfig(), {"RANK": "0"}),
        ("distributed.rank", DistributedConfig(), ParallelConfig(), {"WORLD_SIZE": "2", "RANK": "2"}),
        ("distributed.master_addr", DistributedConfig(world_size=2, rank=0), ParallelConfig(), {}),
        ("parallel.tensor_model_parallel_size", ONE, ParallelConfig(tensor_model_parallel_size=2), {}),
        (
            "parallel.pipeline_model_parallel_size",
            DistributedConfig(world_size=2, rank=0, master_addr="h", master_port=1),
            ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2),
            {},
        ),
        ("parallel.global_batch_size", ONE, ParallelConfig(micro_batch_size=2, global_batch_size=3), {}),
        ("distributed.local_rank", DistributedConfig(backend="nccl", world_size=1, rank=0), ParallelConfig(), {}),
    ],
)
def test_bad_configuration_is_rejected_before_anything_is_acquired(
    monkeypatch: pytest.MonkeyPatch,
    field: str,
    distributed: DistributedConfig,
    parallel: ParallelConfig,
    env: dict[str, str],
) -> None:
    """init_distributed raises ConfigError naming the field, having opened no store (no socket, no thread) nor group."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    session = Session(TorchActions(distributed, parallel))
    ports, thread_count = listening(), len(threads())  # after: the session starts its teardown workers with it
    with pytest.raises(ConfigError) as caught:
        session.init_distributed()
    assert caught.value.field == field
    assert session.state is State.UNINITIALIZED
    assert session.ledger.entries == ()
    assert listening() == ports and len(threads()) == thread_count  # no store served, no store thread
    assert alive() == NOTHING_ALIVE


def test_config_reads_torchrun_environment() -> None:
    """None fields come from the torchrun variables; the agent store flag makes every rank a client."""
    env = {
        "WORLD_SIZE": "4",
        "RANK": "3",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    rendezvous = DistributedConfig().resolve(env)
    ParallelConfig(tensor_model_parallel_size=2).check_world(rendezvous.world_size)  # 2 divides 4: no error
    assert (rendezvous.world_size, rendezvous.rank, rendezvous.local_rank) == (4, 3, 1)
    assert (rendezvous.master_addr, rendezvous.master_port, rendezvous.use_agent_store) == ("node0", 29500, True)
    assert ParallelConfig(micro_batch_size=2).resolved_global_batch_size(4) == 8


# -- session-owned resources -----------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("state", LIVE_STATES, ids=lambda s: s.value)
def test_failure_in_each_state_releases_everything_without_a_collective(state: State, recorder: TorchCalls) -> None:
    """A failure in any live state releases all, runs no collective, re-raises the same error; a retry closes."""
    if state is State.UNINITIALIZED:
        # A peer that never comes: the rendezvous times out inside init_distributed.
        port = free_port()
        config = DistributedConfig(world_size=2, rank=0, master_addr="127.0.0.1", master_port=port, timeout_s=0.5)
    else:
        port, config = 0, ONE
    session = Session(TorchActions(config, ParallelConfig()))
    raised: BaseException | None = None
    with pytest.raises(Exception) as caught, session:  # identity is checked below
        if state is State.UNINITIALIZED:
            recorder.on = True
            session.init_distributed()  # raises: the peer never comes
        drive(session, state)
        dist.all_reduce(torch.ones(1))
        before = group_sequence_numbers()
        recorder.on = True
        raised = RuntimeError(f"injected in {state.value}")
        raise raised
    recorder.on = False
    if state is State.UNINITIALIZED:
        # The ranks meet on an attempt number before the group's rendezvous: the error names who never came.
        assert isinstance(caught.value, AttemptDisagreement)
        assert caught.value.proposals[1] is None and "rank 1" in str(caught.value)
        assert port not in listening()  # the store it hosted is closed
        before = {}
    else:
        assert caught.value is raised
        assert recorder.named(*TORCH_RELEASES, *MEGATRON_RELEASES)[-1] == "_abort_process_group"
    assert recorder.named(*TORCH_COLLECTIVES) == []
    assert group_sequence_numbers() == {} and {g: g._get_sequence_number_for_group() for g in before} == before
    del before
    assert session.state is State.FAILED
    assert alive() == NOTHING_ALIVE
    recorder.on = True
    run_to_closed()
    assert "barrier" in recorder.named(*TORCH_COLLECTIVES)  # the recorder does see the success path's barrier


def test_failure_teardown_leaves_no_reference_to_any_group() -> None:
    """After failure teardown nothing in torch or megatron-core still references any process group."""
    session = Session(TorchActions(ONE, ParallelConfig()))
    drive(session, State.TRAINING)
    groups = [weakref.ref(group) for group in dist.distributed_c10d._world.pg_map]
    assert len(groups) > 10  # megatron's subgroups are among them
    session.fail(RuntimeError("injected"))
    gc.collect()
    assert [ref for ref in groups if ref() is not None] == []


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit])
def test_interruptions_take_the_failure_path_and_propagate(interruption: type[BaseException]) -> None:
    """KeyboardInterrupt and SystemExit raised in the loop release everything and propagate as the same object."""
    session = Session(TorchActions(ONE, ParallelConfig()))
    raised = interruption()
    with pytest.raises(interruption) as caught, session:
        drive(session, State.TRAINING)
        raise raised
    assert caught.value is raised
    assert session.state is State.FAILED
    assert alive() == NOTHING_ALIVE


class FailingAbortModelParallel(TorchActions):
    """TorchActions whose abort_model_parallel (the failure plan's release of Megatron's state) raises at once."""

    def abort_model_parallel(self) -> None:
        """Raise an injected teardown fault."""
        raise OSError("injected teardown fault")


def test_failing_teardown_step_keeps_original_error_and_runs_later_steps() -> None:
    """A teardown step that raises adds a note to the original error (same object) and the group is still aborted."""
    session = Session(FailingAbortModelParallel(ONE, ParallelConfig()))
    raised = RuntimeError("original")
    with pytest.raises(RuntimeError) as caught, session:
        drive(session, State.TRAINING)
        raise raised
    assert caught.value is raised
    assert any("abort_model_parallel" in note for note in raised.__notes__)
    assert session.report is not None
    assert [str(f.step) for f in session.report.failed] == ["abort_model_parallel"]
    assert [str(step) for step in session.report.ran[-2:]] == ["abort_process_group", "close_store"]
    assert not dist.is_initialized()
    assert alive()["microbatch_calculator"] is False and alive()["rerun_state_machine"] is False
    parallel_state.destroy_model_parallel()  # the step that failed on purpose


@pytest.mark.timeout(60)
def test_fifty_fail_then_retry_cycles_do_not_grow_threads_or_fds() -> None:
    """50 cycles of a failed session then a closed one: threads, fds and sockets stay at the first cycle's level."""

    def cycle() -> None:
        session = Session(TorchActions(ONE, ParallelConfig()))
        with pytest.raises(RuntimeError), session:
            drive(session, State.TRAINING)
            raise RuntimeError("injected")
        assert session.state is State.FAILED
        run_to_closed()

    def counts() -> tuple[int, int, int]:
        return len(threads()), len(os.listdir("/proc/self/fd")), len(sockets())

    hook = sys.excepthook
    cycle()
    after_first = counts()
    start = time.monotonic()
    for _ in range(49):
        cycle()
    per_cycle = (time.monotonic() - start) / 49
    now = counts()
    assert all(n <= first for n, first in zip(now, after_first, strict=True)), (
        f"threads/fds/sockets {after_first} -> {now}"
    )
    assert per_cycle < 1.0, f"{per_cycle * 1000:.0f} ms a cycle"
    assert sys.excepthook is hook  # the excepthook torch wraps at each group creation is restored


def test_a_group_and_store_left_by_an_interrupted_teardown_are_reclaimed_not_adopted() -> None:
    """Ctrl-C in the teardown leaves group and store; the next session releases both first, owns its new ones."""
    port = free_port()
    config = DistributedConfig(world_size=1, rank=0, master_addr="127.0.0.1", master_port=port, timeout_s=20)

    class Interrupted(TorchActions):
        """Ctrl-C lands in each release, once (a later session's reclaim then succeeds)."""

        pending: ClassVar[set[str]] = {"abort_process_group", "close_store"}

        def abort_process_group(self) -> None:
            self._interrupt("abort_process_group")
            super().abort_process_group()

        def close_store(self) -> None:
            self._interrupt("close_store")
            super().close_store()

        def _interrupt(self, step: str) -> None:
            if step in self.pending:
                self.pending.discard(step)
                raise KeyboardInterrupt(f"during {step}")

    first = Session(Interrupted(config, ParallelConfig()))
    first.init_distributed()
    with pytest.raises(KeyboardInterrupt):
        first.fail(RuntimeError("boom"))
    assert dist.is_initialized() and Resource.RENDEZVOUS_STORE in live_resources()
    second = Session(TorchActions(config, ParallelConfig()))
    with second:
        second.init_distributed()
        # Old code: the store's init saw the leftover group, so the new store was "the caller's".
        assert second.ledger.owner(Resource.RENDEZVOUS_STORE) is Owner.SESSION
        assert second.ledger.owner(Resource.PROCESS_GROUP) is Owner.SESSION
        assert [str(record.step) for record in second.reclaimed] == ["abort_process_group", "close_store"]
        second.init_globals()
        second.start_training()
    assert second.state is State.CLOSED
    del first
    gc.collect()
    assert alive() == NOTHING_ALIVE and port not in listening() and not live_resources()


def test_each_session_on_a_fixed_port_hosts_its_own_store_and_closes_it() -> None:
    """Each session hosts its store on the port and closes it at teardown (old code kept one listening for good)."""
    port = free_port()
    config = DistributedConfig(world_size=1, rank=0, master_addr="127.0.0.1", master_port=port, timeout_s=20)
    prefixes = []
    for fail in (True, False, True):
        actions = TorchActions(config, ParallelConfig())
        session = Session(actions)
        if fail:
            with pytest.raises(RuntimeError), session:
                drive(session, State.GLOBALS_READY)
                raise RuntimeError("injected")
        else:
            with session:
                drive(session, State.TRAINING)
        assert session.state is (State.FAILED if fail else State.CLOSED)
        prefixes.append(actions.store_prefix)
        assert alive() == NOTHING_ALIVE
        assert port not in listening() and not live_resources()  # the session's store went with it
    assert len(set(prefixes)) == 3
    given = TorchActions(config, ParallelConfig(), store_prefix="wrapper/iteration-7")
    assert given.init_process_group() is Owner.SESSION and given.store_prefix == "wrapper/iteration-7"
    assert (given.rank, given.world_size) == (0, 1)
    given.destroy_process_group()
    with pytest.raises(MissingResource) as missing:
        _ = given.rank
    assert missing.value.resource == "process_group"
    with pytest.raises(ConfigError) as reused:
        given.init_process_group()  # one prefix serves one attempt
    assert reused.value.field == "store_prefix"
    assert not dist.is_initialized()
    assert port not in listening()  # opened by init_process_group itself: dropped with its group
    assert release_everything() == []


# -- caller-owned resources ------------------------------------------------------------


def test_caller_owned_group_and_model_parallel_survive_a_failure() -> None:
    """A failure leaves the caller's group and model-parallel state alive and usable; only the session's go."""
    caller_group()
    parallel_state.initialize_model_parallel(distributed_timeout_minutes=0.5)
    session = Session(TorchActions(ONE, ParallelConfig()))
    with pytest.raises(RuntimeError), session:
        drive(session, State.TRAINING)
        raise RuntimeError("injected")
    assert session.ledger.owner(Resource.PROCESS_GROUP) is Owner.CALLER
    assert session.ledger.owner(Resource.MODEL_PARALLEL) is Owner.CALLER
    assert session.ledger.owner(Resource.MICROBATCH_CALCULATOR) is Owner.SESSION
    assert alive() == {**NOTHING_ALIVE, "process_group": True, "model_parallel": True}
    for group in (None, parallel_state.get_data_parallel_group()):
        value = torch.ones(1)
        dist.all_reduce(value, group=group)
        assert value.item() == 1.0
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def test_caller_owned_group_keeps_working_after_session_model_parallel_is_released() -> None:
    """On the caller's group, a failure releases the session's model-parallel subgroups; the group stays usable."""
    caller_group()
    session = Session(TorchActions(ONE, ParallelConfig()))
    with pytest.raises(RuntimeError), session:
        drive(session, State.TRAINING)
        subgroups = [weakref.ref(g) for g in dist.distributed_c10d._world.pg_map if g is not dist.group.WORLD]
        raise RuntimeError("injected")
    assert session.ledger.owner(Resource.MODEL_PARALLEL) is Owner.SESSION
    assert list(dist.distributed_c10d._world.pg_map) == [dist.group.WORLD]
    gc.collect()
    assert [ref for ref in subgroups if ref() is not None] == []
    value = torch.ones(1)
    dist.all_reduce(value)
    assert value.item() == 1.0
    dist.destroy_process_group()


def test_found_group_that_disagrees_with_the_config_is_refused() -> None:
    """A caller's group whose world size differs from the configuration raises ResourceMismatch and is left alone."""
    caller_group()
    config = DistributedConfig(world_size=2, rank=0)
    with pytest.raises(ResourceMismatch) as caught:
        TorchActions(config, ParallelConfig()).init_process_group()
    error = caught.value
    assert (error.resource, error.what, error.found, error.wanted) == ("process_group", "world size", 1, 2)
    assert error.remedy
    assert dist.is_initialized()
    dist.destroy_process_group()


def test_found_group_in_which_this_process_has_another_rank_is_refused() -> None:
    """A caller's group where this process's rank differs from the configuration raises ResourceMismatch on rank."""
    fake_caller_group(rank=1, world_size=2)
    with pytest.raises(ResourceMismatch) as caught:
        TorchActions(DistributedConfig(world_size=2, rank=0), ParallelConfig()).init_process_group()
    error = caught.value
    assert (error.resource, error.what, error.found, error.wanted) == ("process_group", "rank", 1, 0)
    assert dist.is_initialized() and dist.get_rank() == 1


def test_found_model_parallel_state_with_other_sizes_is_refused() -> None:
    """A caller's model-parallel state whose sizes differ from the configuration raises ResourceMismatch; it stays."""
    fake_caller_group(rank=0, world_size=2)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=2, distributed_timeout_minutes=0.5, create_gloo_process_groups=False
    )
    actions = TorchActions(DistributedConfig(world_size=2, rank=0), ParallelConfig())
    assert actions.init_process_group() is Owner.CALLER
    with pytest.raises(ResourceMismatch) as caught:
        actions.init_model_parallel()
    error = caught.value
    assert (error.resource, error.what) == ("model_parallel", "(tensor, pipeline, context) sizes")
    assert (error.found, error.wanted) == ((2, 1, 1), (1, 1, 1))
    assert parallel_state.model_parallel_is_initialized()


def test_found_microbatch_calculator_with_other_batch_sizes_is_refused() -> None:
    """A caller's microbatch calculator with other (micro, global) batch sizes raises ResourceMismatch; it stays."""
    caller_group()
    num_microbatches_calculator.init_num_microbatches_calculator(0, None, 8, 2, 1)
    with pytest.raises(ResourceMismatch) as caught:
        TorchActions(ONE, ParallelConfig(micro_batch_size=1)).init_microbatch_calculator()
    error = caught.value
    assert (error.resource, error.what) == ("microbatch_calculator", "(micro, global) batch size")
    assert (error.found, error.wanted) == ((2, 8), (1, 1))
    assert num_microbatches_calculator.get_micro_batch_size() == 2


def test_found_rerun_state_machine_in_another_mode_is_refused() -> None:
    """A caller's rerun state machine in another mode raises ResourceMismatch naming both modes; it stays."""
    rerun_state_machine.initialize_rerun_state_machine(mode=rerun_state_machine.RerunMode.VALIDATE_RESULTS)
    with pytest.raises(ResourceMismatch) as caught:
        TorchActions(ONE, ParallelConfig(rerun_mode="disabled")).init_rerun_state_machine()
    error = caught.value
    assert (error.resource, error.what, error.found, error.wanted) == (
        "rerun_state_machine",
        "mode",
        "validate_results",
        "disabled",
    )
    assert rerun_state_machine._GLOBAL_RERUN_STATE_MACHINE is not None


def test_megatron_globals_without_a_default_group_are_refused_as_missing() -> None:
    """init_model_parallel and init_microbatch_calculator without a default group raise MissingResource naming it."""
    actions = TorchActions(ONE, ParallelConfig())
    for init in (actions.init_model_parallel, actions.init_microbatch_calculator):
        with pytest.raises(MissingResource) as caught:
            init()
        assert caught.value.resource == "process_group"
        assert init.__name__ in caught.value.detail
    assert alive() == NOTHING_ALIVE


@pytest.mark.parametrize("caller_keeps_group", [False, True])
def test_stale_model_parallel_state_is_refused(caller_keeps_group: bool) -> None:
    """Model-parallel state left from an earlier group is refused with StaleResource, never reused."""
    caller_group()
    parallel_state.initialize_model_parallel(distributed_timeout_minutes=0.5)
    dist.destroy_process_group()  # the group goes, megatron's state stays: stale
    if caller_keeps_group:
        caller_group()
    session = Session(TorchActions(ONE, ParallelConfig()))
    with pytest.raises(StaleResource) as caught, session:
        drive(session, State.GLOBALS_READY)
    assert caught.value.resource == "model_parallel"
    assert "destroy_model_parallel()" in caught.value.detail  # the remedy
    assert session.state is State.FAILED
    assert dist.is_initialized() is caller_keeps_group
    parallel_state.destroy_model_parallel()
    if caller_keeps_group:
        dist.destroy_process_group()


def test_half_made_model_parallel_state_is_refused() -> None:
    """A megatron-core global set without model-parallel state is refused with StaleResource naming it; it stays."""
    caller_group()
    parallel_state._set_global_memory_buffer()
    with pytest.raises(StaleResource) as caught:
        TorchActions(ONE, ParallelConfig()).init_model_parallel()
    assert caught.value.resource == "model_parallel"
    assert "_GLOBAL_MEMORY_BUFFER" in caught.value.detail
    assert parallel_state._GLOBAL_MEMORY_BUFFER is not None


# -- two ranks -------------------------------------------------------------------------


@pytest.mark.timeout(150)
@pytest.mark.parametrize("launcher", [pytest.param("torchrun", marks=pytest.mark.slow), "plain"])
def test_two_ranks_failure_in_each_state_releases_blocked_peer(launcher: str, tmp_path: Path) -> None:
    """Rank 1 fails in each state while rank 0 waits in an all-reduce: both leave teardown in seconds, release all."""
    env = {"DIST_RESULTS": str(tmp_path)}
    results = run_workers("dist_worker", timeout_s=120, torchrun=launcher == "torchrun", env=env)
    assert all(result.ok for result in results), "\n".join(map(str, results))
    ranks = [[json.loads(line) for line in (tmp_path / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    for rank, records in enumerate(ranks):
        *failures, success = records
        assert [f["fail_state"] for f in failures] == ["dist_ready", "globals_ready", "training", "finalizing"]
        for record in failures:
            assert record["final_state"] == "failed", record
            assert record["alive"] == NOTHING_ALIVE, record
            assert record["same_object"] is True, record
            assert record["teardown_s"] < GROUP_TIMEOUT_S / 2, record  # no wait for the group timeout
            assert "barrier" not in record["plan"], record
            if rank == 0:
                assert record["blocked_s"] < GROUP_TIMEOUT_S / 2, record  # released by rank 1's abort, not the timeout
            else:
                assert record["error"] == "PlannedFailure", record
        assert success == {"final_state": "closed", "sum": 2.0, "alive": NOTHING_ALIVE}


# -- nccl (needs CUDA) -----------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="nccl needs CUDA")
@pytest.mark.timeout(120)
def test_nccl_session_fails_then_closes_on_one_gpu() -> None:
    """On one GPU with nccl, a failure releases everything and a new session then closes."""
    config = DistributedConfig(backend="nccl", world_size=1, rank=0, local_rank=0, timeout_s=60)
    session = Session(TorchActions(config, ParallelConfig(create_gloo_process_groups=False)))
    with pytest.raises(RuntimeError), session:
        drive(session, State.TRAINING)
        dist.all_reduce(torch.ones(1, device="cuda"))
        raise RuntimeError("injected")
    assert alive() == NOTHING_ALIVE
    session = Session(TorchActions(config, ParallelConfig(create_gloo_process_groups=False)))
    with session:
        drive(session, State.TRAINING)
        value = torch.ones(1, device="cuda")
        dist.all_reduce(value)
    assert session.state is State.CLOSED and value.item() == 1.0


@pytest.mark.timeout(90)
def test_a_kept_traceback_does_not_keep_the_peer_blocked(tmp_path: Path) -> None:
    """A failure raised in a torch frame holding the group, kept like a notebook keeps it, still releases the peer."""
    results = run_workers("kept_traceback_worker", timeout_s=60, env={"RESULTS": str(tmp_path)})
    assert all(result.ok for result in results), "\n".join(map(str, results))
    blocked, failing = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert blocked["blocked_s"] < 1.0, blocked  # released by rank 1's teardown, not by the group timeout
    assert failing["state"] == blocked["state"] == "failed"
    assert any("cleared the locals of" in note and "torch frame" in note for note in failing["notes"]), failing
    assert failing["connections"] == [], failing  # no socket of the aborted groups left open


def test_megatron_gloo_twins_are_built_only_off_gloo_unless_asked() -> None:
    """``create_gloo_process_groups`` None means twins only for a non-gloo default group; a non-bool is refused."""
    assert ParallelConfig().gloo_process_groups("gloo") is False
    assert ParallelConfig().gloo_process_groups("nccl") is True
    assert ParallelConfig(create_gloo_process_groups=True).gloo_process_groups("gloo") is True
    assert ParallelConfig(create_gloo_process_groups=False).gloo_process_groups("nccl") is False
    with pytest.raises(ConfigError) as refused:
        ParallelConfig(create_gloo_process_groups="yes")  # type: ignore[arg-type]
    assert refused.value.field == "parallel.create_gloo_process_groups"


@pytest.mark.timeout(120)
def test_a_healthy_close_frees_the_gloo_groups_in_parallel() -> None:
    """A close at 2 ranks frees every gloo group, megatron-core's copies too, on the freeing threads, not one by one."""
    for report in worker_reports("close_worker", timeout_s=100):
        for session in report["sessions"]:
            assert session["state"] == "closed" and not session["initialized"], session
            assert session["backends"] == ["gloo"] and session["groups"] > 10, session  # megatron-core's among them
            assert session["alive"] == 0 and session["freed"] == session["groups"], session  # all freed
            # Not one after the other on the teardown's thread (a tick of gloo's socket loop per group and peer).
            assert session["threads"] == ["lifecycle-free-group"], session
