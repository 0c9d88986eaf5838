"""AcceleratedOptimizer: steps only on gradient-sync steps and knows when the grad scaler skipped a step."""

from __future__ import annotations

from typing import Any

import torch

from ..diagnostics.stop_notice import notice as stop_notice
from ..runtime.collectives import send_to_device
from ..runtime.state import AcceleratorState, GradientState


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Put the optimizer's state tensors (Adam moments, ...) on `device`; the step counters stay put."""
    if not optimizer.state:
        return
    if torch.device(device).type == "cpu" and all(
        value.device.type == "cpu"
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    ):
        # Several CPU processes use device cpu:0 (as Accelerate does), and `.to("cpu:0")` of a
        # tensor on "cpu" copies it: every tensor is where it belongs already (measured: 0.9 s of
        # a 100M-parameter resume on 2 processes went to copying AdamW's state).
        return
    state_dict = optimizer.state_dict()
    state_dict["state"] = send_to_device(state_dict["state"], device)
    optimizer.load_state_dict(state_dict)


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps a torch optimizer; `step` and `zero_grad` act only when gradients are synchronised."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        device_placement: bool = True,
        scaler: Any = None,
        *,
        device: torch.device | None = None,
        gradient_state: GradientState | None = None,
    ) -> None:
        """Wrap `optimizer`; `prepare()` builds it for you.

        Args:
            optimizer (torch.optim.Optimizer): The optimizer to wrap.
            device_placement (bool): Move its state to `device` (default True).
            scaler (torch.amp.GradScaler | None): The fp16 loss scaler that steps it, if any.
            device (torch.device | None): Where its state goes; None means the process's device.
            gradient_state (GradientState | None): Tells whether gradients are synchronised; None means the
                process's.
        """
        self.optimizer = optimizer
        self.scaler = scaler
        self.device = device if device is not None else AcceleratorState().device
        self.gradient_state = gradient_state if gradient_state is not None else GradientState()
        self.device_placement = device_placement
        self._is_overflow = False
        self._unscaled = False
        # Fault tolerance (cadence/fault_tolerance) sets this: averages the gradients across the
        # replica groups and returns whether the quorum committed the step.
        self.step_gate: Any = None
        if device_placement:
            move_optimizer_state(optimizer, self.device)

    @property
    def accelerator_state(self) -> AcceleratorState:
        """The process's AcceleratorState (kept for code written against Accelerate)."""
        return AcceleratorState()

    @property
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state."""
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        """Replace the wrapped optimizer's per-parameter state."""
        self.optimizer.state = value

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups."""
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        """Replace the wrapped optimizer's parameter groups."""
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:
        """The wrapped optimizer's default hyper-parameters."""
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        """Replace the wrapped optimizer's default hyper-parameters."""
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the wrapped optimizer.

        Args:
            param_group (dict[str, Any]): The group, as for `torch.optim.Optimizer.add_param_group`.
        """
        self.optimizer.add_param_group(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict into the wrapped optimizer (its state is moved to the device when placed).

        Args:
            state_dict (dict[str, Any]): A state dict of the same optimizer.
        """
        self.optimizer.load_state_dict(state_dict)
        if self.device_placement:
            move_optimizer_state(self.optimizer, self.device)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict."""
        return self.optimizer.state_dict()

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Zero the gradients, but only on a step that synchronises them (inside `accumulate()`, only at the end of a window).

        Args:
            set_to_none (bool | None): Set gradients to None instead of zeros (None: torch's default, True).
        """
        if self.gradient_state.sync_gradients:
            if set_to_none is None:
                self.optimizer.zero_grad()
            else:
                self.optimizer.zero_grad(set_to_none=set_to_none)

    def train(self) -> None:
        """Call the wrapped optimizer's `train()` if it has one (schedule-free optimizers)."""
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()

    def eval(self) -> None:
        """Call the wrapped optimizer's `eval()` if it has one (schedule-free optimizers)."""
        if hasattr(self.optimizer, "eval") and callable(self.optimizer.eval):
            self.optimizer.eval()

    def unscale_(self) -> None:
        """Unscale the gradients once per step (fp16); later calls before the step do nothing."""
        if self.scaler is not None and not self._unscaled:
            self.scaler.unscale_(self.optimizer)
            self._unscaled = True

    def step(self, closure: Any = None) -> Any:
        """Update the parameters, but only on a step that synchronises gradients; through the fp16 scaler if any.

        With fp16, a step whose gradients overflowed is skipped (`step_was_skipped` then says so).

        Args:
            closure (Callable | None): Re-evaluates the model and returns the loss, for optimizers that
                need it (LBFGS).

        Returns:
            The closure's loss, when given.
        """
        if not self.gradient_state.sync_gradients:
            return None
        factor = self.gradient_state.window_factor
        if factor != 1.0:  # a dataloader's last, shorter window (see GradientState.window_factor)
            self._scale_gradients(factor)
        stop_notice.step_completed()  # a step boundary for the graceful stop (diagnostics/stop_notice)
        try:
            if self.step_gate is not None:
                self._is_overflow = not self.step_gate()  # an uncommitted step is a skipped step
                if self._is_overflow:
                    return None
            if self.scaler is None:
                return (
                    self.optimizer.step(closure) if closure is not None else self.optimizer.step()
                )
            return self._scaled_step(closure)
        finally:
            if factor != 1.0:  # the gradients read after the step are the ones backward left
                self._scale_gradients(1.0 / factor)

    def _scale_gradients(self, factor: float) -> None:
        with torch.no_grad():
            for group in self.optimizer.param_groups:
                for parameter in group["params"]:
                    if parameter.grad is not None:
                        parameter.grad.mul_(factor)

    def _scaled_step(self, closure: Any) -> Any:
        stepped = False
        instance_attrs = self.optimizer.__dict__
        patched_before = instance_attrs.get("step")  # e.g. an LR scheduler's step counter wrapper
        original_step = self.optimizer.step

        def recording_step(*args: Any, **kwargs: Any) -> Any:
            nonlocal stepped
            stepped = True
            return original_step(*args, **kwargs)

        self.optimizer.step = recording_step
        try:
            if closure is not None:
                result = self.scaler.step(self.optimizer, closure)
            else:
                result = self.scaler.step(self.optimizer)
            self.scaler.update()
        finally:
            if patched_before is not None:
                instance_attrs["step"] = patched_before
            else:
                instance_attrs.pop("step", None)
            self._unscaled = False
        self._is_overflow = not stepped
        return result

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last `step` was skipped: fp16 gradients overflowed, or (fault tolerance) the
        quorum did not commit it."""
        return self._is_overflow

    @property
    def is_overflow(self) -> bool:
        """Same as `step_was_skipped`: the last step was skipped for fp16 overflow."""
        return self._is_overflow

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


def move_to_device(state: Any, device: Any) -> Any:
    """Every tensor of a (nested) optimizer state moved to `device`, structure kept.

    Example:
        >>> move_to_device({"exp_avg": torch.zeros(2)}, "cpu")["exp_avg"].device
        device(type='cpu')

    Args:
        state (Any): An optimizer state, or any nesting of tensors.
        device (Any): Where the tensors go.

    Returns:
        The same structure on `device`.
    """
    return send_to_device(state, device)


def patch_optimizer_step(accelerated_optimizer: Any, method: Any) -> Any:
    """`method` (an optimizer's `step`) wrapped to record on `accelerated_optimizer` that it ran
    (`_accelerate_step_called = True`); a grad scaler that skips the step never calls it.

    Args:
        accelerated_optimizer (Any): The `AcceleratedOptimizer` that notes the call.
        method (Any): The wrapped optimizer's bound `step`.

    Returns:
        The replacement `step`, taking the same arguments.
    """

    def patched_step(*args: Any, **kwargs: Any) -> Any:
        accelerated_optimizer._accelerate_step_called = True
        return method(*args, **kwargs)

    return patched_step
