"""Gradient accumulation and the backward pass of one micro-step.

`GradientAccumulation` counts micro-steps, tells `GradientState` whether this one synchronises, divides
the loss by the number of accumulation steps, hands it to the strategy's backward (which scales it as its
precision says), and decides how the optimizer step reweights the last, shorter window of a dataloader
(`GradientState.window_factor`, see `adjust_last_window`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..core.input_errors import with_rank
from ..core.prepared import PreparedObjects
from ..diagnostics.ledger import ledger
from ..runtime.state import GradientState
from ..strategies import Strategy


class GradientAccumulation:
    """The accumulation counter and backward of one Accelerator."""

    def __init__(
        self,
        strategy: Strategy,
        prepared: PreparedObjects,
        gradient_state: GradientState,
        complete_gradients: Callable[[], None] | None = None,
        trains_nothing: Callable[[], bool] | None = None,
    ) -> None:
        self.strategy = strategy
        self.prepared = prepared
        self.gradient_state = gradient_state
        # Under fault tolerance, averages the gradients across the replica groups before they are
        # read (the clips), as DDP's backward has averaged them across processes.
        self.complete_gradients = complete_gradients
        # Under fault tolerance, whether the batch in hand is a stand-in that trains nothing (a
        # restarted group passing through an epoch the job finished): its backward is skipped.
        self.trains_nothing = trains_nothing
        self.step = 0
        # Micro-batches in the window that ends with this step (0 while the window is still open).
        self.micro_steps_in_window = 0
        # Inside `accumulate()` only: a dataloader's last, shorter window is reweighted (see backward).
        self._in_micro_step = False

    def state_dict(self) -> dict[str, int]:
        """The micro-step counter (`Accelerator.step`), for a fault-tolerant group that heals."""
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Take the counter from `state_dict`."""
        self.step = int(state["step"])

    def begin_micro_step(self) -> None:
        """Advance the counter and decide whether this micro-step synchronises gradients."""
        state = self.gradient_state
        state._set_window_factor(1.0)
        steps = state.num_steps
        if state.sync_with_dataloader and state.end_of_dataloader:
            self.micro_steps_in_window = self.step % steps + 1
            self.step = 0
            state._set_sync_gradients(True)
        else:
            self.step += 1
            sync = self.step % steps == 0
            self.micro_steps_in_window = steps if sync else 0
            state._set_sync_gradients(sync)

    @contextlib.contextmanager
    def accumulate(self, models: tuple[torch.nn.Module, ...]) -> Iterator[None]:
        """One micro-step: skip the gradient all-reduce unless this micro-step synchronises."""
        self.begin_micro_step()
        state = self.gradient_state
        allow_sync = state.sync_gradients or (
            self.strategy.context.use_distributed and state.sync_each_batch
        )
        with contextlib.ExitStack() as stack:
            if not allow_sync:
                for model in models:
                    stack.enter_context(self.strategy.no_sync(model))
            self._in_micro_step = True
            try:
                yield
            finally:
                self._in_micro_step = False

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Divide the loss for accumulation, run the strategy's backward, fix up a short last window."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(
                with_rank(f"backward() needs the loss tensor, got {type(loss).__name__}.")
            )
        if self.trains_nothing is not None and self.trains_nothing():
            return
        steps = self.gradient_state.num_steps
        strategy = self.strategy
        if steps > 1 and strategy.divides_loss_for_accumulation:
            loss = loss / steps
        # The last window of a dataloader may hold fewer than N micro-batches, each divided by N: the
        # optimizer step multiplies the gradients by N / micro-batches (and puts them back after), so
        # the update is their mean while the gradients seen between backward and step stay the
        # reference's. A backward outside `accumulate()` resets it.
        self.gradient_state._set_window_factor(self._short_window_factor(steps))
        syncs = self.gradient_state.sync_gradients
        if self.prepared.models and syncs and strategy.context.use_distributed:
            # The wrapped model all-reduces gradients during backward: the watchdog must see it.
            with ledger.entered("backward", None):
                strategy.backward(loss, **kwargs)
        else:
            strategy.backward(loss, **kwargs)

    def _short_window_factor(self, steps: int) -> float:
        """`num_steps / micro-steps` when this backward closes a dataloader's shorter last window
        inside `accumulate()` (and the reweighting is on), else 1."""
        if (
            not self._in_micro_step
            or not self.strategy.divides_loss_for_accumulation
            or not self.gradient_state.adjust_last_window
            or not self.gradient_state.sync_gradients
            or not 0 < self.micro_steps_in_window < steps
        ):
            return 1.0
        return steps / self.micro_steps_in_window

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide fp16 gradients by the loss scale (once per step); a no-op without fp16."""
        if self.strategy.precision.scaler is None:
            return
        if optimizer is None:
            optimizers = self.prepared.optimizers
        else:
            optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
        for opt in optimizers:
            prepared = self.prepared.find_optimizer(opt)
            if prepared is None:
                raise ValueError(
                    "unscale_gradients() got an optimizer that was not passed to prepare()."
                )
            prepared.unscale_()

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> Any:
        """Unscale, then clip the total norm of the gradients the optimizer step will use: when a
        dataloader's last, shorter window closes, the step multiplies them by `window_factor`, so
        the clip and the norm returned are those of the rescaled gradients (docs/differences.md)."""
        self._complete()
        self.unscale_gradients()
        factor = self.gradient_state.window_factor
        norm = self.strategy.clip_grad_norm_(parameters, max_norm / factor, norm_type)
        return norm * factor if factor != 1.0 else norm

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Unscale, then clip every value of the gradients the optimizer step will use."""
        self._complete()
        self.unscale_gradients()
        self.strategy.clip_grad_value_(parameters, clip_value / self.gradient_state.window_factor)

    def _complete(self) -> None:
        if self.complete_gradients is not None and self.gradient_state.sync_gradients:
            self.complete_gradients()

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Backward through a LOMO / AdaLomo optimizer (package `lomo-optim`)."""
        import importlib.util

        if importlib.util.find_spec("lomo_optim") is None:
            raise ImportError("lomo_backward needs the LOMO optimizers: `pip install lomo-optim`.")
        from lomo_optim import AdaLomo, Lomo  # optional dependency

        for optimizer in self.prepared.optimizers:
            inner = optimizer.optimizer
            if isinstance(inner, (Lomo, AdaLomo)):
                inner.fused_backward(loss, learning_rate)
                return
        raise ValueError("lomo_backward needs a Lomo or AdaLomo optimizer passed to prepare().")
