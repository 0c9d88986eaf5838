"""The reference's `utils.launch` path (home: `cadence.launch_env`)."""

from __future__ import annotations

from ..launch_env import (
    PrepareForLaunch,
    env_var_path_add,
    prepare_deepspeed_cmd_env,
    prepare_extend_env_parallelism_config,
    prepare_multi_gpu_env,
    prepare_sagemager_args_inputs,
    prepare_simple_launcher_cmd_env,
    prepare_tpu,
    setup_fp8_env,
)

__all__ = [
    "PrepareForLaunch",
    "env_var_path_add",
    "prepare_deepspeed_cmd_env",
    "prepare_extend_env_parallelism_config",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
    "setup_fp8_env",
]
