"""`to-fsdp2`: rewrite a config file's FSDP1 settings as FSDP2 settings (Accelerate's command)."""

from __future__ import annotations

import argparse
import enum
import logging
from pathlib import Path
from typing import Any

from .parser_compat import run_parser

logger = logging.getLogger(__name__)


class ConversionStatus(enum.Enum):
    """What happens to an FSDP1 key that has no FSDP2 equivalent."""

    NOT_YET_IMPLEMENTED = 0
    REMOVED = -1


# FSDP1 key -> FSDP2 key, or why it is dropped.
ARGUMENT_KEY_MAPPING: dict[str, Any] = {
    "fsdp_version": "fsdp_version",
    "fsdp_reshard_after_forward": "fsdp_reshard_after_forward",
    "fsdp_auto_wrap_policy": "fsdp_auto_wrap_policy",
    "fsdp_backward_prefetch": ConversionStatus.REMOVED,
    "fsdp_forward_prefetch": ConversionStatus.NOT_YET_IMPLEMENTED,
    "fsdp_cpu_ram_efficient_loading": "fsdp_cpu_ram_efficient_loading",
    "fsdp_offload_params": "fsdp_offload_params",
    "fsdp_sharding_strategy": "fsdp_reshard_after_forward",
    "fsdp_state_dict_type": "fsdp_state_dict_type",
    "fsdp_sync_module_states": ConversionStatus.REMOVED,
    "fsdp_transformer_layer_cls_to_wrap": "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params": "fsdp_min_num_params",
    "fsdp_use_orig_params": ConversionStatus.REMOVED,
    "fsdp_activation_checkpointing": "fsdp_activation_checkpointing",
}

# A sharding strategy becomes "reshard after forward": True where FSDP1 freed parameters after forward.
_RESHARD = {
    "FULL_SHARD": True,
    "SHARD_GRAD_OP": False,
    "HYBRID_SHARD": True,
    "HYBRID_SHARD_ZERO2": False,
    "NO_SHARD": False,
}
ARGUMENT_VALUE_MAPPING: dict[str, dict[str, Any]] = {
    "fsdp_sharding_strategy": dict(_RESHARD),
    "fsdp_reshard_after_forward": dict(_RESHARD),
}


def convert_config_to_fsdp2(config: dict) -> dict:
    """The config with its `fsdp_config` rewritten for FSDP2 (`fsdp_version: 2`); a config
    without FSDP settings, or already FSDP2, is returned unchanged.

    Example:
        >>> convert_config_to_fsdp2({"fsdp_config": {"fsdp_sharding_strategy": "FULL_SHARD"}})
        {'fsdp_config': {'fsdp_reshard_after_forward': True, 'fsdp_version': 2}}

    Args:
        config (dict): The config file's content.

    Returns:
        dict: The converted config.
    """
    fsdp_config = config.get("fsdp_config") or {}
    if not fsdp_config:
        logger.info("No FSDP config found in the config file, skipping conversion...")
        return config
    if fsdp_config.get("fsdp_version", 1) == 2:
        logger.warning("Config already specifies FSDP2, skipping conversion...")
        return config
    converted: dict[str, Any] = {}
    for key, value in fsdp_config.items():
        target = ARGUMENT_KEY_MAPPING.get(key)
        if target is None:
            converted[key] = value  # not an FSDP1-specific key: kept as it is
        elif target is ConversionStatus.REMOVED:
            logger.warning(f"Argument {key} has been removed in FSDP2, skipping this key...")
        elif target is ConversionStatus.NOT_YET_IMPLEMENTED:
            logger.warning(f"Argument {key} is not yet implemented in FSDP2, skipping this key...")
        else:
            converted[target] = ARGUMENT_VALUE_MAPPING.get(key, {}).get(value, value)
    converted["fsdp_version"] = 2
    config["fsdp_config"] = converted
    return config


def load_config(config_file: str) -> dict:
    """The YAML config file as a dict; an empty file raises ValueError.

    Args:
        config_file (str): The YAML file's path.

    Returns:
        dict: Its content.
    """
    import yaml

    with open(config_file, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    if not config:
        raise ValueError(f"Config file {config_file} is empty")
    return config


def to_fsdp2_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The `to-fsdp2` parser: added to `subparsers` when given, standalone otherwise.

    Args:
        subparsers (Any): The subparsers action of the `cadence` parser; None builds a standalone parser.

    Returns:
        argparse.ArgumentParser: The parser.
    """
    description = "Convert a config file from FSDP1 to FSDP2 settings."
    if subparsers is not None:
        parser = subparsers.add_parser(
            "to-fsdp2",
            help="Convert a config file that uses FSDP1 to one that uses FSDP2.",
            description=description,
        )
    else:
        parser = argparse.ArgumentParser("cadence to-fsdp2", description=description)
    parser.add_argument(
        "--config_file",
        "--config-file",
        type=str,
        required=True,
        help="The config file to convert.",
    )
    parser.add_argument(
        "--overwrite", action="store_true", default=False, help="Rewrite the file in place."
    )
    parser.add_argument(
        "--output_file",
        "--output-file",
        type=str,
        default=None,
        help="Where to write the converted config.",
    )
    parser.set_defaults(func=to_fsdp2_command)
    return parser


def to_fsdp2_command(args: argparse.Namespace) -> None:
    """Convert `args.config_file`, writing `args.output_file` (or the file itself with `--overwrite`).

    Args:
        args (argparse.Namespace): The parsed `to-fsdp2` arguments.

    Raises:
        FileNotFoundError: The config file does not exist.
        ValueError: Neither `--overwrite` nor `--output_file`.
        FileExistsError: The output file exists and `--overwrite` is not set.
    """
    import yaml

    if not Path(args.config_file).exists():
        raise FileNotFoundError(f"Config file {args.config_file} not found")
    if not args.overwrite and args.output_file is None:
        raise ValueError("If --overwrite is not set, --output_file must be provided")
    if not args.overwrite and Path(args.output_file).exists():
        raise FileExistsError(
            f"Output file {args.output_file} already exists and --overwrite is not set"
        )
    config = convert_config_to_fsdp2(load_config(args.config_file))
    output = args.output_file or args.config_file
    with open(output, "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle)


def register(subparsers: Any) -> None:
    """Add the `to-fsdp2` subcommand to `subparsers`."""
    to_fsdp2_command_parser(subparsers)


def main() -> int:
    """Run `to-fsdp2` with the process arguments."""
    return run_parser(to_fsdp2_command_parser())
