"""A gate that forces, every time, an order NVRx's in-process Wrapper takes only sometimes.

On a peer of the failing rank, the Wrapper's monitor thread starts its abort and
interrupts the main thread only after it; on a loaded machine the main thread runs
training collectives in between (25-150 ms: Megatron's cross-entropy, the gradient
all-reduce). The fault matrix's probe must not count those as collectives on the
failure path; ``matrix_worker.Probe`` calls this gate's hooks when a cell is run with
``gate=True``.
"""

from __future__ import annotations

import threading
import time

GATE_WAIT_S = 7.0
"""The most the gate holds either thread waiting for the other."""


class NvrxOrderGate:
    """Forces the order NVRx's Wrapper may take on a peer of the failing rank, every time.

    The Wrapper's monitor thread starts its abort, and interrupts the main thread only
    after the abort; meanwhile the main thread runs training collectives. Here the main
    thread waits at its first batch of train step 2 until the abort reaches the group's
    abort (``at_batch``); the abort waits there until the main thread has started a
    collective (``at_abort``, ``at_collective``: Megatron's cross-entropy, on the
    tensor-parallel group of one); once that collective returns, the main thread waits
    in Python for the Wrapper's interrupt (``after_collective``), so that it starts no
    collective on a group already aborted (on gloo one waits for the group timeout). Each
    wait is bounded by ``GATE_WAIT_S``; ``held`` says whether the order was forced.
    """

    def __init__(self) -> None:
        self.abort_started = threading.Event()
        self.main_collective = threading.Event()
        self.batch_waited = False
        self.interrupted = False
        """The Wrapper's interrupt landed while the main thread waited for it after the collective."""

    def at_batch(self) -> None:
        """In the main thread, before the batch: wait (once) for the abort to start."""
        if not self.batch_waited:
            self.batch_waited = True
            self.abort_started.wait(GATE_WAIT_S)

    def at_abort(self) -> None:
        """In the monitor thread, before the group's abort: wait for the main thread's next collective."""
        self.abort_started.set()
        self.main_collective.wait(GATE_WAIT_S)

    def at_collective(self) -> None:
        """In the main thread, as a collective starts."""
        if self.abort_started.is_set():
            self.main_collective.set()

    def after_collective(self) -> None:
        """In the main thread, as the first collective since the abort started returns: wait for the interrupt."""
        if not self.main_collective.is_set() or self.interrupted:
            return
        deadline = time.monotonic() + GATE_WAIT_S
        try:
            while time.monotonic() < deadline:
                time.sleep(0.005)
        except BaseException:
            self.interrupted = True
            raise

    @property
    def held(self) -> bool:
        """True if the main thread started a collective while the abort waited, and was interrupted after it."""
        return self.main_collective.is_set() and self.interrupted
