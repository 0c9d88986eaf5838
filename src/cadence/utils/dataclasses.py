"""Accelerate's `utils.dataclasses` path: enums, kwargs handlers, plugins and configurations (homes: `cadence.core.enums`, `cadence.options.dataclasses`, `cadence.options.dataclasses`, `cadence.plugins`)."""

from __future__ import annotations

from ..core.enums import (
    BaseEnum,
    ComputeEnvironment,
    CustomDtype,
    DDPCommunicationHookType,
    DistributedType,
    DynamoBackend,
    EnumWithContains,
    FP8BackendType,
    LoggerType,
    PrecisionType,
    RNGType,
    SageMakerDistributedType,
)
from ..data.batches import (
    TensorInformation,
)
from ..fsdp_helpers import (
    get_module_class_from_name,
)
from ..options.dataclasses import (
    AORecipeKwargs,
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    FP8RecipeKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    MSAMPRecipeKwargs,
    ProfileKwargs,
    ProjectConfiguration,
    TERecipeKwargs,
    TorchDynamoPlugin,
)
from ..plugins import (
    DeepSpeedPlugin,
    DeepSpeedSequenceParallelConfig,
    FullyShardedDataParallelPlugin,
    MegatronLMPlugin,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
    TorchTensorParallelPlugin,
)
from ..unsupported.bitsandbytes import (
    BnbQuantizationConfig,
)
from ..unsupported.megatron_lm import (
    MODEL_CONFIGS_TO_MEGATRON_PARSERS,
    add_model_config_to_megatron_parser,
    parse_bert_config,
    parse_glm4_moe_config,
    parse_gpt2_config,
    parse_llama_config,
    parse_t5_config,
)

__all__ = [
    "AORecipeKwargs",
    "AutocastKwargs",
    "BaseEnum",
    "BnbQuantizationConfig",
    "ComputeEnvironment",
    "CustomDtype",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DeepSpeedSequenceParallelConfig",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "DynamoBackend",
    "EnumWithContains",
    "FP8BackendType",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "MODEL_CONFIGS_TO_MEGATRON_PARSERS",
    "MSAMPRecipeKwargs",
    "MegatronLMPlugin",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "SageMakerDistributedType",
    "TERecipeKwargs",
    "TensorInformation",
    "TorchContextParallelConfig",
    "TorchDynamoPlugin",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
    "add_model_config_to_megatron_parser",
    "get_module_class_from_name",
    "parse_bert_config",
    "parse_glm4_moe_config",
    "parse_gpt2_config",
    "parse_llama_config",
    "parse_t5_config",
]
