"""A fault-matrix worker that imports nothing heavy, for the pool's own tests (``test_matrix_pool.py``).

It speaks the pool's protocol (``matrix_pool``): ``("ready", pid)`` after
``ready_after_s``, then one answer per cell. Its cells are not ``Cell``s but orders:
a number (take that many seconds, then answer with no problems), ``"hang"`` (never
answer) or ``"exit"`` (the worker dies without answering).
"""

from __future__ import annotations

import os
import time
from typing import Any


def serve(conn: Any, rank: int, world_size: int, base: str, ready_after_s: float = 0.0) -> None:
    """Say ready after ``ready_after_s``; then obey each order until ``conn`` sends None."""
    time.sleep(ready_after_s)  # a worker slow to import
    conn.send(("ready", os.getpid()))
    while (message := conn.recv()) is not None:
        order, _ports, _options = message
        if order == "hang":
            time.sleep(3600)
        if order == "exit":
            os._exit(3)
        time.sleep(order)
        conn.send({"rank": rank, "problems": [], "elapsed": order, "fired": True})
