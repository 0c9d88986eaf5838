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
