"""Reference path: re-exports `cadence.training.optimizer` under Accelerate's `optimizer` module path."""

from __future__ import annotations

from cadence.training.optimizer import (
    AcceleratedOptimizer,
    move_optimizer_state,
    move_to_device,
    patch_optimizer_step,
)

__all__ = [
    "AcceleratedOptimizer",
    "move_optimizer_state",
    "move_to_device",
    "patch_optimizer_step",
]
