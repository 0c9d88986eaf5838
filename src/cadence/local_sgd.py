"""Reference path: re-exports `cadence.accelerator.local_sgd` under Accelerate's `local_sgd` module path."""

from __future__ import annotations

from cadence.accelerator.local_sgd import (
    LocalSGD,
)

__all__ = [
    "LocalSGD",
]
