"""Start this replica group's fault-tolerant session when the settings ask for one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .config import FaultToleranceConfig


def start_fault_tolerance(
    config: FaultToleranceConfig | None,
    *,
    device: torch.device,
    group_rank: int,
    group_world_size: int,
    group_barrier: Callable[[], None] | None,
    syncing: Callable[[], bool] | None = None,
    registered: list[Any] | None = None,
) -> Any:
    """The group's `FaultTolerantSession` (joined to the Lighthouse), or None when `config` is None.
    `syncing` says whether the current micro-batch ends the optimizer step's window; `registered`
    is the list of objects registered for checkpointing (they heal with the model).

    torchft loads here, only when fault tolerance is on.
    """
    if config is None:
        return None
    from .session import FaultTolerantSession  # deferred: imports torchft, an optional dependency

    return FaultTolerantSession(
        config,
        device=device,
        group_rank=group_rank,
        group_world_size=group_world_size,
        group_barrier=group_barrier if group_world_size > 1 else None,
        syncing=syncing,
        registered=registered,
    )
