"""Shared helpers for the pretrain and demo tests: small configs, liveness checks, bounded subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from lifecycle._torch.config import DistributedConfig, ParallelConfig
from lifecycle._training.config import CheckpointConfig, ModelConfig, PretrainConfig, TrainingConfig

REPO = Path(__file__).resolve().parents[2]
TINY = ModelConfig(vocab_size=32, seq_length=16, hidden_size=32, num_layers=1, num_heads=2)


def config_of_one(tmp_path: Path, *, iterations: int = 3, interval: int = 2, **fields: Any) -> PretrainConfig:
    """A world-of-one config on loopback (any free port) with a tiny model, checkpoints and a journal in tmp_path."""
    base: dict[str, Any] = {
        "distributed": DistributedConfig(world_size=1, rank=0, master_addr="127.0.0.1", master_port=0, timeout_s=20),
        "parallel": ParallelConfig(micro_batch_size=4),
        "model": TINY,
        "training": TrainingConfig(iterations=iterations, log_interval=0, eval_interval=2, eval_iterations=1),
        "checkpoint": CheckpointConfig(dir=str(tmp_path / "ckpt"), interval=interval),
        "journal_dir": str(tmp_path / "journal"),
    }
    base.update(fields)
    return PretrainConfig(**base)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def child_env() -> dict[str, str]:
    """Environment for a child that imports lifecycle from this checkout, quietly."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(REPO / "tests"), env.get("PYTHONPATH")]))
    env["TORCH_CPP_LOG_LEVEL"] = "error"
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"
    return env


def run_bounded(command: list[str], timeout: float, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in its own process group; on timeout kill the whole group and fail loudly.

    Output (stdout and stderr together) is captured. No process outlives this call.
    """
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
        raise AssertionError(f"{command} ran past {timeout} s; output:\n{out}") from None
    finally:
        # torchrun's ranks share the group: make sure none is left behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(command, process.returncode, out, "")


def demo_command(*args: str) -> list[str]:
    """The demo command line: ``python -m lifecycle demo ARGS``."""
    return [sys.executable, "-m", "lifecycle", "demo", *args]
