"""Mixed precision, owned by the strategy: autocast, fp32 outputs and loss scaling, built from the
`PrecisionChoice` that `choice.choose_precision` made (nothing here parses or checks the name again).

Four policies, chosen with the strategy by `cadence.strategies.select_strategy`:

- `Precision`: full precision; no autocast, no scaler.
- `AutocastPrecision`: bf16/fp16 autocast around `forward`, fp32 outputs; fp16 adds a `GradScaler`.
- `ShardedAutocastPrecision`: the same, with torch's `ShardedGradScaler` (sharded backends: each rank sees
  only its gradient shards, so the overflow flag must be all-reduced for every rank to skip together).
- `EnginePrecision`: an engine (DeepSpeed) casts and scales itself; Cadence adds nothing.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any

import torch

from ..core.nested import recursively_apply
from .choice import PrecisionChoice

# fp8 runs its converted linears in float8 and everything else under bf16 autocast (the reference's way).
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _to_fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in _LOW_PRECISION else tensor


def convert_outputs_to_fp32(model_forward: Any) -> Any:
    """Wrap `model_forward` so that every fp16/bf16 tensor it returns comes back as fp32.

    Example::

        model.forward = convert_outputs_to_fp32(model.forward)

    Args:
        model_forward (Any): The forward function to wrap.

    Returns:
        The wrapped forward, taking the same arguments.
    """

    @functools.wraps(model_forward)
    def forward_in_fp32(*args: Any, **kwargs: Any) -> Any:
        outputs = model_forward(*args, **kwargs)
        if (
            type(outputs) is torch.Tensor
        ):  # the common case: one plain tensor, no walk over containers
            return outputs.float() if outputs.dtype in _LOW_PRECISION else outputs
        return recursively_apply(_to_fp32, outputs)

    forward_in_fp32._cadence_wrapped_forward = model_forward  # type: ignore[attr-defined]
    return forward_in_fp32


class Precision:
    """Full precision: the model runs in its own dtype; no autocast, no loss scaling."""

    mixed_precision = "no"
    scaler: Any = None

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager:
        """The autocast context of this policy (a no-op here)."""
        return contextlib.nullcontext()

    def convert_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Swap the model's layers for this policy's kind before it is placed and wrapped (fp8 swaps its
        linears); the others return the model as it is."""
        return model

    def attach_optimizer(self, optimizer: torch.optim.Optimizer, models: list[Any]) -> None:
        """Hook the prepared optimizer into this policy (fp8 with FSDP2 refreshes its scales after a step)."""

    def wrap_forward(self, model: torch.nn.Module) -> None:
        """Make `model.forward` run under this policy (nothing to do here)."""

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on (scaled for fp16)."""
        return loss

    @property
    def casts_parameters(self) -> bool:
        """Whether the forward computes in a lower precision than the fp32 master weights."""
        return False


class AutocastPrecision(Precision):
    """bf16 / fp16 through `torch.autocast` on `forward`, outputs cast back to fp32; fp16 scales the loss."""

    def __init__(
        self,
        mixed_precision: str,
        device_type: str,
        autocast_kwargs: dict[str, Any] | None = None,
        scaler: Any = None,
    ) -> None:
        self.mixed_precision = mixed_precision
        self.device_type = device_type
        self.autocast_kwargs = dict(autocast_kwargs or {})
        self.scaler = scaler

    @classmethod
    def build(cls, choice: PrecisionChoice, device: torch.device) -> AutocastPrecision:
        """The policy for `choice` on `device` (with a GradScaler for fp16)."""
        handler = choice.autocast_handler
        kwargs = handler.to_kwargs() if handler is not None else {}
        return cls(choice.mixed_precision, device.type, kwargs, cls._scaler(choice, device))

    @staticmethod
    def _scaler(choice: PrecisionChoice, device: torch.device) -> Any:
        if choice.mixed_precision != "fp16":
            return None
        handler = choice.scaler_handler
        return torch.amp.GradScaler(device.type, **(handler.to_kwargs() if handler else {}))

    @property
    def casts_parameters(self) -> bool:
        """Always True: this policy runs the forward pass under autocast."""
        return True

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager:
        """A `torch.autocast` context for the chosen dtype; `autocast_handler` overrides kwargs."""
        kwargs = dict(self.autocast_kwargs)
        if autocast_handler is not None:
            kwargs.update(autocast_handler.to_kwargs())
        kwargs.setdefault("enabled", True)
        if kwargs.get("cache_enabled", 0) is None:
            kwargs.pop("cache_enabled")
        return torch.autocast(
            device_type=self.device_type, dtype=AUTOCAST_DTYPES[self.mixed_precision], **kwargs
        )

    def _autocast_factory(self) -> Any:
        """A function giving a new autocast context, its arguments resolved once (not on every step)."""
        kwargs = dict(self.autocast_kwargs)
        kwargs.setdefault("enabled", True)
        if kwargs.get("cache_enabled", 0) is None:
            kwargs.pop("cache_enabled")
        return functools.partial(
            torch.autocast,
            device_type=self.device_type,
            dtype=AUTOCAST_DTYPES[self.mixed_precision],
            **kwargs,
        )

    def wrap_forward(self, model: torch.nn.Module) -> None:
        """Run `model.forward` under autocast and hand back fp32 outputs (Accelerate's behaviour)."""
        if hasattr(model.forward, "_cadence_wrapped_forward"):
            return
        original = model.forward
        model.forward = convert_outputs_to_fp32(_under_autocast(self._autocast_factory(), original))
        model._cadence_original_forward = original  # type: ignore[attr-defined]

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss multiplied by the grad scaler (fp16), else unchanged."""
        return loss if self.scaler is None else self.scaler.scale(loss)


class ShardedAutocastPrecision(AutocastPrecision):
    """Autocast with torch's `ShardedGradScaler`: ranks that each hold a gradient shard agree on skipping."""

    @staticmethod
    def _scaler(choice: PrecisionChoice, device: torch.device) -> Any:
        if choice.mixed_precision != "fp16":
            return None
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        handler = choice.scaler_handler
        return ShardedGradScaler(device.type, **(handler.to_kwargs() if handler else {}))


class EnginePrecision(Precision):
    """The engine (DeepSpeed) casts and scales itself; `mixed_precision` reports what its config enables."""

    def __init__(self, mixed_precision: str) -> None:
        self.mixed_precision = mixed_precision


def _under_autocast(new_context: Any, forward: Any) -> Any:
    # One autocast context per thread, reused step after step: building it (argument checks, device
    # queries) is most of the wrapper's cost. `torch.autocast` keeps the state to restore on the
    # instance, so a context in use is taken out while the forward runs: a re-entrant call, or another
    # thread (DataParallel replicas share this wrapper), gets one of its own.
    idle = threading.local()

    @functools.wraps(forward)
    def under_autocast(*args: Any, **kwargs: Any) -> Any:
        context = idle.__dict__.pop("context", None) or new_context()
        try:
            with context:
                return forward(*args, **kwargs)
        finally:
            idle.context = context

    return under_autocast


def remove_forward_wrapper(model: torch.nn.Module) -> None:
    """Undo `wrap_forward`: give the model back its own `forward`."""
    original = model.__dict__.pop("_cadence_original_forward", None)
    if original is None and hasattr(model.__dict__.get("forward"), "_cadence_wrapped_forward"):
        # A forward wrapped by hand, the reference's way: `model._original_forward = model.forward`
        # then `model.forward = convert_outputs_to_fp32(model.forward)`.
        original = model.__dict__.pop("_original_forward", None)
    if original is not None:
        if (
            getattr(original, "__self__", None) is model
            and original.__func__ is type(model).forward
        ):
            model.__dict__.pop("forward", None)
        else:
            model.forward = original
