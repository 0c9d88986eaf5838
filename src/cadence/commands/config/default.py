"""Accelerate's `commands.config.default` path: `write_basic_config` and `config default`."""

from __future__ import annotations

import argparse
from typing import Any

from ...launch.config_file import write_basic_config
from ..config_cmd import default_command

description = "Create a default config file for Cadence with only a few flags set."


def default_command_parser(
    parser: Any, parents: list[argparse.ArgumentParser]
) -> argparse.ArgumentParser:
    """Add the `default` subcommand to the subparsers `parser` (with `parents`' options).

    Args:
        parser (Any): The subparsers action of the `config` parser.
        parents (list[argparse.ArgumentParser]): Parsers whose options the subcommand also takes.

    Returns:
        argparse.ArgumentParser: The subcommand's parser.
    """
    default = parser.add_parser(
        "default", parents=parents, help=description, description=description
    )
    default.add_argument(
        "--config_file", "--config-file", default=None, help="Where to write the config file."
    )
    default.add_argument(
        "--mixed_precision",
        "--mixed-precision",
        choices=["no", "fp16", "bf16"],
        type=str.lower,
        default="no",
        help="Mixed precision to record in the file (default: no).",
    )
    default.set_defaults(func=default_config_command)
    return default


def default_config_command(args: argparse.Namespace) -> int:
    """Write the basic config for this machine to `args.config_file` (default location if None).

    Args:
        args (argparse.Namespace): The parsed `config default` arguments.

    Returns:
        int: The exit code.
    """
    return default_command(args)


__all__ = ["default_command_parser", "default_config_command", "description", "write_basic_config"]
