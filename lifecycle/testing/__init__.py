"""Tools for test suites of code that uses lifecycle: doubles, ports, a rank launcher, probes.

- ``RecordingActions`` / ``RecordingCheckpoints``: recording, fault-injecting stand-ins
  for the real resource actions (no torch).
- ``free_port`` / ``free_ports``: rendezvous ports that are free now.
- ``launch_ranks``: run a script as N ranks on loopback (or under torchrun), bounded in
  time, leaving no process behind; ``run_command``: one command, bounded the same way;
  ``torchrun_command``: a torchrun command line.
- ``alive``, ``megatron_globals``, ``threads``, ``sockets``: what exists in this
  process, read from torch, megatron-core and the operating system, not from the
  library's ledger; ``release_everything`` releases it all.
- ``LifecycleLeakWarning``: the category of the pytest plugin's leak reports (a
  ``Warning``, not a ``UserWarning``, so ``-W ignore::UserWarning`` leaves it shown).

``import lifecycle.testing`` loads no torch: the probes import it when called.
"""

from lifecycle._core.exports import publish
from lifecycle._launch.launcher import torchrun_command
from lifecycle.testing.doubles import COLLECTIVES, RecordingActions, RecordingCheckpoints
from lifecycle.testing.launch import RankResult, launch_ranks, run_command
from lifecycle.testing.leaks import LifecycleLeakWarning
from lifecycle.testing.ports import free_port, free_ports
from lifecycle.testing.probes import (
    TORCH_COLLECTIVES,
    Socket,
    alive,
    megatron_globals,
    release_everything,
    sockets,
    threads,
)

__all__ = [
    "COLLECTIVES",
    "TORCH_COLLECTIVES",
    "LifecycleLeakWarning",
    "RankResult",
    "RecordingActions",
    "RecordingCheckpoints",
    "Socket",
    "alive",
    "free_port",
    "free_ports",
    "launch_ranks",
    "megatron_globals",
    "release_everything",
    "run_command",
    "sockets",
    "threads",
    "torchrun_command",
]

publish(globals())  # each name reads as lifecycle.testing.NAME where its home is private
