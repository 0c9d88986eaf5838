"""A cheap per-process record of the collective Cadence is in: sequence number, operation, inputs, caller.

The hot path (`with ledger.entered(...)`) only bumps a counter and keeps references; shapes and the
caller's `file:line` are worked out later, by the watchdog thread or when a check fails. On CUDA, where
collectives return before they finish, the entries stay "in flight" until a CUDA event recorded after
them completes, so a rank blocked later (at `.item()`, say) still shows the collective it waits in.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any

from ..core.settings import env_bool
from .callsite import caller_outside_cadence, describe_frame, user_call_site
from .signature import describe_inputs


class Entry:
    """One collective call; also the context manager that records it."""

    __slots__ = (
        "ledger", "operation", "inputs", "timeout", "frame", "sequence", "started", "nested",
        "site", "shapes", "event",
    )  # fmt: skip

    def __init__(self, ledger: Ledger, operation: str, inputs: Any, timeout: float | None, frame):
        self.ledger = ledger
        self.operation = operation
        self.inputs = inputs
        self.timeout = timeout
        self.frame = frame
        self.sequence = 0
        self.started = 0.0
        self.nested = False
        self.site: str | None = None
        self.shapes: str | None = None
        self.event: Any = None

    def __enter__(self) -> Entry:
        ledger = self.ledger
        if ledger.current is not None:  # a collective built from collectives: the outer one counts
            self.nested = True
            return self
        ledger.sequence += 1
        self.sequence = ledger.sequence
        self.started = time.monotonic()
        ledger.current = self
        return self

    def __exit__(self, error_type: Any, error: Any, traceback: Any) -> None:
        if self.nested:
            return
        ledger = self.ledger
        if ledger.device_events and error_type is None:
            ledger.keep_in_flight(self)
        ledger.current = None
        ledger.completed = self.sequence
        ledger.last_operation = self.operation
        self.inputs = self.frame = None

    def call_site(self) -> str:
        """`file:line` of the user code that called this collective (only while it is running)."""
        if self.site is None and self.frame is not None:
            self.site = describe_frame(caller_outside_cadence(self.frame))
        return self.site or "<unknown>"

    def describe_inputs(self) -> str:
        """Short description of the input shapes of the collective, computed once."""
        if self.shapes is None:
            inputs = self.inputs
            self.shapes = "" if inputs is None else describe_inputs(inputs)
        return self.shapes


class _Unrecorded:
    """What `entered` gives when the ledger is switched off: a context manager that does nothing."""

    nested = False
    sequence = 0
    operation = ""
    timeout = None

    def __init__(self, operation: str = "", inputs: Any = None) -> None:
        self.operation, self.inputs = operation, inputs

    def __enter__(self) -> _Unrecorded:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        return None

    def call_site(self) -> str:

        filename, lineno = user_call_site(3)
        return describe_frame(None) if not lineno else f"{filename}:{lineno}"

    def describe_inputs(self) -> str:

        return "" if self.inputs is None else describe_inputs(self.inputs)


class Ledger:
    """Per-process record of the collective operations issued, for hang diagnostics."""

    def __init__(self) -> None:
        self.enabled = env_bool("CADENCE_LEDGER", True)
        self.sequence = 0
        self.completed = 0
        self.current: Entry | None = None
        self.last_operation: str | None = None
        self.device_events = False
        self.in_flight: deque[Entry] = deque(maxlen=64)

    def entered(self, operation: str, inputs: Any = None, timeout: float | None = None):
        """Context manager around one collective: `with ledger.entered("gather", tensor): ...`."""
        if not self.enabled:
            return _Unrecorded(operation, inputs)
        return Entry(self, operation, inputs, timeout, sys._getframe(1))

    def restart(self) -> None:
        """A new process group: numbering starts again (every rank does this at the same point)."""
        self.sequence = self.completed = 0
        self.current = None
        self.last_operation = None
        self.in_flight.clear()

    # -- CUDA: collectives finish after they return ------------------------------------------------
    def keep_in_flight(self, entry: Entry) -> None:
        """Keep `entry` until the device finishes it, recording a CUDA event after it."""
        import torch

        entry.call_site()  # the frames are gone once the call returns
        entry.describe_inputs()
        entry.event = torch.cuda.Event()
        entry.event.record()
        self.in_flight.append(entry)

    def oldest_unfinished_on_device(self) -> Entry | None:
        """The oldest in-flight entry the device has not finished, or None."""
        while self.in_flight:
            entry = self.in_flight[0]
            if entry.event is None or not entry.event.query():
                return entry
            self.in_flight.popleft()
        return None

    def waiting_in(self) -> Entry | None:
        """The collective this process waits in: the running call, else one still running on the GPU."""
        current = self.current
        if current is not None:
            return current
        return self.oldest_unfinished_on_device() if self.device_events else None


ledger = Ledger()
