"""Suite-wide checks: under ``make test-unit`` (``LIFECYCLE_TORCH_FREE=1``) nothing may import torch."""

from __future__ import annotations

import os
import sys

import pytest

HEAVY = ("torch", "megatron", "nvidia_resiliency_ext")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail a torch-free run that loaded torch, megatron-core or NVRx, naming what it loaded."""
    if os.environ.get("LIFECYCLE_TORCH_FREE") != "1":
        return
    heavy = sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))
    if heavy:
        print(f"\ntorch-free run imported {', '.join(heavy)}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
