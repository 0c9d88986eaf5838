"""Cadence: one PyTorch training script on a CPU, a GPU, many processes or many machines.

Public names are imported on first use, so `import cadence` costs almost nothing beyond `import torch`.
"""

from __future__ import annotations

from cadence.core.lazy_exports import REFERENCE_SUBMODULES, lazy_exports

__version__ = "0.1.0"

# The enums and option records that `cadence` and `cadence.utils` both export (as the reference's
# namespaces do): one table, which cadence.utils takes from here.
_CONFIGURATION_EXPORTS = {
    "DistributedType": "cadence.core.enums",
    "PrecisionType": "cadence.core.enums",
    "RNGType": "cadence.core.enums",
    "LoggerType": "cadence.core.enums",
    "DynamoBackend": "cadence.core.enums",
    "DDPCommunicationHookType": "cadence.core.enums",
    "DataLoaderConfiguration": "cadence.options.dataclasses",
    "ProjectConfiguration": "cadence.options.dataclasses",
    "GradientAccumulationPlugin": "cadence.options.dataclasses",
    "TorchDynamoPlugin": "cadence.options.dataclasses",
    "AutocastKwargs": "cadence.options.dataclasses",
    "DistributedDataParallelKwargs": "cadence.options.dataclasses",
    "GradScalerKwargs": "cadence.options.dataclasses",
    "InitProcessGroupKwargs": "cadence.options.dataclasses",
    "ProfileKwargs": "cadence.options.dataclasses",
    "FP8RecipeKwargs": "cadence.options.dataclasses",
}

_EXPORTS = {
    **_CONFIGURATION_EXPORTS,
    "Accelerator": "cadence.accelerator",
    "PartialState": "cadence.runtime.state",
    "AcceleratorState": "cadence.runtime.state",
    "GradientState": "cadence.runtime.state",
    "skip_first_batches": "cadence.data",
    "notebook_launcher": "cadence.launch.launchers",
    "debug_launcher": "cadence.launch.launchers",
    "find_executable_batch_size": "cadence.runtime.memory",
    "get_logger": "cadence.runtime.logging",
    "FullyShardedDataParallelPlugin": "cadence.plugins",
    "DeepSpeedPlugin": "cadence.plugins",
    "ParallelismConfig": "cadence.plugins",
    "synchronize_rng_states": "cadence.runtime.random",
    "is_rich_available": "cadence.core.availability",
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

__all__ = sorted(_EXPORTS) + ["__version__"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, submodules=REFERENCE_SUBMODULES[__name__])
