"""nccl, decided on CPU: the device each rank binds, the NCCL environment, the Wrapper's timeout order, the seeding.

Everything here is a pure decision or a refusal made before anything is acquired, so
it runs without a GPU; what needs one (binding, seeding, the health check on a device)
is in tests/gpu (``make gpu-check``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import socket
import subprocess
import sys
import zipfile
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.distributed
from support.configs import FAST, config_of_one
from support.launch import suite_env
from support.probes import alive

from lifecycle import ConfigError, DistributedConfig, ParallelConfig, Session, State, TorchActions, restart
from lifecycle._torch.config import (
    NCCL_ENV_DEFAULTS,
    check_nccl_environment,
    cuda_device_index,
    set_nccl_environment,
    validate,
)
from lifecycle._torch.megatron import seed_model_parallel_rng
from lifecycle.testing import launch_ranks

NOTHING_ALIVE = dict.fromkeys(alive(), False)
ASYNC = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
RETHROW = "TORCH_NCCL_RETHROW_CUDA_ERRORS"
NCCL2 = "TORCH_DIST_USE_NCCL2"
SAFE = {ASYNC: "2", RETHROW: "0", NCCL2: "0"}
NCCL_OF_ONE = DistributedConfig(backend="nccl", world_size=1, rank=0, local_rank=0)

# -- the device each rank binds ------------------------------------------------------------


@pytest.mark.parametrize(
    ("local_rank", "count", "env", "index"),
    [
        (3, 8, {}, 3),  # LOCAL_RANK picks one of several
        (0, 1, {}, 0),
        (None, 1, {}, 0),
        # One visible GPU per process: the old code refused LOCAL_RANK 1 ("not below the device count 1").
        (1, 1, {"CUDA_VISIBLE_DEVICES": "1"}, 0),
        (5, 1, {"CUDA_VISIBLE_DEVICES": "GPU-8c1f"}, 0),
        (1, 2, {"CUDA_VISIBLE_DEVICES": "2,3"}, 1),
    ],
)
def test_each_rank_binds_local_rank_or_its_one_visible_device(
    local_rank: int | None, count: int, env: dict[str, str], index: int
) -> None:
    """With one visible device every rank binds device 0; with several, LOCAL_RANK picks it."""
    assert cuda_device_index(local_rank, count, env) == index


@pytest.mark.parametrize(
    ("local_rank", "count", "env", "field", "says"),
    [
        (0, 0, {}, "distributed.backend", "none is visible"),
        (None, 4, {}, "distributed.local_rank", "LOCAL_RANK is not set"),
        (4, 4, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "distributed.local_rank", "not below the CUDA device count 4"),
        # The node's only GPU, unrestricted: local rank 0 binds it too, and NCCL refuses two ranks on it.
        (1, 1, {}, "distributed.local_rank", "NCCL refuses two ranks on one device"),
    ],
)
def test_a_rank_without_a_device_of_its_own_is_refused(
    local_rank: int | None, count: int, env: dict[str, str], field: str, says: str
) -> None:
    """No device, no LOCAL_RANK among several, LOCAL_RANK past them, a shared only GPU: ConfigError naming why."""
    with pytest.raises(ConfigError) as refused:
        cuda_device_index(local_rank, count, env)
    assert refused.value.field == field
    assert says in refused.value.message


def test_nccl_needs_no_local_rank_when_one_device_is_visible() -> None:
    """resolve() takes an nccl world without LOCAL_RANK when CUDA_VISIBLE_DEVICES names one device (old: refused)."""
    config = DistributedConfig(backend="nccl", world_size=1, rank=0)
    assert config.resolve({"CUDA_VISIBLE_DEVICES": "GPU-8c1f"}).local_rank is None
    with pytest.raises(ConfigError) as refused:
        config.resolve({"CUDA_VISIBLE_DEVICES": "0,1"})
    assert refused.value.field == "distributed.local_rank"


# -- the NCCL environment ------------------------------------------------------------------


def test_unset_nccl_variables_get_the_documented_safe_defaults() -> None:
    """Unset: CleanUpOnly (2), no CUDA-error rethrow (0) and the legacy nccl backend (0) are returned and set."""
    assert check_nccl_environment({}) == dict(NCCL_ENV_DEFAULTS) == SAFE
    env = {RETHROW: "false", NCCL2: "0"}  # an explicit safe value is kept as written
    assert set_nccl_environment(env) == {ASYNC: "2"}
    assert env == {RETHROW: "false", NCCL2: "0", ASYNC: "2"}
    assert check_nccl_environment(env) == {}


@pytest.mark.parametrize(
    ("env", "variable", "says"),
    [
        ({ASYNC: "1"}, ASYNC, "torchrun sets 1"),  # TearDown: what torchrun puts in every worker's environment
        ({ASYNC: "3"}, ASYNC, "SkipCleanUp"),  # torch's own default
        ({ASYNC: "0"}, ASYNC, "never released"),
        ({ASYNC: "7"}, ASYNC, "not a mode torch knows"),
        ({ASYNC: "two"}, ASYNC, "not an integer"),
        ({"NCCL_ASYNC_ERROR_HANDLING": "1"}, "NCCL_ASYNC_ERROR_HANDLING", "TearDown"),  # the legacy name counts
        ({RETHROW: "1"}, RETHROW, "terminates the process"),
        ({RETHROW: "TRUE"}, RETHROW, "terminates the process"),
        ({RETHROW: "maybe"}, RETHROW, "not a boolean"),
        ({NCCL2: "1"}, NCCL2, "ProcessGroupNCCL2"),  # torch 2.15's new backend: not shown on a GPU yet
        ({NCCL2: "false"}, NCCL2, "ProcessGroupNCCL2"),  # torch compares with "0" exactly
    ],
)
def test_a_setting_that_kills_or_strands_the_rank_is_refused_naming_it(
    env: dict[str, str], variable: str, says: str
) -> None:
    """Each contradictory NCCL setting: ConfigError naming the variable, its value, why, and what to set."""
    with pytest.raises(ConfigError) as refused:
        check_nccl_environment(env)
    assert refused.value.field == variable
    assert f"{variable}={env[variable]!r}" in refused.value.message
    assert says in refused.value.message
    assert "=2" in refused.value.message or "=0" in refused.value.message  # what to set instead


def test_the_new_name_overrides_the_legacy_one_as_torch_reads_them() -> None:
    """TORCH_NCCL_ASYNC_ERROR_HANDLING=2 wins over a legacy NCCL_ASYNC_ERROR_HANDLING=1 (torch reads the new first)."""
    assert check_nccl_environment({ASYNC: "2", "NCCL_ASYNC_ERROR_HANDLING": "1", RETHROW: "0", NCCL2: "0"}) == {}


def test_validate_checks_the_nccl_environment_only_for_nccl() -> None:
    """validate() refuses TearDown for nccl, and gloo ignores the NCCL variables."""
    torchrun_env = {ASYNC: "1", "LOCAL_RANK": "0"}
    with pytest.raises(ConfigError) as refused:
        validate(NCCL_OF_ONE, ParallelConfig(), torchrun_env)
    assert refused.value.field == ASYNC
    validate(DistributedConfig(world_size=1, rank=0), ParallelConfig(), torchrun_env)


NCCL2_BOUND = """
import torch.distributed as dist
from lifecycle import ConfigError, DistributedConfig, ParallelConfig
from lifecycle._torch.config import validate
dist.Backend._ensure_backend_registered("nccl")  # what torch does at the process's first nccl group
print(dist.Backend._plugins["NCCL"].creator_fn.__name__)
config = DistributedConfig(backend="nccl", world_size=1, rank=0, local_rank=0)
try:
    validate(config, ParallelConfig(), {"TORCH_DIST_USE_NCCL2": "0"})
except ConfigError as refused:
    print(refused.field, "|", refused.message)
"""


@pytest.mark.skipif(not hasattr(torch.distributed, "ProcessGroupNCCL2"), reason="torch before 2.15: no NCCL2")
@pytest.mark.parametrize(("env", "bound"), [({}, "_create_nccl2_process_group"), ({NCCL2: "0"}, None)])
def test_a_process_whose_nccl_is_already_nccl2_is_refused_saying_how(env: dict[str, str], bound: str | None) -> None:
    """torch 2.15 binds "nccl" at the first nccl group: bound to ProcessGroupNCCL2, validate refuses; legacy passes."""
    child_env = {key: value for key, value in os.environ.items() if key != NCCL2} | suite_env() | env
    done = subprocess.run(
        [sys.executable, "-c", NCCL2_BOUND], env=child_env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if bound is None:
        assert lines == ["_create_nccl_process_group"], done.stdout
        return
    assert lines[0] == bound, done.stdout
    field, message = lines[1].split(" | ", 1)
    assert field == NCCL2
    assert "ProcessGroupNCCL2" in message and f"export {NCCL2}=0" in message


def test_a_session_refuses_a_tearing_down_watchdog_before_acquiring_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    """init_distributed on nccl with TORCH_NCCL_ASYNC_ERROR_HANDLING=1: ConfigError naming it; no store, no group.

    The old code went on to the device check (``backend``: no CUDA here; on a GPU, a group
    whose watchdog kills the rank).
    """
    monkeypatch.setenv(ASYNC, "1")
    monkeypatch.setenv(RETHROW, "0")
    session = Session(TorchActions(NCCL_OF_ONE, ParallelConfig()))
    with pytest.raises(ConfigError) as refused:
        session.init_distributed()
    assert refused.value.field == ASYNC
    assert session.state is State.UNINITIALIZED
    assert session.ledger.entries == ()
    assert alive() == NOTHING_ALIVE


def test_wrapped_pretrain_refuses_it_before_its_store_opens(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """wrapped_pretrain on nccl with a rethrowing watchdog: ConfigError before the kept store listens on its port."""
    monkeypatch.setenv(RETHROW, "1")
    monkeypatch.setenv(ASYNC, "2")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    nccl = DistributedConfig(backend="nccl", world_size=1, rank=0, local_rank=0, master_port=port)
    config = dataclasses.replace(config_of_one(tmp_path), distributed=nccl)
    with pytest.raises(ConfigError) as refused:
        restart.wrapped_pretrain(config, max_restarts=0, **FAST)
    assert refused.value.field == RETHROW
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # nothing was left listening on the group's port


# -- the Wrapper's timeouts ----------------------------------------------------------------

GLOO_DEFAULTS = {
    "soft_timeout": timedelta(seconds=70),
    "hard_timeout": timedelta(seconds=80),
    "barrier_timeout": timedelta(seconds=100),
    "completion_timeout": timedelta(seconds=100),
}


def test_gloo_keeps_the_group_timeout_first() -> None:
    """gloo: soft = group + 10 s, hard = group + 20 s, barriers = group + 40 s, as before."""
    assert restart.wrapper_timeouts(60.0, "gloo") == GLOO_DEFAULTS
    with pytest.raises(ConfigError) as refused:
        restart.wrapper_timeouts(60.0, "gloo", {"soft_timeout": timedelta(seconds=60)})
    assert refused.value.field == "soft_timeout"


@pytest.mark.parametrize("group_s", [23.0, 60.0, 600.0])
def test_nccl_orders_the_watchdog_after_the_wrappers_hard_kill(group_s: float) -> None:
    """nccl: soft < hard, and hard + monitor interval + termination grace (NVRx defaults 1 s, 5 s) < group timeout.

    The old code gave nccl gloo's order (hard = group + 20 s): the watchdog came first.
    """
    timeouts = restart.wrapper_timeouts(group_s, "nccl")
    group = timedelta(seconds=group_s)
    assert timedelta(0) < timeouts["soft_timeout"] < timeouts["hard_timeout"] < timeouts["barrier_timeout"]
    assert timeouts["hard_timeout"] + timedelta(seconds=1 + 5) < group
    assert timeouts["completion_timeout"] == timeouts["barrier_timeout"] == group + timedelta(seconds=40)


def test_nccl_timeouts_follow_the_overridden_intervals() -> None:
    """A longer termination grace moves the hard timeout earlier by as much; explicit timeouts that fit are kept."""
    base = restart.wrapper_timeouts(60.0, "nccl")
    longer = restart.wrapper_timeouts(60.0, "nccl", {"termination_grace_time": timedelta(seconds=15)})
    assert base["hard_timeout"] - longer["hard_timeout"] == timedelta(seconds=10)
    given = {"soft_timeout": timedelta(seconds=5), "hard_timeout": timedelta(seconds=10), **FAST}
    kept = restart.wrapper_timeouts(30.0, "nccl", given)
    assert (kept["soft_timeout"], kept["hard_timeout"]) == (given["soft_timeout"], given["hard_timeout"])


def test_nccl_refuses_a_watchdog_that_could_kill_the_rank_first() -> None:
    """A hard timeout whose kill ends at or after the group timeout, or a group timeout too short: ConfigError."""
    with pytest.raises(ConfigError) as refused:
        restart.wrapper_timeouts(60.0, "nccl", {"hard_timeout": timedelta(seconds=55)})  # 55 + 1 + 5 >= 60
    assert refused.value.field == "hard_timeout"
    assert "watchdog (group timeout 60.0 s) must outlast NVRx's hard timeout (55.0 s)" in refused.value.message
    with pytest.raises(ConfigError) as refused:
        restart.wrapper_timeouts(20.0, "nccl")
    assert refused.value.field == "group_timeout_s"
    assert "above 22.0 s" in refused.value.message


def test_make_wrapper_orders_nccl_and_adds_the_cuda_health_check_only_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """make_wrapper(backend="nccl"): soft and hard below the group timeout and a CudaHealthCheck; gloo: neither.

    The old make_wrapper had no backend: gloo's order for everything, and no health check.
    """
    monkeypatch.setenv("MASTER_PORT", "29500")
    nccl = restart.make_wrapper(max_restarts=1, group_timeout_s=60.0, backend="nccl")
    assert nccl.hard_timeout < timedelta(seconds=60)
    assert isinstance(nccl.health_check, restart.CudaHealthCheck)
    gloo = restart.make_wrapper(max_restarts=1, group_timeout_s=60.0)
    assert gloo.soft_timeout > timedelta(seconds=60)
    assert gloo.health_check is None


def test_the_cuda_health_check_passes_where_cuda_is_not_in_use() -> None:
    """Without an initialized CUDA context the health check does nothing and hands the Wrapper's state on."""
    state = object()
    assert restart.CudaHealthCheck(timeout_s=1.0)(state) is state


# -- the tensor-parallel RNG tracker -------------------------------------------------------


def test_the_rng_tracker_is_seeded_only_with_cuda() -> None:
    """Without CUDA nothing is seeded (the CPU layers never fork the tracker); a negative seed is refused."""
    from megatron.core.tensor_parallel import random as tp_random

    tracker = tp_random._CUDA_RNG_STATE_TRACKER
    assert seed_model_parallel_rng(1234) is False
    assert tp_random._CUDA_RNG_STATE_TRACKER is tracker  # not replaced by a seeded one
    with pytest.raises(ConfigError) as refused:
        ParallelConfig(seed=-1)
    assert refused.value.field == "parallel.seed"


# -- the GPU check's own parts, rehearsed on CPU -------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def load_gpu_check() -> ModuleType:
    """``tools/gpu_check.py`` as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "tools" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_wheel(folder: Path, name: str, version: str, *requires: str) -> None:
    """A wheel holding only its METADATA: enough for the wheelhouse check."""
    lines = [f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {line}" for line in requires)]
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(lines) + "\n")


def test_the_wheelhouse_check_names_what_the_gpu_host_would_miss(tmp_path: Path) -> None:
    """A requirement with no wheel, or with the wrong version, is named; torch and inapplicable markers are not."""
    gpu_check = load_gpu_check()
    fake_wheel(tmp_path, "transitions", "0.9.3", "six", 'pygraphviz; extra == "diagrams"')
    fake_wheel(tmp_path, "megatron_core", "0.16.1", "torch>=2.6.0", "numpy", "packaging>=24.2")
    fake_wheel(tmp_path, "packaging", "23.0")
    fake_wheel(tmp_path, "numpy", "2.4.6", 'pywin32; sys_platform == "win32"')
    assert gpu_check.missing_requirements(tmp_path) == [
        "megatron-core needs packaging>=24.2 (have 23.0)",
        "transitions needs six (have none)",
    ]
    fake_wheel(tmp_path, "six", "1.17.0")
    fake_wheel(tmp_path, "packaging", "26.4")
    (tmp_path / "packaging-23.0-py3-none-any.whl").unlink()
    assert gpu_check.missing_requirements(tmp_path) == []


def test_each_gpu_stack_pins_the_libraries_ci_tests() -> None:
    """The ci wheelhouse pins make venv's megatron-core and NVRx; the newest one pins make test-compat's."""
    gpu_check = load_gpu_check()
    makefile = (REPO / "Makefile").read_text()
    for stack, names in (("ci", ("megatron-core", "nvidia-resiliency-ext")), ("newest", ("megatron-core",))):
        pins = {line.split("==")[0].lower(): line for line in gpu_check.pinned(gpu_check.STACKS[stack])}
        for name in names:
            assert pins[name] in makefile, (stack, pins[name])
    newest = gpu_check.pinned(gpu_check.STACKS["newest"])
    assert "nvidia-resiliency-ext==0.7.0" in newest and "COMPAT_NVRX := nvidia-resiliency-ext==0.7.0" in makefile


def test_the_newest_stack_is_refused_on_a_glibc_older_than_its_nvrx_wheel(capsys: pytest.CaptureFixture[str]) -> None:
    """NVRx 0.7.0 is manylinux_2_39 only: run --stack newest on an older glibc exits 2, saying so, building nothing."""
    gpu_check = load_gpu_check()
    glibc = gpu_check.host_glibc()
    if glibc is None or glibc >= (2, 39):
        pytest.skip(f"this host's glibc ({glibc}) would run the newest stack")
    newest = gpu_check.STACKS["newest"]
    assert gpu_check.run(newest.wheelhouse, newest) == 2
    assert "need glibc 2.39 or newer" in capsys.readouterr().err
    assert not newest.venv.exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", ["session", "pretrain", "inprocess"])
def test_the_gpu_checks_worker_runs_each_scenario_on_two_cpu_ranks(tmp_path: Path, scenario: str) -> None:
    """The GPU check's worker, on gloo (GPU_WORKER_BACKEND): each scenario finishes on both ranks as tests/gpu expects.

    The GPU tests cannot run here; this keeps their worker from rotting as pretrain changes.
    """
    worker = REPO / "tests" / "gpu" / "gpu_worker.py"
    env = suite_env({"GPU_WORKER_BACKEND": "gloo", "TORCH_CPP_LOG_LEVEL": "error"})
    results = launch_ranks([str(worker), scenario, str(tmp_path)], 2, timeout_s=240, env=env)
    assert all(result.ok for result in results), "\n".join(map(str, results))
    for rank in (0, 1):
        report = json.loads((tmp_path / f"{scenario}-rank{rank}.json").read_text())
        assert report["ok"], report
        if scenario == "session":
            assert [f["final_state"] for f in report["failures"]] == ["failed"] * 4
            assert (report["final_state"], report["sum"], report["alive"]) == ("closed", 2.0, NOTHING_ALIVE)
        elif scenario == "pretrain":
            assert all(r["fault"] != "did not fire" for r in report["phases"].values()), report
            assert all(r["retry_final_step"] == 4 and r["retry_loss_finite"] for r in report["phases"].values())
        else:
            assert (report["iterations_started"], report["state"]) == ([0, 1], "closed")
