"""Mixed precision policies: the autocast context, the fp32 output wrapper and the gradient scaler."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

from .ops import recursively_apply

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _to_fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def convert_outputs_to_fp32(model_forward: Any) -> Any:
    """`model_forward` wrapped so its fp16/bf16 tensor outputs come back in fp32."""

    @functools.wraps(model_forward)
    def forward_in_fp32(*args: Any, **kwargs: Any) -> Any:
        return recursively_apply(_to_fp32, model_forward(*args, **kwargs))

    forward_in_fp32._cadence_wrapped_forward = model_forward  # type: ignore[attr-defined]
    return forward_in_fp32


@dataclass
class PrecisionPolicy:
    mixed_precision: str
    device_type: str
    autocast_kwargs: dict[str, Any]
    scaler: Any = None

    @classmethod
    def create(
        cls,
        mixed_precision: str,
        device: torch.device,
        scaler_handler: Any = None,
        autocast_handler: Any = None,
        fp8_handler: Any = None,
    ) -> PrecisionPolicy:
        if mixed_precision == "fp8":
            _require_fp8_backend(device)
        kwargs = autocast_handler.to_kwargs() if autocast_handler is not None else {}
        scaler = None
        if mixed_precision == "fp16":
            scaler_kwargs = scaler_handler.to_kwargs() if scaler_handler is not None else {}
            scaler = torch.amp.GradScaler(device.type, **scaler_kwargs)
        return cls(mixed_precision, device.type, kwargs, scaler)

    @property
    def enabled(self) -> bool:
        return self.mixed_precision in _AUTOCAST_DTYPES

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager:
        """The autocast context of this policy (a no-op without mixed precision)."""
        if not self.enabled:
            return contextlib.nullcontext()
        kwargs = dict(self.autocast_kwargs)
        if autocast_handler is not None:
            kwargs.update(autocast_handler.to_kwargs())
        kwargs.setdefault("enabled", True)
        if kwargs.get("cache_enabled", 0) is None:
            kwargs.pop("cache_enabled")
        return torch.autocast(
            device_type=self.device_type, dtype=_AUTOCAST_DTYPES[self.mixed_precision], **kwargs
        )

    def wrap_forward(self, model: torch.nn.Module) -> None:
        """Run `model.forward` under autocast and hand back fp32 outputs (the reference's behaviour)."""
        if not self.enabled or hasattr(model.forward, "_cadence_wrapped_forward"):
            return
        original = model.forward
        autocast_forward = self._autocast_forward(original)
        model.forward = convert_outputs_to_fp32(autocast_forward)
        model._cadence_original_forward = original  # type: ignore[attr-defined]

    def _autocast_forward(self, forward: Any) -> Any:
        policy = self

        @functools.wraps(forward)
        def under_autocast(*args: Any, **kwargs: Any) -> Any:
            with policy.autocast():
                return forward(*args, **kwargs)

        return under_autocast


def remove_forward_wrapper(model: torch.nn.Module) -> None:
    original = model.__dict__.pop("_cadence_original_forward", None)
    if original is not None:
        if (
            getattr(original, "__self__", None) is model
            and original.__func__ is type(model).forward
        ):
            model.__dict__.pop("forward", None)
        else:
            model.forward = original


def require_fp8_package() -> None:
    """Fail (before any process group exists) when no FP8 backend package is installed."""
    has_te = importlib.util.find_spec("transformer_engine") is not None
    has_ao = importlib.util.find_spec("torchao") is not None
    if not (has_te or has_ao):
        raise ImportError(
            "mixed_precision='fp8' needs an FP8 backend: install torchao (`pip install torchao`) or "
            "NVIDIA Transformer Engine."
        )


def _require_fp8_backend(device: torch.device) -> None:
    require_fp8_package()
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        raise RuntimeError(
            "mixed_precision='fp8' needs an NVIDIA GPU with compute capability 8.9 or newer (Ada, "
            f"Hopper); this process runs on {device}. Use mixed_precision='bf16' instead."
        )
    raise NotImplementedError(
        "FP8 training through torchao/Transformer Engine is not wired into Cadence yet; use 'bf16'."
    )
