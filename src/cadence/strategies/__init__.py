"""One strategy per backend: how a model is wrapped, synchronised, unwrapped, clipped and saved.

`select_strategy` is the one function that chooses the strategy and, with it, its precision policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..core.enums import DistributedType
from ..core.prepared import PreparedObjects
from ..precision.choice import PrecisionChoice
from ..precision.policy import (
    AutocastPrecision,
    EnginePrecision,
    Precision,
    ShardedAutocastPrecision,
)
from ..runtime.state import GradientState
from .base import Strategy
from .context import StrategyContext

if TYPE_CHECKING:
    from ..precision.fp8 import Float8Precision

__all__ = ["Strategy", "StrategyContext", "select_strategy", "select_precision"]


def select_precision(context: StrategyContext, choice: PrecisionChoice) -> Precision:
    """The precision policy of the backend in `context` for `choice` (parsed and checked once, in the
    Accelerator's settings; only the device this process got is checked here)."""
    if context.distributed_type == DistributedType.DEEPSPEED:
        return EnginePrecision(context.mixed_precision)
    capability = None
    if choice.mixed_precision == "fp8" and context.device.type == "cuda":
        capability = torch.cuda.get_device_capability(
            context.device
        )  # this worker uses CUDA anyway
    choice.check_device(context.device.type, capability)
    if choice.mixed_precision == "no":
        return Precision()
    if choice.mixed_precision == "fp8":
        return _float8_precision(context, choice)
    if context.distributed_type == DistributedType.XLA:  # bf16 through torch.autocast("xla")
        return AutocastPrecision.build(choice, context.device)
    sharded = context.distributed_type == DistributedType.FSDP or (
        context.parallelism_config is not None and context.parallelism_config.tp_enabled
    )
    policy = ShardedAutocastPrecision if sharded and context.use_distributed else AutocastPrecision
    return policy.build(choice, context.device)


def _float8_precision(context: StrategyContext, choice: PrecisionChoice) -> Float8Precision:
    from ..precision.fp8 import Float8Precision  # deferred: FP8 conversion loads only for fp8

    fsdp = context.distributed_type == DistributedType.FSDP
    fsdp2 = fsdp and context.fsdp_plugin.fsdp_version == 2
    policy = Float8Precision.build_fp8(choice, context.device, fsdp2=fsdp2)
    if policy.backend == "AO" and fsdp and context.fsdp_plugin.cpu_ram_efficient_loading:
        raise ValueError(
            "torchao FP8 with FSDP and cpu_ram_efficient_loading is not supported (the float8 layers "
            "cannot be filled from the main process's weights): set cpu_ram_efficient_loading=False."
        )
    return policy


def select_strategy(
    context: StrategyContext,
    choice: PrecisionChoice,
    prepared: PreparedObjects,
    gradient_state: GradientState,
) -> Strategy:
    """The strategy for the backend in `context`, holding the precision policy chosen for it."""
    precision = select_precision(context, choice)
    distributed_type = context.distributed_type
    if distributed_type == DistributedType.XLA:
        from .xla import XLAStrategy  # deferred: torch_xla loads only when an XLA device is used

        return XLAStrategy(context, precision, prepared)
    parallelism = context.parallelism_config
    if parallelism is not None and getattr(parallelism, "pp_enabled", False):
        from .pipeline.strategy import (  # deferred: torch.distributed.pipelining only when pp is on
            PipelineStrategy,
        )

        return PipelineStrategy(context, precision, prepared, gradient_state=gradient_state)
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
