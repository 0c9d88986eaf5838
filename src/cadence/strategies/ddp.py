"""DistributedDataParallel: gradients are averaged across ranks during backward."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from .base import Strategy
from .ddp_hooks import register_comm_hook


class DDPStrategy(Strategy):
    name = "ddp"

    def wrap_model(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        if evaluation_mode or not any(p.requires_grad for p in model.parameters()):
            return model
        accelerator = self.accelerator
        handler = accelerator.ddp_handler
        kwargs = handler.to_kwargs() if handler is not None else {}
        for name in ("comm_hook", "comm_wrapper", "comm_state_option"):
            kwargs.pop(name, None)
        device = accelerator.device
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device.index])
            kwargs.setdefault("output_device", device.index)
        wrapped = DistributedDataParallel(model, **kwargs)
        register_comm_hook(wrapped, handler)
        return wrapped

    def is_wrapped(self, model: Any) -> bool:
        return isinstance(model, DistributedDataParallel)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager:
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: Any):
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        previous = (model.require_backward_grad_sync, model.require_forward_param_sync)
        model.require_backward_grad_sync = True
        model.require_forward_param_sync = True
        # Ask the reducer to expect every parameter's gradient in the coming backward.
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = previous
