"""AcceleratedScheduler: follows the optimizer, so a schedule written for one process lasts as many samples."""

from __future__ import annotations

from typing import Any

from .state import AcceleratorState, GradientState


class AcceleratedScheduler:
    """Steps the wrapped scheduler only when its optimizers really stepped.

    Without `split_batches`, each optimizer step consumes `num_processes` times more samples than on one
    process, so the scheduler advances `num_processes` steps at a time.
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: Any,
        step_with_optimizer: bool = True,
        split_batches: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
        self.split_batches = split_batches
        self.step_with_optimizer = step_with_optimizer
        self.gradient_state = GradientState()

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        if any(getattr(opt, "step_was_skipped", False) for opt in self.optimizers):
            return
        repeats = 1 if self.split_batches else AcceleratorState().num_processes
        total_steps = getattr(self.scheduler, "total_steps", None)
        for _ in range(repeats):
            # OneCycleLR raises past its last step; the reference stops there instead.
            if total_steps is not None and self.scheduler._step_count > total_steps:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> Any:
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        return self.scheduler.print_lr(*args, **kwargs)

    def __repr__(self) -> str:
        return f"AcceleratedScheduler({self.scheduler!r})"
