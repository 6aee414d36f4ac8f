"""lifecycle.testing: ports, the rank launcher and the probes do what their contracts say."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist
from megatron.core import num_microbatches_calculator, parallel_state
from support.internals import kill_group, kill_marked, marked

from lifecycle.testing import (
    alive,
    free_ports,
    launch_ranks,
    megatron_globals,
    release_everything,
    run_command,
    sockets,
    threads,
)

NOTHING = dict.fromkeys(("process_group", "model_parallel", "microbatch_calculator", "rerun_state_machine"), False)


@pytest.fixture(autouse=True)
def clean() -> None:
    """Each test starts with nothing alive."""
    release_everything()


def test_free_ports_are_consecutive_bindable_and_below_the_ephemeral_range() -> None:
    """``free_ports(n)`` gives n consecutive ports, each bindable now, none the kernel hands out on its own."""
    ports = free_ports(3)
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert list(ports) == list(range(ports[0], ports[0] + 3))
    assert ports[-1] < first_ephemeral
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_each_rank_gets_its_own_variables_and_its_own_result() -> None:
    """Ranks see RANK/WORLD_SIZE/LOCAL_RANK and one loopback MASTER_ADDR:PORT; exit codes and output are per rank."""
    code = (
        "import json, os, sys\n"
        "keys = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'EXTRA')\n"
        "print(json.dumps({k: os.environ.get(k) for k in keys}))\n"
        "sys.exit(int(os.environ['RANK']) * 3)\n"
    )
    results = launch_ranks(["-c", code], 3, timeout_s=60, env={"EXTRA": "yes"}, master_port=free_ports(1)[0])
    seen = [json.loads(r.output.strip().splitlines()[-1]) for r in results]
    assert [r.rank for r in results] == [0, 1, 2]
    assert [r.returncode for r in results] == [0, 3, 6]
    assert [r.ok for r in results] == [True, False, False]
    assert [(s["RANK"], s["LOCAL_RANK"], s["WORLD_SIZE"]) for s in seen] == [(str(i), str(i), "3") for i in range(3)]
    assert {(s["MASTER_ADDR"], s["MASTER_PORT"], s["EXTRA"]) for s in seen} == {
        ("127.0.0.1", seen[0]["MASTER_PORT"], "yes")
    }


def test_a_rank_past_the_deadline_is_killed_with_what_it_started(tmp_path: Path) -> None:
    """At ``timeout_s`` every rank still running, and its children, are killed; the result says so."""
    code = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open(os.path.join({str(tmp_path)!r}, os.environ['RANK']), 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "if os.environ['RANK'] == '1':\n"
        "    time.sleep(60)\n"
    )
    started = time.monotonic()
    fast, slow = launch_ranks(["-c", code], 2, timeout_s=3)
    assert time.monotonic() - started < 15
    assert (fast.timed_out, slow.timed_out) == (False, True)
    assert slow.returncode < 0
    for rank in ("0", "1"):
        for pid in map(int, (tmp_path / rank).read_text().split()):
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_process_that_outlives_its_rank_is_killed_and_reported() -> None:
    """A daemon a rank leaves (own session, like NVRx's monitor) is killed after ``grace_s`` and listed."""
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n"
    (result,) = launch_ranks(["-c", code], 1, timeout_s=30, grace_s=0.5)
    assert result.returncode == 0 and not result.timed_out
    assert len(result.left_behind) == 1 and not result.ok
    pid = result.left_behind[0]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_the_shared_launcher_kills_a_whole_session_and_every_marked_escapee() -> None:
    """kill_group kills a child's session; kill_marked finds by mark, and kills, what left it (a setsid grandchild)."""
    mark = uuid.uuid4().hex
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    print(os.getpid(), flush=True)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "TOOLKIT_MARK": f"{mark}:0"},
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        escapee = int(child.stdout.readline())
        assert set(marked("TOOLKIT_MARK", f"{mark}:")) == {child.pid, escapee}
        kill_group(child)
        assert child.returncode < 0 and marked("TOOLKIT_MARK", f"{mark}:") == {escapee: "0"}
        assert kill_marked("TOOLKIT_MARK", mark) == {escapee: ":0"}
        assert not psutil.pid_exists(escapee) or psutil.Process(escapee).status() == psutil.STATUS_ZOMBIE
        assert marked("TOOLKIT_MARK", mark) == {}
    finally:
        child.kill()
        kill_marked("TOOLKIT_MARK", mark)


def test_run_command_bounds_one_command() -> None:
    """``run_command`` returns the exit code and output of one command, and kills it at the deadline."""
    done = run_command([sys.executable, "-c", "print('hello'); raise SystemExit(4)"], timeout_s=30)
    assert (done.rank, done.returncode, done.output.strip(), done.timed_out) == (None, 4, "hello", False)
    late = run_command([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1)
    assert late.timed_out and late.returncode < 0


def test_alive_sees_what_torch_and_megatron_hold_without_lifecycle() -> None:
    """Resources made directly with torch and megatron-core show in ``alive``; ``release_everything`` ends them."""
    assert alive() == NOTHING
    # Earlier tests in this process may have left megatron's plain rank lists: not live, and not this test's.
    assert all(kind == "list" for kind in megatron_globals().values())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_ports(1)[0]}", rank=0, world_size=1)
    assert alive() == {**NOTHING, "process_group": True}
    parallel_state.initialize_model_parallel()
    num_microbatches_calculator.init_num_microbatches_calculator(0, None, 4, 4, 1)
    assert alive() == {**NOTHING, "process_group": True, "model_parallel": True, "microbatch_calculator": True}
    assert megatron_globals()["parallel_state._DATA_PARALLEL_GROUP"] == "ProcessGroup"
    assert release_everything() == ["process_group", "model_parallel", "microbatch_calculator"]
    assert alive() == NOTHING and dist.distributed_c10d._world.pg_map == {}


def test_sockets_and_threads_show_what_this_process_opened() -> None:
    """A listening socket and a named thread appear in ``sockets()`` and ``threads()``, and go when closed."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert any(s.status == "LISTEN" and s.local[1] == port for s in sockets())
    assert not any(s.local[1] == port for s in sockets())
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="probe-me")
    worker.start()
    try:
        assert "probe-me" in threads()
    finally:
        stop.set()
        worker.join()
    assert "probe-me" not in threads()
