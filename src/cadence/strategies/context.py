"""What a strategy is told about this process and the training, once, when it is built.

A strategy never sees the Accelerator: it receives this record (device, ranks, plugins, handlers), the
precision it owns, and the `PreparedObjects` registry it may read (FSDP1 broadcasts, DeepSpeed registers
its engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..core.enums import DistributedType


@dataclass(frozen=True)
class StrategyContext:
    """The facts a strategy needs, resolved before the first model is prepared.

    Example::

        context = StrategyContext(device=torch.device("cpu"), process_index=0, num_processes=1,
                                  distributed_type=DistributedType.NO, mixed_precision="no")
    """

    device: torch.device
    process_index: int
    num_processes: int
    distributed_type: DistributedType
    mixed_precision: str
    fsdp_plugin: Any = None
    deepspeed_plugin: Any = None
    # Several named DeepSpeed plugins (`Accelerator(deepspeed_plugins={...})`): the one selected when a
    # model is prepared (`AcceleratorState.select_deepspeed_plugin`) configures its engine.
    deepspeed_plugins: Any = None
    parallelism_config: Any = None
    ddp_handler: Any = None
    # Needed by engines that build data loaders and schedulers themselves (DeepSpeed).
    split_batches: bool = False
    step_scheduler_with_optimizer: bool = True

    @property
    def use_distributed(self) -> bool:
        """Whether more than one process takes part."""
        return self.num_processes > 1 and self.distributed_type != DistributedType.NO

    @property
    def is_main_process(self) -> bool:
        """Whether this is global rank 0."""
        return self.process_index == 0

    @classmethod
    def of_state(
        cls,
        state: Any,
        *,
        ddp_handler: Any = None,
        split_batches: bool = False,
        step_scheduler_with_optimizer: bool = True,
    ) -> StrategyContext:
        """The context of an `AcceleratorState` (device, ranks, backend, precision, plugins)."""
        return cls(
            device=state.device,
            process_index=state.process_index,
            num_processes=state.num_processes,
            distributed_type=state.distributed_type,
            mixed_precision=state.mixed_precision,
            fsdp_plugin=state.fsdp_plugin,
            deepspeed_plugin=state.deepspeed_plugin,
            deepspeed_plugins=getattr(state, "deepspeed_plugins", None),
            parallelism_config=state.parallelism_config,
            ddp_handler=ddp_handler,
            split_batches=split_batches,
            step_scheduler_with_optimizer=step_scheduler_with_optimizer,
        )
