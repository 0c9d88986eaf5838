"""One strategy per backend: how a model is wrapped, synchronised, unwrapped and clipped."""

from __future__ import annotations

from typing import Any

from ..enums import DistributedType
from .base import Strategy


def select_strategy(accelerator: Any) -> Strategy:
    distributed_type = accelerator.distributed_type
    if distributed_type == DistributedType.FSDP:
        from .fsdp import create_fsdp_strategy

        return create_fsdp_strategy(accelerator)
    if distributed_type == DistributedType.DEEPSPEED:
        from .deepspeed import DeepSpeedStrategy

        return DeepSpeedStrategy(accelerator)
    parallelism = getattr(accelerator.state, "parallelism_config", None)
    if parallelism is not None and parallelism.tp_enabled:
        from .tp import TPStrategy

        return TPStrategy(accelerator)
    if accelerator.use_distributed:
        from .ddp import DDPStrategy

        return DDPStrategy(accelerator)
    return Strategy(accelerator)
