"""Where the user's code is: the frame that called Cadence, or where the main thread is right now."""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from types import FrameType

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONTEXTLIB = os.path.dirname(os.__file__) + os.sep + "contextlib.py"


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(sorted(os.path.abspath(d) + os.sep for d in dirs if d))


_LIBRARY_DIRS = _library_dirs()


def is_cadence_file(filename: str) -> bool:
    """Whether `filename` belongs to the cadence package (or contextlib)."""
    return filename.startswith(_PACKAGE_DIR) or filename == _CONTEXTLIB


def is_user_file(filename: str) -> bool:
    """Not Cadence, not the standard library, not an installed package, not frozen/builtin code."""
    if filename.startswith("<") or is_cadence_file(filename):
        return False
    return not filename.startswith(_LIBRARY_DIRS)


def caller_outside_cadence(frame: FrameType | None) -> FrameType | None:
    """Walk outwards from `frame` to the first frame not in Cadence: whoever called the collective."""
    while frame is not None and is_cadence_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def innermost_user_frame(frame: FrameType | None) -> FrameType | None:
    """Walk outwards from the innermost `frame` to the first frame of user code (else the innermost)."""
    first = frame
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return first


def short_path(filename: str) -> str:
    """Relative to the working directory when below it, else as is."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive (Windows)
        return filename
    return filename if relative.startswith("..") else relative


def describe_frame(frame: FrameType | None, with_function: bool = False) -> str:
    """`file:line` of `frame` (with the function name if asked), or `<unknown>`."""
    if frame is None:
        return "<unknown>"
    site = f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"
    if with_function and frame.f_code.co_name not in ("<module>", ""):
        site += f" in {frame.f_code.co_name}()"
    return site


def user_call_site(skip: int = 2) -> tuple[str, int]:
    """(file, line) of the first frame outside Cadence, `skip` frames above this function's caller."""
    frame = caller_outside_cadence(sys._getframe(skip))
    if frame is None:
        return "<unknown>", 0
    return frame.f_code.co_filename, frame.f_lineno


def main_thread_location() -> str:
    """Where the main thread is now (its innermost user-code line), read from another thread."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    return describe_frame(innermost_user_frame(frame), with_function=True)
