"""The pytest plugin: the leak guard's cost per test, and n-rank worlds with reused against fresh workers.

(1) Guard overhead: one suite of ``TESTS`` trivial tests, run by pytest in a subprocess
    with the plugin (its default, ``warn``) and without it (``-p no:lifecycle``), the two
    runs alternating, ``RUNS`` of each. Timed inside the run, from the end of collection
    to the end of the session, so pytest's start-up is not counted. Twice: a torch-free
    suite (the guard's probes find nothing loaded) and one whose module imports torch
    and megatron-core (every probe reads a live module).
(2) Worlds: ``WORLD_TESTS`` tests marked ``@pytest.mark.world(2)`` in a module that
    imports torch, of two bodies: an empty one, and one that creates a gloo group on its
    two ranks, all-reduces a tensor and destroys the group. Per-test time (the median of
    the tests' call durations) with ``lifecycle_world_workers = reuse`` (the ranks'
    processes run test after test) against ``fresh`` (two new processes per test,
    importing torch each time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import median, paired_ratio, table

TESTS = 400
RUNS = 5
WORLD_TESTS = 6
FRESH_TARGET = 5.0
"""Target: a world test with reused workers runs at least 5× faster than with fresh ones."""

CONFTEST = """
import json, os, time

_t = {}

def pytest_collection_finish(session):
    _t["start"] = time.perf_counter()

def pytest_runtest_logreport(report):
    if report.when == "call":
        _t.setdefault("calls", []).append(report.duration)

def pytest_sessionfinish(session):
    with open(os.environ["BENCH_OUT"], "w") as out:
        json.dump({"session": time.perf_counter() - _t["start"], "calls": _t.get("calls", [])}, out)
"""

PLAIN = "\n".join(f"def test_{i}():\n    assert {i} >= 0\n" for i in range(TESTS))
HEAVY = "import torch.distributed\nimport megatron.core.parallel_state\n\n" + PLAIN
WORLD = """
import pytest
import torch
import torch.distributed as dist


@pytest.mark.parametrize("i", range({n}))
@pytest.mark.world(2, timeout=120)
def test_body(world, i):
{body}
"""
BODIES = {
    "empty body (torch imported)": "    assert world.size == 2\n",
    "gloo group, all-reduce, destroy": """    dist.init_process_group("gloo")
    try:
        total = torch.ones(1)
        dist.all_reduce(total)
        assert total.item() == 2
    finally:
        dist.destroy_process_group()
""",
}


def _suite(folder: Path, module: str, ini: str = "") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "conftest.py").write_text(CONFTEST)
    (folder / "test_bench.py").write_text(module)
    (folder / "pytest.ini").write_text("[pytest]\n" + ini)


def _run(folder: Path, *args: str) -> dict[str, object]:
    out = folder / "times.json"
    env = {**os.environ, "BENCH_OUT": str(out), "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", *args]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"bench suite failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result: dict[str, object] = json.loads(out.read_text())
    return result


def _guard_row(name: str, folder: Path) -> list[str]:
    on: list[float] = []
    off: list[float] = []
    for i in range(RUNS):
        sides = [("on", ()), ("off", ("-p", "no:lifecycle"))]
        for side, args in sides if i % 2 == 0 else sides[::-1]:  # each side first as often
            seconds = float(_run(folder, *args)["session"])  # type: ignore[arg-type]
            (on if side == "on" else off).append(seconds / TESTS)
    return [
        name,
        f"{median(off) * 1e6:.0f}",
        f"{median(on) * 1e6:.0f}",
        f"{(median(on) - median(off)) * 1e6:+.0f}",
        f"{median(on) / median(off):.2f}",
        f"{paired_ratio(on, off):.2f}",
    ]


def main() -> str:
    """Run both measurements; return the Markdown tables and what they show."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        _suite(root / "plain", PLAIN)
        _suite(root / "heavy", HEAVY)
        rows = [
            _guard_row("torch-free suite", root / "plain"),
            _guard_row("torch and megatron-core loaded", root / "heavy"),
        ]
        guard = table(
            f"Leak guard per test ({TESTS} trivial tests, {RUNS} interleaved runs with and without the plugin; µs)",
            ["suite", "without plugin", "with guard (warn)", "guard's cost", "ratio of medians",
             "median of back-to-back ratios"],
            rows,
        )  # fmt: skip
        world_rows = []
        for label, body in BODIES.items():
            per_test = {}
            for mode in ("reuse", "fresh"):
                folder = root / f"world-{mode}-{len(world_rows)}"
                module = textwrap.dedent(WORLD).replace("{n}", str(WORLD_TESTS)).replace("{body}", body)
                _suite(folder, module, f"lifecycle_world_workers = {mode}\n")
                calls = [float(c) for c in _run(folder)["calls"]]  # type: ignore[attr-defined]
                per_test[mode] = median(calls)
            ratio = per_test["fresh"] / per_test["reuse"]
            world_rows.append(
                [label, f"{per_test['reuse']:.3f}", f"{per_test['fresh']:.3f}", f"{ratio:.1f}",
                 "met" if ratio >= FRESH_TARGET else "missed"]
            )  # fmt: skip
    world = table(
        f"World tests, 2 gloo ranks ({WORLD_TESTS} tests of each body and mode; median s per test)",
        ["test body", "reused workers", "fresh workers", "fresh ÷ reused", f"target (≥ {FRESH_TARGET:g})"],
        world_rows,
    )
    return (
        guard + "\nWhat this shows: what the leak guard adds to each test: two snapshots (before setup, after "
        "teardown) of the declared resources' probes, lifecycle's signal handlers and the threads. The probes "
        "read only modules already imported, so a torch-free suite pays for a few attribute reads; with torch "
        "and megatron-core loaded each probe asks them. pytest's own per-test cost is the baseline.\n\n"
        + world
        + "\nWhat this shows: a world test's ranks are processes. With reused workers, a test costs what its body "
        "does plus a message to each rank; fresh workers start an interpreter per rank and import torch (and the "
        "test module) for every test. With a group in the body, its creation (a new store on a new port, the "
        "peers' connections) and destruction are paid in both modes and shrink the ratio. Workers are replaced "
        "only after a test that left something alive.\n"
    )


if __name__ == "__main__":
    print(main())
