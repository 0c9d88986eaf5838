"""Accelerate's `accelerate.utils.modeling` path: sizes, device maps, tensors, loading (see cadence.bigmodel)."""

from __future__ import annotations

from ..bigmodel.device_map import (
    check_device_map,
    clean_device_map,
    fallback_allocate,
    get_balanced_memory,
    get_max_memory,
    get_module_size_with_ties,
    infer_auto_device_map,
)
from ..bigmodel.loading import (
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    load_checkpoint_in_model,
    load_state_dict,
)
from ..bigmodel.offload import (
    load_offloaded_weight,
    load_offloaded_weights,
    offload_weight,
    save_offload_index,
)
from ..bigmodel.sizes import (
    calculate_maximum_sizes,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    get_max_layer_size,
    get_module_leaves,
    get_non_persistent_buffers,
    named_module_tensors,
)
from ..bigmodel.tensors import (
    align_module_device,
    check_device_same,
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    has_offloaded_params,
    id_tensor_storage,
    is_peft_model,
    retie_parameters,
    set_module_tensor_to_device,
)
from ..runtime.autocast import get_grad_scaler, get_mixed_precision_context_manager

__all__ = [
    "get_grad_scaler",
    "get_mixed_precision_context_manager",
    "SAFE_WEIGHTS_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "align_module_device",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_device_same",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "fallback_allocate",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_layer_size",
    "get_max_memory",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "id_tensor_storage",
    "infer_auto_device_map",
    "is_peft_model",
    "load_checkpoint_in_model",
    "load_offloaded_weight",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "offload_weight",
    "retie_parameters",
    "save_offload_index",
    "set_module_tensor_to_device",
]
