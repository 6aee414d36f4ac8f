"""Configurations the tests share: tiny, on loopback, with short timeouts."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from lifecycle import (
    CheckpointConfig,
    DistributedConfig,
    ModelConfig,
    ParallelConfig,
    PretrainConfig,
    TrainingConfig,
)

GROUP_TIMEOUT_S = 10.0
"""Every test group's timeout; a release that waits on a peer shows as taking this long."""

ONE = DistributedConfig(world_size=1, rank=0, timeout_s=GROUP_TIMEOUT_S)
"""This process as a world of one, rendezvous on any free loopback port."""

TINY = ModelConfig(vocab_size=32, seq_length=16, hidden_size=32, num_layers=1, num_heads=2)
"""A model that trains a step in milliseconds on CPU."""

INTERVAL = timedelta(seconds=0.05)
FAST: dict[str, Any] = {
    "monitor_thread_interval": INTERVAL,
    "monitor_process_interval": INTERVAL,
    "heartbeat_interval": INTERVAL,
    "progress_watchdog_interval": INTERVAL,
    "last_call_wait": INTERVAL,
}
"""Wrapper settings for tests: 50 ms intervals keep a restart near a quarter of a second."""


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
