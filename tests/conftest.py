"""Suite-wide checks: under ``make test-unit`` (``LIFECYCLE_TORCH_FREE=1``) nothing may import torch.

And the seeded sample of ``make test-slow``: of each family of tests marked
``sampled(family)``, ``LIFECYCLE_SLOW_SAMPLE`` (a fraction) picks that share, at least one,
with ``LIFECYCLE_SLOW_SEED`` (default: today's date, so that successive days cover the
family); the header prints the seed that replays a run. ``make test-slow-all`` runs all.
"""

from __future__ import annotations

import datetime
import math
import os
import random
import signal
import sys

import pytest

HEAVY = ("torch", "megatron", "nvidia_resiliency_ext")


def pytest_configure(config: pytest.Config) -> None:
    """Give the suite Python's own Ctrl-C handler when it started with SIGINT ignored; declare ``sampled``.

    A shell starts a background job (``make test &``, ``nohup``) with SIGINT ignored, and Python
    then installs no ``KeyboardInterrupt`` handler: the shield passes a Ctrl-C on to "ignore", as
    it must, and every test pinning that a Ctrl-C still raises would fail for how the suite was
    launched (measured: five of them in a backgrounded ``.ci/run``). Child processes get the
    default disposition back at exec, so their Python installs its own handler too.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.addinivalue_line("markers", "sampled(family): one of a family make test-slow runs a seeded share of")


def _sample() -> tuple[float, str] | None:
    """The share of each sampled family to run and the seed, or None to run them all."""
    share = os.environ.get("LIFECYCLE_SLOW_SAMPLE", "")
    if not share:
        return None
    seed = os.environ.get("LIFECYCLE_SLOW_SEED") or datetime.date.today().strftime("%Y%m%d")
    return float(share), seed


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say which share of each sampled family runs, and the seed that replays the choice."""
    sample = _sample()
    if sample is None:
        return None
    share, seed = sample
    return (
        f"sampled families: {share:.0%} of each, seed {seed} "
        f"(LIFECYCLE_SLOW_SEED={seed} replays it; make test-slow-all runs every test)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect all but a seeded share (at least one) of each ``sampled`` family when a sample is asked for."""
    sample = _sample()
    if sample is None:
        return
    share, seed = sample
    families: dict[str, list[pytest.Item]] = {}
    for item in items:
        marker = item.get_closest_marker("sampled")
        if marker is not None:
            families.setdefault(str(marker.args[0]), []).append(item)
    dropped: set[str] = set()
    for family, members in families.items():
        members.sort(key=lambda item: item.nodeid)
        keep = max(1, math.ceil(share * len(members)))
        kept = random.Random(f"{seed}:{family}").sample(members, keep)
        dropped.update(item.nodeid for item in members if item not in kept)
    if dropped:
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in dropped])
        items[:] = [item for item in items if item.nodeid not in dropped]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail a torch-free run that loaded torch, megatron-core or NVRx, naming what it loaded."""
    if os.environ.get("LIFECYCLE_TORCH_FREE") != "1":
        return
    heavy = sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))
    if heavy:
        print(f"\ntorch-free run imported {', '.join(heavy)}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
