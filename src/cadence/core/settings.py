"""The one settings resolver of a worker process: the only reader of `os.environ` (rank variables aside,
which `cadence.runtime.topology` reads) and of the record `cadence launch` writes.

Every setting resolves the same way: explicit argument > launch record > environment variable > default,
and remembers where its value came from. The environment names are in one table, `ENV_NAMES`: Cadence's
own name first, then Accelerate's (so `ACCELERATE_MIXED_PRECISION=bf16` keeps working). One boolean
parser, `parse_bool`, reads every flag.

Example::

    from cadence.core.settings import resolve
    resolve("mixed_precision", explicit=None, default="no")   # Resolved(value='bf16', source='launch')
"""

from __future__ import annotations

import copy
import functools
import json
import os
from dataclasses import dataclass
from typing import Any

from .environment import str_to_bool

LAUNCH_CONFIG_ENV = "CADENCE_LAUNCH_CONFIG"


# setting -> (launch-record key or None, environment names in order of precedence)
ENV_NAMES: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "use_cpu": ("use_cpu", ("CADENCE_USE_CPU", "ACCELERATE_USE_CPU")),
    "debug": ("debug", ("CADENCE_DEBUG", "ACCELERATE_DEBUG_MODE")),
    "mixed_precision": (
        "mixed_precision",
        ("CADENCE_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION"),
    ),
    "gradient_accumulation_steps": (
        "gradient_accumulation_steps",
        ("CADENCE_GRADIENT_ACCUMULATION_STEPS", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"),
    ),
    "dynamo_backend": (None, ("CADENCE_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_BACKEND")),
    "dynamo_mode": (None, ("CADENCE_DYNAMO_MODE", "ACCELERATE_DYNAMO_MODE")),
    "dynamo_use_fullgraph": (
        None,
        ("CADENCE_DYNAMO_USE_FULLGRAPH", "ACCELERATE_DYNAMO_USE_FULLGRAPH"),
    ),
    "dynamo_use_dynamic": (None, ("CADENCE_DYNAMO_USE_DYNAMIC", "ACCELERATE_DYNAMO_USE_DYNAMIC")),
    "dynamo_use_regional_compilation": (
        None,
        ("CADENCE_DYNAMO_USE_REGIONAL_COMPILATION", "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"),
    ),
    "torch_device": (None, ("CADENCE_TORCH_DEVICE", "ACCELERATE_TORCH_DEVICE")),
    "use_fsdp": (None, ("CADENCE_USE_FSDP", "ACCELERATE_USE_FSDP")),
    "use_deepspeed": (None, ("CADENCE_USE_DEEPSPEED", "ACCELERATE_USE_DEEPSPEED")),
    "use_parallelism_config": (
        None,
        ("CADENCE_USE_PARALLELISM_CONFIG", "ACCELERATE_USE_PARALLELISM_CONFIG"),
    ),
    # cp_size > 1 without FSDP2 (plain DDP over the cp ranks), as the reference's variable allows.
    "allow_cp_standalone": (
        None,
        ("CADENCE_ALLOW_CP_STANDALONE", "ACCELERATE_ALLOW_CP_STANDALONE"),
    ),
    # Context parallelism drops any attention mask, as the reference does, instead of refusing a
    # mask that is not causal (docs/differences.md).
    "cp_drop_attention_mask": (None, ("CADENCE_CP_DROP_ATTENTION_MASK",)),
    "fork_launched": (None, ("FORK_LAUNCHED",)),
    # Not launched by Cadence and no cpu=True: a process group someone else started (Ray Train)
    # is ignored and each process runs alone, as the reference does (docs/differences.md).
    "ignore_process_group": (None, ("CADENCE_IGNORE_PROCESS_GROUP",)),
    "fp8_backend": (None, ("CADENCE_FP8_BACKEND", "ACCELERATE_FP8_BACKEND")),
    "log_level": (None, ("CADENCE_LOG_LEVEL", "ACCELERATE_LOG_LEVEL")),
    "stuck_timeout": ("stuck_timeout", ("CADENCE_STUCK_TIMEOUT",)),
    # The stop notice (a scheduler's pre-kill signal) and how long the launcher waits for the
    # checkpoint it triggers; see diagnostics/stop_notice.py and launch/elastic_agent.py.
    "stop_signal": ("stop_signal", ("CADENCE_STOP_SIGNAL",)),
    "stop_grace": ("stop_grace", ("CADENCE_STOP_GRACE",)),
    "process_group_timeout": ("process_group_timeout", ()),
    # Per-step fault tolerance (torchft): the record `cadence launch --fault_tolerance` writes for
    # each replica group; see cadence/fault_tolerance/config.py.
    "fault_tolerance": ("fault_tolerance", ()),
    # XLA (torch_xla): CADENCE_USE_XLA=1 asks for it, 0 refuses it; the reference's USE_TORCH_XLA=0
    # refuses it too. PJRT_DEVICE (torch_xla's runtime) or a TPU VM's TPU_ACCELERATOR_TYPE wants it.
    "use_xla": ("use_xla", ("CADENCE_USE_XLA",)),
    "use_torch_xla": (None, ("USE_TORCH_XLA",)),
    "pjrt_device": (None, ("PJRT_DEVICE",)),
    "tpu_accelerator_type": (None, ("TPU_ACCELERATOR_TYPE",)),
    "xla_mp_device_loader": (None, ("CADENCE_XLA_MP_DEVICE_LOADER",)),
}


# The variables the reference's launcher uses to hand plugin fields to a worker; plugins fill fields
# the user left unset from these (through `plugin_env_text` / `plugin_env_bool`, which refuse a name
# missing here, so this table stays the complete list).
PLUGIN_ENV_NAMES: dict[str, tuple[str, ...]] = {
    "DeepSpeedPlugin": (
        "ACCELERATE_DEEPSPEED_CONFIG_FILE",
        "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES",
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
        "ACCELERATE_DEEPSPEED_ZERO3_INIT",
        "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE",
        "ACCELERATE_FP8_BACKEND",
        "ACCELERATE_FP8_OPT_LEVEL",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
        "ACCELERATE_GRADIENT_CLIPPING",
    ),
    "FullyShardedDataParallelPlugin": (
        "FSDP_ACTIVATION_CHECKPOINTING",
        "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD",
        "FSDP_AUTO_WRAP_POLICY",
        "FSDP_BACKWARD_PREFETCH",
        "FSDP_CPU_RAM_EFFICIENT_LOADING",
        "FSDP_FORWARD_PREFETCH",
        "FSDP_IGNORED_MODULES",
        "FSDP_MIN_NUM_PARAMS",
        "FSDP_OFFLOAD_PARAMS",
        "FSDP_RESHARD_AFTER_FORWARD",
        "FSDP_SHARDING_STRATEGY",
        "FSDP_STATE_DICT_TYPE",
        "FSDP_SYNC_MODULE_STATES",
        "FSDP_TRANSFORMER_CLS_TO_WRAP",
        "FSDP_USE_ORIG_PARAMS",
        "FSDP_VERSION",
    ),
    "ParallelismConfig": (
        "PARALLELISM_CONFIG_CP_BACKEND",
        "PARALLELISM_CONFIG_CP_COMM_STRATEGY",
        "PARALLELISM_CONFIG_CP_SIZE",
        "PARALLELISM_CONFIG_DP_REPLICATE_SIZE",
        "PARALLELISM_CONFIG_DP_SHARD_SIZE",
        "PARALLELISM_CONFIG_PP_SCHEDULE",
        "PARALLELISM_CONFIG_PP_SIZE",
        "PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION",
        "PARALLELISM_CONFIG_SP_BACKEND",
        "PARALLELISM_CONFIG_SP_SEQ_LENGTH",
        "PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE",
        "PARALLELISM_CONFIG_SP_SIZE",
        "PARALLELISM_CONFIG_TP_SIZE",
    ),
}
_PLUGIN_ENV = frozenset(name for names in PLUGIN_ENV_NAMES.values() for name in names)


class LaunchConfigError(RuntimeError):
    """The launcher's settings record is not valid JSON or not an object."""


@dataclass(frozen=True)
class Resolved:
    """A setting's value and where it came from ("argument", "launch", "env:<NAME>" or "default")."""

    value: Any
    source: str


def parse_bool(value: Any, name: str = "value") -> bool:
    """The one boolean parser: True/False, or y/yes/t/true/on/1 and n/no/f/false/off/0 in any case.

    Example::

        parse_bool("Yes")  # True
    """
    if isinstance(value, bool):
        return value
    try:
        return bool(str_to_bool(value, to_bool=True))  # the one parser: its words, its rules
    except ValueError:
        raise ValueError(
            f"{name} must be a boolean (true/false, yes/no, 1/0), got {value!r}."
        ) from None


def env_text(name: str, default: str | None = None) -> str | None:
    """The raw value of environment variable `name` (or `default`)."""
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    """Environment variable `name` read with `parse_bool` (a bad spelling is an error naming it)."""
    raw = os.environ.get(name)
    return default if raw is None or raw.strip() == "" else parse_bool(raw, name)


def plugin_env_text(name: str, default: str | None = None) -> str | None:
    """A plugin field's value from its environment variable (`name` must be in `PLUGIN_ENV_NAMES`)."""
    if name not in _PLUGIN_ENV:
        raise KeyError(f"{name} is not in cadence.core.settings.PLUGIN_ENV_NAMES; add it there.")
    return env_text(name, default)


def plugin_env_bool(name: str, default: bool = False) -> bool:
    """`plugin_env_text` read with `parse_bool`."""
    raw = plugin_env_text(name)
    return default if raw is None or raw.strip() == "" else parse_bool(raw, name)


def read_launch_config(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The settings written by `cadence launch`, or an empty dict when the script was not launched by it."""
    raw = (os.environ if env is None else env).get(LAUNCH_CONFIG_ENV)
    if not raw:
        return {}
    return copy.deepcopy(_parse_launch_config(raw))  # callers may not change the cached record


@functools.lru_cache(maxsize=4)
def _parse_launch_config(raw: str) -> dict[str, Any]:
    # Parsed once per distinct record, however many components ask for it.
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
    """The launch record as the launcher writes it into the environment."""
    return json.dumps(settings, sort_keys=True, separators=(",", ":"))


def resolve(
    name: str,
    explicit: Any = None,
    default: Any = None,
    launch: dict[str, Any] | None = None,
) -> Resolved:
    """Explicit argument > launch record > environment (Cadence's name, then Accelerate's) > default."""
    if explicit is not None:
        return Resolved(explicit, "argument")
    key, env_names = ENV_NAMES[name]
    record = read_launch_config() if launch is None else launch
    if key is not None and record.get(key) is not None:
        return Resolved(record[key], "launch")
    for env_name in env_names:
        raw = os.environ.get(env_name)
        if raw is not None and raw.strip() != "":
            return Resolved(raw, f"env:{env_name}")
    return Resolved(default, "default")


def resolve_flag(name: str, explicit: bool | None = None, launch: dict | None = None) -> Resolved:
    """`resolve` for a boolean setting: strings from the environment go through `parse_bool`."""
    found = resolve(name, explicit or None, False, launch)
    if isinstance(found.value, str):
        return Resolved(parse_bool(found.value, found.source.removeprefix("env:")), found.source)
    return Resolved(bool(found.value), found.source)


def describe(resolved: dict[str, Resolved]) -> str:
    """One line per setting, `name = value (source)`, for debug output."""
    return "\n".join(f"{name} = {item.value!r} ({item.source})" for name, item in resolved.items())


def device_from_env(env: dict[str, str] | None = None) -> Any:
    """The torch device named by CADENCE_TORCH_DEVICE (or Accelerate's ACCELERATE_TORCH_DEVICE).

    As in Accelerate it overrides every other choice, `cpu=True` included.

    Example::

        # CADENCE_TORCH_DEVICE=cuda:1 python train.py  -> this process runs on the second GPU
    """
    import torch  # the launcher side imports this module without torch

    env = os.environ if env is None else env
    for name in ENV_NAMES["torch_device"][1]:
        raw = env.get(name, "").strip()
        if not raw:
            continue
        try:
            return torch.device(raw)
        except RuntimeError as error:
            raise ValueError(
                f"{name}={raw!r} is not a torch device ({error}); use a name such as 'cpu', "
                "'cuda:0' or 'mps', or unset it."
            ) from None
    return None
