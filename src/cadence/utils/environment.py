"""Accelerate's `utils.environment` path: environment-variable helpers (home: `cadence.core.environment`)."""

from __future__ import annotations

from ..core.environment import (
    CPUInformation,
    are_libraries_initialized,
    check_cuda_fp8_capability,
    check_cuda_p2p_ib_support,
    clear_environment,
    convert_dict_to_env_variables,
    get_cpu_distributed_information,
    get_current_device_type,
    get_driver_version,
    get_gpu_info,
    get_int_from_env,
    override_numa_affinity,
    parse_choice_from_env,
    parse_flag_from_env,
    patch_environment,
    purge_accelerate_environment,
    purge_cadence_environment,
    set_numa_affinity,
    str_to_bool,
)

__all__ = [
    "CPUInformation",
    "are_libraries_initialized",
    "check_cuda_fp8_capability",
    "check_cuda_p2p_ib_support",
    "clear_environment",
    "convert_dict_to_env_variables",
    "get_cpu_distributed_information",
    "get_current_device_type",
    "get_driver_version",
    "get_gpu_info",
    "get_int_from_env",
    "override_numa_affinity",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "purge_accelerate_environment",
    "purge_cadence_environment",
    "set_numa_affinity",
    "str_to_bool",
]
