"""The per-rank watchdog thread: publish this rank's state, watch the others', stop the job with a report.

Every `tick` seconds each rank writes its state (see verdict.py) to the side channel and looks for a
recorded reason to stop. A rank that has waited in a collective for a while reads every rank's state
and judges; when the job cannot make progress it records the report (the first one wins), prints it and
exits. The other ranks find the reason on their next tick, say why they stop, and exit too. A rank
that fails with an uncaught exception records that (see hooks.py), so its peers stop within a tick.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
import weakref
from dataclasses import replace
from typing import Any

from .callsite import main_thread_location
from .channel import SideChannel
from .hooks import install_hooks
from .ledger import ledger
from .settings import WatchSettings
from .signing import JOB_TOKEN_ENV
from .stop_notice import NOTICE_POLL, notice
from .stop_notice import watchdog_tick as stop_notice_tick
from .stopping import print_report, stop_process
from .verdict import judge, stall_report

# Reads of everyone's state, each with no other rank's record verifying, before saying the tokens differ.
_FOREIGN_READS_BEFORE_WARNING = 3
# Ranks that read everyone's state per tick, about (so the store is not flooded on large jobs).
_READERS_PER_TICK = 8


class Watchdog:
    """Background thread that publishes this rank's progress and watches the other ranks."""

    def __init__(
        self, channel: SideChannel, rank: int, world_size: int, settings: WatchSettings, group: Any
    ):
        self.channel = channel
        self.rank = rank
        self.world_size = world_size
        self.settings = settings
        # Weakly: the process group must die with destroy_process_group, not at interpreter shutdown
        # (a gloo group destroyed then aborts the process from a C++ destructor).
        self._group = weakref.ref(group) if group is not None else (lambda: None)
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.final_phase: dict[str, Any] | None = None  # set when the script exits or fails
        self._ticks = 0
        self._store_failing_since: float | None = None
        self._stalls_seen: set[int] = set()  # collectives whose stall this rank has dealt with
        self._foreign_reads = 0  # consecutive reads where no other rank's record verified
        self._told_tokens_differ = False
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cadence-watchdog", daemon=True)

    def start(self) -> None:
        """Start the watchdog thread."""
        self._thread.start()

    def halt(self) -> None:
        """Stop the watchdog thread (waits up to 2 s for it)."""
        self._halt.set()
        notice.wake.set()  # the thread waits on the notice's wake-up, not on the halt
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2)

    def release(self) -> None:
        """Drop this watchdog's reference to the process group's store once its thread has ended, so
        the store is destroyed with the group at exit, not during interpreter shutdown."""
        global _active
        if self._thread.is_alive():
            return
        self.channel = None
        if _active is self:
            _active = None

    @property
    def group(self) -> Any:
        """The process group watched (None once it was destroyed)."""
        return self._group()

    @property
    def running(self) -> bool:
        """Whether the watchdog thread is alive and has not been told to stop."""
        return self._thread.is_alive() and not self._halt.is_set()

    # -- this rank's state -----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """This rank's current state record, as published on the side channel."""
        now = time.time()
        state: dict[str, Any] = {
            "rank": self.rank,
            "pid": self.pid,
            "host": self.host,
            "beat": now,
            "done": ledger.completed,
            "last_op": ledger.last_operation,
            "where": main_thread_location(),
        }
        if self.final_phase is not None:
            state.update(self.final_phase)
            return state
        entry = ledger.waiting_in()
        if entry is None:
            state["phase"] = "running"
            return state
        state.update(
            phase="collective",
            seq=entry.sequence,
            op=entry.operation,
            shapes=entry.describe_inputs(),
            site=entry.call_site(),
            since=now - (time.monotonic() - entry.started),
            timeout=entry.timeout,
        )
        # Finished on the CPU but not on the GPU: not done.
        state["done"] = min(state["done"], entry.sequence - 1)
        return state

    def publish_final(self, phase: dict[str, Any]) -> None:
        """Record the final phase of this rank and publish its last state."""
        self.final_phase = phase
        self.channel.publish(self.rank, self.snapshot())

    # -- the loop --------------------------------------------------------------------------------
    def _run(self) -> None:
        next_tick = time.monotonic() + self.settings.tick
        while not self._halt.is_set():
            # A stop notice wakes the thread at once, and while the ranks agree on the stop step
            # the channel is read every NOTICE_POLL seconds (only the notice's records).
            now = time.monotonic()
            wait = min(NOTICE_POLL, next_tick - now) if notice.agreeing else next_tick - now
            notice.wake.wait(max(0.0, wait))
            notice.wake.clear()
            if self._halt.is_set() or not _same_group(self.group):
                return  # halted, or the process group was destroyed: nothing left to watch
            full = time.monotonic() >= next_tick
            if full:
                next_tick = time.monotonic() + self.settings.tick
            try:
                if full:
                    self._tick()
                elif self.final_phase is None:
                    stop_notice_tick(self.channel, self.rank, self.world_size)
                self._store_failing_since = None
            except Exception as error:  # noqa: BLE001 - the store went away (its host ended)
                self._on_store_error(error)

    def _tick(self) -> None:
        if self.final_phase is not None:
            return  # the script is ending (exited, or failed and printing its error): let it end
        self._ticks += 1
        mine = self.snapshot()
        self.channel.publish(self.rank, mine)
        reason = self.channel.stop_reason()
        if reason is not None and reason.get("rank") != self.rank:
            stop_process(self.rank, reason, reporter=False)
        stop_notice_tick(self.channel, self.rank, self.world_size)
        if mine.get("phase") != "collective" or not self._my_turn():
            return
        if time.time() - mine["since"] < self.settings.grace:
            return
        states = self.channel.states(self.world_size)
        self._check_tokens_agree()
        states[self.rank] = mine
        verdict = judge(self.rank, states, time.time(), self.settings)
        still = ledger.waiting_in()
        if still is None or still.sequence != mine["seq"]:
            return
        if verdict is None:
            self._report_stall(states)
            return
        reason = {
            "kind": "report",
            "rank": self.rank,
            "verdict": verdict.kind,
            "headline": verdict.headline,
            "report": verdict.report,
            "culprits": verdict.culprits,
            "time": time.time(),
        }
        standing = self.channel.claim_stop(reason)
        stop_process(self.rank, standing, reporter=standing == reason)

    def _check_tokens_agree(self) -> None:
        """Every other rank's record fails to verify, read after read: not a forger (the ranks rewrite
        their records every tick) but ranks started with different CADENCE_JOB_TOKEN values. Say so once."""
        others = {r for r in range(self.world_size) if r != self.rank}
        if not others or set(self.channel.last_unverified) != others:
            self._foreign_reads = 0
            return
        self._foreign_reads += 1
        if self._foreign_reads == _FOREIGN_READS_BEFORE_WARNING and not self._told_tokens_differ:
            self._told_tokens_differ = True
            print_report(
                f"[rank {self.rank}] Cadence: no other rank's watchdog record verifies with this rank's "
                f"{JOB_TOKEN_ENV}, so failures and stuck ranks elsewhere cannot be reported here. Give "
                f"every machine the same {JOB_TOKEN_ENV} (or none)."
            )

    def _report_stall(self, states: list[dict[str, Any] | None]) -> None:
        """Once per stalled collective in the whole job: say where every rank is, and go on."""
        seq = states[self.rank]["seq"]
        if seq in self._stalls_seen:
            return
        report = stall_report(self.rank, states, time.time(), self.settings)
        if report is None:
            return
        self._stalls_seen.add(seq)
        # The first rank to claim this stall prints it; the others stay quiet.
        _, ours = self.channel.claim(f"stall/{seq}", {"rank": self.rank, "time": time.time()})
        if ours:
            print_report(f"[rank {self.rank}] {report}")

    def _my_turn(self) -> bool:
        stride = max(1, math.ceil(self.world_size / _READERS_PER_TICK))
        return (self._ticks + self.rank) % stride == 0

    def _on_store_error(self, error: Exception) -> None:
        now = time.time()
        if self._store_failing_since is None:
            self._store_failing_since = now
        entry = ledger.waiting_in()
        # Outside a collective this rank may be finishing on its own: leave it alone.
        if entry is not None and now - self._store_failing_since > max(self.settings.grace, 5.0):
            stop_process(
                self.rank,
                {
                    "kind": "lost",
                    "rank": self.rank,
                    "headline": f"lost the job's store while waiting in {entry.operation} "
                    f"#{entry.sequence} at {entry.call_site()} ({type(error).__name__}: {error}); "
                    "the launcher or the rank hosting the store has ended",
                },
                reporter=True,
            )


def _same_group(group: Any) -> bool:
    import torch.distributed as dist

    try:
        return dist.is_initialized() and dist.distributed_c10d._get_default_group() is group
    except (RuntimeError, ValueError):
        return False


# -- one watchdog per process (and per process group) ----------------------------------------------
_active: Watchdog | None = None
_generation = 0


def active_watchdog() -> Watchdog | None:
    """The watchdog running in this process, or None (none, or a forked child)."""
    watchdog = _active
    if watchdog is None or watchdog.pid != os.getpid():  # a forked child (dataloader worker)
        return None
    return watchdog


def start_watchdog(state: Any, settings: WatchSettings) -> Watchdog | None:
    """Watch this rank (called by PartialState once the process group exists); idempotent per group."""
    global _active, _generation
    import torch.distributed as dist

    if not ledger.enabled or not state.use_distributed or not dist.is_initialized():
        return None
    settings = replace(
        settings,
        process_group_timeout=process_group_timeout_seconds(settings.process_group_timeout),
    )
    group = dist.distributed_c10d._get_default_group()
    current = active_watchdog()
    if current is not None and current.group is group and current.running:
        current.settings = settings
        return current
    if current is not None:
        current.halt()
        _generation += 1
    channel = SideChannel.of_default_group(_generation)
    if channel is None:
        return None
    ledger.restart()
    ledger.device_events = getattr(state.device, "type", "cpu") == "cuda"
    watchdog = Watchdog(channel, state.process_index, state.num_processes, settings, group)
    _active = watchdog
    install_hooks(active_watchdog)
    watchdog.start()
    return watchdog


def process_group_timeout_seconds(default: float) -> float:
    """The timeout the default process group was created with (its backend's options), else `default`."""
    import torch
    import torch.distributed as dist

    try:
        group = dist.distributed_c10d._get_default_group()
    except (RuntimeError, ValueError):
        return default
    for device in ("cpu", "cuda"):
        try:
            return group._get_backend(torch.device(device)).options._timeout.total_seconds()
        except (RuntimeError, AttributeError, ValueError):
            continue
    return default
