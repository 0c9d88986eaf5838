"""The process's autocast context and loss scaler, for scripts that drive mixed precision by hand
(`cadence.utils.get_mixed_precision_context_manager`, `get_grad_scaler`): both read the precision and
the device from the process state; the Accelerator's own policy is the strategy's `Precision`."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..core.enums import DistributedType
from ..precision.policy import AUTOCAST_DTYPES
from .state import AcceleratorState


def get_mixed_precision_context_manager(
    native_amp: bool = False, autocast_kwargs: Any = None
) -> Any:
    """The autocast context of the current process's mixed precision (a no-op context when
    `native_amp` is False or the precision is "no").

    Example::

        with get_mixed_precision_context_manager(native_amp=True):
            outputs = model(inputs)

    Args:
        native_amp (bool): Whether the precision runs through torch's autocast (default False).
        autocast_kwargs (Any): An `AutocastKwargs` whose options go to `torch.autocast`; None uses its
            defaults.

    Returns:
        A context manager.
    """
    state = AcceleratorState()
    if not native_amp or state.mixed_precision not in AUTOCAST_DTYPES:
        return contextlib.nullcontext()
    kwargs = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
    return torch.autocast(
        device_type=state.device.type, dtype=AUTOCAST_DTYPES[state.mixed_precision], **kwargs
    )


def get_grad_scaler(distributed_type: Any = None, **kwargs: Any) -> Any:
    """A gradient scaler for this process's device: torch's `ShardedGradScaler` under FSDP, else
    `torch.amp.GradScaler` (`kwargs` go to the scaler).

    Example::

        scaler = get_grad_scaler(init_scale=1024)

    Args:
        distributed_type (Any): The job's `DistributedType`; `DistributedType.FSDP` gives the sharded
            scaler.
        **kwargs: Passed to the scaler (init_scale, growth_factor ...).

    Returns:
        The scaler.
    """
    device_type = AcceleratorState().device.type
    if distributed_type == DistributedType.FSDP:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler  # heavy

        return ShardedGradScaler(device_type, **kwargs)
    return torch.amp.GradScaler(device_type, **kwargs)
