"""The strategy interface, and its single-process implementation (no wrapping, no communication)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch


class Strategy:
    """Single process: the model is used as it is."""

    name = "single"

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator

    def wrap_model(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        return model

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def is_wrapped(self, model: Any) -> bool:
        return False

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def trigger_sync_in_backward(self, model: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        loss.backward(**kwargs)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # -- hooks of the sharded and engine backends (FSDP, tensor parallel, DeepSpeed) -----------------
    # Whether Accelerator.backward divides the loss by the accumulation steps (DeepSpeed's engine does).
    divides_loss_for_accumulation = True
    # Whether models and optimizers are checkpointed by save_sharded_state / load_sharded_state.
    saves_sharded_state = False

    def prepare_group(
        self, objects: list[Any], kinds: list[str], placements: list[Any]
    ) -> list[Any] | None:
        """Prepare all objects of one prepare() call together (an engine); None: one by one as usual."""
        return None

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Point an optimizer built before prepare() at the parameters that sharding put in the model."""

    def state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's whole state dict (on sharded backends: complete on the main process, on CPU)."""
        return (self.accelerator.unwrap_model(model) if unwrap else model).state_dict()

    def save_sharded_state(
        self, directory: Any, models: list[Any], optimizers: list[Any]
    ) -> list[str]:
        raise NotImplementedError(f"The {self.name} strategy saves models with the regular files.")

    def load_sharded_state(self, directory: Any, models: list[Any], optimizers: list[Any]) -> None:
        raise NotImplementedError(f"The {self.name} strategy loads models from the regular files.")
