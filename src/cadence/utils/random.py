"""Reference path: re-exports `cadence.runtime.random` under Accelerate's `utils.random` module path."""

from __future__ import annotations

from cadence.runtime.random import (
    set_seed,
    synchronize_rng_state,
    synchronize_rng_states,
)

__all__ = [
    "set_seed",
    "synchronize_rng_state",
    "synchronize_rng_states",
]
