"""Clearing the locals of a library's frames in a traceback, and no others.

A gloo group or a rendezvous store is freed (its sockets closed, its server stopped)
only when its last reference goes, and the frames of a failure's traceback keep their
locals alive for as long as the caller keeps the exception (a notebook keeps
``sys.last_traceback``). lifecycle never clears the caller's frames (debuggers and error
reporters read their locals); it clears the frames of the packages a resource kind
declares as holders (``Resource.held_in_frames_of``: torch's own functions, which take
a group or a store as an argument), and says so in a note, and its
own finished frames, silently: a failed step's loss holds its autograd graph, whose
megatron-core nodes hold the tensor-parallel group, and a failed collective's wrapper
holds its ``Work``.

The session clears them before its teardown aborts the groups: the groups are still
registered then, so nothing is freed here, and the teardown's threads hold the last
references (``lifecycle._torch.groups``: gloo's destructor waits a tick of its socket
loop; one after the other on this thread they cost a tick each).
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


def clear_frames_of(
    error: BaseException, packages: tuple[str, ...], quietly: tuple[str, ...] = (), note: bool = True
) -> int:
    """Clear the locals of the finished frames of ``packages`` and ``quietly`` in the tracebacks of ``error`` and
    of its chain.

    The chain is ``error``'s ``__cause__`` and ``__context__``, theirs, and so on (a
    ``CheckpointError`` raised from gloo's ``RuntimeError`` keeps torch's frames in its
    cause). Frames still executing are skipped; frames of every other module (the
    caller's) are left as they are. The tracebacks' lines stay printable. Returns how
    many frames of ``packages`` were cleared; if any, a note on ``error`` says how many
    and why (those of ``quietly`` are not counted; ``note`` False: the caller adds it
    later with ``note_cleared``).
    """
    loud = tuple(d for d in map(_package_dir, packages) if d is not None)
    dirs = loud + tuple(d for d in map(_package_dir, quietly) if d is not None)
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
            path = os.path.abspath(frame.f_code.co_filename)
            if path.startswith(dirs):
                try:
                    frame.clear()
                except RuntimeError:  # still executing
                    pass
                else:
                    cleared += path.startswith(loud)
            tb = tb.tb_next
    if note:
        note_cleared(error, cleared, packages)
    return cleared


def note_cleared(error: BaseException, cleared: int, packages: tuple[str, ...]) -> None:
    """Add to ``error`` the note saying that ``cleared`` frames of ``packages`` were cleared; nothing if none were."""
    if cleared:
        error.add_note(
            f"lifecycle: cleared the locals of {cleared} {', '.join(packages)} frame(s) of this traceback: they held "
            "a process group or store, whose sockets close only once it is freed"
        )
