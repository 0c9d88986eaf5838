"""Cadence: one PyTorch training script on a CPU, a GPU, many processes or many machines.

Public names are imported on first use, so `import cadence` costs almost nothing beyond `import torch`.
"""

from __future__ import annotations

from cadence.lazy_exports import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "Accelerator": "cadence.accelerator",
    "PartialState": "cadence.state",
    "AcceleratorState": "cadence.state",
    "GradientState": "cadence.state",
    "DistributedType": "cadence.enums",
    "PrecisionType": "cadence.enums",
    "RNGType": "cadence.enums",
    "LoggerType": "cadence.enums",
    "DynamoBackend": "cadence.enums",
    "DDPCommunicationHookType": "cadence.enums",
    "DataLoaderConfiguration": "cadence.dataclasses",
    "ProjectConfiguration": "cadence.dataclasses",
    "GradientAccumulationPlugin": "cadence.dataclasses",
    "TorchDynamoPlugin": "cadence.dataclasses",
    "AutocastKwargs": "cadence.dataclasses",
    "DistributedDataParallelKwargs": "cadence.dataclasses",
    "GradScalerKwargs": "cadence.dataclasses",
    "InitProcessGroupKwargs": "cadence.dataclasses",
    "ProfileKwargs": "cadence.dataclasses",
    "FP8RecipeKwargs": "cadence.dataclasses",
    "skip_first_batches": "cadence.data",
    "notebook_launcher": "cadence.launchers",
    "debug_launcher": "cadence.launchers",
    "find_executable_batch_size": "cadence.utils.memory",
    "get_logger": "cadence.logging",
    "FullyShardedDataParallelPlugin": "cadence.plugins",
    "DeepSpeedPlugin": "cadence.plugins",
    "ParallelismConfig": "cadence.plugins",
    "synchronize_rng_states": "cadence.utils.random",
    "is_rich_available": "cadence.availability",
    # big-model inference (issue 16)
    "init_empty_weights": "cadence.big_modeling",
    "init_on_device": "cadence.big_modeling",
    "dispatch_model": "cadence.big_modeling",
    "load_checkpoint_and_dispatch": "cadence.big_modeling",
    "load_checkpoint_in_model": "cadence.big_modeling",
    "cpu_offload": "cadence.big_modeling",
    "cpu_offload_with_hook": "cadence.big_modeling",
    "disk_offload": "cadence.big_modeling",
    "infer_auto_device_map": "cadence.big_modeling",
    "prepare_pippy": "cadence.inference",
    # the opt-in `accelerate` alias (issue 23)
    "as_accelerate": "cadence.alias",
}

# The reference's package submodules, attributes once used (code reaches them that way), never
# imported by `import cadence` itself.
_SUBMODULES = (
    "accelerator", "big_modeling", "checkpointing", "commands", "data_loader", "hooks", "inference",
    "launchers", "local_sgd", "logging", "memory_utils", "optimizer", "parallelism_config",
    "scheduler", "state", "test_utils", "tracking", "utils",
)  # fmt: skip

__all__ = sorted(_EXPORTS) + ["__version__"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, submodules=_SUBMODULES)
