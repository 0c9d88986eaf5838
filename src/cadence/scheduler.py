"""Reference path: re-exports `cadence.training.scheduler` under Accelerate's `scheduler` module path."""

from __future__ import annotations

from cadence.training.scheduler import (
    AcceleratedScheduler,
)

__all__ = [
    "AcceleratedScheduler",
]
