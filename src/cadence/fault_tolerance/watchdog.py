"""A thread that says why a step is late: it calls back when a quorum armed for a step is still not
formed after a delay, once per late quorum. One thread for the session's life, not one per step."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class QuorumWatchdog:
    """Calls `say(step)` when a quorum armed for `step` is still not formed after `delay` s."""

    def __init__(self, delay: float, say: Callable[[int], None]) -> None:
        self.delay = delay
        self.say = say
        self._armed: tuple[int, int] | None = None  # (arming serial, step): a re-armed step is new
        self._serial = 0
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, step: int) -> None:
        """Start waiting for the quorum of `step`."""
        with self._changed:
            self._serial += 1
            self._armed = (self._serial, step)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="cadence_quorum_watchdog", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def disarm(self) -> None:
        """The quorum formed (or failed)."""
        with self._changed:
            self._armed = None
            self._changed.notify()

    def _watch(self) -> None:
        while True:  # a daemon thread: ends with the process
            with self._changed:
                while self._armed is None:
                    self._changed.wait()
                armed = self._armed
                deadline = time.monotonic() + self.delay
                while self._armed == armed and time.monotonic() < deadline:
                    self._changed.wait(max(0.0, deadline - time.monotonic()))
                late = self._armed == armed
            if late:
                self.say(armed[1])
                with self._changed:
                    while self._armed == armed:  # once per late quorum
                        self._changed.wait()
