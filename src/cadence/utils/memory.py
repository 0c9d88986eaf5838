"""Reference path: re-exports `cadence.runtime.memory` under Accelerate's `utils.memory` module path."""

from __future__ import annotations

from cadence.runtime.memory import (
    clear_device_cache,
    find_executable_batch_size,
    release_memory,
    should_reduce_batch_size,
)

__all__ = [
    "clear_device_cache",
    "find_executable_batch_size",
    "release_memory",
    "should_reduce_batch_size",
]
