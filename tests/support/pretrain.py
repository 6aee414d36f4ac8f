"""Names the pretrain and demo tests import from here; they live in ``configs`` and ``launch``."""

from support.configs import TINY, config_of_one
from support.launch import REPO, demo_command, free_port, run_bounded, suite_env

__all__ = ["REPO", "TINY", "config_of_one", "demo_command", "free_port", "run_bounded", "suite_env"]
