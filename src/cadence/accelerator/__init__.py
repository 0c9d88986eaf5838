"""The `Accelerator` and the components it owns (settings, preparation, accumulation).

`cadence.accelerator` is also Accelerate's module path `accelerate.accelerator`, from which scripts
import the configuration classes next to the Accelerator (`from accelerate.accelerator import
Accelerator, DataLoaderConfiguration, GradientAccumulationPlugin`): those names are re-exported here.
"""

# The backend probes Accelerate's `accelerator` module consults (and tests patch there); the
# Preparer reads them from this package at call time.
from ..core.availability import is_bitsandbytes_multi_backend_available, is_xpu_available  # noqa: F401
from ..core.enums import (
    DistributedType,
    DynamoBackend,
    FP8BackendType,
    LoggerType,
    PrecisionType,
    RNGType,
)
from ..core.lazy_exports import lazy_exports
from ..runtime.gradient_state import GradientState
from ..runtime.state import AcceleratorState, PartialState
from .facade import Accelerator

# The option records (their home is cadence.options.dataclasses, where cadence.utils takes them too),
# and the backend plugins, which load on first use of their name (most scripts never name one).
_OPTION_RECORDS = (
    "AORecipeKwargs", "AutocastKwargs", "DataLoaderConfiguration", "DistributedDataParallelKwargs",
    "FP8RecipeKwargs", "GradientAccumulationPlugin", "GradScalerKwargs", "InitProcessGroupKwargs",
    "KwargsHandler", "MSAMPRecipeKwargs", "ProfileKwargs", "ProjectConfiguration", "TERecipeKwargs",
    "TorchDynamoPlugin",
)  # fmt: skip
_EXPORTS = {
    **dict.fromkeys(_OPTION_RECORDS, "cadence.options.dataclasses"),
    "DeepSpeedPlugin": "cadence.plugins.deepspeed",
    "FullyShardedDataParallelPlugin": "cadence.plugins.fsdp",
    "MegatronLMPlugin": "cadence.plugins.megatron",
    "TorchTensorParallelPlugin": "cadence.plugins.parallelism",
}

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

_lazy_getattr, _lazy_dir = lazy_exports(__name__, _EXPORTS)
__getattr__ = _lazy_getattr


def __dir__() -> list[str]:
    """The eager names and the plugins loaded on first use."""
    return sorted(set(globals()) | set(_EXPORTS))
