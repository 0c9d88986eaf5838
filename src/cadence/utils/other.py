"""Accelerate's `utils.other` path: model and process helpers (homes: `cadence.training.model_helpers`, `cadence.process_helpers`)."""

from __future__ import annotations

from ..launch.config_file import (
    write_basic_config,
)
from ..process_helpers import (
    TORCH_SAFE_GLOBALS,
    check_os_kernel,
    get_free_port,
    is_port_in_use,
    load,
    save,
    wait_for_everyone,
)
from ..training.model_helpers import (
    clean_state_dict_for_safetensors,
    compile_regions,
    compile_regions_deepspeed,
    compile_regions_fsdp2,
    convert_bytes,
    extract_model_from_parallel,
    get_model_tp_size,
    get_module_children_bottom_up,
    get_pretty_name,
    has_compiled_regions,
    has_repeated_blocks,
    is_compiled_module,
    is_repeated_blocks,
    merge_dicts,
    model_has_dtensor,
    recursive_getattr,
)

__all__ = [
    "TORCH_SAFE_GLOBALS",
    "check_os_kernel",
    "clean_state_dict_for_safetensors",
    "compile_regions",
    "compile_regions_deepspeed",
    "compile_regions_fsdp2",
    "convert_bytes",
    "extract_model_from_parallel",
    "get_free_port",
    "get_model_tp_size",
    "get_module_children_bottom_up",
    "get_pretty_name",
    "has_compiled_regions",
    "has_repeated_blocks",
    "is_compiled_module",
    "is_port_in_use",
    "is_repeated_blocks",
    "load",
    "merge_dicts",
    "model_has_dtensor",
    "recursive_getattr",
    "save",
    "wait_for_everyone",
    "write_basic_config",
]
