"""Where each `cadence launch` setting comes from: flag > ``CADENCE_<FLAG>`` env > config file > default.

`SETTINGS` lists every setting with its converter and default. `SettingsResolver` picks the value of
one setting from the four layers and remembers the layer, for the banner and the tests.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import config_file as config_files
from .args import str_to_bool

GPU_DISTRIBUTED_TYPES = {
    kind
    for kind in config_files.CLUSTER_DISTRIBUTED_TYPES
    if kind.startswith("MULTI_") and kind != "MULTI_CPU"
}


class LaunchPlanError(ValueError):
    """The flags, environment and config file do not describe a launch Cadence can start."""


CPU_SKIPS_DEFAULT_CONFIG = "default: --cpu skips the default config file"
FLAG = "flag"
CONFIG = "config file"
DEFAULT = "default"


@dataclass(frozen=True)
class Setting:
    """A resolved launch setting: its value and where it came from."""

    value: Any
    source: str  # "flag", "env NAME", "config file", "default" or "default: <reason>"


def _int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    return int(value)


def _bool(value: Any) -> bool:
    return value if isinstance(value, bool) else str_to_bool(str(value))


def _text(value: Any) -> str:
    return str(value)


# name -> (converter for env/config values, default). Flags are already converted by argparse.
SETTINGS: dict[str, tuple[Callable[[Any], Any], Any]] = {
    "cpu": (_bool, False),
    "multi_gpu": (_bool, False),
    "use_fsdp": (_bool, False),
    "use_deepspeed": (_bool, False),
    "num_processes": (_int, None),
    "num_machines": (_int, 1),
    "nnodes": (_text, None),
    "nproc_per_node": (_int, None),
    "oversubscribe": (_bool, False),
    "machine_rank": (_int, 0),
    "main_process_ip": (_text, None),
    "main_process_port": (_int, None),
    "rdzv_backend": (lambda v: str(v).lower(), "static"),
    "rdzv_conf": (_text, ""),
    "rdzv_endpoint": (_text, None),
    "same_network": (_bool, False),
    "gpu_ids": (_text, "all"),
    "mixed_precision": (lambda v: str(v).lower(), "no"),
    "gradient_accumulation_steps": (_int, None),
    "num_cpu_threads_per_process": (_int, None),
    "enable_cpu_affinity": (_bool, False),
    "dynamo_backend": (lambda v: str(v).lower(), "no"),
    "dynamo_mode": (lambda v: str(v).lower(), "default"),
    "dynamo_use_fullgraph": (_bool, False),
    "dynamo_use_dynamic": (_bool, False),
    "dynamo_use_regional_compilation": (_bool, False),
    "debug": (_bool, False),
    "quiet": (_bool, False),
    "max_restarts": (_int, 0),
    "monitor_interval": (float, 0.1),
    "log_dir": (_text, None),
    "tee": (_text, "0"),
    "role": (_text, "default"),
    "main_training_function": (_text, "main"),
    "downcast_bf16": (_bool, False),
    # Pipeline parallelism (Cadence only): handed to the workers as PARALLELISM_CONFIG_* variables.
    "parallelism_config_pp_size": (_int, None),
    "parallelism_config_pp_schedule": (_text, None),
    # DeepSpeed
    "deepspeed_config_file": (_text, None),
    "zero_stage": (_int, 2),
    "offload_optimizer_device": (lambda v: str(v).lower(), "none"),
    "offload_param_device": (lambda v: str(v).lower(), "none"),
    "offload_optimizer_nvme_path": (_text, None),
    "offload_param_nvme_path": (_text, None),
    "gradient_clipping": (float, None),
    "zero3_init_flag": (_bool, None),
    "zero3_save_16bit_model": (_bool, None),
    "deepspeed_hostfile": (_text, None),
    "deepspeed_exclusion_filter": (_text, None),
    "deepspeed_inclusion_filter": (_text, None),
    "deepspeed_multinode_launcher": (lambda v: str(v).lower(), "pdsh"),
    "deepspeed_moe_layer_cls_names": (_text, None),
    # FSDP
    "fsdp_version": (_int, 1),
    "fsdp_offload_params": (_bool, False),
    "fsdp_min_num_params": (_int, 100_000_000),
    "fsdp_sharding_strategy": (lambda v: str(v).upper(), "FULL_SHARD"),
    "fsdp_reshard_after_forward": (_text, "true"),
    "fsdp_auto_wrap_policy": (lambda v: str(v).upper(), None),
    "fsdp_transformer_layer_cls_to_wrap": (_text, None),
    "fsdp_backward_prefetch": (lambda v: str(v).upper(), None),
    "fsdp_state_dict_type": (lambda v: str(v).upper(), None),
    "fsdp_forward_prefetch": (_bool, False),
    "fsdp_use_orig_params": (_bool, True),
    "fsdp_cpu_ram_efficient_loading": (_bool, True),
    "fsdp_sync_module_states": (_bool, True),
    "fsdp_activation_checkpointing": (_bool, False),
    "fsdp_activation_checkpointing_offload": (_bool, False),
}
DEEPSPEED_SETTINGS = (
    "deepspeed_config_file",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_optimizer_nvme_path",
    "offload_param_nvme_path",
    "gradient_clipping",
    "zero3_init_flag",
    "zero3_save_16bit_model",
    "deepspeed_hostfile",
    "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter",
    "deepspeed_multinode_launcher",
    "deepspeed_moe_layer_cls_names",
)
FSDP_SETTINGS = tuple(name for name in SETTINGS if name.startswith("fsdp_"))
DYNAMO_OPTIONS = (
    "dynamo_mode",
    "dynamo_use_fullgraph",
    "dynamo_use_dynamic",
    "dynamo_use_regional_compilation",
)
# Environment variable names that differ from CADENCE_<NAME>.
ENV_NAMES = {"cpu": "CADENCE_USE_CPU"}


def env_name(setting: str) -> str:
    """The environment variable that sets `setting` (`CADENCE_<SETTING>` unless mapped)."""
    return ENV_NAMES.get(setting, "CADENCE_" + setting.upper())


def config_values(config: config_files.ClusterConfig, notes: list[str]) -> dict[str, Any]:
    """The config file as launch settings keyed like the flags."""
    values: dict[str, Any] = {}
    for name in (
        "num_machines",
        "machine_rank",
        "gpu_ids",
        "main_process_ip",
        "main_process_port",
        "rdzv_backend",
        "same_network",
        "main_training_function",
        "enable_cpu_affinity",
        "downcast_bf16",
        "debug",
        "mixed_precision",
    ):
        values[name] = getattr(config, name)
    if config.num_processes not in (None, -1):
        values["num_processes"] = config.num_processes
    kind = config.distributed_type
    values["cpu"] = bool(config.use_cpu) or kind == "MULTI_CPU"
    values["multi_gpu"] = kind in GPU_DISTRIBUTED_TYPES
    values["use_fsdp"] = kind == "FSDP"
    values["use_deepspeed"] = kind == "DEEPSPEED"
    for key, value in config.fsdp_config.items():
        values[key if key.startswith("fsdp_") else "fsdp_" + key] = value
    for key, value in config.deepspeed_config.items():
        values[key] = value
    for key, value in config.dynamo_config.items():
        values[key if key.startswith("dynamo_") else "dynamo_" + key] = value
    if config.mpirun_config.get("mpirun_hostfile"):
        notes.append(
            "mpirun_config in the config file is ignored: cadence launch starts processes itself"
        )
    if config.parallelism_config:
        taken = ("parallelism_config_pp_size", "parallelism_config_pp_schedule")
        ignored = []
        for key, value in config.parallelism_config.items():
            name = key if key.startswith("parallelism_config_") else "parallelism_config_" + key
            if name in taken:
                values[name] = value
            else:
                ignored.append(key)
        if ignored:
            notes.append(
                f"parallelism_config keys {', '.join(sorted(ignored))} in the config file are ignored "
                "(Cadence takes pp_size and pp_schedule there yet)"
            )
    return values


def read_config(
    explicit: dict[str, Any], env: Mapping[str, str], allow_xla: bool = False
) -> tuple[config_files.ClusterConfig | None, Setting]:
    """The config file named by the flag, CADENCE_CONFIG_FILE, or the default location (when present).

    `allow_xla`: the XLA launcher (`launch/xla_launcher.py`) reads `distributed_type: XLA` files; the torchrun plan
    refuses them with a message pointing to `--tpu`."""
    if "config_file" in explicit:
        path, source = explicit["config_file"], FLAG
    elif env.get("CADENCE_CONFIG_FILE"):
        path, source = env["CADENCE_CONFIG_FILE"], "env CADENCE_CONFIG_FILE"
    else:
        default = config_files.default_config_path(dict(env))
        try:
            cpu_typed = explicit.get("cpu") or _bool(env.get("CADENCE_USE_CPU") or "0")
        except argparse.ArgumentTypeError:
            cpu_typed = False  # reported with the other settings below
        if not default.is_file():
            return None, Setting(None, "default: no config file")
        if cpu_typed:
            # As in the reference: --cpu means "plain CPU run", so the machine's default file is not read.
            return None, Setting(None, CPU_SKIPS_DEFAULT_CONFIG)
        path, source = str(default), DEFAULT
    try:
        loaded = config_files.load_config_from_file(path)
    except config_files.ConfigFileError as err:
        raise LaunchPlanError(str(err)) from None
    if isinstance(loaded, config_files.SageMakerConfig):
        raise LaunchPlanError(
            f"The config file {path} is for Amazon SageMaker, which cadence launch cannot start. "
            "Use a LOCAL_MACHINE config (`cadence config`)."
        )
    if loaded.distributed_type == "XLA" and not allow_xla:
        raise LaunchPlanError(
            f"The config file {path} asks for distributed_type XLA, which runs through torch_xla's "
            "launcher, but --cpu, --multi_gpu, --use_fsdp or --use_deepspeed was typed. Nothing was started: drop that flag "
            "to launch on XLA, or use a config file of another type."
        )
    if loaded.distributed_type == "MEGATRON_LM":
        raise LaunchPlanError(
            f"The config file {path} asks for distributed_type {loaded.distributed_type}, which Cadence does "
            "not support. Use MULTI_GPU, MULTI_CPU, FSDP, DEEPSPEED, XLA or NO."
        )
    return loaded, Setting(str(path), source)


class SettingsResolver:
    """Picks each setting from the four layers; bad environment or config values are collected in `errors`."""

    def __init__(
        self, explicit: dict[str, Any], env: Mapping[str, str], from_config: dict[str, Any]
    ):
        self.explicit, self.env, self.from_config = explicit, env, from_config
        self.errors: list[str] = []

    def __call__(self, name: str) -> Setting:
        convert, default = SETTINGS[name]
        if name in self.explicit:
            return Setting(self.explicit[name], FLAG)
        variable = env_name(name)
        raw = self.env.get(variable)
        if raw:
            try:
                return Setting(convert(raw), f"env {variable}")
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                self.errors.append(
                    f"environment variable {variable}={raw!r} is not a valid value for --{name}"
                )
                return Setting(default, DEFAULT)
        if self.from_config.get(name) is not None:
            try:
                return Setting(convert(self.from_config[name]), CONFIG)
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                self.errors.append(
                    f"config file value {name}: {self.from_config[name]!r} is not valid"
                )
                return Setting(default, DEFAULT)
        return Setting(default, DEFAULT)
