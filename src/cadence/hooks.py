"""Reference path: re-exports `cadence.bigmodel` (hooks moving weights and activations) under Accelerate's `hooks` module path."""

from __future__ import annotations

from .bigmodel.attach import (
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
)
from .bigmodel.hooks import (
    AlignDevicesHook,
    CpuOffload,
    LayerwiseCastingHook,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    find_device,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from .bigmodel.offload import (
    PrefixedDataset,
)
from .bigmodel.sizes import (
    get_non_persistent_buffers,
    named_module_tensors,
)
from .bigmodel.tensors import (
    set_module_tensor_to_device,
)

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "LayerwiseCastingHook",
    "ModelHook",
    "PrefixedDataset",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
    "find_device",
    "get_non_persistent_buffers",
    "named_module_tensors",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
    "set_module_tensor_to_device",
]
