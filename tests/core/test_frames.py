"""Clearing a library's frames in a failure's tracebacks (what keeps a gloo group's sockets open)."""

from __future__ import annotations

import json
import os
import sys
from types import FrameType

from lifecycle._core.frames import clear_frames_of


class Held:
    """Stands for a process group: something a library frame keeps as a local."""


def _fails_in_json(held: Held) -> None:
    # json's decoder frame (a finished library frame) is the innermost frame of the cause.
    json.loads("{", object_hook=lambda _: held)


def _wrapped(held: Held) -> None:
    try:
        _fails_in_json(held)
    except ValueError as exc:
        raise RuntimeError("finalize failed") from exc


def test_the_frames_of_a_package_are_cleared_in_the_cause_and_context_chain_too() -> None:
    """Frames of the named package are cleared in ``__cause__``/``__context__`` tracebacks, others kept."""
    held = Held()
    try:
        _wrapped(held)
    except RuntimeError as exc:
        error = exc
    cause = error.__cause__
    assert cause is not None
    json_frames = [f for f in _frames(cause) if f.f_code.co_filename.startswith(_dir("json"))]
    assert json_frames, "the cause's traceback reaches into json"
    assert any(f.f_locals for f in json_frames)
    cleared = clear_frames_of(error, ("json",))
    assert cleared == len(json_frames)  # the old code looked only at error's own traceback: 0
    assert all(not f.f_locals for f in json_frames)
    assert any("held" in f.f_locals for f in _frames(cause))  # our own frames are left as they were
    assert any("cleared the locals" in note for note in error.__notes__)


def _frames(error: BaseException) -> list[FrameType]:
    tb, found = error.__traceback__, []
    while tb is not None:
        found.append(tb.tb_frame)
        tb = tb.tb_next
    return found


def _dir(package: str) -> str:
    return os.path.dirname(os.path.abspath(sys.modules[package].__file__ or ""))


def test_quiet_packages_are_cleared_too_but_not_counted_and_not_noted() -> None:
    """Frames of ``quietly``'s packages are cleared like those of ``packages``, but not counted, and no note says so
    (lifecycle's own frames: a failed step's loss holds the tensor-parallel group through its graph)."""
    held = Held()
    try:
        _wrapped(held)
    except RuntimeError as exc:
        error = exc
    assert error.__cause__ is not None
    json_frames = [f for f in _frames(error.__cause__) if f.f_code.co_filename.startswith(_dir("json"))]
    assert any(f.f_locals for f in json_frames)
    assert clear_frames_of(error, (), quietly=("json",)) == 0
    assert all(not f.f_locals for f in json_frames)
    assert any("held" in f.f_locals for f in _frames(error.__cause__))  # the caller's frames are kept
    assert not getattr(error, "__notes__", [])
