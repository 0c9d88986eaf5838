"""The `Accelerator` and the components it owns (settings, preparation, accumulation).

`cadence.accelerator` is also the reference's module path `accelerate.accelerator`, from which scripts
import the configuration classes next to the Accelerator (`from accelerate.accelerator import
Accelerator, DataLoaderConfiguration, GradientAccumulationPlugin`): those names are re-exported here.
"""

from ..core.enums import (
    DistributedType,
    DynamoBackend,
    FP8BackendType,
    LoggerType,
    PrecisionType,
    RNGType,
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
from ..plugins.deepspeed import DeepSpeedPlugin
from ..plugins.fsdp import FullyShardedDataParallelPlugin
from ..plugins.megatron import MegatronLMPlugin
from ..plugins.parallelism import TorchTensorParallelPlugin
from ..runtime.gradient_state import GradientState
from ..runtime.state import AcceleratorState, PartialState
from .facade import Accelerator

__all__ = [
    "AORecipeKwargs",
    "Accelerator",
    "AcceleratorState",
    "AutocastKwargs",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "DynamoBackend",
    "FP8BackendType",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "GradientState",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "MSAMPRecipeKwargs",
    "MegatronLMPlugin",
    "PartialState",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "TERecipeKwargs",
    "TorchDynamoPlugin",
    "TorchTensorParallelPlugin",
]
