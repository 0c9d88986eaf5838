"""A cheap per-process record of the collective Cadence is in (operation, shapes, call site, sequence)."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Entry:
    sequence: int
    operation: str
    shapes: Any
    filename: str
    lineno: int
    started: float


def user_call_site(skip: int = 2) -> tuple[str, int]:
    """The first frame outside Cadence (and contextlib): where the user called us."""
    frame = sys._getframe(skip)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_PACKAGE_DIR) and not filename.endswith("contextlib.py"):
            return filename, frame.f_lineno
        frame = frame.f_back
    return "<unknown>", 0


class Ledger:
    def __init__(self) -> None:
        self.sequence = 0
        self.current: Entry | None = None
        self.last: Entry | None = None

    @contextmanager
    def entered(self, operation: str, shapes: Any):
        if (
            self.current is not None
        ):  # nested (a collective built from collectives): record the outer one
            yield
            return
        self.sequence += 1
        filename, lineno = user_call_site(3)
        self.current = Entry(self.sequence, operation, shapes, filename, lineno, time.monotonic())
        try:
            yield
        finally:
            self.last, self.current = self.current, None


ledger = Ledger()
