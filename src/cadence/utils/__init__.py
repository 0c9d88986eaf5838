"""The public `cadence.utils` namespace (names resolved on first use)."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # collectives and device moves
    "gather": "cadence.ops",
    "gather_object": "cadence.ops",
    "reduce": "cadence.ops",
    "broadcast": "cadence.ops",
    "broadcast_object_list": "cadence.ops",
    "pad_across_processes": "cadence.ops",
    "send_to_device": "cadence.ops",
    "concatenate": "cadence.ops",
    "recursively_apply": "cadence.ops",
    "honor_type": "cadence.ops",
    "DistributedOperationException": "cadence.ops",
    # randomness
    "set_seed": "cadence.utils.random",
    "synchronize_rng_state": "cadence.utils.random",
    "synchronize_rng_states": "cadence.utils.random",
    # enums and configuration
    "DistributedType": "cadence.enums",
    "PrecisionType": "cadence.enums",
    "RNGType": "cadence.enums",
    "LoggerType": "cadence.enums",
    "DynamoBackend": "cadence.enums",
    "DDPCommunicationHookType": "cadence.enums",
    "ComputeEnvironment": "cadence.enums",
    "DataLoaderConfiguration": "cadence.configs",
    "ProjectConfiguration": "cadence.configs",
    "GradientAccumulationPlugin": "cadence.configs",
    "TorchDynamoPlugin": "cadence.configs",
    "KwargsHandler": "cadence.kwargs",
    "AutocastKwargs": "cadence.kwargs",
    "DistributedDataParallelKwargs": "cadence.kwargs",
    "GradScalerKwargs": "cadence.kwargs",
    "InitProcessGroupKwargs": "cadence.kwargs",
    "ProfileKwargs": "cadence.kwargs",
    "FP8RecipeKwargs": "cadence.kwargs",
    # sharded and model-parallel training
    "FullyShardedDataParallelPlugin": "cadence.plugins",
    "DeepSpeedPlugin": "cadence.plugins",
    "HfDeepSpeedConfig": "cadence.plugins",
    "DummyOptim": "cadence.plugins",
    "DummyScheduler": "cadence.plugins",
    "TorchTensorParallelPlugin": "cadence.plugins",
    "TorchTensorParallelConfig": "cadence.plugins",
    "TorchContextParallelConfig": "cadence.plugins",
    "ParallelismConfig": "cadence.plugins",
    "MegatronLMPlugin": "cadence.plugins",
    "merge_fsdp_weights": "cadence.commands.merge_weights",
    # progress, memory
    "tqdm": "cadence.utils.tqdm",
    "find_executable_batch_size": "cadence.utils.memory",
    "release_memory": "cadence.utils.memory",
    "clear_device_cache": "cadence.utils.memory",
    # which tracker packages are installed
    "is_tensorboard_available": "cadence.tracking.registry",
    "is_wandb_available": "cadence.tracking.registry",
    "is_comet_ml_available": "cadence.tracking.registry",
    "is_aim_available": "cadence.tracking.registry",
    "is_mlflow_available": "cadence.tracking.registry",
    "is_clearml_available": "cadence.tracking.registry",
    "is_dvclive_available": "cadence.tracking.registry",
    "is_swanlab_available": "cadence.tracking.registry",
    "is_trackio_available": "cadence.tracking.registry",
    # data
    "skip_first_batches": "cadence.data",
    "find_batch_size": "cadence.data.batches",
    "ignorant_find_batch_size": "cadence.data.batches",
    "slice_tensors": "cadence.data.batches",
    "get_data_structure": "cadence.data.batches",
    "initialize_tensors": "cadence.data.batches",
    "TensorInformation": "cadence.data.batches",
    # big-model inference (issue 16)
    "infer_auto_device_map": "cadence.utils.modeling",
    "load_checkpoint_in_model": "cadence.utils.modeling",
    "load_state_dict": "cadence.utils.modeling",
    "get_balanced_memory": "cadence.utils.modeling",
    "get_max_memory": "cadence.utils.modeling",
    "get_max_layer_size": "cadence.utils.modeling",
    "compute_module_sizes": "cadence.utils.modeling",
    "calculate_maximum_sizes": "cadence.utils.modeling",
    "convert_file_size_to_int": "cadence.utils.modeling",
    "dtype_byte_size": "cadence.utils.modeling",
    "named_module_tensors": "cadence.utils.modeling",
    "check_device_map": "cadence.utils.modeling",
    "set_module_tensor_to_device": "cadence.utils.modeling",
    "find_tied_parameters": "cadence.utils.modeling",
    "retie_parameters": "cadence.utils.modeling",
    "check_tied_parameters_in_config": "cadence.utils.modeling",
    "check_tied_parameters_on_same_device": "cadence.utils.modeling",
    "has_offloaded_params": "cadence.utils.modeling",
    "align_module_device": "cadence.utils.modeling",
    "id_tensor_storage": "cadence.utils.modeling",
    "is_peft_model": "cadence.utils.modeling",
    "load_offloaded_weights": "cadence.utils.modeling",
    "offload_weight": "cadence.utils.offload",
    "load_offloaded_weight": "cadence.utils.offload",
    "offload_state_dict": "cadence.utils.offload",
    "save_offload_index": "cadence.utils.offload",
    "OffloadedWeightsLoader": "cadence.utils.offload",
    "PrefixedDataset": "cadence.utils.offload",
    "extract_submodules_state_dict": "cadence.utils.offload",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cadence.utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
