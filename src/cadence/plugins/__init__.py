"""Settings objects for sharded and model-parallel training (FSDP, DeepSpeed, tensor parallel, meshes).

Names resolve on first use, so importing `cadence.plugins` does not import torch.distributed.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "FullyShardedDataParallelPlugin": "cadence.plugins.fsdp",
    "DeepSpeedPlugin": "cadence.plugins.deepspeed",
    "DeepSpeedConfig": "cadence.plugins.deepspeed",
    "HfDeepSpeedConfig": "cadence.plugins.deepspeed",
    "DummyOptim": "cadence.plugins.deepspeed",
    "DummyScheduler": "cadence.plugins.deepspeed",
    "ParallelismConfig": "cadence.plugins.parallelism",
    "TorchTensorParallelPlugin": "cadence.plugins.parallelism",
    "TorchTensorParallelConfig": "cadence.plugins.parallelism",
    "TorchContextParallelConfig": "cadence.plugins.parallelism",
    "DeepSpeedSequenceParallelConfig": "cadence.plugins.parallelism",
    "MegatronLMPlugin": "cadence.plugins.megatron",
}
_ALIASES = {"HfDeepSpeedConfig": "DeepSpeedConfig"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cadence.plugins' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _ALIASES.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
