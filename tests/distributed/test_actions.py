"""TorchActions on real gloo process groups and real megatron-core globals (no mocks of either)."""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from megatron.core import num_microbatches_calculator, parallel_state, rerun_state_machine
from support.probes import TORCH_COLLECTIVES, alive

import lifecycle._torch.store as distributed_module
from lifecycle import ConfigError, LifecycleError, Owner, Resource, Session, State
from lifecycle._torch.actions import TorchActions, close_hosted_stores
from lifecycle._torch.config import DistributedConfig, ParallelConfig, validate

WORKER = Path(__file__).resolve().parents[1] / "workers" / "dist_worker.py"
LIVE_STATES = ("uninitialized", "dist_ready", "globals_ready", "training", "finalizing")
ONE = DistributedConfig(world_size=1, rank=0, timeout_s=20)


# -- helpers ---------------------------------------------------------------------------


NOTHING_ALIVE = dict.fromkeys(
    ("process_group", "model_parallel", "microbatch_calculator", "rerun_state_machine"), False
)


def force_release() -> None:
    """Release whatever a test left, so one failure does not cascade."""
    rerun_state_machine.destroy_rerun_state_machine()
    num_microbatches_calculator.destroy_num_microbatches_calculator()
    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.distributed_c10d._abort_process_group()
    close_hosted_stores()


def drive(session: Session, state: str) -> None:
    """Pull triggers until ``session`` is in ``state``."""
    for step in (session.init_distributed, session.init_globals, session.start_training, session.finish):
        if session.state.value == state:
            return
        step()
    assert session.state.value == state


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    """True if nothing listens on ``port`` (connections lingering in TIME_WAIT do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def run_to_closed() -> None:
    """A session that trains (one real all-reduce) and closes; asserts it reached ``closed``."""
    session = Session(TorchActions(ONE, ParallelConfig()))
    with session:
        drive(session, "training")
        value = torch.ones(1)
        dist.all_reduce(value, group=parallel_state.get_data_parallel_group())
        assert value.item() == 1.0
    assert session.state is State.CLOSED
    assert alive() == NOTHING_ALIVE


def caller_group() -> None:
    """Create the default group as a caller would, without the library."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)


def group_sequence_numbers() -> dict[Any, int]:
    """Every live group and its collective sequence number (each collective, barrier included, adds one)."""
    groups: list[Any] = list(dist.distributed_c10d._world.pg_map)
    return {group: group._get_sequence_number_for_group() for group in groups}


class Recorder:
    """Records calls of torch.distributed collectives and of torch/megatron teardown functions, while on."""

    def __init__(self) -> None:
        self.on = False
        self.collectives: list[str] = []
        self.teardown: list[str] = []

    def wrap(self, log: list[str], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if self.on:
                log.append(name)
            return fn(*args, **kwargs)

        return recorded


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    """Every test starts and ends with nothing alive."""
    force_release()
    yield
    force_release()


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """Wrap torch.distributed's collectives and the torch/megatron release functions with a recorder."""
    rec = Recorder()
    for module in (dist, dist.distributed_c10d):
        for name in TORCH_COLLECTIVES:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, rec.wrap(rec.collectives, name, getattr(module, name)))
        for name in ("destroy_process_group", "_abort_process_group"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, rec.wrap(rec.teardown, name, getattr(module, name)))
    for module, name in (
        (parallel_state, "destroy_model_parallel"),
        (parallel_state, "destroy_global_memory_buffer"),
        (num_microbatches_calculator, "destroy_num_microbatches_calculator"),
        (rerun_state_machine, "destroy_rerun_state_machine"),
    ):
        monkeypatch.setattr(module, name, rec.wrap(rec.teardown, name, getattr(module, name)))
    return rec


# -- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "build"),
    [
        ("world_size", lambda: DistributedConfig(world_size=0)),
        ("world_size", lambda: DistributedConfig(world_size=-2)),
        ("rank", lambda: DistributedConfig(world_size=2, rank=2)),
        ("rank", lambda: DistributedConfig(rank=-1)),
        ("backend", lambda: DistributedConfig(backend="mpi")),
        ("timeout_s", lambda: DistributedConfig(timeout_s=0)),
        ("timeout_s", lambda: DistributedConfig(timeout_s=float("inf"))),
        ("master_port", lambda: DistributedConfig(master_port=70000)),
        ("tensor_model_parallel_size", lambda: ParallelConfig(tensor_model_parallel_size=0)),
        ("global_batch_size", lambda: ParallelConfig(global_batch_size=0)),
        ("rerun_mode", lambda: ParallelConfig(rerun_mode="sometimes")),
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
        ("world_size", DistributedConfig(), ParallelConfig(), {"WORLD_SIZE": "0", "RANK": "0"}),
        ("world_size", DistributedConfig(), ParallelConfig(), {"RANK": "0"}),
        ("rank", DistributedConfig(), ParallelConfig(), {"WORLD_SIZE": "2", "RANK": "2"}),
        ("master_addr", DistributedConfig(world_size=2, rank=0), ParallelConfig(), {}),
        ("tensor_model_parallel_size", ONE, ParallelConfig(tensor_model_parallel_size=2), {}),
        (
            "pipeline_model_parallel_size",
            DistributedConfig(world_size=2, rank=0, master_addr="h", master_port=1),
            ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2),
            {},
        ),
        ("global_batch_size", ONE, ParallelConfig(micro_batch_size=2, global_batch_size=3), {}),
        ("local_rank", DistributedConfig(backend="nccl", world_size=1, rank=0), ParallelConfig(), {}),
    ],
)
def test_bad_configuration_is_rejected_before_anything_is_acquired(
    monkeypatch: pytest.MonkeyPatch,
    field: str,
    distributed: DistributedConfig,
    parallel: ParallelConfig,
    env: dict[str, str],
) -> None:
    """init_distributed raises ConfigError naming the field, having opened no store and made no group."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    stores: list[object] = []
    real_store = getattr(distributed_module, "TCPStore")  # noqa: B009 - not re-exported for mypy

    def recording_store(*args: Any, **kwargs: Any) -> Any:
        stores.append(args)
        return real_store(*args, **kwargs)

    monkeypatch.setattr(distributed_module, "TCPStore", recording_store)
    session = Session(TorchActions(distributed, parallel))
    with pytest.raises(ConfigError) as caught:
        session.init_distributed()
    assert caught.value.field == field
    assert session.state is State.UNINITIALIZED
    assert session.ledger.entries == ()
    assert stores == []
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
    rendezvous = validate(DistributedConfig(), ParallelConfig(tensor_model_parallel_size=2), env)
    assert (rendezvous.world_size, rendezvous.rank, rendezvous.local_rank) == (4, 3, 1)
    assert (rendezvous.master_addr, rendezvous.master_port, rendezvous.use_agent_store) == ("node0", 29500, True)
    assert ParallelConfig(micro_batch_size=2).resolved_global_batch_size(4) == 8


# -- session-owned resources -----------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("state", LIVE_STATES)
def test_failure_in_each_state_releases_everything_without_a_collective(state: str, recorder: Recorder) -> None:
    """A failure in any live state releases all, runs no collective, re-raises the same error; a retry closes."""
    if state == "uninitialized":
        # A peer that never comes: the rendezvous times out inside init_distributed.
        port = free_port()
        config = DistributedConfig(world_size=2, rank=0, master_addr="127.0.0.1", master_port=port, timeout_s=0.5)
    else:
        port, config = 0, ONE
    session = Session(TorchActions(config, ParallelConfig()))
    raised: BaseException | None = None
    with pytest.raises(Exception) as caught, session:  # identity is checked below
        if state == "uninitialized":
            recorder.on = True
            session.init_distributed()  # raises: the peer never comes
        drive(session, state)
        dist.all_reduce(torch.ones(1))
        before = group_sequence_numbers()
        recorder.on = True
        raised = RuntimeError(f"injected in {state}")
        raise raised
    recorder.on = False
    if state == "uninitialized":
        assert isinstance(caught.value, dist.DistStoreError)
        assert port_is_free(port)  # the store it hosted is closed
        before = {}
    else:
        assert caught.value is raised
        assert recorder.teardown[-1] == "_abort_process_group"
    assert recorder.collectives == []
    assert group_sequence_numbers() == {} and {g: g._get_sequence_number_for_group() for g in before} == before
    del before
    assert session.state is State.FAILED
    assert alive() == NOTHING_ALIVE
    recorder.on = True
    run_to_closed()
    assert "barrier" in recorder.collectives  # the recorder does see the success path's barrier


def test_failure_teardown_leaves_no_reference_to_any_group() -> None:
    """After failure teardown nothing in torch or megatron-core still references any process group."""
    session = Session(TorchActions(ONE, ParallelConfig()))
    drive(session, "training")
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
        drive(session, "training")
        raise raised
    assert caught.value is raised
    assert session.state is State.FAILED
    assert alive() == NOTHING_ALIVE


class FailingDestroyModelParallel(TorchActions):
    """TorchActions whose destroy_model_parallel raises before releasing anything."""

    def destroy_model_parallel(self) -> None:
        """Raise an injected teardown fault."""
        raise OSError("injected teardown fault")


def test_failing_teardown_step_keeps_original_error_and_runs_later_steps() -> None:
    """A teardown step that raises adds a note to the original error (same object) and the group is still aborted."""
    session = Session(FailingDestroyModelParallel(ONE, ParallelConfig()))
    raised = RuntimeError("original")
    with pytest.raises(RuntimeError) as caught, session:
        drive(session, "training")
        raise raised
    assert caught.value is raised
    assert any("destroy_model_parallel" in note for note in raised.__notes__)
    assert session.report is not None
    assert [str(f.step) for f in session.report.failed] == ["destroy_model_parallel"]
    assert str(session.report.ran[-1]) == "abort_process_group"
    assert not dist.is_initialized()
    assert alive()["microbatch_calculator"] is False and alive()["rerun_state_machine"] is False
    parallel_state.destroy_model_parallel()  # the step that failed on purpose


@pytest.mark.timeout(60)
def test_fifty_fail_then_retry_cycles_do_not_grow_threads_or_fds() -> None:
    """50 cycles of a failed session then a closed one: threads and open fds stay at the first cycle's level."""

    def cycle() -> None:
        session = Session(TorchActions(ONE, ParallelConfig()))
        with pytest.raises(RuntimeError), session:
            drive(session, "training")
            raise RuntimeError("injected")
        assert session.state is State.FAILED
        run_to_closed()

    def counts() -> tuple[int, int]:
        return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))

    hook = sys.excepthook
    cycle()
    after_first = counts()
    start = time.monotonic()
    for _ in range(49):
        cycle()
    per_cycle = (time.monotonic() - start) / 49
    threads, fds = counts()
    assert (threads, fds) <= after_first, f"threads/fds {after_first} -> {(threads, fds)}"
    assert per_cycle < 1.0, f"{per_cycle * 1000:.0f} ms a cycle"
    assert sys.excepthook is hook  # the excepthook torch wraps at each group creation is restored


def test_reinit_on_a_fixed_port_reuses_the_hosted_store_with_a_new_prefix() -> None:
    """Sessions on one fixed port reuse one hosted store with distinct prefixes; close_hosted_stores frees it."""
    port = free_port()
    config = DistributedConfig(world_size=1, rank=0, master_addr="127.0.0.1", master_port=port, timeout_s=20)
    prefixes = []
    for fail in (True, False, True):
        actions = TorchActions(config, ParallelConfig())
        session = Session(actions)
        if fail:
            with pytest.raises(RuntimeError), session:
                drive(session, "globals_ready")
                raise RuntimeError("injected")
        else:
            with session:
                drive(session, "training")
        assert session.state is (State.FAILED if fail else State.CLOSED)
        prefixes.append(actions.store_prefix)
        assert alive() == NOTHING_ALIVE
    assert len(set(prefixes)) == 3
    given = TorchActions(config, ParallelConfig(), store_prefix="wrapper/iteration-7")
    assert given.init_process_group() is Owner.SESSION and given.store_prefix == "wrapper/iteration-7"
    assert (given.rank, given.world_size) == (0, 1)
    given.destroy_process_group()
    with pytest.raises(LifecycleError):
        _ = given.rank
    with pytest.raises(LifecycleError, match="already used"):
        given.init_process_group()  # one prefix serves one attempt
    assert not dist.is_initialized()
    assert not port_is_free(port)
    assert close_hosted_stores() == 1
    assert port_is_free(port)


# -- caller-owned resources ------------------------------------------------------------


def test_caller_owned_group_and_model_parallel_survive_a_failure() -> None:
    """A failure leaves the caller's group and model-parallel state alive and usable; only the session's go."""
    caller_group()
    parallel_state.initialize_model_parallel(distributed_timeout_minutes=0.5)
    session = Session(TorchActions(ONE, ParallelConfig()))
    with pytest.raises(RuntimeError), session:
        drive(session, "training")
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
        drive(session, "training")
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
    """A caller's group whose world size differs from the configuration raises LifecycleError and is left alone."""
    caller_group()
    config = DistributedConfig(world_size=2, rank=0)
    with pytest.raises(LifecycleError, match="world size 1"):
        TorchActions(config, ParallelConfig()).init_process_group()
    assert dist.is_initialized()
    dist.destroy_process_group()


@pytest.mark.parametrize("caller_keeps_group", [False, True])
def test_stale_model_parallel_state_is_refused(caller_keeps_group: bool) -> None:
    """Model-parallel state left from an earlier group is refused with LifecycleError, never reused."""
    caller_group()
    parallel_state.initialize_model_parallel(distributed_timeout_minutes=0.5)
    dist.destroy_process_group()  # the group goes, megatron's state stays: stale
    if caller_keeps_group:
        caller_group()
    session = Session(TorchActions(ONE, ParallelConfig()))
    with pytest.raises(LifecycleError, match="stale"), session:
        drive(session, "globals_ready")
    assert session.state is State.FAILED
    assert dist.is_initialized() is caller_keeps_group
    parallel_state.destroy_model_parallel()
    if caller_keeps_group:
        dist.destroy_process_group()


# -- two ranks -------------------------------------------------------------------------


def launch(launcher: str, results: Path) -> list[subprocess.Popen[bytes]]:
    """Start the two-rank worker under torchrun (agent store) or as two plain processes (rank 0 hosts the store)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "PET_"))}
    env.update(TORCH_CPP_LOG_LEVEL="error", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", DIST_RESULTS=str(results))
    env["PYTHONPATH"] = os.pathsep.join([str(WORKER.parents[2]), str(WORKER.parents[1])])
    common = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "start_new_session": True}
    if launcher == "torchrun":
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--monitor-interval",
            "0.1",
            str(WORKER),
        ]
        return [subprocess.Popen(command, env=env, **common)]  # type: ignore[call-overload]
    procs = []
    for rank in range(2):
        env_rank = {
            **env,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(subprocess.Popen([sys.executable, str(WORKER)], env=env_rank, **common))  # type: ignore[call-overload]
    return procs


@pytest.mark.timeout(150)
@pytest.mark.parametrize("launcher", ["torchrun", "plain"])
def test_two_ranks_failure_in_each_state_releases_blocked_peer(launcher: str, tmp_path: Path) -> None:
    """Rank 1 fails in each state while rank 0 waits in an all-reduce: both leave teardown in seconds, release all."""
    procs = launch(launcher, tmp_path)
    try:
        outputs = [proc.communicate(timeout=120)[0].decode(errors="replace") for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert [proc.returncode for proc in procs] == [0] * len(procs), "\n".join(o[-3000:] for o in outputs)
    ranks = [[json.loads(line) for line in (tmp_path / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    for rank, records in enumerate(ranks):
        *failures, success = records
        assert [f["fail_state"] for f in failures] == ["dist_ready", "globals_ready", "training", "finalizing"]
        for record in failures:
            assert record["final_state"] == "failed", record
            assert record["alive"] == NOTHING_ALIVE, record
            assert record["same_object"] is True, record
            assert record["teardown_s"] < 10.0, record  # the group timeout is 30 s
            assert "barrier" not in record["plan"], record
            if rank == 0:
                assert record["blocked_s"] < 10.0, record  # released by rank 1's abort, not by the timeout
            else:
                assert record["error"] == "InjectedFault", record
        assert success == {"final_state": "closed", "sum": 2.0, "alive": NOTHING_ALIVE}


# -- nccl (needs CUDA) -----------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="nccl needs CUDA")
@pytest.mark.timeout(120)
def test_nccl_session_fails_then_closes_on_one_gpu() -> None:
    """On one GPU with nccl, a failure releases everything and a new session then closes."""
    config = DistributedConfig(backend="nccl", world_size=1, rank=0, local_rank=0, timeout_s=60)
    session = Session(TorchActions(config, ParallelConfig(create_gloo_process_groups=False)))
    with pytest.raises(RuntimeError), session:
        drive(session, "training")
        dist.all_reduce(torch.ones(1, device="cuda"))
        raise RuntimeError("injected")
    assert alive() == NOTHING_ALIVE
    session = Session(TorchActions(config, ParallelConfig(create_gloo_process_groups=False)))
    with session:
        drive(session, "training")
        value = torch.ones(1, device="cuda")
        dist.all_reduce(value)
    assert session.state is State.CLOSED and value.item() == 1.0
