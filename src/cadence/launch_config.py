"""The one serialised settings record that `cadence launch` hands to every worker.

The launcher writes a JSON object into the environment variable ``CADENCE_LAUNCH_CONFIG``; workers read it
once. Keys (all optional): ``num_processes``, ``num_machines``, ``backend`` ("gloo" / "nccl"), ``use_cpu``,
``mixed_precision``, ``gradient_accumulation_steps``, ``dynamo`` (dict: backend, mode, fullgraph, dynamic),
``debug``, ``fsdp`` (dict), ``deepspeed`` (dict), ``process_group_timeout`` and ``stuck_timeout``
(seconds).

`cadence launch` also writes ``distributed_type`` ("NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED"),
``main_training_function``, ``enable_cpu_affinity``, ``downcast_bf16``, and ``dynamo.regional_compilation``.
``fsdp`` holds the launcher's FSDP settings without their ``fsdp_`` prefix (version, sharding_strategy,
reshard_after_forward, offload_params, min_num_params, auto_wrap_policy, transformer_layer_cls_to_wrap,
backward_prefetch, state_dict_type, forward_prefetch, use_orig_params, cpu_ram_efficient_loading,
sync_module_states, activation_checkpointing, activation_checkpointing_offload). ``deepspeed`` holds
zero_stage, offload_optimizer_device, offload_param_device, offload_*_nvme_path, gradient_clipping,
zero3_init_flag, zero3_save_16bit_model, deepspeed_config_file, deepspeed_hostfile,
deepspeed_{exclusion,inclusion}_filter, deepspeed_multinode_launcher, deepspeed_moe_layer_cls_names, and
``fields_from_config`` (the names whose value came from the config file, for conflict checks against a
DeepSpeed JSON file). Values that the user did not set are the launcher's defaults.
"""

from __future__ import annotations

import json
import os
from typing import Any

LAUNCH_CONFIG_ENV = "CADENCE_LAUNCH_CONFIG"


class LaunchConfigError(RuntimeError):
    """The launcher's settings record is not valid JSON or not an object."""


def read_launch_config(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The settings written by `cadence launch`, or an empty dict when the script was not launched by it."""
    raw = (os.environ if env is None else env).get(LAUNCH_CONFIG_ENV)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise LaunchConfigError(
            f"{LAUNCH_CONFIG_ENV} is not valid JSON ({err}). It is written by `cadence launch`; "
            "unset it if you set it by hand."
        ) from None
    if not isinstance(value, dict):
        raise LaunchConfigError(
            f"{LAUNCH_CONFIG_ENV} must hold a JSON object, got {type(value).__name__}."
        )
    return value


def encode_launch_config(settings: dict[str, Any]) -> str:
    return json.dumps(settings, sort_keys=True, separators=(",", ":"))
