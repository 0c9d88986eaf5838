"""Reference path: re-exports `cadence.launch.launchers` under Accelerate's `launchers` module path."""

from __future__ import annotations

from cadence.launch.launchers import (
    WorkerProcessesFailed,
    debug_launcher,
    notebook_launcher,
    test_launch,
)

__all__ = [
    "WorkerProcessesFailed",
    "debug_launcher",
    "notebook_launcher",
    "test_launch",
]
