"""Names the restart tests import from here; they live in ``configs``."""

from support.configs import FAST, GROUP_TIMEOUT_S, INTERVAL

__all__ = ["FAST", "GROUP_TIMEOUT_S", "INTERVAL"]
