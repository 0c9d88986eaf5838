"""Reference path: re-exports `cadence.bigmodel` (empty init, dispatch, CPU/disk offload) under Accelerate's `big_modeling` module path."""

from __future__ import annotations

from .bigmodel.attach import (
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
)
from .bigmodel.device_map import (
    check_device_map,
    get_balanced_memory,
    infer_auto_device_map,
)
from .bigmodel.dispatch import (
    SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING,
    attach_layerwise_casting_hooks,
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    load_checkpoint_and_dispatch,
)
from .bigmodel.empty_init import (
    init_empty_weights,
    init_on_device,
)
from .bigmodel.hooks import (
    AlignDevicesHook,
    CpuOffload,
    LayerwiseCastingHook,
    UserCpuOffloadHook,
    add_hook_to_module,
)
from .bigmodel.loading import (
    load_checkpoint_in_model,
)
from .bigmodel.offload import (
    OffloadedWeightsLoader,
    extract_submodules_state_dict,
    offload_state_dict,
)
from .bigmodel.tensors import (
    find_tied_parameters,
    retie_parameters,
)

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "LayerwiseCastingHook",
    "OffloadedWeightsLoader",
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_layerwise_casting_hooks",
    "check_device_map",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "extract_submodules_state_dict",
    "find_tied_parameters",
    "get_balanced_memory",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "offload_state_dict",
    "retie_parameters",
]
