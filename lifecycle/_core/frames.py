"""Clearing the locals of a library's frames in a traceback, and no others.

A gloo group or a rendezvous store is freed (its sockets closed, its server stopped)
only when its last reference goes, and the frames of a failure's traceback keep their
locals alive for as long as the caller keeps the exception (a notebook keeps
``sys.last_traceback``). lifecycle never clears the caller's frames (debuggers and error
reporters read their locals) nor its own (they hold groups and stores only through
containers that teardown empties); it clears only the frames of the packages a resource
kind declares as holders (``Resource.held_in_frames_of``: torch's own functions, which
take a group or a store as an argument), and says so in a note.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType


def _package_dir(package: str) -> str | None:
    """The directory of ``package`` if it is already imported (never imports it), with a trailing separator."""
    module = sys.modules.get(package)
    path = getattr(module, "__file__", None)
    return None if path is None else os.path.dirname(os.path.abspath(path)) + os.sep


def clear_frames_of(error: BaseException, packages: tuple[str, ...]) -> int:
    """Clear the locals of the finished frames of ``packages`` in the tracebacks of ``error`` and of its chain.

    The chain is ``error``'s ``__cause__`` and ``__context__``, theirs, and so on (a
    ``CheckpointError`` raised from gloo's ``RuntimeError`` keeps torch's frames in its
    cause). Frames still executing are skipped; frames of every other module (the
    caller's, lifecycle's) are left as they are. The tracebacks' lines stay printable.
    Returns how many frames were cleared; if any, a note on ``error`` says how many and why.
    """
    dirs = tuple(d for d in map(_package_dir, packages) if d is not None)
    cleared = 0
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending and dirs:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        tb: TracebackType | None = current.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if os.path.abspath(frame.f_code.co_filename).startswith(dirs):
                try:
                    frame.clear()
                except RuntimeError:  # still executing
                    pass
                else:
                    cleared += 1
            tb = tb.tb_next
    if cleared:
        names = ", ".join(packages)
        error.add_note(
            f"lifecycle: cleared the locals of {cleared} {names} frame(s) of this traceback: they held a process "
            "group or store, whose sockets close only once it is freed"
        )
    return cleared
