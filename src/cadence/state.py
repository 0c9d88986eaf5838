"""Reference path: re-exports `cadence.runtime.state` under Accelerate's `state` module path."""

from __future__ import annotations

from cadence.runtime.state import (
    AcceleratorState,
    GradientState,
    PartialState,
    ThreadLocalSharedDict,
    do_nothing,
    is_initialized,
    reset_state,
    resolve_mixed_precision,
)

__all__ = [
    "AcceleratorState",
    "GradientState",
    "PartialState",
    "ThreadLocalSharedDict",
    "do_nothing",
    "is_initialized",
    "reset_state",
    "resolve_mixed_precision",
]
