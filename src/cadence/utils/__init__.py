"""The public `cadence.utils` namespace (names resolved on first use)."""

from __future__ import annotations

from cadence.lazy_exports import lazy_exports

_EXPORTS = {
    # collectives and device moves
    "gather": "cadence.collectives",
    "gather_object": "cadence.collectives",
    "reduce": "cadence.collectives",
    "broadcast": "cadence.collectives",
    "broadcast_object_list": "cadence.collectives",
    "pad_across_processes": "cadence.collectives",
    "send_to_device": "cadence.collectives",
    "concatenate": "cadence.collectives",
    "recursively_apply": "cadence.collectives",
    "honor_type": "cadence.collectives",
    "DistributedOperationException": "cadence.collectives",
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
    "DataLoaderConfiguration": "cadence.dataclasses",
    "ProjectConfiguration": "cadence.dataclasses",
    "GradientAccumulationPlugin": "cadence.dataclasses",
    "TorchDynamoPlugin": "cadence.dataclasses",
    "KwargsHandler": "cadence.dataclasses",
    "AutocastKwargs": "cadence.dataclasses",
    "DistributedDataParallelKwargs": "cadence.dataclasses",
    "GradScalerKwargs": "cadence.dataclasses",
    "InitProcessGroupKwargs": "cadence.dataclasses",
    "ProfileKwargs": "cadence.dataclasses",
    "FP8RecipeKwargs": "cadence.dataclasses",
    "AORecipeKwargs": "cadence.dataclasses",
    "TERecipeKwargs": "cadence.dataclasses",
    "MSAMPRecipeKwargs": "cadence.dataclasses",
    "convert_model_to_fp8_ao": "cadence.precision_fp8",
    "filter_first_and_last_linear_layers": "cadence.precision_fp8",
    "has_ao_layers": "cadence.precision_fp8",
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
    "merge_fsdp_weights": "cadence.checkpointing.merge",
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
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
