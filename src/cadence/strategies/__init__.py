"""One strategy per backend: how a model is wrapped, synchronised, unwrapped, clipped and saved.

`select_strategy` is the one function that chooses the strategy and, with it, its precision policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..core.enums import DistributedType
from ..core.prepared import PreparedObjects
from ..precision.choice import fp8_handler_backend
from ..precision.policy import (
    AutocastPrecision,
    EnginePrecision,
    Precision,
    PrecisionRequest,
    ShardedAutocastPrecision,
    check_precision_supported,
)
from ..runtime.state import GradientState
from .base import Strategy
from .context import StrategyContext

if TYPE_CHECKING:
    from ..precision.fp8 import Float8Precision

__all__ = ["Strategy", "StrategyContext", "select_strategy", "select_precision"]


def select_precision(context: StrategyContext, request: PrecisionRequest) -> Precision:
    """The precision policy of the backend in `context` for what `request` asks."""
    if context.distributed_type == DistributedType.DEEPSPEED:
        check_precision_supported(request.mixed_precision, device_type=None, engine="deepspeed")
        return EnginePrecision(context.mixed_precision)
    capability = None
    if request.mixed_precision == "fp8" and context.device.type == "cuda":
        capability = torch.cuda.get_device_capability(
            context.device
        )  # this worker uses CUDA anyway
    check_precision_supported(
        request.mixed_precision,
        device_type=context.device.type,
        fp8_backend=fp8_handler_backend(request.fp8_handler),
        capability=capability,
    )
    if request.mixed_precision == "no":
        return Precision()
    if request.mixed_precision == "fp8":
        return _float8_precision(context, request)
    if context.distributed_type == DistributedType.XLA:  # bf16 through torch.autocast("xla")
        return AutocastPrecision.build(request, context.device)
    sharded = context.distributed_type == DistributedType.FSDP or (
        context.parallelism_config is not None and context.parallelism_config.tp_enabled
    )
    policy = ShardedAutocastPrecision if sharded and context.use_distributed else AutocastPrecision
    return policy.build(request, context.device)


def _float8_precision(context: StrategyContext, request: PrecisionRequest) -> Float8Precision:
    from ..precision.fp8 import Float8Precision  # deferred: FP8 conversion loads only for fp8

    fsdp = context.distributed_type == DistributedType.FSDP
    fsdp2 = fsdp and context.fsdp_plugin.fsdp_version == 2
    policy = Float8Precision.build_fp8(request, context.device, fsdp2=fsdp2)
    if policy.backend == "AO" and fsdp and context.fsdp_plugin.cpu_ram_efficient_loading:
        raise ValueError(
            "torchao FP8 with FSDP and cpu_ram_efficient_loading is not supported (the float8 layers "
            "cannot be filled from the main process's weights): set cpu_ram_efficient_loading=False."
        )
    return policy


def select_strategy(
    context: StrategyContext,
    request: PrecisionRequest,
    prepared: PreparedObjects,
    gradient_state: GradientState,
) -> Strategy:
    """The strategy for the backend in `context`, holding the precision policy chosen for it."""
    precision = select_precision(context, request)
    distributed_type = context.distributed_type
    if distributed_type == DistributedType.XLA:
        from .xla import XLAStrategy  # deferred: torch_xla loads only when an XLA device is used

        return XLAStrategy(context, precision, prepared)
    if distributed_type == DistributedType.FSDP:
        if context.fsdp_plugin.fsdp_version == 1:
            from .fsdp1 import FSDP1Strategy

            return FSDP1Strategy(context, precision, prepared)
        from .fsdp import FSDPStrategy

        return FSDPStrategy(context, precision, prepared)
    if distributed_type == DistributedType.DEEPSPEED:
        from .deepspeed import DeepSpeedStrategy

        return DeepSpeedStrategy(context, precision, prepared, gradient_state=gradient_state)
    parallelism = context.parallelism_config
    if parallelism is not None and parallelism.tp_enabled:
        from .tp import TPStrategy

        return TPStrategy(context, precision, prepared)
    if context.use_distributed:
        from .ddp import DDPStrategy

        return DDPStrategy(context, precision, prepared)
    return Strategy(context, precision, prepared)
