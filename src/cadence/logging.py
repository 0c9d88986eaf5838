"""Reference path: re-exports `cadence.runtime.logging` under Accelerate's `logging` module path."""

from __future__ import annotations

from cadence.runtime.logging import (
    MultiProcessAdapter,
    get_logger,
)

__all__ = [
    "MultiProcessAdapter",
    "get_logger",
]
