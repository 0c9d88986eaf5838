"""Reference path: re-exports `cadence.bigmodel` (pipeline-parallel inference) under Accelerate's `inference` module path."""

from __future__ import annotations

from .bigmodel.device_map import (
    infer_auto_device_map,
)
from .bigmodel.pipeline import (
    build_pipeline,
    copy_tensor_to_devices,
    find_pippy_batch_size,
    generate_device_map,
    is_pippy_available,
    pad_input_tensors,
    pippy_forward,
    prepare_pippy,
)
from .bigmodel.sizes import (
    calculate_maximum_sizes,
)

__all__ = [
    "build_pipeline",
    "calculate_maximum_sizes",
    "copy_tensor_to_devices",
    "find_pippy_batch_size",
    "generate_device_map",
    "infer_auto_device_map",
    "is_pippy_available",
    "pad_input_tensors",
    "pippy_forward",
    "prepare_pippy",
]
