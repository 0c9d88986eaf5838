"""Settings objects for sharded and model-parallel training (FSDP, DeepSpeed, tensor parallel, meshes).

Names resolve on first use, so importing `cadence.plugins` does not import torch.distributed.
"""

from __future__ import annotations

from cadence.core.lazy_exports import lazy_exports

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
    "PipelineParallelConfig": "cadence.plugins.pipeline",
    "MegatronLMPlugin": "cadence.plugins.megatron",
}
_ALIASES = {"HfDeepSpeedConfig": "DeepSpeedConfig"}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _ALIASES)
