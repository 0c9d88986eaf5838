"""Root-cause summaries of failed multi-process jobs, read from torch elastic's per-worker error files."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass

# Errors a rank raises because a *peer* went away: never the root cause when a real error exists.
_PEER_SYMPTOMS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "DistBackendError",
    "stopped because rank",
    "Socket Timeout",
    "timed out",
    "Timed out",
)


@dataclass(frozen=True)
class WorkerFailure:
    rank: int
    message: str
    traceback: str
    timestamp: int

    @property
    def is_peer_symptom(self) -> bool:
        text = self.message + self.traceback[-2000:]
        return any(symptom in text for symptom in _PEER_SYMPTOMS)


def read_error_files(log_dir: str) -> list[WorkerFailure]:
    """Every worker failure recorded under a torch elastic log directory (the newest attempt)."""
    failures = []
    for path in glob.glob(os.path.join(log_dir, "**", "error.json"), recursive=True):
        rank_dir = os.path.basename(os.path.dirname(path))
        try:
            with open(path) as handle:
                content = json.load(handle)["message"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(content, str):
            message, traceback, timestamp = content, "", 0
        else:
            extra = content.get("extraInfo", {})
            message = content.get("message", "")
            traceback = extra.get("py_callstack", "")
            timestamp = int(extra.get("timestamp", 0) or 0)
        rank = int(rank_dir) if rank_dir.isdigit() else -1
        failures.append(WorkerFailure(rank, message, traceback, timestamp))
    return failures


def root_cause(failures: list[WorkerFailure]) -> WorkerFailure | None:
    if not failures:
        return None
    return min(failures, key=lambda f: (f.is_peer_symptom, f.timestamp, f.rank))


def format_summary(failures: list[WorkerFailure], tail_lines: int = 8) -> str:
    """One short report: the rank that failed first with its exception and traceback tail, then the rest."""
    first = root_cause(failures)
    if first is None:
        return "A worker failed without leaving an error record (killed by a signal?)."
    tail = "\n".join("    " + line for line in first.traceback.strip().splitlines()[-tail_lines:])
    lines = [f"Rank {first.rank} failed first: {first.message}"]
    if tail:
        lines.append(tail)
    others = sorted(f.rank for f in failures if f is not first)
    if others:
        lines.append(
            f"Rank(s) {', '.join(map(str, others))} stopped because rank {first.rank} failed."
        )
    return "\n".join(lines)
