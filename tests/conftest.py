"""Suite-wide checks: under ``make test-unit`` (``LIFECYCLE_TORCH_FREE=1``) nothing may import torch."""

from __future__ import annotations

import os
import signal
import sys

import pytest

HEAVY = ("torch", "megatron", "nvidia_resiliency_ext")


def pytest_configure(config: pytest.Config) -> None:
    """Give the suite Python's own Ctrl-C handler when it started with SIGINT ignored.

    A shell starts a background job (``make test &``, ``nohup``) with SIGINT ignored, and Python
    then installs no ``KeyboardInterrupt`` handler: the shield passes a Ctrl-C on to "ignore", as
    it must, and every test pinning that a Ctrl-C still raises would fail for how the suite was
    launched (measured: five of them in a backgrounded ``.ci/run``). Child processes get the
    default disposition back at exec, so their Python installs its own handler too.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail a torch-free run that loaded torch, megatron-core or NVRx, naming what it loaded."""
    if os.environ.get("LIFECYCLE_TORCH_FREE") != "1":
        return
    heavy = sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))
    if heavy:
        print(f"\ntorch-free run imported {', '.join(heavy)}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
