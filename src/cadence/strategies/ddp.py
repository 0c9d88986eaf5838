"""DistributedDataParallel: gradients are averaged across ranks during backward."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from .base import Strategy
from .ddp_hooks import register_comm_hook


class DDPStrategy(Strategy):
    """DistributedDataParallel: every rank holds the whole model; backward averages gradients."""

    name = "ddp"
    # With ACCELERATE_ALLOW_CP_STANDALONE=true (checked when the plugins are resolved).
    runs_context_parallel = True

    def wrap_model(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        """Wrap a trainable model in DistributedDataParallel (handler options and hook)."""
        self.prepare_context_parallel(model)
        if evaluation_mode or not any(p.requires_grad for p in model.parameters()):
            return model
        handler = self.context.ddp_handler
        kwargs = handler.to_kwargs() if handler is not None else {}
        for name in ("comm_hook", "comm_wrapper", "comm_state_option"):
            kwargs.pop(name, None)
        device = self.context.device
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device.index])
            kwargs.setdefault("output_device", device.index)
        wrapped = DistributedDataParallel(model, **kwargs)
        register_comm_hook(wrapped, handler)
        return wrapped

    def is_wrapped(self, model: Any) -> bool:
        """Whether `model` is a DistributedDataParallel wrapper."""
        return isinstance(model, DistributedDataParallel)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module inside a DistributedDataParallel wrapper (else `model` itself)."""
        return model.module if isinstance(model, DistributedDataParallel) else model

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager:
        """DDP's `no_sync()` for a wrapped model: backward skips the all-reduce."""
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: Any):
        """Context making the next backward all-reduce gradients even inside `no_sync`."""
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
