"""torch elastic's local agent, extended where `cadence launch` needs more than it does.

`torch.distributed.run` builds a `LocalElasticAgent`; within `supervising_agent()` it builds this
subclass instead (same constructor, same loop), which adds:

- **stopping that reaches every worker**: each worker's process group gets the death signal, then
  SIGCONT, so a frozen (SIGSTOPped) worker receives it now rather than never; one still alive after
  the grace is SIGKILLed (with SIGCONT again) and remembered, so the summary can say the launcher
  stopped it;
- **the right grace for each stop**: after a failure a short one (`FAILURE_GRACE`: the job is over,
  a stuck rank is not waited on for 30 s); for a stop notice, a membership change or workers that
  stopped to resume, `CADENCE_STOP_GRACE` (default 30 s, torch's) so the step and its checkpoint
  can finish;
- **one line per restart** with the old and new world size;
- the **restart generation** for the workers (`CADENCE_RESTART_GENERATION`: the rendezvous round);
- **leaving on a stop notice**: once its workers have committed the checkpoint and ended, the node
  leaves the rendezvous at once (rendezvous_leave.py), so the other nodes' next round completes
  without waiting for its heartbeats to expire; a repeated notice during that stop is ignored;
- **a notice to one rank is a notice to its node**: a worker that got the signal itself ends with
  `NODE_LEAVES_EXIT_CODE` (the others with `RESUME_EXIT_CODE`), and the agent then stops and leaves
  as if it had got the notice. When the agent sent the signal itself (its own notice, a membership
  change) it has decided already, and the two codes mean the same: resume.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.agent.server.api import WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import SignalException

from ..core.torch_compat import agent_handles_extra_signals, agent_shutdown_closes_rendezvous
from ..diagnostics.generation_env import GENERATION_ENV
from ..diagnostics.stop_notice import (
    AGENT_PID_ENV,
    NODE_LEAVES_EXIT_CODE,
    RESUME_EXIT_CODE,
    stop_grace,
    stop_signal,
)
from .rendezvous_leave import leave_rendezvous

# Exit codes of workers that stopped on notice after committing a checkpoint.
RESUME_CODES = frozenset({RESUME_EXIT_CODE, NODE_LEAVES_EXIT_CODE})

# The signals torch elastic's process context stops the workers on, on every release.
TORCH_HANDLED_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})

# Seconds a worker gets to end after the job failed, before SIGKILL (torch's default is 30).
FAILURE_GRACE = 3.0


@dataclass(frozen=True)
class LauncherKill:
    """A worker the launcher stopped: with which signal, why, and the grace it was given."""

    local_rank: int
    rank: int
    grace: float
    why: str  # "after rank 0 failed", "on a stop notice", ...
    signal_name: str  # the signal sent ("SIGKILL": it did not end within the grace)


def _takes(function: Any, name: str) -> bool:
    """Whether `function` accepts the keyword `name` (torch's private agent API varies by release)."""
    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


class SupervisingAgent(LocalElasticAgent):
    """`LocalElasticAgent` with the stopping, grace and restart reports described above."""

    latest: SupervisingAgent | None = None  # the agent of this launcher (for the summary)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.notice_grace = stop_grace()
        self.stopped: dict[int, LauncherKill] = {}  # pid -> how and why the launcher stopped it
        self._why_stopping = "after a failure"
        self._world_size: int | None = None
        self.exit_codes: dict[int, int | None] = {}  # local rank -> exit code, at the last stop
        self.noticed_ranks: list[int] = []  # ranks of this node that got the notice themselves
        SupervisingAgent.latest = self

    # -- why the workers are being stopped -------------------------------------------------------
    def _monitor_workers(self, worker_group: Any) -> Any:
        result = super()._monitor_workers(worker_group)
        if result.state == WorkerState.HEALTHY:
            self._why_stopping = "for a membership change"  # the only stop of healthy workers
        elif result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            codes = {failure.exitcode for failure in result.failures.values()}
            resuming = bool(codes) and codes <= RESUME_CODES
            self._why_stopping = "to resume" if resuming else "after a failure"
            noticed = [r for r, f in result.failures.items() if f.exitcode == NODE_LEAVES_EXIT_CODE]
            if resuming and noticed:
                # A rank of this node got the notice itself (this agent sent nothing): the node
                # leaves, as on a notice to the launcher. torch's run() stops and re-raises this.
                self.noticed_ranks = sorted(noticed)
                sig = stop_signal() or signal.SIGTERM
                raise SignalException(f"rank {noticed[0]} got the stop notice", sigval=sig)
        return result

    def _invoke_run(self, role: str = "default") -> Any:
        try:
            return super()._invoke_run(role)
        except SignalException as stop:
            self._why_stopping = "on a stop notice"
            # The workers are about to checkpoint: a repeated notice (a scheduler that signals
            # every process, or twice) must not break off the stop that saves them.
            with suppress(ValueError, OSError):
                signal.signal(stop.sigval, signal.SIG_IGN)
            raise

    def _shutdown(
        self, death_sig: signal.Signals = signal.SIGTERM, *args: Any, **kwargs: Any
    ) -> None:
        handlers = getattr(self._pcontext, "subprocess_handlers", None) or {}
        if handlers:
            self._stop_processes(handlers, death_sig)
        if self._why_stopping == "on a stop notice":
            self._leave()
            if agent_shutdown_closes_rendezvous() and _takes(super()._shutdown, "is_restart"):
                # torch 2.7 would also close the rendezvous, ending the nodes that go on.
                args, kwargs = (), {**kwargs, "is_restart": True}
        # Nothing is left alive: torch's own shutdown only closes logs and servers. Its signature
        # differs between torch releases (a `timeout` since 2.12, `is_restart` before), so only
        # what it takes is passed.
        if _takes(super()._shutdown, "timeout"):
            kwargs["timeout"] = 0
        super()._shutdown(death_sig, *args, **kwargs)

    def _hook_pcontext(self) -> None:
        """torch's process context also stops the other workers itself when one fails (with a
        30-s grace): route that through `_stop_processes` too."""
        pcontext = self._pcontext
        original = getattr(pcontext, "_close", None)
        if original is None or not hasattr(pcontext, "subprocess_handlers"):
            return

        def close(death_sig: signal.Signals, *args: Any, **kwargs: Any) -> None:
            self._stop_processes(pcontext.subprocess_handlers, death_sig)
            if _takes(original, "timeout"):
                kwargs["timeout"] = 0
                args = ()
            original(death_sig, *args, **kwargs)

        pcontext._close = close

    def _leave(self) -> None:
        """Leave the rendezvous now that the workers ended: the other nodes go on without this one."""
        outcome = leave_rendezvous(self._rdzv_handler)
        if outcome is None:
            return  # a static rendezvous: nothing to leave
        left, why_not = outcome
        if why_not is None:
            where = f" (rendezvous round {left})" if left is not None else ""
            text = f"left the job{where}; the other nodes go on without it"
        else:
            text = f"could not leave the rendezvous ({why_not}); the other nodes drop it later"
        print(f"cadence launch: this node {text}", file=sys.stderr, flush=True)

    def _grace(self, procs: dict[int, Any]) -> tuple[float, str]:
        ended = {rank: proc.poll() for rank, proc in procs.items() if proc.poll() is not None}
        failed = sorted(
            rank for rank, code in ended.items() if code != 0 and code not in RESUME_CODES
        )
        if failed or self._why_stopping == "after a failure":
            ranks = [self._global_rank(rank) for rank in failed]
            return FAILURE_GRACE, f"after rank {ranks[0]} failed" if ranks else "after a failure"
        return self.notice_grace, self._why_stopping

    def _global_rank(self, local_rank: int) -> int:
        workers = self._worker_group.workers
        return workers[local_rank].global_rank if local_rank < len(workers) else local_rank

    def _stop_processes(self, handlers: dict[int, Any], death_sig: signal.Signals) -> None:
        procs = {rank: h.proc for rank, h in handlers.items()}
        grace, why = self._grace(procs)
        alive = {rank: proc for rank, proc in procs.items() if proc.poll() is None}
        for local_rank, proc in alive.items():
            self.stopped[proc.pid] = LauncherKill(
                local_rank, self._global_rank(local_rank), grace, why, death_sig.name
            )
            _signal_group(proc.pid, death_sig)
            _signal_group(proc.pid, signal.SIGCONT)  # a frozen worker gets the signal now
        deadline = time.monotonic() + grace
        while alive and time.monotonic() < deadline:  # bounded by the grace
            time.sleep(0.05)
            alive = {rank: proc for rank, proc in alive.items() if proc.poll() is None}
        for local_rank, proc in alive.items():
            self.stopped[proc.pid] = LauncherKill(
                local_rank, self._global_rank(local_rank), grace, why, "SIGKILL"
            )
            _signal_group(proc.pid, signal.SIGKILL)
            _signal_group(proc.pid, signal.SIGCONT)
        for proc in alive.values():
            try:
                proc.wait(5)
            except Exception:  # noqa: BLE001 - uninterruptible sleep: torch's close reports it
                pass
        if procs:
            self.exit_codes = {rank: proc.poll() for rank, proc in procs.items()}

    @property
    def stopped_to_resume(self) -> bool:
        """Whether every worker ended with a resume code at the last stop."""
        codes = set(self.exit_codes.values())
        return bool(codes) and codes <= RESUME_CODES

    # -- restarts ------------------------------------------------------------------------------
    def _start_workers(self, worker_group: Any) -> dict[int, Any]:
        # Workers inherit the agent's environment: the generation travels that way.
        os.environ[GENERATION_ENV] = str(self._generation())
        os.environ[AGENT_PID_ENV] = str(os.getpid())  # a worker's notice reaches its node this way
        started = super()._start_workers(worker_group)
        self._hook_pcontext()
        self._handle_notice_signal()
        return started

    def _handle_notice_signal(self) -> None:
        """torch < 2.10 has no --signals_to_handle: its process context handles SIGTERM, SIGINT,
        SIGHUP and SIGQUIT only, so a stop notice on another signal gets torch's handler here."""
        notice = stop_signal()
        if agent_handles_extra_signals() or notice is None or notice in TORCH_HANDLED_SIGNALS:
            return
        from torch.distributed.elastic.multiprocessing.api import _terminate_process_handler

        signal.signal(notice, _terminate_process_handler)

    def _generation(self) -> int:
        holder = getattr(self._rdzv_handler, "_state_holder", None)
        round_ = getattr(getattr(holder, "state", None), "round", None)
        if isinstance(round_, int):
            return round_
        return self._worker_group.spec.max_restarts - self._remaining_restarts

    def _initialize_workers(self, worker_group: Any) -> None:
        super()._initialize_workers(worker_group)
        workers = worker_group.workers
        size = workers[0].world_size if workers else None
        if self._world_size is not None:
            restart = worker_group.spec.max_restarts - self._remaining_restarts
            print(
                f"cadence launch: restart (generation {os.environ.get(GENERATION_ENV)}, "
                f"{restart} of --max_restarts used): world size {self._world_size} -> {size}",
                file=sys.stderr,
                flush=True,
            )
        self._world_size = size


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # torch starts each worker in its own session (process group = pid)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def supervising_agent() -> Iterator[None]:
    """Within this block, torch elastic's launcher builds a `SupervisingAgent`."""
    import torch.distributed.launcher.api as launcher_api

    original = launcher_api.LocalElasticAgent
    launcher_api.LocalElasticAgent = SupervisingAgent  # the name launch_agent() builds
    try:
        yield
    finally:
        launcher_api.LocalElasticAgent = original
