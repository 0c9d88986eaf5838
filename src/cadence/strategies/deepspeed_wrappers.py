"""The wrappers a DeepSpeed engine's model, optimizer and scheduler are handed back in."""

from __future__ import annotations

from typing import Any

import torch

from ..training.optimizer import AcceleratedOptimizer
from ..training.scheduler import AcceleratedScheduler


class DeepSpeedEngineWrapper:
    """Runs the engine's backward, then its step at gradient accumulation boundaries.

    Args:
        engine (Any): The `deepspeed.DeepSpeedEngine` of the prepared model.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def backward(self, loss: torch.Tensor, sync_gradients: bool = True, **kwargs: Any) -> None:
        """Engine backward; at an accumulation boundary (`sync_gradients`) also the engine step.

        Args:
            loss (torch.Tensor): The loss to differentiate.
            sync_gradients (bool): This step ends a gradient accumulation window (default True).
            **kwargs: Passed to the engine's `backward`.
        """
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)
        self.engine.backward(loss, **kwargs)
        if sync_gradients:
            self.engine.step()

    def get_global_grad_norm(self) -> float | None:
        """The gradient norm the engine measured at its last step (None if unknown)."""
        norm = self.engine.get_global_grad_norm()
        return norm.item() if hasattr(norm, "item") else norm


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The engine steps and zeroes the optimizer inside `backward`; these calls are no-ops.

    Args:
        optimizer (Any): The optimizer the DeepSpeed engine owns.
    """

    def __init__(self, optimizer: Any) -> None:
        super().__init__(optimizer, device_placement=False, scaler=None)
        self._reports_overflow = hasattr(self.optimizer, "overflow")

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """No-op: the engine zeroes the gradients itself.

        Args:
            set_to_none (bool | None): Ignored.
        """
        pass

    def step(self, closure: Any = None) -> None:
        """No-op: the engine steps the optimizer inside `backward`.

        Args:
            closure (Any): Ignored.
        """
        pass

    @property
    def step_was_skipped(self) -> bool:
        """Whether the engine's optimizer skipped its last step on overflow."""
        return bool(self.optimizer.overflow) if self._reports_overflow else False


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """A DeepSpeed scheduler is stepped by the engine; `step` here is a no-op.

    Args:
        scheduler (Any): The scheduler the DeepSpeed engine owns.
        optimizers (Any): The prepared optimizer(s) it schedules.
    """

    def __init__(self, scheduler: Any, optimizers: Any) -> None:
        super().__init__(scheduler, optimizers)

    def step(self, *args: Any, **kwargs: Any) -> None:
        """No-op: the engine steps the scheduler.

        Args:
            *args: Ignored.
            **kwargs: Ignored.
        """
        pass
