"""Reference path: re-exports `cadence.runtime.memory` under Accelerate's deprecated `memory_utils` module path (it warns: import from `cadence` instead)."""

from __future__ import annotations

import warnings

from .runtime.memory import find_executable_batch_size

warnings.warn(
    "cadence.memory_utils is deprecated: import `find_executable_batch_size` from `cadence` "
    "(`from cadence import find_executable_batch_size`).",
    FutureWarning,
    stacklevel=2,
)

__all__ = ["find_executable_batch_size"]
