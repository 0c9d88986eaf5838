"""Turn failed workers into a short root-cause summary: which rank failed first, why, and where."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Any

from ..core.torch_compat import failures_include_stopped_ranks

TRACEBACK_TAIL_LINES = 8
# Errors a rank raises because a *peer* went away: never the root cause when another failure exists.
_KNOCK_ON = re.compile(
    r"Connection closed by peer|Connection reset|Broken pipe|DistBackendError|DistNetworkError|"
    r"ProcessGroupGloo|NCCL communicator was aborted|Socket Timeout|recvBytes|sendBytes|"
    r"failed to recv|peer closed|Connection refused|because rank \d+ failed|SignalException|got signal",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class WorkerFailure:
    """One failed worker process, with its exit code and the error file it wrote, if any."""

    rank: int
    local_rank: int
    exitcode: int
    pid: int | None
    error_data: dict[str, Any] | None  # the worker's JSON error file, when it wrote one
    # Set when the launcher itself SIGKILLed the worker: why ("after a failure", ...) and the grace.
    killed_by_launcher: str | None = None

    @property
    def exception(self) -> str | None:
        """The exception message from the worker's error file, or None."""
        message = (self.error_data or {}).get("message")
        if isinstance(message, dict):
            return message.get("message")
        return message if isinstance(message, str) and message else None

    @property
    def traceback(self) -> str:
        """The Python call stack from the worker's error file, or an empty string."""
        message = (self.error_data or {}).get("message")
        if isinstance(message, dict):
            return (message.get("extraInfo") or {}).get("py_callstack") or ""
        return ""

    @property
    def time(self) -> float:
        """When the worker failed, taken from its error file."""
        data = self.error_data or {}
        precise = (data.get("cadence") or {}).get("time")
        if precise is not None:
            return float(precise)
        message = data.get("message")
        if isinstance(message, dict):
            try:
                return float(message["extraInfo"]["timestamp"])
            except (KeyError, TypeError, ValueError):
                pass
        return float("inf")

    @property
    def is_knock_on(self) -> bool:
        """Whether the failure looks caused by another rank failing (peer closed, etc.)."""
        return bool(_KNOCK_ON.search(f"{self.exception or ''}\n{self.traceback}"))

    def describe_exit(self) -> str:
        """Human-readable exit: the killing signal's name, or the exit code."""
        if self.exitcode < 0:
            try:
                name = signal.Signals(-self.exitcode).name
            except ValueError:
                name = f"signal {-self.exitcode}"
            if self.killed_by_launcher:
                return f"stopped by the launcher {self.killed_by_launcher}"
            # Nothing in this job sent it: the kernel's OOM killer is the usual sender.
            hint = (
                " (out of memory? the kernel's OOM killer logs each kill: `dmesg | grep -i oom` "
                "or `journalctl -k | grep -i oom`)"
                if name == "SIGKILL"
                else ""
            )
            return f"killed by {name}{hint}"
        return f"exit code {self.exitcode}"


def root_cause(failures: list[WorkerFailure]) -> WorkerFailure:
    """The failure that most likely caused the others: a real error before a peer-loss error, earliest first."""
    return min(failures, key=lambda f: (f.is_knock_on, f.exception is None, f.time, f.rank))


def _first_line(text: str, limit: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _tail(text: str, lines: int) -> list[str]:
    # Drop blank lines and the ^^^^ / ~~~~ markers Python 3.11+ puts under expressions.
    rows = [row for row in text.rstrip().splitlines() if row.strip() and row.strip(" ^~")]
    return rows[-lines:]


def format_failure_summary(
    failures: list[WorkerFailure],
    local_ranks: list[int],
    log_dir: str | None = None,
    verbose: bool = False,
    title: str = "cadence launch",
) -> str:
    """The launcher's report: root cause first, then what happened to every other rank on this machine."""
    cause = root_cause(failures)
    lines = [f"{title}: rank {cause.rank} failed ({cause.describe_exit()})"]
    if cause.exception:
        lines.append(f"  {cause.exception}")
        tail = _tail(cause.traceback, TRACEBACK_TAIL_LINES)
        if tail:
            lines.append("  last lines of its traceback:")
            lines += [f"    {row}" for row in tail]
    elif cause.exitcode >= 0:
        lines.append(
            "  no Python exception was recorded (the script called sys.exit, or the process crashed)"
        )
    if cause.is_knock_on:
        lines.append(
            "  this looks like a lost connection: the root cause may be on another machine"
        )
    failed = {f.rank: f for f in failures}
    because = f"stopped because rank {cause.rank} failed"
    groups: dict[str, list[int]] = {}
    for rank in sorted(set(local_ranks) | set(failed)):
        if rank == cause.rank:
            continue
        other = failed.get(rank)
        if other is None:
            label = because
        elif other.killed_by_launcher:
            label = _stopped_label(cause, other)
        elif other.is_knock_on:
            label = f"{because} (lost the connection to it)"
        else:
            label = f"also failed: {_first_line(other.exception or other.describe_exit())}"
        groups.setdefault(label, []).append(rank)
    for label, ranks in groups.items():
        lines.append(f"  rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {label}")
    if verbose:
        for rank in sorted(failed):
            if rank != cause.rank and failed[rank].traceback:
                lines.append(f"  rank {rank} traceback:")
                lines += [f"    {row}" for row in failed[rank].traceback.rstrip().splitlines()]
    if log_dir:
        lines.append(f"  worker logs and error files: {log_dir}")
    return "\n".join(lines)


def failures_from_elastic(error: Any, killed: dict[int, Any] | None = None) -> list[WorkerFailure]:
    """Convert torch elastic's ChildFailedError into WorkerFailure records; `killed` maps the pids
    the launcher SIGKILLed itself to why (see launch/elastic_agent.LauncherKill)."""
    killed = killed or {}
    result = []
    for rank, failure in sorted(error.failures.items()):
        data = failure.error_file_data if isinstance(failure.error_file_data, dict) else None
        if data is not None and not isinstance(data.get("message"), dict):
            data = None  # torch's placeholder when the worker wrote no error file
        result.append(
            WorkerFailure(
                rank=int(rank),
                local_rank=int(failure.local_rank),
                exitcode=int(failure.exitcode),
                pid=failure.pid,
                error_data=data or None,
                killed_by_launcher=_launcher_kill(killed.get(failure.pid)),
            )
        )
    if not failures_include_stopped_ranks():
        # torch < 2.10 lists only the workers that failed by themselves: add those the agent stopped.
        listed = {failure.rank for failure in result}
        for pid, stop in killed.items():
            if stop.rank not in listed:
                sig = getattr(signal.Signals, stop.signal_name, signal.SIGTERM)
                result.append(
                    WorkerFailure(
                        rank=stop.rank,
                        local_rank=stop.local_rank,
                        exitcode=-int(sig),
                        pid=pid,
                        error_data=None,
                        killed_by_launcher=_launcher_kill(stop),
                    )
                )
        result.sort(key=lambda failure: failure.rank)
    return result


def _stopped_label(cause: WorkerFailure, other: WorkerFailure) -> str:
    """What happened to a rank the launcher stopped itself (not a failure of its own)."""
    if (cause.exception or "").startswith("CollectiveStuck"):
        return (
            f"stopped by the launcher after the stuck timeout (rank {cause.rank}'s report above "
            "says where it was and for how long)"
        )
    because = f"stopped because rank {cause.rank} failed"
    if other.exitcode == -9:
        return f"{because} ({other.describe_exit()})"
    return because


def _launcher_kill(stop: Any) -> str | None:
    if stop is None:
        return None
    if stop.signal_name == "SIGKILL":
        return f"{stop.why}: it did not end within {stop.grace:g} s of being told to stop"
    return f"{stop.why} ({stop.signal_name})"


def failures_from_error_files(log_dir: str) -> list[WorkerFailure]:
    """Every worker failure recorded under a torch elastic log folder (`.../<local_rank>/error.json`).

    With forked workers torch reports only one failure; the error files hold all of them."""
    import glob
    import json
    import os

    result = []
    for path in sorted(glob.glob(os.path.join(log_dir, "**", "error.json"), recursive=True)):
        folder = os.path.basename(os.path.dirname(path))
        try:
            with open(path) as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            continue
        if folder.isdigit() and isinstance(data, dict) and isinstance(data.get("message"), dict):
            result.append(WorkerFailure(int(folder), int(folder), 1, None, data))
    return result
