"""One strategy per backend: how a model is wrapped, synchronised, unwrapped and clipped."""

from __future__ import annotations

from typing import Any

from ..enums import DistributedType
from .base import Strategy


def select_strategy(accelerator: Any) -> Strategy:
    distributed_type = accelerator.distributed_type
    if distributed_type == DistributedType.FSDP:
        from .fsdp import FSDPStrategy

        return FSDPStrategy(accelerator)
    if distributed_type == DistributedType.DEEPSPEED:
        from .deepspeed import DeepSpeedStrategy

        return DeepSpeedStrategy(accelerator)
    if accelerator.use_distributed:
        from .ddp import DDPStrategy

        return DDPStrategy(accelerator)
    return Strategy(accelerator)
