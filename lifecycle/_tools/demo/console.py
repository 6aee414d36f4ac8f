"""The demo's terminal: lifecycle's lines from every rank, live; torchrun's own output kept in a file.

torchrun writes its own log lines, and on a failed or stopped run its Python traceback
and error summary, to the terminal it was started from. The demo gives it a file
instead (``torchrun.log`` in the journal folder) and has it redirect every rank's
stdout and stderr into files under ``<journal folder>/torchrun/`` (its ``--log-dir``
and ``--redirects 3``). ``RankOutput`` follows those files on a thread and echoes each
rank's lines as they come: rank 0's progress, each rank's failure and notes, the
liveness monitor's verdicts. Lines that are noise to a user are left in the files
only: torch's own log lines (``W1202 01:51:26.507000 729 ...api.py:1028] ...``),
torch 2.15's ``nanobind: leaked ...`` lines at exit, and Python's warning lines.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import TextIO

TORCHRUN_LOG = "torchrun.log"
"""torchrun's own output (its log lines, traceback and error summary), in the journal folder."""

RANK_LOGS = "torchrun"
"""The folder, in the journal folder, where torchrun redirects each rank's stdout and stderr."""

POLL_S = 0.1
"""How often the ranks' files are read for new lines."""

NOISE = re.compile(
    r"^(?:[WEIDF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ "  # torch's own log lines (glog format)
    r"|nanobind: leaked"  # torch 2.15 at interpreter exit
    r"|nanobind: this is likely"
    r"|\s+warnings\.warn\("  # the second line of a Python warning
    r"|\S+:\d+: \w*Warning: )"  # the first
)
"""Lines of a rank's output that stay in its file: torch's log lines, nanobind's leak report, Python warnings."""


def shown(line: str) -> bool:
    """Whether a line of a rank's output reaches the terminal (not ``NOISE``)."""
    return NOISE.match(line) is None


class RankOutput:
    """Follow the rank output files under ``folder`` (any depth: ``<run>/attempt_0/<rank>/stdout.log``) and echo
    their new, whole lines that are ``shown`` to ``out`` (stderr's lines to ``err``), until ``stop``."""

    def __init__(self, folder: Path, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.folder = folder
        self.out = out if out is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lifecycle-demo-console", daemon=True)

    def start(self) -> RankOutput:
        """Start following (a daemon thread); returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following, after a last read that echoes every whole line written so far (and any last partial one)."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        self.poll(final=True)

    def _run(self) -> None:
        while not self._done.wait(POLL_S):
            self.poll()

    def poll(self, *, final: bool = False) -> None:
        """Read what the files gained since the last read; echo the whole lines (``final``: the rest too)."""
        try:
            files = sorted(self.folder.rglob("std*.log"), key=lambda p: (p.parent.name, p.name))
        except OSError:
            return
        for path in files:
            try:
                with path.open("rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    data = f.read()
            except OSError:
                continue
            if not data and not (final and self._partial.get(path)):
                continue
            self._offsets[path] = self._offsets.get(path, 0) + len(data)
            data = self._partial.pop(path, b"") + data
            lines = data.split(b"\n")
            rest = lines.pop()
            if final and rest:
                lines.append(rest)
            elif rest:
                self._partial[path] = rest
            stream = self.err if path.name.startswith("stderr") else self.out
            text = [line.decode("utf-8", "backslashreplace") for line in lines]
            kept = [line for line in text if shown(line)]
            if kept:
                try:
                    stream.write("\n".join(kept) + "\n")
                    stream.flush()
                except (OSError, ValueError):  # a closed terminal or pipe: the files keep everything
                    pass
