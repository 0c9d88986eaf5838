"""Accelerate's `utils.deepspeed` path (homes: `cadence.plugins.deepspeed`, `cadence.strategies.deepspeed`, `cadence.plugins.deepspeed_helpers`)."""

from __future__ import annotations

from ..plugins.deepspeed import (
    DeepSpeedConfig as HfDeepSpeedConfig,
)
from ..plugins.deepspeed import (
    DummyOptim,
    DummyScheduler,
)
from ..plugins.deepspeed_helpers import get_active_deepspeed_plugin, map_pytorch_optim_to_deepspeed
from ..strategies.deepspeed import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
)

__all__ = [
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "HfDeepSpeedConfig",
    "get_active_deepspeed_plugin",
    "map_pytorch_optim_to_deepspeed",
]
