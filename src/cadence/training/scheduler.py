"""AcceleratedScheduler: follows the optimizer, so a schedule written for one process lasts as many samples."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..runtime.state import AcceleratorState, GradientState


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
        *,
        num_processes: int | Callable[[], int] | None = None,
        gradient_state: GradientState | None = None,
    ) -> None:
        """Wrap `scheduler` so it advances with its optimizers; `prepare()` builds it for you.

        Args:
            scheduler (torch.optim.lr_scheduler.LRScheduler): The scheduler to wrap.
            optimizers (torch.optim.Optimizer | list): The prepared optimizer(s) it follows: it advances
                only when they really stepped.
            step_with_optimizer (bool): Advance together with the optimizer (default True); False steps
                the scheduler whenever `step()` is called.
            split_batches (bool): Whether batches are split among processes (then one step per call);
                otherwise it advances `num_processes` steps per call, so the schedule counts samples as on
                one process (default False).
            num_processes (int | Callable[[], int] | None): The number of processes; None means the
                process state's. A callable is asked at each step (fault tolerance: the ranks that
                trained the step just committed, which change with the quorum).
            gradient_state (GradientState | None): Tells whether gradients are synchronised; None means the
                process's.
        """
        self.scheduler = scheduler
        self.optimizers = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
        self.split_batches = split_batches
        self.step_with_optimizer = step_with_optimizer
        self.num_processes = (
            num_processes if num_processes is not None else AcceleratorState().num_processes
        )
        self.gradient_state = gradient_state if gradient_state is not None else GradientState()

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Advance the schedule after an optimizer step that really happened.

        Without `split_batches` it advances once per process, so the schedule matches the samples seen.
        Nothing happens on an accumulation micro-step or when fp16 skipped the optimizer step.

        Args:
            *args: Passed to the wrapped scheduler's `step`.
            **kwargs: Passed to the wrapped scheduler's `step`.
        """
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        if any(getattr(opt, "step_was_skipped", False) for opt in self.optimizers):
            return
        processes = self.num_processes
        repeats = 1 if self.split_batches else (processes() if callable(processes) else processes)
        total_steps = getattr(self.scheduler, "total_steps", None)
        for _ in range(repeats):
            # OneCycleLR raises past its last step; the reference stops there instead.
            if total_steps is not None and self.scheduler._step_count > total_steps:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        """The learning rates last computed by the wrapped scheduler."""
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped scheduler's state dict."""
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict into the wrapped scheduler.

        Args:
            state_dict (dict[str, Any]): A state dict of the same scheduler.
        """
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> Any:
        """The wrapped scheduler's `get_lr()`."""
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped scheduler's `print_lr`.

        Args:
            *args: Its arguments.
            **kwargs: Its keyword arguments.
        """
        return self.scheduler.print_lr(*args, **kwargs)

    def __repr__(self) -> str:
        return f"AcceleratedScheduler({self.scheduler!r})"
