"""Graceful stop on notice: every rank stops at the same step boundary, where the job checkpoints.

A stop notice is the signal a scheduler sends before it kills a job (SIGTERM by default; SLURM's
``--signal`` choice through ``CADENCE_STOP_SIGNAL``), or torch elastic's SIGTERM when it restarts the
workers for a node that joins or leaves. The protocol agrees on ONE step without a collective on the
training path (see docs/how-to/preemptible-elastic.md):

1. the rank that gets the signal marks itself noticed (signal handler: a flag, nothing else);
2. its watchdog thread writes ``notice`` in the job's side channel (the rendezvous store); every
   other rank's watchdog reads it on its next tick;
3. once noticed, each rank's watchdog proposes ``completed steps + 1`` (``proposal/<rank>``): a
   boundary its main thread has not passed yet, since the step count only grows;
4. a main thread reaching its own proposal waits (once, bounded) until every rank has proposed; the
   target is the largest proposal, which no rank has passed; every rank stops exactly there.

The training path pays one attribute read per batch (`at_step_boundary`) and one increment per
optimizer step (`step_completed`). At the target the registered action runs (the Accelerator's
`save_state`) and the process ends at once with `RESUME_EXIT_CODE` (`os._exit` after flushing: the
checkpoint is committed, and unwinding a distributed process can take seconds the restart waits
for). Under `cadence launch`'s elastic agent, a rank that got the signal itself ends with
`NODE_LEAVES_EXIT_CODE` instead: its agent then leaves the job with its whole node, as if the
launcher had got the notice (the agent tells its own SIGTERMs apart: it knows when it sent them).

The watchdog is woken at once by the signal and polls the channel every `NOTICE_POLL` seconds while
the ranks agree, so the stop costs about one watchdog tick for the ranks that did not get the signal.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..core.settings import env_text, resolve
from .generation_env import GENERATION_ENV
from .stopping import flush_output

# "Stopped on notice after committing a checkpoint: start me again to resume" (EX_TEMPFAIL).
RESUME_EXIT_CODE = 75
# A worker of `cadence launch`'s elastic agent that got the notice itself (not through the channel):
# "resume me, and my node leaves the job". Only that agent sees it; its launcher exits with 75.
NODE_LEAVES_EXIT_CODE = 77
# Set by `cadence launch`'s elastic agent for its workers: its pid (a worker checks its parent is it).
AGENT_PID_ENV = "CADENCE_AGENT_PID"
# Seconds between the watchdog's reads of the channel while the ranks agree on the stop step.
NOTICE_POLL = 0.05
DEFAULT_STOP_GRACE = 30.0  # seconds; torch elastic's own SIGTERM -> SIGKILL window
# A main thread waits at most this long for every rank's proposal before it stops without saving.
PROPOSAL_WAIT = 60.0


def stop_signal() -> signal.Signals | None:
    """The notice signal: `CADENCE_STOP_SIGNAL` (a name such as SIGUSR1, or a number), else SIGTERM;
    None for `off` (Accelerate's behaviour: the signal ends the worker at once)."""
    found = resolve("stop_signal", default="SIGTERM")
    text = str(found.value).strip().upper()
    if text in ("OFF", "NONE", "0"):
        return None
    try:
        if text.isdigit():
            return signal.Signals(int(text))
        return signal.Signals[text if text.startswith("SIG") else "SIG" + text]
    except (KeyError, ValueError):
        raise ValueError(
            f"{found.source.removeprefix('env:')}={found.value!r} is not a signal; use a name such "
            "as SIGTERM or SIGUSR1"
        ) from None


def stop_grace() -> float:
    """Seconds the launcher gives workers between the notice and SIGKILL (`CADENCE_STOP_GRACE`)."""
    found = resolve("stop_grace", default=DEFAULT_STOP_GRACE)
    try:
        value = float(found.value)
    except (TypeError, ValueError):
        value = -1.0
    if not 0 <= value <= 24 * 3600:
        raise ValueError(
            f"{found.source.removeprefix('env:')}={found.value!r} must be a number of seconds "
            "(0 to 86400)"
        )
    return value


class StopNotice:
    """This process's view of the stop protocol (one per process)."""

    def __init__(self) -> None:
        self.completed = 0  # optimizer steps completed (boundaries passed)
        self.noticed = False  # this rank got the signal, or read the job's notice
        self.direct = False  # this rank got the signal itself
        self.wake = threading.Event()  # wakes the watchdog: the signal came, answer now
        self.announce = False  # this rank got the signal and has not told the job yet
        self.proposal: int | None = None
        self.target: int | None = None
        self.target_known = threading.Event()
        self.action: Callable[[], None] | None = None
        self.signal_number: int | None = None
        self.alive: Callable[[], bool] = lambda: True
        self.solo = True  # no side channel: this process decides alone
        self._previous_handler: Any = None

    # -- the training path ---------------------------------------------------------------------
    def step_completed(self) -> None:
        """The optimizer stepped (a real, synchronised step)."""
        self.completed += 1

    def at_step_boundary(self) -> None:
        """Before the next batch: stop here when this is the agreed step."""
        if self.proposal is None and self.target is None:
            return  # the hot path: no notice
        if self.target is None:
            if self.completed < self.proposal:
                return
            self._wait_for_target()
        if self.target is not None and self.completed >= self.target:
            self._stop()

    # -- the notice ----------------------------------------------------------------------------
    def install(
        self, action: Callable[[], None], solo: bool, alive: Callable[[], bool] = lambda: True
    ) -> signal.Signals | None:
        """Run `action` at the agreed boundary after the notice signal (main thread only); once
        `alive()` is false (its Accelerator is gone) the signal acts as it did before."""
        self.action, self.solo, self.alive = action, solo, alive
        if threading.current_thread() is not threading.main_thread():
            return None
        number = stop_signal()
        if number is None:
            return None
        if self.signal_number != number:
            self._previous_handler = signal.signal(number, self._on_signal)
            self.signal_number = number
        return number

    def uninstall(self) -> None:
        """Give the notice signal back to its previous handler."""
        if self.signal_number is not None and threading.current_thread() is threading.main_thread():
            signal.signal(self.signal_number, self._previous_handler or signal.SIG_DFL)
        self.signal_number, self.action = None, None

    def _on_signal(self, signum: int, frame: Any) -> None:
        if not self.alive():  # nothing left to checkpoint: the signal does what it did before
            previous = self._previous_handler
            self.uninstall()
            if callable(previous):
                previous(signum, frame)
            else:
                os.kill(os.getpid(), signum)
            return
        if self.noticed:
            return
        self.noticed = self.announce = self.direct = True
        self.wake.set()
        if self.solo:  # nobody to agree with: the next boundary
            self.proposal = self.target = self.completed + 1
            self.target_known.set()

    @property
    def agreeing(self) -> bool:
        """Whether a notice is known here and the ranks have not agreed on the step yet."""
        return self.noticed and self.action is not None and not self.target_known.is_set()

    def propose(self) -> int:
        """This rank's proposal: the next boundary it has not passed (called by the watchdog)."""
        if self.proposal is None:
            self.proposal = self.completed + 1
        return self.proposal

    def agree(self, target: int) -> None:
        """Every rank has proposed: `target` is the step all ranks stop after."""
        self.target = target
        self.target_known.set()

    def _wait_for_target(self) -> None:
        if not self.target_known.wait(PROPOSAL_WAIT):
            _say(
                "Cadence: a stop notice came, but not every rank answered within "
                f"{PROPOSAL_WAIT:.0f} s; stopping without a checkpoint (the previous one stands)"
            )
            _exit(RESUME_EXIT_CODE)

    def _stop(self) -> None:
        action, self.action = self.action, None
        self.proposal = self.target = None  # never again, whatever the action does
        if action is not None:
            action()
        _exit_now(NODE_LEAVES_EXIT_CODE if self.direct and _under_agent() else RESUME_EXIT_CODE)


def _under_agent() -> bool:
    """Whether this process is a worker of `cadence launch`'s elastic agent (its direct child)."""
    text = env_text(AGENT_PID_ENV) or ""
    return text.isdigit() and int(text) == os.getppid()


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _exit(code: int) -> None:
    # SystemExit unwinds the script (its `finally` blocks run) and ends the process with `code`.
    sys.stdout.flush()
    raise SystemExit(code)


def _exit_now(code: int) -> None:
    # The checkpoint is committed: end without unwinding. Tearing down the process group and the
    # watchdog while the peers exit too can take seconds, which the restart of the job waits for.
    # What the script printed or logged is flushed first; its `finally` blocks and atexit handlers
    # do not run.
    flush_output()
    logging.shutdown()
    os._exit(code)


notice = StopNotice()


def say_resumed(path: Any, world_size: int) -> None:
    """After a restart of an elastic launch, say once which checkpoint the job resumed from."""
    generation = env_text(GENERATION_ENV) or "0"
    if generation.isdigit() and int(generation) > 0:
        _say(
            f"Cadence: resumed from {path} at world size {world_size} (restart generation {generation})"
        )


def watchdog_tick(channel: Any, rank: int, world_size: int) -> None:
    """The side-channel half of the protocol, run on every watchdog tick (cheap when idle)."""
    if notice.target_known.is_set() or notice.action is None:
        return
    if notice.announce:
        channel.claim("notice", {"rank": rank, "time": time.time(), "pid": os.getpid()})
        notice.announce = False
    if not notice.noticed:
        if channel.get("notice") is None:
            return
        notice.noticed = True
    if notice.proposal is None:
        channel.put(f"proposal/{rank}", {"step": notice.propose()})
    proposals = [channel.get(f"proposal/{other}") for other in range(world_size)]
    if all(p is not None for p in proposals):
        notice.agree(max(int(p["step"]) for p in proposals))
